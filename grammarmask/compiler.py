"""Compilation off the hot path: background threads, a timeout, and a bounded LRU cache.

outlines-core needs seconds per schema, so compiled grammars are cached by backend + spec +
options + vocabulary (compile_cache.py), and a request for a grammar already compiling
waits for that same compilation instead of starting another. Failures are cached too: a
bad spec sent twice fails twice at once.

backend="auto" picks per grammar the first backend of `AUTO_ORDER` that enforces all of it
(nothing declared unenforced, and its compile does not refuse it); each actual backend's
compilation is cached as if asked for by name.

A JSON Schema is lowered once (`lowered`): `check`, `auto`'s judgement of each candidate and
the compile itself hand the same lowered schema to every backend they ask.

A compile that nobody waits for any more (its requests left, or all of them passed their
compile timeout) is ended where its backend can end it (`Backend.stoppable`: outlines
builds its index in a child process, killed then); such a compile is also ended when its
memory passes `compile_memory_bytes`, and `auto` gives such a backend half of what is left
of a request's time when another candidate remains. A compile ended at its timeout stays in
the cache as that failure, for requests with the same or a shorter timeout: a retry would
only burn the same seconds again. xgrammar and llguidance compiles cannot be ended; they
run to their end (llguidance's take milliseconds).

Compile threads run at a lower CPU priority (Linux nice, per thread; the threads a backend
starts while compiling inherit it): on a busy machine a long compile takes what the mask
fills of running requests leave, instead of stalling their steps.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass

from .backends import AUTO, Backend, CompiledGrammar, auto_order, create_backend, installed_backends
from .backends.base import CompileBudget
from .compile_cache import CacheKey, CompileCache
from .errors import (
    CompileAbandonedError,
    CompileTimeoutError,
    GrammarError,
    NotFullyEnforcedError,
    UnsupportedGrammarError,
)
from .grammars import Grammar
from .schema import LoweredSchema, lower_schema
from .vocabulary import Vocabulary

_MAX_NICE = 19
_LOWERED_KEPT = 64
"""Lowered schemas a compiler keeps for the grammars it was last asked about."""
_GiB = 1 << 30


def default_compile_memory_bytes() -> int:
    """The memory one compile may take by default: an eighth of this machine's physical
    memory, between 1 and 16 GiB (a medium schema's outlines index holds about 130 MB; a
    string of 1,000 free characters about 3 GB on a 129k vocabulary)."""
    try:
        physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        physical = 16 * _GiB
    return int(min(16 * _GiB, max(_GiB, physical // 8)))


@dataclass(eq=False)
class _InFlight:
    """Who waits for an unfinished compile: how many, until when, and (auto) the compile
    the selection waits for now."""

    key: CacheKey
    what: str
    waiters: int
    deadline: float
    limit_s: float
    inner: Future[CompiledGrammar] | None = None


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

    The compile timeout is how long `compile` waits, and when a compile that nobody waits
    for any longer is ended (see the module docstring).
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
        compile_memory_bytes: int | None = None,
    ) -> None:
        """A compiler for `vocab`; nothing compiles until `submit` or `compile`.

        Args:
            vocab: the vocabulary every grammar is compiled for.
            threads: compile threads (and as many for auto selections).
            cache_size: compiled grammars kept, most recently used first.
            cache_bytes: the memory the kept grammars may hold, by their estimates.
            timeout_s: the default compile timeout.
            backends: backends to add or replace by name.
            nice: how much lower the compile threads run (Linux nice increment; 0 keeps
                the caller's priority).
            compile_memory_bytes: the memory one stoppable compile may take (None:
                `default_compile_memory_bytes()`).
        """
        if compile_memory_bytes is not None and compile_memory_bytes < 1:
            raise ValueError(f"compile_memory_bytes must be positive, not {compile_memory_bytes}")
        self.vocab = vocab
        self.timeout_s = timeout_s
        self.compile_memory_bytes = (
            default_compile_memory_bytes() if compile_memory_bytes is None else compile_memory_bytes
        )
        self._in_flight: dict[Future[CompiledGrammar], _InFlight] = {}
        self._cache = CompileCache(cache_size, cache_bytes)
        self._backends: dict[str, Backend] = dict(backends or {})
        self._lowered: OrderedDict[str, LoweredSchema] = OrderedDict()
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

    def lowered(self, grammar: Grammar) -> LoweredSchema | None:
        """`grammar.lower()`, computed once for the grammars this compiler was last asked
        about: every backend judging or compiling a schema reads the same lowered form."""
        if grammar.kind != "json_schema":
            return None
        with self._lock:
            kept = self._lowered.get(grammar.source)
            if kept is not None:
                self._lowered.move_to_end(grammar.source)
                return kept
        lowered = lower_schema(grammar.schema)
        with self._lock:
            self._lowered[grammar.source] = lowered
            while len(self._lowered) > _LOWERED_KEPT:
                self._lowered.popitem(last=False)
        return lowered

    def auto_candidates(self, kind: str = "json_schema") -> tuple[str, ...]:
        """The backends `auto` tries for a kind of grammar, in order: installed ones and any
        given to this compiler."""
        available = set(installed_backends()) | set(self._backends)
        return tuple(name for name in auto_order(kind) if name in available)

    def submit(
        self,
        grammar: Grammar,
        backend: str = "xgrammar",
        *,
        allow_unenforced: bool = False,
        timeout_s: float | None = None,
    ) -> Future[CompiledGrammar]:
        """Start (or join) the compilation of `grammar`; returns at once.

        The caller counts as waiting for it until `timeout_s` (default: the compiler's)
        has passed or it calls `release`; a compile nobody waits for is ended where its
        backend can be (see the module docstring).

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
        limit = self.timeout_s if timeout_s is None else timeout_s
        if backend == AUTO:
            label = "auto-allow-unenforced" if allow_unenforced else AUTO
            # an auto entry shares the compiled grammar of a named entry: it holds no bytes
            return self._cached(
                (label, grammar.key, self.vocab.fingerprint),
                f"{grammar.describe()} on {backend}",
                limit,
                self._selector,
                lambda flight: self._select(grammar, allow_unenforced, flight),
                counted=False,
            )
        engine = self.backend(backend)
        return self._cached(
            (backend, grammar.key, self.vocab.fingerprint),
            f"{grammar.describe()} on {backend}",
            limit,
            self._executor,
            lambda flight: engine.compile_within(
                grammar, self.lowered(grammar), self._budget(flight)
            ),
            counted=True,
        )

    def release(self, future: Future[CompiledGrammar]) -> None:
        """The caller of `submit` no longer waits for `future` (its request left): once
        nobody does, the compile is ended where its backend can be. Call it once per
        `submit`, and only for a future that is not done yet (a done one is ignored)."""
        with self._lock:
            flight = self._in_flight.get(future)
            if flight is None or future.done():
                return
            flight.waiters -= 1
            if flight.waiters > 0:
                return
        self._release_inner(flight)

    def _release_inner(self, flight: _InFlight) -> None:
        """An auto selection lets go of the compile it waits for (once)."""
        with self._lock:
            inner, flight.inner = flight.inner, None
        if inner is not None:
            self.release(inner)

    def _budget(self, flight: _InFlight) -> CompileBudget:
        return CompileBudget(self.compile_memory_bytes, lambda: self._stop_reason(flight))

    def _stop_reason(self, flight: _InFlight) -> CompileTimeoutError | None:
        """Why the compile of `flight` should end now, if it should: a passed deadline
        first (cached, so the same timeout does not pay again; its waiters release at it)."""
        with self._lock:
            if time.monotonic() >= flight.deadline:
                return CompileTimeoutError(
                    f"compiling {flight.what} took longer than {flight.limit_s:g} s; ended"
                )
            if flight.waiters <= 0:
                return CompileAbandonedError(
                    f"compiling {flight.what}: no request waits for it; ended"
                )
        return None

    def _cached(
        self,
        key: CacheKey,
        what: str,
        limit_s: float,
        executor: ThreadPoolExecutor,
        work: Callable[[_InFlight], CompiledGrammar],
        *,
        counted: bool,
    ) -> Future[CompiledGrammar]:
        deadline = time.monotonic() + limit_s
        with self._lock:
            future = self._cache.get(key)
            if future is not None and not self._compiles_anew(future, limit_s):
                self._cache.touch(key)
                flight = self._in_flight.get(future)
                if flight is not None:  # one more waiter for a compile in flight
                    flight.waiters += 1
                    flight.deadline = max(flight.deadline, deadline)
                    flight.limit_s = max(flight.limit_s, limit_s)
                return future
            flight = _InFlight(key, what, 1, deadline, limit_s)
            future = executor.submit(self._run, flight, work, counted)
            self._in_flight[future] = flight
            if future.done():  # the executor ran it before the line above (a closed one)
                self._in_flight.pop(future, None)
            self._cache.put(key, future)
        future.add_done_callback(self._landed)
        return future

    @staticmethod
    def _compiles_anew(future: Future[CompiledGrammar], limit_s: float) -> bool:
        """A cached entry not to reuse: cancelled, or ended at a timeout shorter than the
        one asked for now (lock held)."""
        if future.cancelled():
            return True
        if not future.done():
            return False
        error = future.exception()
        return (
            isinstance(error, CompileTimeoutError)
            and error.limit_s is not None
            and error.limit_s < limit_s
        )

    def _landed(self, future: Future[CompiledGrammar]) -> None:
        """A compile ended: nobody waits any more; one ended for want of waiters is dropped
        from the cache (the next request compiles anew)."""
        with self._lock:
            flight = self._in_flight.pop(future, None)
            if flight is not None and isinstance(future.exception(), CompileAbandonedError):
                self._cache.drop(flight.key, future)

    def _run(
        self, flight: _InFlight, work: Callable[[_InFlight], CompiledGrammar], counted: bool
    ) -> CompiledGrammar:
        """Compile on an executor thread; count the bytes before anyone sees the result
        (failures hold none); a timeout remembers the limit it was ended at."""
        try:
            compiled = work(flight)
        except CompileAbandonedError:
            raise
        except CompileTimeoutError as exc:
            raise CompileTimeoutError(str(exc), flight.limit_s) from None
        if counted:
            with self._lock:
                self._cache.count(flight.key, compiled.memory_bytes)
        return compiled

    def check(self, grammar: Grammar, backend: str = AUTO, allow_unenforced: bool = False) -> None:
        """Raise now what a compile of `grammar` on `backend` would refuse that the support
        tables already show, without compiling: a kind the named backend cannot serve, or
        under "auto" a grammar no installed backend enforces fully (NotFullyEnforcedError,
        unless `allow_unenforced`). What only a compile finds (a schema a backend rejects)
        still fails the compile. A server calls this when it admits a request."""
        if backend != AUTO:
            self.backend(backend).unenforced(grammar, self.lowered(grammar))
            return
        ranked, reasons = self._ranked(grammar, allow_unenforced)
        if not ranked:
            raise self._refusal(grammar, reasons, allow_unenforced)

    def _ranked(
        self, grammar: Grammar, allow_unenforced: bool
    ) -> tuple[list[str], dict[str, tuple[str, ...]]]:
        """The auto candidates that may serve `grammar`, fewest unenforced constraints
        first, and why each of the others may not."""
        reasons: dict[str, tuple[str, ...]] = {}
        assessed: list[tuple[str, int]] = []
        lowered = self.lowered(grammar)
        for name in self.auto_candidates(grammar.kind):
            try:
                unenforced = self.backend(name).unenforced(grammar, lowered)
            except GrammarError as exc:
                reasons[name] = (str(exc),)
                continue
            if unenforced and not allow_unenforced:
                reasons[name] = tuple(str(item) for item in unenforced)
            else:
                assessed.append((name, len(unenforced)))
        return [name for name, _ in sorted(assessed, key=lambda item: item[1])], reasons

    def _refusal(
        self, grammar: Grammar, reasons: dict[str, tuple[str, ...]], allow_unenforced: bool
    ) -> GrammarError:
        """Why no candidate serves `grammar`, each backend's reasons in auto order."""
        ordered = {
            name: reasons[name] for name in self.auto_candidates(grammar.kind) if name in reasons
        }
        listed = "; ".join(f"{name}: {', '.join(why)}" for name, why in ordered.items())
        if allow_unenforced:
            return UnsupportedGrammarError(
                f"no installed backend can serve {grammar.describe()}: {listed or 'none installed'}"
            )
        return NotFullyEnforcedError(
            f"no installed backend enforces all of {grammar.describe()} ({listed}); "
            "pass allow_unenforced=True to serve it with the backend that leaves out the "
            "fewest constraints",
            ordered,
        )

    def _select(
        self, grammar: Grammar, allow_unenforced: bool, flight: _InFlight
    ) -> CompiledGrammar:
        """The auto choice; runs on a selector thread and waits on cached compilations,
        each within what is left of the selection's own time."""
        ranked, reasons = self._ranked(grammar, allow_unenforced)
        for place, name in enumerate(ranked):
            stop = self._stop_reason(flight)
            if stop is not None:
                raise stop
            # a backend whose compile can be ended gets half of what is left when others
            # remain: a minutes-long index build then gives way to one that serves it now
            share = 0.5 if self.backend(name).stoppable and place < len(ranked) - 1 else 1.0
            try:
                return self._candidate(grammar, name, flight, share)
            except GrammarError as exc:
                reasons[name] = (str(exc),)
        raise self._refusal(grammar, reasons, allow_unenforced)

    def _candidate(
        self, grammar: Grammar, name: str, flight: _InFlight, share: float
    ) -> CompiledGrammar:
        """Compile on one candidate backend for an auto selection, within `share` of what
        is left of its time."""
        remaining = share * max(0.0, flight.deadline - time.monotonic())
        inner = self.submit(grammar, name, timeout_s=remaining)
        with self._lock:
            flight.inner = inner
            abandoned = flight.waiters <= 0
        if abandoned:  # released while the line above was not yet there to let go
            self._release_inner(flight)
        try:
            return wait_compiled(inner, remaining)
        except FutureTimeout:
            self._release_inner(flight)
            raise CompileTimeoutError(
                f"compiling {grammar.describe()} on {name} took longer than {remaining:g} s"
            ) from None
        finally:
            with self._lock:
                if flight.inner is inner:
                    flight.inner = None

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
        future = self.submit(grammar, backend, allow_unenforced=allow_unenforced, timeout_s=limit)
        try:
            return wait_compiled(future, limit)
        except FutureTimeout:
            self.release(future)
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
            return self._cache.bytes

    def close(self) -> None:
        """Stop the worker threads and the backends' compile processes; compilations in
        flight are abandoned (those in a compile process end with it)."""
        self._selector.shutdown(wait=False, cancel_futures=True)
        self._executor.shutdown(wait=False, cancel_futures=True)
        with self._lock:
            backends = list(self._backends.values())
        for backend in backends:
            backend.close()


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
