"""Per-request matcher state, and one step's fill on threads, with per-request isolation.

The pool runs this in its own process (thread isolation) and every worker process runs it
too (process isolation): the same code decides every row and every failure reason in both
modes, which is what keeps their masks bit-identical.

Matchers write a request's rows straight into the step's host slot. A step closed at its
deadline moves its rows to a copy of the slot (`FillResult.host`), which takes the slot's
place in the ring: a fill that comes back late writes into the old buffer, which nobody
reads any more, never into the masks of this step or of a later one. (Filling into scratch
rows and copying them in under the step's lock, as before, cost a copy per request and
made the two fill threads of a fill_async step wait on each other: B=64 D=5 took 1.3x
the synchronous fill.)
"""

from __future__ import annotations

import functools
import itertools
import sys
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor, Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Literal, NamedTuple, cast

import torch

from .backends import Backend, CompiledGrammar, Matcher, words_per_row
from .backends.base import fill_stop_only
from .compiler import GrammarCompiler, wait_compiled
from .enforcement import Unenforced
from .errors import GrammarError, GrammarMaskError
from .grammars import Grammar
from .steps import RequestId, StepPlan, integer_ids, listed
from .vocabulary import Vocabulary


def require_gil(gil_enabled: Callable[[], bool] | None = None) -> None:
    """Refuse to run without the GIL: a step's fill threads claim requests and record
    outcomes without locks (see StepFill), relying on `next()` and `dict.setdefault` being
    single steps under the GIL. `gil_enabled` is `sys._is_gil_enabled` (CPython 3.13 on)."""
    check = gil_enabled or getattr(sys, "_is_gil_enabled", None)
    if check is not None and not check():
        raise ImportError(
            "grammarmask needs the GIL: its mask fill shares a step between threads "
            "without locks, which is safe only under the GIL. This interpreter runs "
            "free-threaded; start it with PYTHON_GIL=1 (or -X gil=1), or use a default "
            "CPython build."
        )


require_gil()

Status = Literal["active", "finished", "failed"]
DEADLINE_REASON = "mask deadline exceeded"

BackendFactory = Callable[[Vocabulary], Mapping[str, Backend]]
"""Extra backends by name, built from the pool's vocabulary (in each worker process, so a
picklable function: a module-level one)."""


@dataclass(frozen=True)
class RequestState:
    """What the engine needs to know about a request after a step."""

    request_id: RequestId
    status: Status
    reason: str | None = None
    backend: str | None = None
    unenforced: tuple[Unenforced, ...] = ()
    committed: int = 0


class RequestFault(Exception):
    """A problem that fails one request (never raised to the caller)."""


class FillEntry(NamedTuple):
    """One request's share of a step: its batch position, drafts and logits rows (a named
    tuple: a step builds one per request, and a frozen dataclass cost ~3x as much)."""

    position: int
    request_id: RequestId
    drafts: tuple[int, ...]
    rows: tuple[int, ...]
    block: slice | None = None
    """`rows` as one slice when they are a run (the default layout), found once per step."""


def fill_entries(plan: StepPlan) -> list[FillEntry]:
    """The step's entries that have a grammar, one record each (what a worker process is
    sent)."""
    return [
        FillEntry(position, request_id, drafts, rows, block)
        for position, request_id, drafts, rows, block in zip(
            itertools.count(), plan.request_ids, plan.drafts, plan.rows, plan.blocks
        )
        if request_id is not None
    ]


class StepEntries(NamedTuple):
    """The step's entries that have a grammar, field by field: in the usual step (every
    entry has one) these are the plan's own tuples, so a step in this process builds
    nothing per request (a FillEntry each cost ~0.5 us, ~1 us with the caches cold)."""

    positions: Sequence[int]
    request_ids: Sequence[RequestId]
    drafts: Sequence[tuple[int, ...]]
    rows: Sequence[tuple[int, ...]]
    blocks: Sequence[slice | None]

    @classmethod
    def of_plan(cls, plan: StepPlan) -> StepEntries:
        ids = plan.request_ids
        if None not in ids:
            return cls(
                range(len(ids)),
                cast(tuple[RequestId, ...], ids),
                plan.drafts,
                plan.rows,
                plan.blocks,
            )
        kept = [position for position, request_id in enumerate(ids) if request_id is not None]
        blocks = plan.blocks
        return cls(
            kept,
            [cast(RequestId, ids[i]) for i in kept],
            [plan.drafts[i] for i in kept],
            [plan.rows[i] for i in kept],
            [blocks[i] for i in kept],
        )

    @classmethod
    def of(cls, entries: Sequence[FillEntry]) -> StepEntries:
        return cls(*(zip(*entries, strict=True) if entries else ((),) * 5))


@dataclass
class FillResult:
    """Valid rows per batch position, and the requests that failed during this step."""

    valid: dict[int, int] = field(default_factory=dict)
    failures: dict[RequestId, str] = field(default_factory=dict)
    host: torch.Tensor | None = None
    """The step's rows in a new buffer, when the step closed while fills were still running
    (they may yet write into the old one): it replaces the host slot."""


class Deadline:
    """When a step must be done; `wait(timeout=...)` may bring it forward while it runs,
    unless `fixed` (a synchronous fill: nobody holds its future)."""

    def __init__(self, seconds: float | None, *, fixed: bool = False) -> None:
        if seconds is not None and seconds <= 0:
            raise ValueError(f"deadline_s must be positive, not {seconds}")
        self.condition = threading.Condition()
        self.at = None if seconds is None else time.monotonic() + seconds
        self.fixed = fixed
        self.helper: Callable[[], None] | None = None
        """Set once the step's fill runs on fill threads: lets a thread that would only
        wait for the step fill too (see StepFill.help)."""
        self.started = False
        """The step's fill has started (and `helper` is set, if it will be): see
        `mark_started`. A flag under `condition`, not an Event: fill_async creates a
        Deadline per step on the engine's thread, where an Event's own condition cost
        ~40 us with the caches cold after a forward."""

    @property
    def never(self) -> bool:
        """No deadline now and none can come: the waiting thread may fill too, since
        nothing needs it free to fail late requests."""
        return self.at is None and self.fixed

    def tighten(self, seconds: float) -> None:
        with self.condition:
            at = time.monotonic() + max(0.0, seconds)
            self.at = at if self.at is None else min(self.at, at)
            self.condition.notify_all()

    def remaining(self) -> float | None:
        return None if self.at is None else self.at - time.monotonic()

    def mark_started(self) -> None:
        with self.condition:
            self.started = True
            self.condition.notify_all()

    def help(self) -> None:
        """Fill with the step's threads until nothing is left to take, once the fill has
        started (a no-op after it has ended, or where it runs in worker processes)."""
        with self.condition:
            self.condition.wait_for(lambda: self.started)
            helper = self.helper
        if helper is not None:
            helper()


@dataclass(eq=False, slots=True)
class _Request:
    request_id: RequestId
    grammar: Grammar | None
    compiled: Future[CompiledGrammar] | None
    deadline: float
    status: Status = "active"
    reason: str | None = None
    matcher: Matcher | None = None
    backend: str | None = None
    unenforced: tuple[Unenforced, ...] = ()
    committed: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def snapshot(self) -> RequestState:
        return RequestState(
            self.request_id, self.status, self.reason, self.backend, self.unenforced, self.committed
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


class MatcherTable:
    """The requests of one pool (or of one worker process) and their matchers."""

    def __init__(self, vocab: Vocabulary, compiler: GrammarCompiler, compile_timeout_s: float):
        self.vocab = vocab
        self.compile_timeout_s = compile_timeout_s
        self._compiler = compiler
        self._words = words_per_row(vocab.size)
        self._requests: dict[RequestId, _Request] = {}
        self._lock = threading.Lock()
        self.stop_row = torch.zeros(1, self._words, dtype=torch.int32)
        fill_stop_only(self.stop_row, 0, vocab.stop_token_ids)
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
                raise GrammarMaskError(f"request {request_id!r} is already in the pool")
            request = _Request(
                request_id,
                grammar,
                self._compiler.submit(grammar, backend, allow_unenforced=allow_unenforced),
                time.monotonic() + timeout,
                backend=backend,
            )
            self._requests[request_id] = request
        return request.snapshot()

    def add_failed(self, request_id: RequestId, backend: str, reason: str) -> None:
        """Register a request that cannot run (a worker process could not add it)."""
        request = _Request(request_id, None, None, 0.0, backend=backend)
        request.fail(reason)
        with self._lock:
            self._requests[request_id] = request

    def remove(self, request_id: RequestId) -> None:
        with self._lock:
            self._requests.pop(request_id, None)

    def state(self, request_id: RequestId) -> RequestState:
        with self._lock:
            request = self._requests.get(request_id)
        if request is None:
            return RequestState(request_id, "failed", f"unknown request id {request_id!r}")
        return request.snapshot()

    def lookup(self, request_ids: Sequence[RequestId]) -> list[_Request]:
        """The requests, under one lock; an unknown id gets a record of its own that fails
        this step (not kept: an engine that keeps sending unknown ids must not grow the
        table)."""
        with self._lock:
            found = list(map(self._requests.get, request_ids))
        if None not in found:  # the usual case: one pass less on fill_async's caller
            return cast(list[_Request], found)
        return [
            request if request is not None else _Request(request_id, None, None, 0.0)
            for request, request_id in zip(found, request_ids, strict=True)
        ]

    def _ready_matcher(self, request: _Request) -> Matcher | None:
        """The request's matcher, waiting for its compilation up to its deadline."""
        if request.status == "failed":
            return None
        if request.matcher is not None:
            return request.matcher
        if request.compiled is None:
            request.fail(
                f"unknown request id {request.request_id!r}: add() it before its first step"
            )
            return None
        try:
            compiled = wait_compiled(
                request.compiled, max(0.0, request.deadline - time.monotonic())
            )
        except FutureTimeout:
            request.fail(f"grammar compilation did not finish within {self.compile_timeout_s:g} s")
            return None
        except GrammarError as exc:
            request.fail(f"grammar error: {exc}")
            return None
        request.backend = compiled.backend
        request.unenforced = compiled.unenforced
        request.matcher = compiled.matcher()
        return request.matcher

    # ------------------------------------------------------------------ fill
    def compiling(self, request: _Request) -> Future[CompiledGrammar] | None:
        """The compilation that a fill of `request` would wait for, if any (none once past
        its compile timeout: the fill then fails it)."""
        if request.matcher is not None or request.status != "active" or request.compiled is None:
            return None
        if request.compiled.done() or time.monotonic() >= request.deadline:
            return None
        return request.compiled

    def scratch_rows(self, count: int) -> torch.Tensor:
        """This thread's scratch rows, reused from request to request: a fresh buffer per
        request cost more than the fills themselves (first-touch page faults)."""
        rows: torch.Tensor | None = getattr(self._scratch, "rows", None)
        if rows is None or rows.shape[0] < count:
            rows = torch.empty(max(count, 8), self._words, dtype=torch.int32)
            self._scratch.rows = rows
        return rows[:count]

    def fill_rows(
        self, request: _Request, drafts: tuple[int, ...], target: torch.Tensor, first: int
    ) -> tuple[int, str | None]:
        """One request's rows into `target[first : first + len(drafts) + 1]`: (valid rows,
        reason if it failed now). The matcher gets the whole of `target` with its row
        numbers: a view per request cost more than the rest of a D=0 request's Python.
        Rows are copied as numpy views (a torch slice assignment took 3.6-4.0 us, numpy
        1.8-2.0 us): stop rows, and the don't-care rows after a rejected draft."""
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
        self, requests: Sequence[_Request], target: torch.Tensor, rows: Sequence[int]
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
            return RequestState(request_id, "failed", f"unknown request id {request_id!r}")
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

    def _advance(self, request: _Request, matcher: Matcher, tokens: Sequence[int]) -> None:
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


class StepFill:
    """One step's fill: threads claim requests in turn (so a hanging matcher holds up one
    thread, not a fixed share of the batch) and write their rows into the host slot.

    Threads share the step without a lock per request: a claim is `next()` on one counter
    and a request's outcome lands with one `dict.setdefault`, each a single step under the
    GIL; the step's condition is taken only for what is rare (a request parked while its
    grammar compiles, a thread leaving, the last outcome, the deadline). With a lock round
    per request, the two fill threads of a 2-core machine queued on the lock behind each
    other's GIL switches (B=256 D=5: 0.94x the naive loop on two threads, where the same
    fills from one counter took 0.83x).

    A request whose grammar is still compiling waits aside, holding no thread: it rejoins
    when its compilation ends or its compile timeout passes, so a slow compile never stalls
    the fill of the others. Its `requests` (one per entry) are looked up on the caller's
    thread, before any later `remove`. `progress[position]`, when given, is set once a
    request's rows are in the slot: its valid rows, or -1 if it failed during this step (a
    parent process reads it after a deadline).
    """

    def __init__(
        self, table: MatcherTable, entries: StepEntries, requests: Sequence[_Request]
    ) -> None:
        if len(requests) != len(entries.positions):
            raise ValueError(f"{len(requests)} requests for {len(entries.positions)} entries")
        self._table = table
        self._entries = entries
        self._requests = requests
        self._claims = itertools.count()
        """`next()` claims the request at that index (past the end: none)."""
        self._retry: deque[int] = deque()
        """Indices back from waiting for their compilation."""
        self._outcomes: dict[int, tuple[int, str | None] | object] = {}
        """Index -> (valid rows, failure) once filled, or _LATE: whichever lands first."""
        self._compiling: dict[int, float] = {}
        """Requests waiting for their compilation: index -> compile deadline."""
        self._drains = 0
        self._helpers = 0
        """Drains run by threads that would otherwise wait for the step (see help)."""
        self._closed = False
        self._chunk = 1
        """Requests one claim takes when the claimed one has no drafts (see `_fill_chunk`)."""
        self._one_row: list[bool] = []
        """Per request: no drafts and a block of rows, what a batch call fills (set with
        `_chunk`)."""
        # set by run(); placeholders until then (a tensor and a condition apiece cost ~1.5 us)
        self._slot = _NO_HOST
        self._condition = _NO_CONDITION
        self._progress: torch.Tensor | None = None
        self._executor: Executor | None = None
        self._deadline = _NO_DEADLINE
        self._threads = 0
        self.result = FillResult()
        self.abandoned = 0
        """Threads still filling when the step went on without them."""
        self.awaited_compiles = False
        """Some request's grammar was still compiling: the step's time says little about
        its fills."""

    @property
    def requests(self) -> int:
        return len(self._requests)

    def run(
        self,
        host: torch.Tensor,
        deadline: Deadline,
        executor: Executor,
        threads: int,
        progress: torch.Tensor | None = None,
        meanwhile: Callable[[], object] | None = None,
        *,
        alone_s: float | None = None,
        batch_one_row: bool = True,
    ) -> FillResult:
        """Fill on up to `threads` tasks of `executor` until done or past the deadline; with
        no deadline possible, this thread is one of the tasks (no hand-off when it alone
        keeps up, as for one request). `meanwhile` runs on this thread once the tasks are
        started, before it fills or waits.

        `alone_s` (a step one thread fills faster): one thread fills, the caller's when
        no deadline can come; otherwise the other threads join if the step is not done
        `alone_s` seconds after it started, so that a hanging matcher or a costlier step
        than expected does not hold the others up. `batch_one_row` allows `_fill_chunk`
        while no deadline is set (False: a worker process whose parent has one).
        """
        self._slot, self._progress, self._condition = host, progress, deadline.condition
        if deadline.never and (threads == 1 or alone_s is not None):
            if meanwhile is not None:
                meanwhile()
            self._fill_alone()
            self._closed = True
            return self.result
        widen_at = None if alone_s is None else time.monotonic() + alone_s
        self._executor, self._threads = executor, threads if widen_at is None else 1
        self._deadline = deadline
        if batch_one_row:
            self._chunk = self._chunk_size(threads)
        total = len(self._requests)
        with self._condition:
            if deadline.never:
                self._drains += 1
            self._start_drains()
            deadline.helper = self.help
            deadline.mark_started()  # the same (reentrant) condition
        if meanwhile is not None:
            meanwhile()
        if deadline.never:
            self._drain()
        with self._condition:
            while len(self._outcomes) < total:
                now = time.monotonic()
                self._requeue_compiles(now)
                if widen_at is not None and now >= widen_at:
                    widen_at, self._threads = None, threads
                    self._start_drains()
                remaining = deadline.remaining()
                if remaining is not None and remaining <= 0:
                    self._close_late()
                    break
                widen_in = None if widen_at is None else widen_at - now
                self._condition.wait(self._next_wake(now, remaining, widen_in))
            self._closed = True
        self._collect()
        return self.result

    def _fill_alone(self) -> None:
        """This thread fills every request, in batch order, no other thread taking part.
        Requests whose grammar still compiles come last, so the others do not wait for them
        (each then waits up to its compile timeout)."""
        compiling = self._table.compiling
        requests = self._requests
        later = [
            i
            for i, request in enumerate(requests)
            if request.matcher is None and compiling(request)
        ]
        self.awaited_compiles = bool(later)
        order: Sequence[int] = range(len(requests))
        if later:
            order = [*(i for i in order if i not in later), *later]
        # the result is written here, not through _outcomes and _collect as a shared step
        # does: that round took 6-8 % more at B=64 D=0, the usual step on one thread
        valid, failures, progress = self.result.valid, self.result.failures, self._progress
        positions, request_ids = self._entries.positions, self._entries.request_ids
        for index in order:
            position = positions[index]
            valid[position], failure = self._fill(index)
            if failure is not None:
                failures[request_ids[index]] = failure
            if progress is not None:
                progress[position] = -1 if failure is not None else valid[position]

    def _chunk_size(self, threads: int) -> int:
        """Requests per claim for a step's one-row requests: one batch call each on two or
        more threads (on one, a call per request cost no more), with enough claims left
        for the threads to even out the slow fills. Notes which requests those are in
        `_one_row`, for `_fill_chunk`."""
        if threads < 2:
            return 1
        entries = self._entries
        self._one_row = [
            not drafts and block is not None
            for drafts, block in zip(entries.drafts, entries.blocks, strict=True)
        ]
        return max(1, min(_CHUNK_MAX, sum(self._one_row) // (threads * _CLAIMS_PER_THREAD)))

    def _start_drains(self) -> None:
        """Enough tasks for what is left, at most `threads` (condition held)."""
        assert self._executor is not None
        left = len(self._requests) - len(self._outcomes) - len(self._compiling)
        while self._drains < min(self._threads, left):
            self._drains += 1
            self._executor.submit(self._drain)

    def help(self) -> None:
        """A thread that would only wait for the step (the engine's, in MaskFuture.wait
        without a timeout) fills too, in place of one fill thread, which stops after its
        current request: on a 2-core machine, the fill threads woken by fill_async were
        often both put on the core the engine's thread was leaving, and a step took the
        time of one thread (B=64 D=5: 1.0x the naive loop, against 0.6x synchronously)."""
        with self._condition:
            if self._closed or len(self._outcomes) == len(self._requests):
                return
            self._drains += 1
            self._helpers += 1
        self._drain(helper=True)

    def _drain(self, *, helper: bool = False) -> None:
        """Fill requests until none is left to claim. A fill thread's drain stops early when
        a helper has taken its place."""
        total, chunk = len(self._requests), self._chunk
        claims, retry, drafts = self._claims, self._retry, self._entries.drafts
        while True:
            if self._closed or self._replaced(helper):  # read freely, then confirmed
                with self._condition:
                    if self._closed or self._replaced(helper):
                        self._leave(helper)
                        return
            index = next(claims)
            if index >= total:
                with self._condition:  # leaving and a request rejoining take turns
                    if self._closed or not retry:
                        self._leave(helper)
                        return
                    index = retry.popleft()
            elif chunk > 1 and not drafts[index] and self._deadline.at is None:
                self._fill_chunk(index)
                continue
            self._fill_unless_parked(index)

    def _fill_unless_parked(self, index: int) -> None:
        """One request's rows, or the request set aside while its grammar compiles."""
        request = self._requests[index]
        if request.matcher is None and self._park(index, request):
            return
        self._settle(index, self._fill(index))

    def _fill_chunk(self, first: int) -> None:
        """`first` and the next requests claimed after it, up to `_chunk`: those without
        drafts whose matchers have a batch call in one call per matcher class, the others
        one by one. Only while the step has no deadline: one late fill would make the
        others of its call late too. (A deadline that `wait(timeout=...)` sets later still
        finds a claimed chunk in one call: an xgrammar fill takes at most ~40 us.)"""
        claims, total, requests = self._claims, len(self._requests), self._requests
        claimed = [first]
        while len(claimed) < self._chunk and (index := next(claims)) < total:
            claimed.append(index)
        one_row, blocks = self._one_row, self._entries.blocks
        batched = [i for i in claimed if one_row[i]]
        filled = self._table.fill_one_row(
            [requests[i] for i in batched],
            self._slot,
            [cast(slice, blocks[i]).start for i in batched],
        )
        done = {batched[k] for k in filled}
        for index in claimed:
            if index in done:
                self._settle(index, (1, None))
            else:
                self._fill_unless_parked(index)

    def _settle(self, index: int, outcome: tuple[int, str | None]) -> None:
        """A request's outcome lands, unless the step went on without it (late)."""
        outcomes = self._outcomes
        if outcomes.setdefault(index, outcome) is not outcome:
            return
        if self._progress is not None:
            valid, failure = outcome
            self._progress[self._entries.positions[index]] = -1 if failure is not None else valid
        if len(outcomes) == len(self._requests):
            with self._condition:
                self._condition.notify_all()

    def _replaced(self, helper: bool) -> bool:
        """A fill thread's drain whose place a helper has taken."""
        return not helper and self._drains > max(self._threads, self._helpers)

    def _leave(self, helper: bool) -> None:
        """A drain ends (condition held)."""
        self._drains -= 1
        self._helpers -= helper

    def _park(self, index: int, request: _Request) -> bool:
        """Set a request aside while its grammar compiles (False: it does not)."""
        compiling = self._table.compiling(request)
        if compiling is None:
            return False
        with self._condition:
            self.awaited_compiles = True
            self._compiling[index] = request.deadline
            self._condition.notify_all()  # the step now also waits for that timeout
        # a finished future keeps its callbacks: hold the step weakly
        compiling.add_done_callback(functools.partial(_requeue_compiled, weakref.ref(self), index))
        return True

    def _fill(self, index: int) -> tuple[int, str | None]:
        """One request's rows: straight into the slot when they are a run (as always in
        the default layout), else through this thread's scratch rows."""
        entries = self._entries
        request, drafts, block = self._requests[index], entries.drafts[index], entries.blocks[index]
        if block is not None:
            return self._table.fill_rows(request, drafts, self._slot, block.start)
        rows = entries.rows[index]
        scratch = self._table.scratch_rows(len(rows))
        outcome = self._table.fill_rows(request, drafts, scratch, 0)
        self._slot[list(rows)] = scratch
        return outcome

    def compiled(self, index: int) -> None:
        """A waiting request's compilation ended, or its compile timeout passed: back in the
        queue (a fill past the timeout fails it there)."""
        with self._condition:
            if self._closed or self._compiling.pop(index, None) is None:
                return
            self._retry.append(index)
            self._start_drains()

    def _requeue_compiles(self, now: float) -> None:
        """Requests past their compile timeout rejoin the queue (condition held, reentrant):
        a compile that never ends must not keep them waiting."""
        for index in [index for index, at in self._compiling.items() if at <= now]:
            self.compiled(index)

    def _next_wake(self, now: float, *also: float | None) -> float | None:
        """Seconds until the next compile timeout or any of `also` (None: not set)."""
        waits = [at - now for at in self._compiling.values()]
        waits += [seconds for seconds in also if seconds is not None]
        return max(0.0, min(waits)) if waits else None

    def _collect(self) -> None:
        """The filled requests' outcomes into the result (those past the deadline are in)."""
        valid, failures = self.result.valid, self.result.failures
        positions, request_ids = self._entries.positions, self._entries.request_ids
        for index, outcome in self._outcomes.items():
            if outcome is not _LATE:
                valid[positions[index]], failure = cast(tuple[int, str | None], outcome)
                if failure is not None:
                    failures[request_ids[index]] = failure

    def _close_late(self) -> None:
        """Past the deadline (condition held): every request not done fails alone. Threads
        still filling write into the slot they were given: the step's rows move to a copy."""
        self._closed = True
        self.abandoned = self._drains
        outcomes = self._outcomes
        late = [i for i in range(len(self._requests)) if outcomes.setdefault(i, _LATE) is _LATE]
        host = self._slot
        if late and self.abandoned:
            host = self.result.host = self._slot.clone()
        entries = self._entries
        for index in late:
            host[list(entries.rows[index])] = self._table.stop_row
            self.result.valid[entries.positions[index]] = 1
            request = self._requests[index]
            if request.status != "failed":
                request.fail(DEADLINE_REASON)
                self.result.failures[entries.request_ids[index]] = DEADLINE_REASON


_LATE = object()
"""The outcome of a request the step closed without (see StepFill._close_late)."""
_CHUNK_MAX = 8
"""Requests in one batch call at most (B=64 D=0 on 2 threads: 4, 8 and 16 took 0.56-0.78,
0.52-0.66 and 0.59-0.77 of one thread's call per request; a call per request on both
threads, 0.62-0.89)."""
_CLAIMS_PER_THREAD = 2
"""Claims each thread gets at least in a step, so that the threads even out the slow fills
(B=16 D=0 on 2 threads, DeepSeek, three runs each: the bare loop with claims of 2, 4 and
8 requests took 0.90-0.93, 0.75-0.93 and 0.97-1.01 of one thread's; the pool with claims
of 4 requests (2 per thread) and of 2 (4 per thread) 1.02-1.11 and 1.06-1.35 of the naive
loop)."""


_NO_HOST = torch.empty(0, dtype=torch.int32)
_NO_CONDITION = threading.Condition()
_NO_DEADLINE = Deadline(None)


def _requeue_compiled(step: weakref.ref[StepFill], index: int, _: object) -> None:
    alive = step()
    if alive is not None:
        alive.compiled(index)


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


StepRun = Callable[[int, torch.Tensor, Deadline, Callable[[], object]], FillResult]
"""Fills a step's rows into (host slot index, host slot) until done or past the deadline;
the last argument is work for the calling thread while the fill runs elsewhere."""
