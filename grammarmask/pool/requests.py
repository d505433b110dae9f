"""Per-request matcher state: the table of one pool's (or one worker process's) requests,
their compilation, one request's rows, and commit.

Every per-request problem fails that request alone (its state keeps the reason); nothing
here raises to the engine for one request.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Literal, cast

import torch

from ..backends import CompiledGrammar, Matcher, words_per_row
from ..backends.base import fill_stop_only
from ..compiler import GrammarCompiler, wait_compiled
from ..errors import CompileTimeoutError, GrammarError, GrammarMaskError, RequestFault
from ..grammars import Grammar
from ..masks import RequestId
from ..schema import Unenforced
from ..vocabulary import Vocabulary
from .plan import integer_ids, listed

Status = Literal["active", "finished", "failed"]
Readiness = Literal["compiling", "ready", "failed"]


@dataclass(frozen=True)
class RequestState:
    """What the engine needs to know about a request after a step."""

    request_id: RequestId
    status: Status
    reason: str | None = None
    backend: str | None = None
    unenforced: tuple[Unenforced, ...] = ()
    committed: int = 0
    ready: bool = False
    """Its grammar is compiled: a step fills its rows without waiting for a compilation."""

    @property
    def readiness(self) -> Readiness:
        """ "compiling" while a step would wait for its grammar, then "ready", or "failed"
        (with `reason`): what an engine checks to keep a compiling request out of its batch,
        so that a slow compilation never stalls the others."""
        if self.status == "failed":
            return "failed"
        return "ready" if self.ready or self.status == "finished" else "compiling"


@dataclass(eq=False, slots=True)
class Request:
    request_id: RequestId
    grammar: Grammar | None
    compilation: Future[CompiledGrammar] | None
    compile_deadline: float
    """When its compilation must be done (monotonic seconds)."""
    status: Status = "active"
    reason: str | None = None
    matcher: Matcher | None = None
    backend: str | None = None
    unenforced: tuple[Unenforced, ...] = ()
    committed: int = 0
    ready: bool = False
    """Its compilation succeeded."""
    lock: threading.Lock = field(default_factory=threading.Lock)

    def snapshot(self) -> RequestState:
        return RequestState(
            self.request_id,
            self.status,
            self.reason,
            self.backend,
            self.unenforced,
            self.committed,
            self.ready,
        )

    @property
    def failed(self) -> bool:
        return self.status == "failed"

    def fail(self, reason: str) -> None:
        """Lock-free on purpose: a step past its deadline fails a request whose fill hangs
        while holding the lock (the reason is set before the status, which readers check)."""
        if self.status != "failed":
            self.reason = reason
            self.status = "failed"


class RequestTable:
    """The requests of one pool (or of one worker process) and their matchers."""

    def __init__(self, vocab: Vocabulary, compiler: GrammarCompiler, compile_timeout_s: float):
        self.vocab = vocab
        self.compile_timeout_s = compile_timeout_s
        self._compiler = compiler
        self._words = words_per_row(vocab.size)
        self._requests: dict[RequestId, Request] = {}
        self._lock = threading.Lock()
        self.stop_row = stop_row(vocab)
        self._stop_words = self.stop_row.numpy()
        self._scratch = threading.local()

    def add(
        self,
        request_id: RequestId,
        grammar: Grammar,
        backend: str,
        compile_timeout_s: float | None = None,
        *,
        allow_unenforced: bool = False,
    ) -> RequestState:
        """`compile_timeout_s` overrides the table's (a replay of a grammar known to compile);
        `allow_unenforced` lets backend="auto" serve a grammar no backend enforces fully."""
        timeout = self.compile_timeout_s if compile_timeout_s is None else compile_timeout_s
        with self._lock:
            if request_id in self._requests:
                raise GrammarMaskError(already_added(request_id))
            request = Request(
                request_id,
                grammar,
                self._compiler.submit(
                    grammar, backend, allow_unenforced=allow_unenforced, timeout_s=timeout
                ),
                time.monotonic() + timeout,
                backend=backend,
            )
            self._requests[request_id] = request
        return request.snapshot()

    def add_failed(self, request_id: RequestId, backend: str, reason: str) -> None:
        """Register a request that cannot run (a worker process could not add it)."""
        request = Request(request_id, None, None, 0.0, backend=backend)
        request.fail(reason)
        with self._lock:
            self._requests[request_id] = request

    def remove(self, request_id: RequestId) -> None:
        """Forget the request; a compile it was waiting for that nobody else waits for is
        ended (see GrammarCompiler.release)."""
        with self._lock:
            request = self._requests.pop(request_id, None)
        if request is not None and request.compilation is not None:
            self._compiler.release(request.compilation)

    def state(self, request_id: RequestId) -> RequestState:
        with self._lock:
            request = self._requests.get(request_id)
        if request is None:
            return RequestState(request_id, "failed", unknown_request(request_id))
        if not request.ready and request.status == "active" and request.compilation is not None:
            self._compiled_grammar(request, 0.0)  # its compilation may have ended: say so now
        return request.snapshot()

    def lookup(self, request_ids: Sequence[RequestId]) -> list[Request]:
        """The requests, under one lock; an unknown id gets a record of its own that fails
        this step (not kept: an engine that keeps sending unknown ids must not grow the
        table)."""
        with self._lock:
            found = list(map(self._requests.get, request_ids))
        if None not in found:  # the usual case: one pass less on fill_async's caller
            return cast(list[Request], found)
        return [
            request if request is not None else Request(request_id, None, None, 0.0)
            for request, request_id in zip(found, request_ids, strict=True)
        ]

    def _ready_matcher(self, request: Request) -> Matcher | None:
        """The request's matcher, waiting for its compilation up to its deadline."""
        if request.status == "failed":
            return None
        if request.matcher is not None:
            return request.matcher
        if request.compilation is None:
            request.fail(not_added(request.request_id))
            return None
        compiled = self._compiled_grammar(
            request, max(0.0, request.compile_deadline - time.monotonic()), final=True
        )
        if compiled is None:
            return None
        request.matcher = compiled.matcher()
        return request.matcher

    def _compiled_grammar(
        self, request: Request, timeout: float, *, final: bool = False
    ) -> CompiledGrammar | None:
        """The request's compiled grammar if ready within `timeout` (its backend and what
        it leaves unenforced are then known), else None. A compile error fails the request,
        and so does a timeout when `final` or once past the compile deadline."""
        assert request.compilation is not None
        try:
            compiled = wait_compiled(request.compilation, timeout)
        except FutureTimeout:
            if final or time.monotonic() >= request.compile_deadline:
                request.fail(
                    f"grammar compilation did not finish within {self.compile_timeout_s:g} s"
                )
            return None
        except CompileTimeoutError as exc:  # ended at its deadline, or cached as such
            request.fail(f"grammar compilation did not finish in time: {exc}")
            return None
        except GrammarError as exc:
            request.fail(f"grammar error: {exc}")
            return None
        request.backend = compiled.backend
        request.unenforced = compiled.unenforced
        request.ready = True
        return compiled

    # ------------------------------------------------------------------ fill
    def compiling(self, request: Request) -> Future[CompiledGrammar] | None:
        """The compilation that a fill of `request` would wait for, if any (none once past
        its compile timeout: the fill then fails it)."""
        if request.matcher is not None or request.status != "active" or request.compilation is None:
            return None
        if request.compilation.done() or time.monotonic() >= request.compile_deadline:
            return None
        return request.compilation

    def scratch_rows(self, count: int) -> torch.Tensor:
        """This thread's scratch rows, reused from request to request: a fresh buffer per
        request cost more than the fills themselves (first-touch page faults)."""
        rows: torch.Tensor | None = getattr(self._scratch, "rows", None)
        if rows is None or rows.shape[0] < count:
            rows = torch.empty(max(count, 8), self._words, dtype=torch.int32)
            self._scratch.rows = rows
        return rows[:count]

    def fill_rows(
        self, request: Request, drafts: tuple[int, ...], target: torch.Tensor, first: int
    ) -> tuple[int, str | None]:
        """One request's rows into `target[first : first + len(drafts) + 1]`: (valid rows,
        reason if it failed now). Stop rows, and the don't-care rows after a rejected draft,
        are copied as numpy views; the matcher gets the whole of `target` with its row
        numbers. Why: per-row torch views and slice assignments cost more than the fill."""
        end = first + len(drafts) + 1
        if request.status == "failed":  # checked before the lock: a late fill may hold it
            target.numpy()[first:end] = self._stop_words
            return 1, None
        with request.lock:
            matcher = request.matcher
            if matcher is None or request.status != "active":  # else ready: the usual case
                matcher = None if request.status == "finished" else self._ready_matcher(request)
            if matcher is None:
                target.numpy()[first:end] = self._stop_words
                return 1, (request.reason if request.failed else None)
            try:
                if not drafts:  # a decode step without speculation: one row
                    matcher.fill(target, first)
                    return 1, None
                self._check_tokens(drafts, "draft")
                accepted = matcher.fill_drafts(target, range(first, end), drafts)
            except Exception as exc:  # isolation: whatever one matcher does stays with it
                request.fail(_fault_reason(exc, "while filling the step's masks"))
                target.numpy()[first:end] = self._stop_words
                return 1, request.reason
            if first + accepted + 1 < end:
                words = target.numpy()
                words[first + accepted + 1 : end] = words[first + accepted]
            return accepted + 1, None

    def fill_one_row(
        self, requests: Sequence[Request], target: torch.Tensor, rows: Sequence[int]
    ) -> list[int]:
        """The row of each request without drafts, `rows[i]` for `requests[i]`, in one
        `Matcher.fill_many` call per matcher class; returns the indices filled. The others
        are left to `fill_rows`, which names any failure: those not active with a matcher,
        those whose lock another thread holds, those of a class without a batch call, and
        all of a call that raised (each then fails or succeeds alone)."""
        groups: dict[type[Matcher], tuple[list[int], list[Matcher], list[int]]] = {}
        held: list[threading.Lock] = []
        try:
            for index, (request, row) in enumerate(zip(requests, rows, strict=True)):
                matcher = request.matcher
                if matcher is None or not request.lock.acquire(blocking=False):
                    continue
                held.append(request.lock)
                if request.status == "active":  # read under the lock, as in fill_rows
                    indices, matchers, group_rows = groups.setdefault(type(matcher), ([], [], []))
                    indices.append(index)
                    matchers.append(matcher)
                    group_rows.append(row)
            filled: list[int] = []
            for kind, (indices, matchers, group_rows) in groups.items():
                try:
                    if kind.fill_many(matchers, target, group_rows):
                        filled += indices
                except Exception:  # refilled one by one below, each failing alone
                    continue
            return filled
        finally:
            for lock in held:
                lock.release()

    def _check_tokens(self, token_ids: Sequence[int], kind: str) -> None:
        if token_ids and (min(token_ids) < 0 or max(token_ids) >= self.vocab.size):
            for token_id in token_ids:
                self._check_token(token_id, kind)

    def _check_token(self, token_id: int, kind: str) -> None:
        if not 0 <= token_id < self.vocab.size:
            raise RequestFault(
                f"{kind} token id {token_id} is outside the vocabulary [0, {self.vocab.size})"
            )

    # ------------------------------------------------------------------ commit
    def commit(self, request_id: RequestId, accepted_tokens: Sequence[int]) -> RequestState:
        """Advance a request by the tokens the sampler accepted; never raises for the request."""
        with self._lock:
            request = self._requests.get(request_id)
        if request is None:
            return RequestState(request_id, "failed", unknown_request(request_id))
        if request.failed:  # before the lock, as in fill_rows
            return request.snapshot()
        try:
            accepted_tokens = token_ids(accepted_tokens)
        except RequestFault as exc:
            request.fail(str(exc))
            return request.snapshot()
        with request.lock:
            stops = self.vocab.stop_token_ids
            if request.status == "finished":
                late = [t for t in accepted_tokens if t not in stops]
                if late:
                    request.fail(f"token {late[0]} committed after the request finished")
                return request.snapshot()
            matcher = self._ready_matcher(request)
            if matcher is None:
                return request.snapshot()
            try:
                self._advance(request, matcher, accepted_tokens)
            except Exception as exc:  # isolation, as in fill
                request.fail(_fault_reason(exc, "while committing tokens"))
            return request.snapshot()

    def _advance(self, request: Request, matcher: Matcher, tokens: Sequence[int]) -> None:
        for token in tokens:
            if request.status == "finished":
                if token not in self.vocab.stop_token_ids:
                    raise RequestFault(f"token {token} committed after the stop token")
                continue
            self._check_token(token, "committed")
            if not matcher.accept(token):
                raise RequestFault(
                    f"committed token {token} ({self.vocab.token_name(token)!r}) is not allowed by "
                    f"the grammar after {request.committed} tokens"
                )
            request.committed += 1
            if matcher.is_terminated():
                request.status, request.reason = "finished", "stop token"
        if request.status == "active" and matcher.can_stop() and self._only_stop_allowed(matcher):
            request.status, request.reason = "finished", "grammar complete"

    def _only_stop_allowed(self, matcher: Matcher) -> bool:
        row = torch.zeros(1, self._words, dtype=torch.int32)
        matcher.fill(row, 0)
        return torch.equal(row, self.stop_row)


def stop_row(vocab: Vocabulary) -> torch.Tensor:
    """The one-row mask of a request that can only end: its stop tokens alone (a failed
    request's rows, wherever its matcher lived)."""
    row = torch.zeros(1, words_per_row(vocab.size), dtype=torch.int32)
    fill_stop_only(row, 0, vocab.stop_token_ids)
    return row


def unknown_request(request_id: RequestId) -> str:
    return f"unknown request id {request_id!r}"


def not_added(request_id: RequestId) -> str:
    """Why a step's request fails when it was never added."""
    return f"{unknown_request(request_id)}: add() it before its first step"


def already_added(request_id: RequestId) -> str:
    return f"request {request_id!r} is already in the pool"


def token_ids(tokens: Sequence[int]) -> tuple[int, ...]:
    """Committed tokens as ids, from any sequence of integers (a list, a sampler's 1-D
    tensor or array); anything that is not an integer fails the request rather than being
    truncated (int(2.7) would silently commit token 2)."""
    values = listed(tokens)
    if values is None:
        raise RequestFault(
            f"committed tokens must be a sequence of integer token ids, not {tokens!r}"
        )
    return integer_ids(
        values,
        lambda token: RequestFault(
            f"committed token {token!r} ({type(token).__name__}) is not an integer token id"
        ),
    )


def _fault_reason(exc: BaseException, where: str) -> str:
    if isinstance(exc, RequestFault):
        return str(exc)
    return f"matcher error {where}: {type(exc).__name__}: {exc}"
