"""One step's fill on threads: requests claimed in turn, rows written straight into the
step's host slot, late requests failed alone at the deadline.

The pool runs this in its own process (thread isolation) and every worker process runs it
too (process isolation): the same code decides every row and every failure reason in both
modes, which keeps their masks bit-identical.

Matchers write a request's rows straight into the step's host slot. A step closed at its
deadline moves its rows to a copy of the slot (`FillResult.host`), which takes the slot's
place in the ring: a fill that comes back late writes into the old buffer, which nobody
reads any more, never into the masks of this step or of a later one.
"""

from __future__ import annotations

import functools
import itertools
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import NamedTuple, cast

import torch

from ..masks import RequestId
from .gil import require_gil
from .plan import StepPlan
from .requests import Request, RequestTable
from .sync import DEADLINE_REASON, StepSync

require_gil()


class FillEntry(NamedTuple):
    """One request's share of a step: its batch position, drafts and logits rows (a named
    tuple: a step builds one per request, the cheapest record to build)."""

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
    nothing per request."""

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


class StepFill:
    """One step's fill: threads claim requests in turn (so a hanging matcher holds up one
    thread, not a fixed share of the batch) and write their rows into the host slot.

    Threads share the step without a lock per request: a claim is `next()` on one counter
    and a request's outcome lands with one `dict.setdefault`, each a single step under the
    GIL; the step's condition is taken only for what is rare (a request parked while its
    grammar compiles, a thread leaving, the last outcome, the deadline). Why: with a lock
    round per request, fill threads queue on the lock behind each other's GIL switches.

    A request whose grammar is still compiling waits aside, holding no thread: it rejoins
    when its compilation ends or its compile timeout passes, so a slow compile never stalls
    the fill of the others. Its `requests` (one per entry) are looked up on the caller's
    thread, before any later `remove`. `progress[position]`, when given, is set once a
    request's rows are in the slot: its valid rows, or -1 if it failed during this step (a
    parent process reads it after a deadline).
    """

    def __init__(
        self, table: RequestTable, entries: StepEntries, requests: Sequence[Request]
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
        # set by run(); shared placeholders until then (a step builds none it may not use)
        self._slot = _NO_HOST
        self._condition = _NO_CONDITION
        self._progress: torch.Tensor | None = None
        self._executor: Executor | None = None
        self._sync = _NO_SYNC
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
        sync: StepSync,
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
        self._slot, self._progress, self._condition = host, progress, sync.condition
        if sync.never and (threads == 1 or alone_s is not None):
            if meanwhile is not None:
                meanwhile()
            self._fill_alone()
            self._closed = True
            return self.result
        widen_at = None if alone_s is None else time.monotonic() + alone_s
        self._executor, self._threads = executor, threads if widen_at is None else 1
        self._sync = sync
        if batch_one_row:
            self._chunk = self._chunk_size(threads)
        total = len(self._requests)
        with self._condition:
            if sync.never:
                self._drains += 1
            self._start_drains()
            sync.helper = self.help
            sync.mark_started()  # the same (reentrant) condition
        if meanwhile is not None:
            meanwhile()
        if sync.never:
            self._drain()
        with self._condition:
            while len(self._outcomes) < total:
                now = time.monotonic()
                self._requeue_compiles(now)
                if widen_at is not None and now >= widen_at:
                    widen_at, self._threads = None, threads
                    self._start_drains()
                remaining = sync.remaining()
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
        # does: this is the usual step, and that round costs it measurably
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
        current request. Why: the scheduler often puts the woken fill threads on the core
        the engine's thread is leaving, and the step then takes the time of one thread."""
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
            elif chunk > 1 and not drafts[index] and self._sync.at is None:
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
        finds a claimed chunk in one call: one chunk is a few fills long.)"""
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

    def _park(self, index: int, request: Request) -> bool:
        """Set a request aside while its grammar compiles (False: it does not)."""
        compiling = self._table.compiling(request)
        if compiling is None:
            return False
        with self._condition:
            self.awaited_compiles = True
            self._compiling[index] = request.compile_deadline
            self._condition.notify_all()  # the step now also waits for that timeout
        # a finished future keeps its callbacks: hold the step weakly
        compiling.add_done_callback(
            functools.partial(_requeue_after_compile, weakref.ref(self), index)
        )
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

    def compile_ended(self, index: int) -> None:
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
            self.compile_ended(index)

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
"""Requests in one batch call at most: longer calls leave the threads uneven (the choice
is measured in docs/performance.md)."""
_CLAIMS_PER_THREAD = 2
"""Claims each thread gets at least in a step, so that the threads even out the slow fills
(see docs/performance.md)."""


_NO_HOST = torch.empty(0, dtype=torch.int32)
_NO_CONDITION = threading.Condition()
_NO_SYNC = StepSync(None)


def _requeue_after_compile(step: weakref.ref[StepFill], index: int, _: object) -> None:
    alive = step()
    if alive is not None:
        alive.compile_ended(index)
