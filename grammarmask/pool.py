"""The matcher pool: the step's mask fill, commit, isolation, deadlines.

The engine's step, seen from here:

    future = pool.fill_async(batch)   # before launching the forward; returns at once
    ...                               # the forward runs while workers fill masks
    masks = future.wait()             # just before sampling: joins the CPU work, then
    gm.apply_bitmask(logits, masks)   # the sampler's stream waits on the copy event
    pool.commit(request_id, accepted) # only accepted tokens ever advance a matcher

Every per-request problem (bad grammar, compile timeout, matcher exception, illegal or
out-of-range token, unknown id, a mask past its deadline, a worker process that died)
fails that request alone: its rows allow only stop tokens and the reason is kept on its
state. Only engine-level mistakes (an inconsistent batch layout) raise.

Matchers live in worker threads of this process (isolation="thread", the default) or in
worker processes (isolation="process", `workers.py`): the same `matchers.py` code fills
the rows in both, behind the small `_Executor` interface below.
"""

from __future__ import annotations

import itertools
import os
import queue
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal, Protocol, cast

import torch

from .backends import AUTO, backend_names, words_per_row
from .compiler import GrammarCompiler
from .errors import GrammarMaskError
from .grammars import Grammar
from .matchers import (
    BackendFactory,
    Deadline,
    FillResult,
    MatcherTable,
    RequestFault,
    RequestState,
    Status,
    StepEntries,
    StepFill,
    StepRun,
)
from .steps import DEFAULT_MAX_DRAFTS, BatchEntry, BatchError, RequestId, StepMasks, StepPlan
from .transfer import CudaOps, DeviceOps, MaskTransfer
from .vocabulary import Vocabulary

__all__ = ["MaskFuture", "MatcherPool", "RequestFault", "RequestState", "Status"]


class _Executor(Protocol):
    """Where the matchers live: threads of this process, or worker processes."""

    def add(
        self,
        request_id: RequestId,
        grammar: Grammar,
        backend: str,
        *,
        allow_unenforced: bool = False,
    ) -> RequestState: ...
    def remove(self, request_id: RequestId) -> None: ...
    def state(self, request_id: RequestId) -> RequestState: ...
    def commit(self, request_id: RequestId, tokens: Sequence[int]) -> RequestState: ...
    def begin(self, plan: StepPlan) -> StepRun:
        """Resolve a step's requests on the caller's thread (before any later `remove`);
        the rest happens where the step is filled."""

    def close(self) -> None: ...


class _ThreadMode:
    """Thread isolation: fill a step on one thread or on all of them, whichever took less
    time per request in recent steps. On a 2-core machine, two threads cost more than the
    second core gave when the fills are cheap (forced two against one, same run: 1.34x at
    0.42 ms of fills, 1.17x at 0.62 ms, 0.82x at 0.87 ms, 0.71-0.79x from 1.3 ms up; and
    at B=64 D=0 with ~7 us fills 1.6x at 0.67 ms), and where the line falls depends on the
    machine and the fills. A threshold on an estimate of the step's CPU time locked into
    two threads near it: their contention inflated the estimate. So both modes are timed,
    and every `EXPLORE_EVERY`-th step tries the one not chosen, to follow the traffic.
    Steps that waited for a compilation are not noted (their time says little)."""

    EXPLORE_EVERY = 16
    WARM_UP = 4
    """Steps of each mode taken in turn before choosing; the first of each is not counted
    (a pool's first steps touch cold matchers, and a bench replays a point ~10 times)."""
    RECENT = 5
    """Steps of each mode whose median time per request stands for it: on a shared VM whose
    speed drifts, a running mean flipped to the slower mode after two slow steps (B=256
    D=5: 32 ms on one thread against 20 ms on two)."""

    def __init__(self) -> None:
        self._recent: dict[bool, deque[float]] = {
            mode: deque(maxlen=self.RECENT) for mode in (False, True)
        }
        """Alone (one thread)? -> seconds per request of its recent steps' fills."""
        self._per_request: dict[bool, float] = {}
        """Alone? -> the median of `_recent`."""
        self._taken = {False: 0, True: 0}
        self._steps = 0

    def alone(self, requests: int) -> bool:
        """Fill the next step of `requests` on one thread? (Both modes in turn at first,
        then the faster, with the other tried now and then.)"""
        if requests < 2:
            return True
        self._steps += 1
        if min(self._taken.values()) < self.WARM_UP:
            return self._taken[True] < self._taken[False]
        faster = self._per_request[True] <= self._per_request[False]
        return faster != (self._steps % self.EXPLORE_EVERY == 0)

    def alone_seconds(self, requests: int) -> float:
        """What a step of `requests` is expected to take on one thread."""
        return requests * self._per_request.get(True, 0.0)

    def note(self, alone: bool, seconds: float, requests: int) -> None:
        if requests < 2:
            return
        self._taken[alone] += 1
        if self._taken[alone] == 1:
            return  # cold
        recent = self._recent[alone]
        recent.append(seconds / requests)
        self._per_request[alone] = statistics.median_high(recent)


SETTLING_STEPS = 2 * _ThreadMode.WARM_UP
"""Steps a thread-isolated pool takes in both thread modes before it keeps to the faster:
what a benchmark should run untimed first."""

_WIDEN_AFTER_S = 2e-3
"""A step filled on one thread that is still running this long after it started, and twice
what it was expected to take, gets the other fill threads (see StepFill.run): a hanging
matcher must not hold up the rest."""


class _ThreadExecutor(MatcherTable):
    """Matchers in this process; `threads` fill threads pull the requests of each step."""

    def __init__(
        self, vocab: Vocabulary, compiler: GrammarCompiler, compile_timeout_s: float, threads: int
    ) -> None:
        super().__init__(vocab, compiler, compile_timeout_s)
        self._threads = threads
        self._executor = ThreadPoolExecutor(threads, thread_name_prefix="grammarmask-fill")
        self.mode = _ThreadMode()

    def begin(self, plan: StepPlan) -> StepRun:
        ids = plan.request_ids
        named = (  # the ids alone: the step's entries are built on the fill thread
            cast(tuple[RequestId, ...], ids)
            if None not in ids
            else [rid for rid in ids if rid is not None]
        )
        requests = self.lookup(named)

        def run(
            slot: int, host: torch.Tensor, deadline: Deadline, meanwhile: Callable[[], object]
        ) -> FillResult:
            step = StepFill(self, StepEntries.of_plan(plan), requests)
            alone = self._threads == 1 or self.mode.alone(step.requests)
            widen = max(_WIDEN_AFTER_S, 2 * self.mode.alone_seconds(step.requests))
            started = time.perf_counter()
            result = step.run(
                host,
                deadline,
                self._executor,
                self._threads,
                meanwhile=meanwhile,
                alone_s=widen if alone else None,
            )
            if step.abandoned:
                self._renew()
            elif not step.awaited_compiles:
                self.mode.note(alone, time.perf_counter() - started, step.requests)
            return result

        return run

    def _renew(self) -> None:
        """A late step left threads inside matcher calls: fresh threads serve the next steps
        (the pool keeps its capacity), the stuck ones end when their call returns."""
        stuck = self._executor
        self._executor = ThreadPoolExecutor(self._threads, thread_name_prefix="grammarmask-fill")
        stuck.shutdown(wait=False, cancel_futures=True)

    def close(self) -> None:
        """Does not wait: a fill that hangs past its deadline must not hang `close` too."""
        self._executor.shutdown(wait=False, cancel_futures=True)


class MaskFuture:
    """The masks of one step, being filled; `wait` joins and orders the device stream.

    The step thread hands the result over under the step's own condition (the Deadline's):
    fill_async builds one of these per step on the engine's thread, and a
    concurrent.futures Future and executor hand-off cost ~3x as much there with the caches
    cold after a forward."""

    def __init__(self, transfer: MaskTransfer, consumer: Any, deadline: Deadline) -> None:
        self._transfer = transfer
        self._consumer = consumer
        self._deadline = deadline
        self._finished = False
        self._value: tuple[StepMasks, Any] | None = None
        self._error: BaseException | None = None

    def finish(self, value: tuple[StepMasks, Any] | None, error: BaseException | None) -> None:
        """The step's masks and copy event, or the exception that ended it."""
        with self._deadline.condition:
            self._value, self._error, self._finished = value, error, True
            self._deadline.condition.notify_all()

    def done(self) -> bool:
        return self._finished

    def _result(self) -> tuple[StepMasks, Any]:
        condition = self._deadline.condition
        with condition:
            condition.wait_for(lambda: self._finished)
        if self._error is not None:
            raise self._error
        assert self._value is not None
        return self._value

    def wait(self, timeout: float | None = None) -> StepMasks:
        """Join the CPU fill, then (on a device) make the consumer stream wait on the copy.

        With `timeout`, requests whose masks are not ready `timeout` seconds from now fail
        alone ("mask deadline exceeded"); the others get their masks.
        """
        if timeout is not None:
            self._deadline.tighten(timeout)
        elif self._deadline.at is None and not self._finished:
            self._deadline.help()  # nothing to do but wait: fill instead (thread isolation)
        masks: StepMasks = self._transfer.join_then_wait(self._result, self._consumer)
        return masks


_NONE_VALID = itertools.repeat(0)
"""The valid rows of an entry without an outcome (one without grammar)."""

_Job = tuple[MaskFuture, StepPlan, int, StepRun, Deadline, Any]
"""A fill_async step for the step thread: its future, plan, number, run, deadline and
consumer stream."""


class MatcherPool:
    """Grammar matchers for the requests of one engine, filled on worker threads or processes.

    `workers` threads (isolation="thread") or processes (isolation="process") fill masks;
    masks are bit-identical for any worker count, batch order and isolation. `max_rows`
    bounds the rows of one step: the host (and device) mask buffers are allocated once for
    it, in a ring of `ring_slots` steps (in shared memory with process isolation).
    `backend_factory` adds backends by name (built in each worker process; `compiler`, a
    ready compiler, works with threads only). backend="auto" serves each grammar with a
    backend that enforces all of it (see GrammarCompiler.submit); `allow_unenforced` opts in
    to loose enforcement for grammars no backend enforces fully.
    """

    def __init__(
        self,
        vocab: Vocabulary,
        backend: str = "xgrammar",
        workers: int | None = None,
        device: str | torch.device | None = None,
        isolation: Literal["thread", "process"] = "thread",
        *,
        max_rows: int = 1024,
        ring_slots: int = 2,
        max_drafts: int = DEFAULT_MAX_DRAFTS,
        compile_timeout_s: float = 60.0,
        compiler: GrammarCompiler | None = None,
        backend_factory: BackendFactory | None = None,
        device_ops: DeviceOps | None = None,
        allow_unenforced: bool = False,
    ) -> None:
        if isolation not in ("thread", "process"):
            raise ValueError(f"isolation must be 'thread' or 'process', not {isolation!r}")
        self.vocab = vocab
        self.backend = backend
        self.isolation = isolation
        self.workers = workers if workers is not None else min(4, os.cpu_count() or 1)
        if self.workers < 1:
            raise ValueError(f"workers must be at least 1, not {self.workers}")
        if max_drafts < 0:
            raise ValueError(f"max_drafts must be at least 0, not {max_drafts}")
        self.max_drafts = max_drafts
        self.compile_timeout_s = compile_timeout_s
        self.allow_unenforced = allow_unenforced
        self._words = words_per_row(vocab.size)
        if device_ops is None and device is not None and torch.device(device).type == "cuda":
            device_ops = CudaOps(torch.device(device))
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self._executor: _Executor
        if isolation == "process":
            if compiler is not None:
                raise ValueError(
                    "a compiler cannot move into worker processes; pass backend_factory"
                )
            if backend_factory is None and backend not in (*backend_names(), AUTO):
                raise GrammarMaskError(
                    f"unknown backend {backend!r}; choose from "
                    f"{', '.join((*backend_names(), AUTO))}"
                )
            from .workers import ProcessExecutor, SharedRing

            ring = SharedRing(ring_slots, max_rows, self._words, pinned=device_ops is not None)
            self._transfer = MaskTransfer(device_ops, max_rows, self._words, ring_slots, ring.host)
            try:
                self._executor = ProcessExecutor(
                    vocab, self.workers, ring, compile_timeout_s, backend_factory
                )
            except BaseException:
                ring.close()
                raise
            self._owned_compiler: GrammarCompiler | None = None
        else:
            self._owned_compiler = (
                None
                if compiler is not None
                else GrammarCompiler(
                    vocab,
                    timeout_s=compile_timeout_s,
                    backends=backend_factory(vocab) if backend_factory is not None else None,
                )
            )
            chosen = compiler or self._owned_compiler
            assert chosen is not None
            if backend != AUTO:
                chosen.backend(backend)  # fail now on an unknown or missing backend
            self._transfer = MaskTransfer(device_ops, max_rows, self._words, ring_slots)
            self._executor = _ThreadExecutor(vocab, chosen, compile_timeout_s, self.workers)
        self._step_lock = threading.Lock()
        self._step = 0
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._step_thread = threading.Thread(
            target=self._serve_steps, name="grammarmask-step", daemon=True
        )
        self._step_thread.start()

    # ------------------------------------------------------------------ requests
    def add(
        self,
        request_id: RequestId,
        grammar: Grammar,
        *,
        backend: str | None = None,
        allow_unenforced: bool | None = None,
    ) -> RequestState:
        """Register a request; its grammar compiles in the background on `backend`
        (default: the pool's). With "auto", `state().backend` names the chosen backend once
        compiled; a grammar no backend enforces fully fails this request alone, unless
        `allow_unenforced` (default: the pool's)."""
        loose = self.allow_unenforced if allow_unenforced is None else allow_unenforced
        return self._executor.add(
            request_id, grammar, backend or self.backend, allow_unenforced=loose
        )

    def remove(self, request_id: RequestId) -> None:
        """Forget a request (finished, failed or cancelled); unknown ids are ignored. A step
        already started still fills it."""
        self._executor.remove(request_id)

    def state(self, request_id: RequestId) -> RequestState:
        return self._executor.state(request_id)

    # ------------------------------------------------------------------ step
    def fill(
        self,
        batch: Sequence[BatchEntry],
        *,
        row_indices: Sequence[Sequence[int]] | None = None,
        num_rows: int | None = None,
        deadline_s: float | None = None,
    ) -> StepMasks:
        """Masks for one step, synchronously (see `fill_async`). Runs on the calling thread
        (with the fill threads), so a small step pays no hand-off between threads."""
        plan, step, consumer = self._prepare(batch, row_indices, num_rows)
        deadline = Deadline(deadline_s, fixed=True)
        if plan.without_grammar:
            return self._without_grammar(plan, step)
        run = self._executor.begin(plan)
        done = self._run_step(plan, step, run, deadline, consumer)
        masks: StepMasks = self._transfer.join_then_wait(lambda: done, consumer)
        return masks

    def fill_async(
        self,
        batch: Sequence[BatchEntry],
        *,
        row_indices: Sequence[Sequence[int]] | None = None,
        num_rows: int | None = None,
        deadline_s: float | None = None,
    ) -> MaskFuture:
        """Start filling the masks of one step and return at once.

        Each entry is (request id or None for a request without grammar, its draft tokens).
        Call it after the previous step's commits; call `wait()` right before sampling.
        A request whose rows are not filled within `deadline_s` fails alone ("mask deadline
        exceeded"); with process isolation the time counts from when its worker takes the
        step up, so a worker's restart does not eat into it.
        """
        plan, step, consumer = self._prepare(batch, row_indices, num_rows)
        deadline = Deadline(deadline_s)
        future = MaskFuture(self._transfer, consumer, deadline)
        if plan.without_grammar:
            future.finish((self._without_grammar(plan, step), None), None)
            return future
        run = self._executor.begin(plan)
        self._jobs.put((future, plan, step, run, deadline, consumer))
        return future

    def _serve_steps(self) -> None:
        """The step thread: fill_async's steps, one at a time, in order, until close()."""
        while (job := self._jobs.get()) is not None:
            future, plan, step, run, deadline, consumer = job
            try:
                done = self._run_step(plan, step, run, deadline, consumer)
            except BaseException as exc:  # the engine hears it from wait()
                future.finish(None, exc)
            else:
                future.finish(done, None)

    def _prepare(
        self,
        batch: Sequence[BatchEntry],
        row_indices: Sequence[Sequence[int]] | None,
        num_rows: int | None,
    ) -> tuple[StepPlan, int, Any]:
        """The step's plan and number (taken now: the next step may start before this one
        is built), and the consumer stream."""
        plan = StepPlan.build(batch, row_indices, num_rows, max_drafts=self.max_drafts)
        if plan.num_rows > self._transfer.rows:
            raise BatchError(
                f"the step has {plan.num_rows} rows; "
                f"the pool was built for max_rows={self._transfer.rows}"
            )
        self._step += 1
        return plan, self._step, self._transfer.consumer_stream()

    def _without_grammar(self, plan: StepPlan, step: int) -> StepMasks:
        bitmask = self._transfer.device_view(0, plan.num_rows)
        return self._masks(plan, step, bitmask, FillResult(), 0.0)

    def _run_step(
        self, plan: StepPlan, step: int, run: StepRun, deadline: Deadline, consumer: Any
    ) -> tuple[StepMasks, Any]:
        """One step at a time (the step thread's and synchronous fills take turns)."""
        with self._step_lock:
            started = time.perf_counter()
            try:
                slot, host = self._transfer.acquire()
                # the row metadata is found while the fill threads (or processes) fill
                result = run(slot, host, deadline, lambda: plan.metadata)
            finally:
                deadline.mark_started()  # whatever ran (or failed): a helper waits no more
            if result.host is not None:  # late fills may still write into the old slot
                self._transfer.replace_host(slot, result.host)
            bitmask, event = self._transfer.publish(slot, plan.num_rows, consumer)
            seconds = time.perf_counter() - started
            return self._masks(plan, step, bitmask, result, seconds), event

    def _masks(
        self,
        plan: StepPlan,
        step: int,
        bitmask: torch.Tensor,
        result: FillResult,
        fill_seconds: float,
    ) -> StepMasks:
        metadata = plan.metadata
        return StepMasks(
            bitmask=bitmask,
            has_grammar=metadata.has_grammar,
            grammar_rows=metadata.grammar_rows,
            row_to_request=metadata.row_to_request,
            local_step=metadata.local_step,
            is_verify=metadata.is_verify,
            request_ids=plan.request_ids,
            rows=plan.rows,
            valid_rows=tuple(map(result.valid.get, range(len(plan.request_ids)), _NONE_VALID)),
            vocab_size=self.vocab.size,
            step=step,
            failures=result.failures,
            fill_seconds=fill_seconds,
        )

    # ------------------------------------------------------------------ commit
    def commit(self, request_id: RequestId, accepted_tokens: Sequence[int]) -> RequestState:
        """Advance a request by the tokens the sampler accepted; never raises for the request."""
        return self._executor.commit(request_id, accepted_tokens)

    # ------------------------------------------------------------------ lifetime
    def close(self) -> None:
        """Waits for the steps already started, then stops the pool's threads."""
        if self._step_thread.is_alive():
            self._jobs.put(None)
            self._step_thread.join()
        self._executor.close()
        if self._owned_compiler is not None:
            self._owned_compiler.close()

    def __enter__(self) -> MatcherPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
