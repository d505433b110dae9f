"""Compilation off the hot path: background threads, a timeout, and a bounded LRU cache.

outlines-core needs seconds per schema, so compiled grammars are cached by backend + spec +
options + vocabulary, and a request for a grammar already compiling waits for that same
compilation instead of starting another. Failures are cached too: a bad spec sent twice
fails twice at once. The cache is bounded in entries and in bytes (each compiled grammar's
`memory_bytes`); the least recently used entries go first. Eviction only drops the cache's
reference: requests already serving a grammar keep it.

backend="auto" picks per grammar the first backend of `AUTO_ORDER` that enforces all of it
(nothing declared unenforced, and its compile does not refuse it); each actual backend's
compilation is cached as if asked for by name.

Compile threads run at a lower CPU priority (Linux nice, per thread; the threads a backend
starts while compiling inherit it): on a busy machine a long compile takes what the mask
fills of running requests leave, instead of stalling their steps.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout

from .backends import AUTO, Backend, CompiledGrammar, auto_order, create_backend, installed_backends
from .errors import (
    CompileTimeoutError,
    GrammarError,
    NotFullyEnforcedError,
    UnsupportedGrammarError,
)
from .grammars import Grammar
from .vocabulary import Vocabulary

CacheKey = tuple[str, tuple[str, str, str, bool, int], str]
_MAX_NICE = 19


def _lower_priority(increment: int) -> None:
    """Raise this thread's nice value by `increment` (Linux only; elsewhere, or if refused,
    the thread keeps the caller's priority)."""
    if increment <= 0 or sys.platform != "linux":
        return
    thread = threading.get_native_id()
    with contextlib.suppress(OSError):
        current = os.getpriority(os.PRIO_PROCESS, thread)
        os.setpriority(os.PRIO_PROCESS, thread, min(_MAX_NICE, current + increment))


class GrammarCompiler:
    """Compiles grammars for one vocabulary on background threads.

    `timeout_s` bounds how long `compile` waits; the compilation itself runs on and its
    result still lands in the cache, so a retry is cheap. `backends` adds or replaces
    backends by name (a wrapped backend, say). `nice` lowers the priority of the compile
    threads (Linux nice increment; 0 keeps the caller's).
    """

    def __init__(
        self,
        vocab: Vocabulary,
        *,
        threads: int = 2,
        cache_size: int = 256,
        cache_bytes: int = 1 << 30,
        timeout_s: float = 60.0,
        backends: Mapping[str, Backend] | None = None,
        nice: int = 10,
    ) -> None:
        if cache_size < 1:
            raise ValueError(f"cache_size must be at least 1, not {cache_size}")
        if cache_bytes < 1:
            raise ValueError(f"cache_bytes must be at least 1, not {cache_bytes}")
        self.vocab = vocab
        self.timeout_s = timeout_s
        self._cache_size = cache_size
        self._cache_bytes = cache_bytes
        self._cache: OrderedDict[CacheKey, Future[CompiledGrammar]] = OrderedDict()
        self._sizes: dict[CacheKey, int] = {}
        self._bytes = 0
        self._backends: dict[str, Backend] = dict(backends or {})
        self._lock = threading.Lock()
        self._executor = ThreadPoolExecutor(
            threads,
            thread_name_prefix="grammarmask-compile",
            initializer=_lower_priority,
            initargs=(nice,),
        )
        # auto selections wait on compilations: on their own threads, so they cannot starve them
        self._selector = ThreadPoolExecutor(threads, thread_name_prefix="grammarmask-auto")

    def backend(self, name: str) -> Backend:
        """The named backend bound to this vocabulary, created once."""
        with self._lock:
            if name not in self._backends:
                self._backends[name] = create_backend(name, self.vocab)
            return self._backends[name]

    def auto_candidates(self, kind: str = "json_schema") -> tuple[str, ...]:
        """The backends `auto` tries for a kind of grammar, in order: installed ones and any
        given to this compiler."""
        available = set(installed_backends()) | set(self._backends)
        return tuple(name for name in auto_order(kind) if name in available)

    def submit(
        self, grammar: Grammar, backend: str = "xgrammar", *, allow_unenforced: bool = False
    ) -> Future[CompiledGrammar]:
        """Start (or join) the compilation of `grammar`; returns at once.

        backend="auto" refuses (NotFullyEnforcedError, with each backend's reasons) a grammar
        that no backend enforces fully, unless `allow_unenforced`: then the backend that
        leaves out the fewest constraints serves it, and `CompiledGrammar.unenforced` says
        what. `allow_unenforced` changes nothing for a named backend, which always serves
        what it compiles and declares the rest.
        """
        if not isinstance(grammar, Grammar):
            raise TypeError(
                f"expected a grammarmask Grammar, not {type(grammar).__name__}; "
                "build one with Grammar.json_schema(...), .regex(...), .ebnf(...) or .choice(...)"
            )
        if backend == AUTO:
            label = "auto-allow-unenforced" if allow_unenforced else AUTO
            # an auto entry shares the compiled grammar of a named entry: it holds no bytes
            return self._cached(
                (label, grammar.key, self.vocab.fingerprint),
                self._selector,
                lambda: self._select(grammar, allow_unenforced),
                counted=False,
            )
        engine = self.backend(backend)
        return self._cached(
            (backend, grammar.key, self.vocab.fingerprint),
            self._executor,
            lambda: engine.compile(grammar),
            counted=True,
        )

    def _cached(
        self,
        key: CacheKey,
        executor: ThreadPoolExecutor,
        work: Callable[[], CompiledGrammar],
        *,
        counted: bool,
    ) -> Future[CompiledGrammar]:
        with self._lock:
            future = self._cache.get(key)
            if future is not None and not future.cancelled():  # a cancelled one compiles anew
                self._cache.move_to_end(key)
                return future
            future = (
                executor.submit(self._counting, key, work) if counted else executor.submit(work)
            )
            self._cache[key] = future
            self._evict()
            return future

    def _counting(self, key: CacheKey, work: Callable[[], CompiledGrammar]) -> CompiledGrammar:
        """Compile, then count the bytes before anyone sees the result (failures hold none)."""
        compiled = work()
        with self._lock:
            if key in self._cache and key not in self._sizes:
                self._sizes[key] = compiled.memory_bytes
                self._bytes += compiled.memory_bytes
                self._evict()
        return compiled

    def _evict(self) -> None:
        """Drop least recently used entries until both bounds hold (lock held)."""
        while self._cache and (
            len(self._cache) > self._cache_size or self._bytes > self._cache_bytes
        ):
            key, _ = self._cache.popitem(last=False)
            self._bytes -= self._sizes.pop(key, 0)

    def _select(self, grammar: Grammar, allow_unenforced: bool) -> CompiledGrammar:
        """The auto choice; runs on a selector thread and waits on cached compilations."""
        reasons: dict[str, tuple[str, ...]] = {}
        assessed: list[tuple[str, int]] = []
        for name in self.auto_candidates(grammar.kind):
            try:
                unenforced = self.backend(name).unenforced(grammar)
            except GrammarError as exc:
                reasons[name] = (str(exc),)
                continue
            if unenforced and not allow_unenforced:
                reasons[name] = tuple(str(item) for item in unenforced)
            else:
                assessed.append((name, len(unenforced)))
        for name, _ in sorted(assessed, key=lambda item: item[1]):
            try:
                return self.compile(grammar, name)
            except GrammarError as exc:
                reasons[name] = (str(exc),)
        ordered = {
            name: reasons[name] for name in self.auto_candidates(grammar.kind) if name in reasons
        }
        listed = "; ".join(f"{name}: {', '.join(why)}" for name, why in ordered.items())
        if allow_unenforced:
            raise UnsupportedGrammarError(
                f"no installed backend can serve {grammar.describe()}: {listed or 'none installed'}"
            )
        raise NotFullyEnforcedError(
            f"no installed backend enforces all of {grammar.describe()} ({listed}); "
            "pass allow_unenforced=True to serve it with the backend that leaves out the "
            "fewest constraints",
            ordered,
        )

    def compile(
        self,
        grammar: Grammar,
        backend: str = "xgrammar",
        *,
        timeout_s: float | None = None,
        allow_unenforced: bool = False,
    ) -> CompiledGrammar:
        """Compile and wait; raises the backend's GrammarError or CompileTimeoutError."""
        limit = self.timeout_s if timeout_s is None else timeout_s
        try:
            return wait_compiled(
                self.submit(grammar, backend, allow_unenforced=allow_unenforced), limit
            )
        except FutureTimeout:
            raise CompileTimeoutError(
                f"compiling {grammar.describe()} on {backend} took longer than {limit:g} s"
            ) from None

    def cached(self) -> int:
        """Number of cache entries (finished or in flight)."""
        with self._lock:
            return len(self._cache)

    def cached_bytes(self) -> int:
        """Estimated memory of the finished compiled grammars in the cache."""
        with self._lock:
            return self._bytes

    def close(self) -> None:
        """Stop the worker threads; compilations in flight are abandoned."""
        self._selector.shutdown(wait=False, cancel_futures=True)
        self._executor.shutdown(wait=False, cancel_futures=True)


def wait_compiled(future: Future[CompiledGrammar], timeout: float | None) -> CompiledGrammar:
    """The compiled grammar, or its compile error raised afresh.

    A cached failure is raised again on every request that asks for it; raising the one
    stored exception object would grow its traceback each time, keeping every frame (and
    the masks they hold) alive.
    Raises concurrent.futures.TimeoutError if not done within `timeout`.
    """
    error = future.exception(timeout=timeout)
    if error is not None:
        raise error.with_traceback(None)
    return future.result()
