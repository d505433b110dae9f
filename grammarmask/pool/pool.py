"""MatcherPool: the grammar matchers of one engine's requests, and the step's mask fill.

The engine's step, seen from here:

    future = pool.fill_async(batch)   # before launching the forward; returns at once
    ...                               # the forward runs while fill threads build masks
    masks = future.wait()             # just before sampling: joins the CPU work, then
    gm.apply_bitmask(logits, masks)   # the sampler's stream waits on the copy event
    pool.commit(request_id, accepted) # only accepted tokens ever advance a matcher

Every per-request problem (bad grammar, compile timeout, matcher exception, illegal or
out-of-range token, unknown id, a mask past its deadline, a worker process that died)
fails that request alone: its rows allow only stop tokens and the reason is kept on its
state. Only engine-level mistakes (an inconsistent batch layout) raise.
"""

from __future__ import annotations

import itertools
import logging
import os
import queue
import threading
import time
from collections.abc import Iterable, Sequence
from typing import Any, Literal, cast

import torch

from ..backends import AUTO, backend_names, words_per_row
from ..compiler import GrammarCompiler
from ..device.transfer import CudaOps, DeviceOps, MaskTransfer
from ..errors import BatchError, GrammarMaskError
from ..grammars import Grammar
from ..masks import RequestId, StepMasks
from ..vocabulary import Vocabulary
from .future import MaskFuture
from .matchers import BackendFactory, Matchers, StepRun
from .plan import DEFAULT_MAX_DRAFTS, BatchEntry, StepPlan
from .process_matchers import ProcessMatchers
from .requests import RequestState
from .shared_ring import SharedRing
from .step_fill import FillResult
from .sync import StepSync
from .thread_matchers import ThreadMatchers

_logger = logging.getLogger("grammarmask")

_LOGGED_KEPT = 65_536
"""Failed request ids remembered as logged, at most (an engine that never removes its
failed requests must not grow the pool)."""

_READY_POLL_S = 1e-3
_READY_POLL_MAX_S = 20e-3
"""wait_ready looks again after 1 ms, then twice as long each time, up to 20 ms."""

_NONE_VALID = itertools.repeat(0)
"""The valid rows of an entry without an outcome (one without grammar)."""

_Job = tuple[MaskFuture, StepPlan, int, StepRun, StepSync, Any]
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
    to loose enforcement for grammars no backend enforces fully. Each failed request is
    logged once at WARNING on the "grammarmask" logger (its id and reason) unless
    `log_failures` is False (an engine that logs them with its own ids).

    With isolation="process" the constructor returns once every worker process is ready,
    and raises WorkerStartError (within seconds when a worker dies or fails while starting,
    else after `start_timeout_s`) saying what happened. A worker restarted after a crash
    that cannot start is not restarted again: its requests fail saying why, and new
    requests go to the other workers.
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
        compile_memory_bytes: int | None = None,
        start_timeout_s: float = 120.0,
        compiler: GrammarCompiler | None = None,
        backend_factory: BackendFactory | None = None,
        device_ops: DeviceOps | None = None,
        allow_unenforced: bool = False,
        log_failures: bool = True,
    ) -> None:
        """Start the pool (and, with process isolation, its workers).

        Args:
            vocab: the engine's vocabulary; rows are `ceil(vocab.size / 32)` int32 words.
            backend: the default backend of `add` ("xgrammar", "llguidance", "outlines",
                "auto", or a name `backend_factory` gives).
            workers: fill threads or processes (default: min(4, cores)).
            device: where `StepMasks.bitmask` lives ("cpu", "cuda", ...; default CPU).
            isolation: "thread" (matchers in this process) or "process" (in worker
                processes: a crash or a hang ends its requests, not the engine).
            max_rows: the most logits rows one step may have; the mask buffers are sized
                for it.
            ring_slots: steps whose masks may be in flight at once.
            max_drafts: the most drafts one batch entry may carry per step.
            compile_timeout_s: how long a request's grammar may compile before the request
                fails.
            compile_memory_bytes: the memory one compile may take where its backend can be
                ended (None: GrammarCompiler's default, an eighth of the machine).
            start_timeout_s: how long worker processes may take to be ready.
            compiler: a ready GrammarCompiler to share (thread isolation only).
            backend_factory: builds extra backends by name, in each worker process.
            device_ops: the device's copy and apply operations (default: chosen from
                `device`).
            allow_unenforced: serve under "auto" grammars no backend enforces fully, with
                what is left out declared.
            log_failures: log each failed request once at WARNING.
        """
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
        self._log_failures = log_failures
        self._logged: dict[RequestId, None] = {}
        """Failed requests already logged, oldest first."""
        self._words = words_per_row(vocab.size)
        if device_ops is None and device is not None and torch.device(device).type == "cuda":
            device_ops = CudaOps(torch.device(device))
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self._matchers: Matchers
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
            ring = SharedRing(ring_slots, max_rows, self._words, pinned=device_ops is not None)
            self._transfer = MaskTransfer(device_ops, max_rows, self._words, ring_slots, ring.host)
            try:
                self._matchers = ProcessMatchers(
                    vocab,
                    self.workers,
                    ring,
                    compile_timeout_s,
                    backend_factory,
                    start_timeout_s,
                    compile_memory_bytes,
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
                    compile_memory_bytes=compile_memory_bytes,
                    backends=backend_factory(vocab) if backend_factory is not None else None,
                )
            )
            chosen = compiler or self._owned_compiler
            assert chosen is not None
            if backend != AUTO:
                chosen.backend(backend)  # fail now on an unknown or missing backend
            self._transfer = MaskTransfer(device_ops, max_rows, self._words, ring_slots)
            self._matchers = ThreadMatchers(vocab, chosen, compile_timeout_s, self.workers)
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
        return self._noted(
            self._matchers.add(request_id, grammar, backend or self.backend, allow_unenforced=loose)
        )

    def remove(self, request_id: RequestId) -> None:
        """Forget a request (finished, failed or cancelled); unknown ids are ignored. A step
        already started still fills it."""
        self._matchers.remove(request_id)
        self._logged.pop(request_id, None)

    def state(self, request_id: RequestId) -> RequestState:
        """The request's state now (an unknown id: failed, saying so)."""
        return self._noted(self._matchers.state(request_id))

    def wait_ready(
        self, request_ids: Iterable[RequestId], timeout: float | None = None
    ) -> dict[RequestId, RequestState]:
        """The requests' states once none of them is compiling any more, or after `timeout`
        seconds (None: until then; each compilation is bounded by compile_timeout_s). Those
        still compiling at the timeout have readiness "compiling"; `timeout=0` asks which are
        ready now. Never raises for a request: an engine admits the "ready" ones to its
        batch, ends the "failed" ones with their reason and keeps the rest waiting."""
        ids = list(request_ids)
        end = None if timeout is None else time.monotonic() + timeout
        pause = _READY_POLL_S
        while True:
            states = {request_id: self.state(request_id) for request_id in ids}
            if all(state.readiness != "compiling" for state in states.values()):
                return states
            left = None if end is None else end - time.monotonic()
            if left is not None and left <= 0:
                return states
            time.sleep(pause if left is None else min(pause, left))
            pause = min(2 * pause, _READY_POLL_MAX_S)

    @property
    def transfer(self) -> MaskTransfer:
        """The pool's mask buffers and their copy to the device: for tests."""
        return self._transfer

    @property
    def matchers(self) -> ThreadMatchers | ProcessMatchers:
        """Where the matchers live: for monitoring (`ProcessMatchers.pids()`) and tests."""
        return cast(ThreadMatchers | ProcessMatchers, self._matchers)

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
        sync = StepSync(deadline_s, fixed=True)
        if plan.without_grammar:
            return self._without_grammar(plan, step)
        run = self._matchers.begin(plan)
        done = self._run_step(plan, step, run, sync, consumer)
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
        sync = StepSync(deadline_s)
        future = MaskFuture(self._transfer, consumer, sync)
        if plan.without_grammar:
            future.finish((self._without_grammar(plan, step), None), None)
            return future
        run = self._matchers.begin(plan)
        self._jobs.put((future, plan, step, run, sync, consumer))
        return future

    def _serve_steps(self) -> None:
        """The step thread: fill_async's steps, one at a time, in order, until close()."""
        while (job := self._jobs.get()) is not None:
            future, plan, step, run, sync, consumer = job
            try:
                done = self._run_step(plan, step, run, sync, consumer)
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
        self, plan: StepPlan, step: int, run: StepRun, sync: StepSync, consumer: Any
    ) -> tuple[StepMasks, Any]:
        """One step at a time (the step thread's and synchronous fills take turns)."""
        with self._step_lock:
            started = time.perf_counter()
            try:
                slot, host = self._transfer.acquire()
                # the row metadata is found while the fill threads (or processes) fill
                result = run(slot, host, sync, lambda: plan.metadata)
            finally:
                sync.mark_started()  # whatever ran (or failed): a helper waits no more
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
        for request_id, reason in result.failures.items():
            self._log_failure(request_id, reason)
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
        return self._noted(self._matchers.commit(request_id, accepted_tokens))

    def _noted(self, state: RequestState) -> RequestState:
        if state.status == "failed":
            self._log_failure(state.request_id, state.reason or "failed")
        return state

    def _log_failure(self, request_id: RequestId, reason: str) -> None:
        """Log a failed request once (WARNING, its id and reason), as serving engines do."""
        if not self._log_failures or request_id in self._logged:
            return
        self._logged[request_id] = None
        if len(self._logged) > _LOGGED_KEPT:
            del self._logged[next(iter(self._logged))]
        _logger.warning("grammarmask: request %r failed: %s", request_id, reason)

    # ------------------------------------------------------------------ lifetime
    def close(self) -> None:
        """Waits for the steps already started, then stops the pool's threads."""
        if self._step_thread.is_alive():
            self._jobs.put(None)
            self._step_thread.join()
        self._matchers.close()
        if self._owned_compiler is not None:
            self._owned_compiler.close()

    def __enter__(self) -> MatcherPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
