"""Process isolation: the pool's Matchers over worker processes (started and restarted by
worker_set.py, each running worker.py) that write masks into a SharedRing.

Each worker process (spawned: torch and xgrammar run threads, which fork would break) holds
some of the requests. The parent keeps, per request, its grammar and committed tokens, so
that it can replay the request on a new worker.

When a worker dies (a signal, an abort, the OOM killer), every request it held fails with
a reason naming the signal, the worker is restarted, and the step goes on for the others.
When a request misses its mask deadline, its worker (a thread of it is stuck in the
matcher) is killed and replaced; the requests it held that were not late are replayed on
the new worker (add + the same commits), so they carry on. Nothing waits without also
watching the process sentinel, so a dead worker never hangs the pool.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import multiprocessing.connection
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import torch

from ..errors import GrammarMaskError, RequestFault, WorkerGone
from ..grammars import Grammar
from ..masks import RequestId
from ..vocabulary import Vocabulary
from .matchers import BackendFactory, StepRun
from .messages import (
    Add,
    Begun,
    Commit,
    Fill,
    FromWorker,
    Ready,
    Remove,
    StartFailed,
    StateQuery,
    ToWorker,
)
from .plan import StepPlan
from .requests import (
    RequestState,
    already_added,
    not_added,
    stop_row,
    token_ids,
    unknown_request,
)
from .shared_ring import SharedRing
from .step_fill import FillEntry, FillResult, fill_entries
from .sync import DEADLINE_REASON, StepSync
from .worker import HANG_GRACE_S
from .worker_process import (
    WorkerProcess,
    death,
    ended,
    poll,
    send,
)
from .worker_set import WorkerSet

_POLL_S = 0.05
"""How often a waiting step looks at its deadline (`wait(timeout=...)` may set one late)."""


@dataclass(eq=False)
class _Held:
    """The parent's record of a request: enough to replay it on a new worker."""

    request_id: RequestId
    grammar: Grammar | None
    backend: str
    worker: int
    allow_unenforced: bool = False
    commits: list[tuple[int, ...]] = field(default_factory=list)
    failed: str | None = None
    """Why it failed, once the parent knows it did (its worker died, a deadline, a reply)."""
    reported: bool = False
    last: RequestState | None = None
    """The worker's last answer about it (backend, committed): what a failure keeps."""


class ProcessMatchers:
    """The pool's Matchers over worker processes (see the module docstring).

    Locks: a worker's slot lock (`WorkerSet.slots`) serialises everything said to it;
    `_lock` guards the request records and which requests each worker holds. A slot lock
    may be taken first, never the reverse.
    """

    def __init__(
        self,
        vocab: Vocabulary,
        workers: int,
        ring: SharedRing,
        compile_timeout_s: float,
        backend_factory: BackendFactory | None,
        start_timeout_s: float,
        compile_memory_bytes: int | None = None,
    ) -> None:
        """Start the workers and wait until each is ready; raise WorkerStartError, having
        stopped them all, if one dies or fails first or takes over `start_timeout_s`."""
        self._compile_timeout_s = compile_timeout_s
        self._stop_row = stop_row(vocab)
        self._held: dict[RequestId, _Held] = {}
        self._lock = threading.Lock()
        self._steps_in_flight = 0
        self._workers = WorkerSet(
            vocab,
            workers,
            ring,
            compile_timeout_s,
            backend_factory,
            start_timeout_s,
            compile_memory_bytes,
        )
        self._slots = self._workers.slots

    @property
    def restarts(self) -> int:
        """Workers replaced so far."""
        return self._workers.restarts

    def worker_of(self, request_id: RequestId) -> int:
        """The index of the worker holding a request (for tests that fault one)."""
        with self._lock:
            return self._held[request_id].worker

    def pids(self) -> list[int]:
        """Process ids of the current workers (for monitoring, and tests that kill one)."""
        return self._workers.pids()

    # ------------------------------------------------------------------ requests
    def add(
        self,
        request_id: RequestId,
        grammar: Grammar,
        backend: str,
        *,
        allow_unenforced: bool = False,
    ) -> RequestState:
        """On the worker holding the fewest requests, among those in service; a request
        for which none is left fails saying why."""
        held = _Held(request_id, grammar, backend, -1, allow_unenforced)
        with self._lock:
            if request_id in self._held:
                raise GrammarMaskError(already_added(request_id))
            self._held[request_id] = held
        while True:
            with self._lock:
                running = self._workers.in_service()
                if not running:
                    held.failed = f"no worker process is running: {self._workers.broken[0]}"
                    return RequestState(request_id, "failed", held.failed, backend=backend)
                index = min(running, key=lambda w: len(w.held)).index
            with self._slots[index]:
                worker = self._alive(self._workers[index], "idle")
                if index in self._workers.broken:  # it died before it was ready: choose again
                    continue
                held.worker = index
                worker.held.add(request_id)
                send(worker, Add(request_id, grammar, backend, allow_unenforced))
            return RequestState(request_id, "active", backend=backend)

    def remove(self, request_id: RequestId) -> None:
        with self._lock:
            held = self._held.pop(request_id, None)
            if held is None or held.worker < 0:
                return
            worker = self._workers[held.worker]
            worker.held.discard(request_id)
            worker.pending_removes.append(request_id)
            if self._steps_in_flight:
                return  # sent after the step, which still fills it
        self._flush_removes(held.worker)

    def _flush_removes(self, index: int) -> None:
        with self._slots[index]:
            worker = self._workers[index]
            removes, worker.pending_removes = worker.pending_removes, []
            for request_id in removes:
                send(worker, Remove(request_id))

    def state(self, request_id: RequestId) -> RequestState:
        return self._ask(request_id, StateQuery(request_id), "answering a state query", ())

    def commit(self, request_id: RequestId, tokens: Sequence[int]) -> RequestState:
        try:
            ids = token_ids(tokens)
        except RequestFault as exc:
            with self._lock:
                held = self._held.get(request_id)
                if held is not None and held.failed is None:
                    held.failed = str(exc)
            ids = ()  # `_ask` answers with that reason (or as unknown)
        return self._ask(request_id, Commit(request_id, ids), "committing tokens", ids)

    def _ask(
        self, request_id: RequestId, message: ToWorker, doing: str, tokens: tuple[int, ...]
    ) -> RequestState:
        with self._lock:
            held = self._held.get(request_id)
        if held is None:
            return RequestState(request_id, "failed", unknown_request(request_id))
        if held.failed is None:
            with self._slots[held.worker]:
                try:
                    worker = self._alive(self._workers[held.worker], "idle")
                    if held.failed is None:
                        send(worker, message)
                        reply = self._receive(worker, doing)
                        if not isinstance(reply, RequestState):
                            raise GrammarMaskError(f"worker answered {reply!r} while {doing}")
                        held.last = reply
                        if reply.status == "failed":  # reported by this reply
                            held.failed, held.reported = reply.reason or "failed", True
                        elif tokens:
                            held.commits.append(tokens)
                        return reply
                except WorkerGone:
                    pass
        held.reported = True  # the caller hears it now
        last = held.last or RequestState(request_id, "active", backend=held.backend)
        return dataclasses.replace(last, status="failed", reason=held.failed)

    # ------------------------------------------------------------------ workers
    def _receive(self, worker: WorkerProcess, doing: str) -> FromWorker:
        """The worker's next answer (slot lock held), skipping its "ready" greeting. Raises
        WorkerGone, after failing its requests, if it dies or hangs first."""
        limit = time.monotonic() + self._compile_timeout_s + HANG_GRACE_S
        while True:
            watched = [worker.conn, worker.process.sentinel]
            ready = multiprocessing.connection.wait(watched, max(0.0, limit - time.monotonic()))
            if not ready:
                self._replace(worker, f"worker process hung while {doing}", kill=True)
                raise WorkerGone
            message = poll(worker) if worker.conn in ready else None
            if isinstance(message, Ready):
                worker.ready = True
            elif isinstance(message, StartFailed) or message is None:
                self._replace(worker, ended(worker, message, f"while {doing}"), kill=False)
                raise WorkerGone
            else:
                return message

    def _alive(self, worker: WorkerProcess, doing: str) -> WorkerProcess:
        """The worker, or its replacement if it died while `doing` (slot lock held)."""
        if worker.process.is_alive():
            return worker
        return self._replace(worker, f"{death(worker)} while {doing}", kill=False)

    def _replace(
        self, worker: WorkerProcess, reason: str, *, kill: bool, replay: bool = False
    ) -> WorkerProcess:
        """Stop `worker` (slot lock held) and start its replacement at the same index. The
        requests it held fail with `reason`, or with `replay` those not failed already are
        replayed on the replacement. A worker that ended before it was ready is not
        replaced: its index stays out of service, and every request it held fails saying
        why it could not start."""
        new = self._workers.restart(worker, reason, kill=kill)
        with self._lock:
            for request_id in worker.held:
                held = self._held.get(request_id)
                if held is None or held.failed is not None:
                    continue
                if new is None:
                    held.failed = self._workers.broken[worker.index]
                elif replay:
                    new.held.add(request_id)
                    send(new, _replay(held))
                else:
                    held.failed = reason
            if new is None:
                worker.held = set()
                return worker
            new.pending_removes = worker.pending_removes
            self._workers.install(new)
        return new

    # ------------------------------------------------------------------ the step
    def begin(self, plan: StepPlan) -> StepRun:
        """Route the step's requests to their workers now (before any later `remove`); the
        entries are built on the thread that runs the step."""
        workers: dict[int, int] = {}
        """Batch position -> the worker holding its request."""
        failed: dict[int, str | None] = {}
        """Batch position -> the failure to report (None: reported before)."""
        with self._lock:
            self._steps_in_flight += 1
            for position, request_id in enumerate(plan.request_ids):
                if request_id is None:
                    continue
                held = self._held.get(request_id)
                if held is None:
                    reason = not_added(request_id)
                    held = _Held(request_id, None, "", -1, failed=reason)  # not kept
                if held.failed is not None:
                    failed[position] = None if held.reported else held.failed
                    held.reported = True
                else:
                    workers[position] = held.worker

        def run(
            slot: int, host: torch.Tensor, sync: StepSync, meanwhile: Callable[[], object]
        ) -> FillResult:
            groups: dict[int, list[FillEntry]] = {}
            local: list[tuple[FillEntry, str | None]] = []
            for entry in fill_entries(plan):
                if entry.position in failed:
                    local.append((entry, failed[entry.position]))
                else:
                    groups.setdefault(workers[entry.position], []).append(entry)
            return self._run(slot, host, sync, groups, local, meanwhile)

        return run

    def _run(
        self,
        slot: int,
        host: torch.Tensor,
        sync: StepSync,
        groups: dict[int, list[FillEntry]],
        local: list[tuple[FillEntry, str | None]],
        meanwhile: Callable[[], object],
    ) -> FillResult:
        result = FillResult()
        for entry, reason in local:
            self._fail_rows(host, entry, result, reason)
        indices = sorted(groups)
        for index in indices:
            self._slots[index].acquire()
        try:
            self._fill_on_workers(slot, host, sync, groups, result, meanwhile)
        finally:
            for index in indices:
                self._slots[index].release()
            with self._lock:
                self._steps_in_flight -= 1
                idle = not self._steps_in_flight
            if idle:
                for index in range(len(self._workers)):
                    self._flush_removes(index)
        return result

    def _fill_on_workers(
        self,
        slot: int,
        host: torch.Tensor,
        sync: StepSync,
        groups: dict[int, list[FillEntry]],
        result: FillResult,
        meanwhile: Callable[[], object],
    ) -> None:
        """Send each worker its entries, run `meanwhile`, then collect answers (slot locks
        held): a worker that dies fails its requests; one past the deadline is expired. Its
        time before it takes the step up (a restart, a replay) does not count against the
        deadline."""
        progress = self._workers.ring.progress[slot]
        started = time.monotonic()
        waiting: dict[int, WorkerProcess] = {}
        begun: dict[int, float] = {}
        for index, entries in groups.items():
            progress[[e.position for e in entries]] = 0
            worker = self._workers[index]
            if not worker.process.is_alive():
                self._bury(worker, host, entries, result)
                continue
            send(worker, Fill(slot, entries, sync.at is None))
            waiting[index] = worker
        meanwhile()
        while waiting:
            watched = [w.conn for w in waiting.values()]
            watched += [w.process.sentinel for w in waiting.values()]
            ready = set(multiprocessing.connection.wait(watched, _POLL_S))
            now = time.monotonic()
            for index, worker in list(waiting.items()):
                if worker.conn in ready:
                    message = poll(worker)
                    if isinstance(message, FillResult):
                        result.valid.update(message.valid)
                        result.failures.update(message.failures)
                        self._note_failures(message.failures)
                        del waiting[index]
                    elif isinstance(message, StartFailed) or message is None:
                        self._bury(worker, host, groups[index], result, message)
                        del waiting[index]
                    elif isinstance(message, Begun):
                        begun[index] = now
                    elif isinstance(message, Ready):
                        worker.ready = True
                elif worker.process.sentinel in ready:
                    continue  # its pipe, read next round, says the rest
                elif _past(sync, begun.get(index), started, now):
                    self._expire(worker, host, progress, groups[index], result)
                    del waiting[index]

    def _bury(
        self,
        worker: WorkerProcess,
        host: torch.Tensor,
        entries: list[FillEntry],
        result: FillResult,
        last: StartFailed | None = None,
    ) -> None:
        """A worker died during the step: its requests fail, naming the signal (or what it
        said if it could not start)."""
        reason = ended(worker, last, "while filling masks")
        self._replace(worker, reason, kill=False)
        if worker.index in self._workers.broken:
            reason = self._workers.broken[worker.index]
        for entry in entries:
            self._fail_rows(host, entry, result, reason)

    def _expire(
        self,
        worker: WorkerProcess,
        host: torch.Tensor,
        progress: torch.Tensor,
        entries: list[FillEntry],
        result: FillResult,
    ) -> None:
        """Past the deadline: kill the worker (so no later write can land), keep the rows it
        finished, fail the late requests alone and replay the others on its replacement."""
        worker.process.kill()
        worker.process.join()
        for entry in entries:
            done = int(progress[entry.position])
            if done > 0:
                result.valid[entry.position] = done
                continue
            reason = DEADLINE_REASON
            if done < 0:
                reason = "matcher error while filling the step's masks (worker then replaced)"
            self._fail_rows(host, entry, result, reason)
            with self._lock:
                held = self._held.get(entry.request_id)
                if held is not None:
                    held.failed = reason
        self._replace(worker, DEADLINE_REASON, kill=False, replay=True)

    def _fail_rows(
        self, host: torch.Tensor, entry: FillEntry, result: FillResult, reason: str | None
    ) -> None:
        host[list(entry.rows)] = self._stop_row
        result.valid[entry.position] = 1
        if reason is not None:
            result.failures[entry.request_id] = reason
            with self._lock:
                held = self._held.get(entry.request_id)
                if held is not None:
                    held.reported = True

    def _note_failures(self, failures: Mapping[RequestId, str]) -> None:
        """Requests that failed inside a worker: never to be replayed."""
        with self._lock:
            for request_id, reason in failures.items():
                held = self._held.get(request_id)
                if held is not None:
                    held.failed, held.reported = reason, True

    # ------------------------------------------------------------------ lifetime
    def close(self) -> None:
        self._workers.close()


def _replay(held: _Held) -> Add:
    """The message that re-creates a request on a new worker: its grammar and commits."""
    return Add(
        held.request_id,
        held.grammar,
        held.backend,
        held.allow_unenforced,
        tuple(held.commits),
        replay=True,
    )


def _past(sync: StepSync, begun: float | None, started: float, now: float) -> bool:
    """A worker's deadline is the step's, moved on by the time it took to take the step up."""
    return sync.at is not None and begun is not None and now >= sync.at + begun - started
