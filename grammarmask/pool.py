"""The matcher pool: per-request grammar state, the step's mask fill, commit, isolation.

The engine's step, seen from here:

    future = pool.fill_async(batch)   # before launching the forward; returns at once
    ...                               # the forward runs while worker threads fill masks
    masks = future.wait()             # just before sampling: joins the CPU work, then
    gm.apply_bitmask(logits, masks)   # the sampler's stream waits on the copy event
    pool.commit(request_id, accepted) # only accepted tokens ever advance a matcher

Every per-request problem (bad grammar, compile timeout, matcher exception, illegal or
out-of-range token, unknown id) fails that request alone: its rows allow only stop tokens
and the reason is kept on its state. Only engine-level mistakes (an inconsistent batch
layout) raise.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from .backends import AUTO, CompiledGrammar, Matcher, words_per_row
from .backends.base import fill_stop_only
from .compiler import GrammarCompiler
from .enforcement import Unenforced
from .errors import GrammarError, GrammarMaskError
from .grammars import Grammar
from .steps import BatchEntry, BatchError, RequestId, StepMasks, StepPlan
from .transfer import CudaOps, DeviceOps, MaskTransfer
from .vocabulary import Vocabulary

Status = Literal["active", "finished", "failed"]


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


@dataclass(eq=False)
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

    def fail(self, reason: str) -> None:
        if self.status != "failed":
            self.status, self.reason = "failed", reason


class MaskFuture:
    """The masks of one step, being filled; `wait` joins and orders the device stream."""

    def __init__(
        self, work: Future[tuple[StepMasks, Any]], transfer: MaskTransfer, consumer: Any
    ) -> None:
        self._work = work
        self._transfer = transfer
        self._consumer = consumer

    def done(self) -> bool:
        return self._work.done()

    def wait(self, timeout: float | None = None) -> StepMasks:
        """Join the CPU fill, then (on a device) make the consumer stream wait on the copy."""
        masks: StepMasks = self._transfer.join_then_wait(
            lambda: self._work.result(timeout=timeout), self._consumer
        )
        return masks


class MatcherPool:
    """Grammar matchers for the requests of one engine, filled on worker threads.

    `workers` threads fill masks (xgrammar releases the GIL); masks are bit-identical for any
    worker count and batch order. backend="auto" serves each grammar with a backend that
    enforces all of it (see GrammarCompiler.submit); `allow_unenforced` opts in to loose
    enforcement for grammars no backend enforces fully. `max_rows` bounds the rows of one
    step: the host (and device) mask buffers are allocated once for it, in a ring of
    `ring_slots` steps.
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
        compile_timeout_s: float = 60.0,
        compiler: GrammarCompiler | None = None,
        device_ops: DeviceOps | None = None,
        allow_unenforced: bool = False,
    ) -> None:
        if isolation != "thread":
            raise ValueError(f"isolation={isolation!r} is not available yet; use 'thread'")
        self.vocab = vocab
        self.backend = backend
        self.workers = workers if workers is not None else min(4, os.cpu_count() or 1)
        if self.workers < 1:
            raise ValueError(f"workers must be at least 1, not {self.workers}")
        self.compile_timeout_s = compile_timeout_s
        self._owns_compiler = compiler is None
        self._compiler = compiler or GrammarCompiler(vocab, timeout_s=compile_timeout_s)
        if backend != AUTO:
            self._compiler.backend(backend)  # fail now on an unknown or missing backend
        self.allow_unenforced = allow_unenforced
        self._words = words_per_row(vocab.size)
        if device_ops is None and device is not None and torch.device(device).type == "cuda":
            device_ops = CudaOps(torch.device(device))
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self._transfer = MaskTransfer(device_ops, max_rows, self._words, ring_slots)
        self._requests: dict[RequestId, _Request] = {}
        self._lock = threading.Lock()
        self._coordinator = ThreadPoolExecutor(1, thread_name_prefix="grammarmask-step")
        self._helpers = (
            ThreadPoolExecutor(self.workers - 1, thread_name_prefix="grammarmask-fill")
            if self.workers > 1
            else None
        )
        self._step = 0
        self._stop_row = torch.zeros(1, self._words, dtype=torch.int32)
        fill_stop_only(self._stop_row, 0, vocab.stop_token_ids)

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
        backend = backend or self.backend
        loose = self.allow_unenforced if allow_unenforced is None else allow_unenforced
        with self._lock:
            if request_id in self._requests:
                raise GrammarMaskError(f"request {request_id!r} is already in the pool")
            request = _Request(
                request_id,
                grammar,
                self._compiler.submit(grammar, backend, allow_unenforced=loose),
                time.monotonic() + self.compile_timeout_s,
                backend=backend,
            )
            self._requests[request_id] = request
        return request.snapshot()

    def remove(self, request_id: RequestId) -> None:
        """Forget a request (finished, failed or cancelled); unknown ids are ignored."""
        with self._lock:
            self._requests.pop(request_id, None)

    def state(self, request_id: RequestId) -> RequestState:
        with self._lock:
            request = self._requests.get(request_id)
        if request is None:
            return RequestState(request_id, "failed", f"unknown request id {request_id!r}")
        with request.lock:
            return request.snapshot()

    def _lookup(self, request_id: RequestId) -> _Request:
        with self._lock:
            request = self._requests.get(request_id)
            if request is None:
                request = _Request(request_id, None, None, 0.0)
                self._requests[request_id] = request
            return request

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
            compiled = request.compiled.result(
                timeout=max(0.0, request.deadline - time.monotonic())
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

    # ------------------------------------------------------------------ step
    def fill(
        self,
        batch: Sequence[BatchEntry],
        *,
        row_indices: Sequence[Sequence[int]] | None = None,
        num_rows: int | None = None,
    ) -> StepMasks:
        """Masks for one step, synchronously (see `fill_async`)."""
        return self.fill_async(batch, row_indices=row_indices, num_rows=num_rows).wait()

    def fill_async(
        self,
        batch: Sequence[BatchEntry],
        *,
        row_indices: Sequence[Sequence[int]] | None = None,
        num_rows: int | None = None,
    ) -> MaskFuture:
        """Start filling the masks of one step and return at once.

        Each entry is (request id or None for a request without grammar, its draft tokens).
        Call it after the previous step's commits; call `wait()` right before sampling.
        """
        plan = StepPlan.build(batch, row_indices, num_rows)
        if plan.num_rows > self._transfer.rows:
            raise BatchError(
                f"the step has {plan.num_rows} rows; "
                f"the pool was built for max_rows={self._transfer.rows}"
            )
        requests = [None if rid is None else self._lookup(rid) for rid in plan.request_ids]
        self._step += 1
        consumer = self._transfer.consumer_stream()
        if all(r is None for r in requests):
            masks = self._masks(plan, self._transfer.device_view(0, plan.num_rows), [], (), {})
            done: Future[tuple[StepMasks, Any]] = Future()
            done.set_result((masks, None))
            return MaskFuture(done, self._transfer, consumer)
        work = self._coordinator.submit(self._run_step, plan, requests, consumer)
        return MaskFuture(work, self._transfer, consumer)

    def _run_step(
        self, plan: StepPlan, requests: list[_Request | None], consumer: Any
    ) -> tuple[StepMasks, Any]:
        started = time.perf_counter()
        slot, host = self._transfer.acquire()
        entries = [i for i, r in enumerate(requests) if r is not None]
        valid = [0] * len(requests)
        failures: dict[RequestId, str] = {}
        chunks = _balanced_chunks(entries, [len(plan.rows[i]) for i in entries], self.workers)

        def fill_chunk(chunk: list[int]) -> None:
            for index in chunk:
                request = requests[index]
                assert request is not None
                valid[index], failure = self._fill_request(
                    request, plan.drafts[index], plan.rows[index], host
                )
                if failure is not None:
                    failures[request.request_id] = failure

        helpers = [self._helpers.submit(fill_chunk, c) for c in chunks[1:]] if self._helpers else []
        if not self._helpers:
            for chunk in chunks[1:]:
                fill_chunk(chunk)
        fill_chunk(chunks[0] if chunks else [])
        for helper in helpers:
            helper.result()
        bitmask, event = self._transfer.publish(slot, plan.num_rows, consumer)
        grammar_rows = [row for i in entries for row in plan.rows[i]]
        masks = self._masks(plan, bitmask, grammar_rows, tuple(valid), failures)
        return dataclasses.replace(masks, fill_seconds=time.perf_counter() - started), event

    def _masks(
        self,
        plan: StepPlan,
        bitmask: torch.Tensor,
        grammar_rows: list[int],
        valid: tuple[int, ...],
        failures: dict[RequestId, str],
    ) -> StepMasks:
        row_to_request, local_step, is_verify = plan.layout()
        has_grammar = torch.zeros(plan.num_rows, dtype=torch.bool)
        has_grammar[grammar_rows] = True
        return StepMasks(
            bitmask=bitmask,
            has_grammar=has_grammar,
            grammar_rows=torch.tensor(grammar_rows, dtype=torch.long),
            row_to_request=row_to_request,
            local_step=local_step,
            is_verify=is_verify,
            request_ids=plan.request_ids,
            rows=plan.rows,
            valid_rows=valid or (0,) * len(plan.request_ids),
            vocab_size=self.vocab.size,
            step=self._step,
            failures=failures,
        )

    def _fill_request(
        self, request: _Request, drafts: tuple[int, ...], rows: tuple[int, ...], host: torch.Tensor
    ) -> tuple[int, str | None]:
        """Fill one request's rows; returns (valid rows, failure reason if it failed now)."""
        with request.lock:
            was_failed = request.status == "failed"
            matcher = None if request.status == "finished" else self._ready_matcher(request)
            if matcher is None:
                host[list(rows)] = self._stop_row
                failed_now = request.status == "failed" and not was_failed
                return 1, (request.reason if failed_now else None)
            try:
                for draft in drafts:
                    self._check_token(draft, "draft")
                accepted = matcher.fill_drafts(host, rows, drafts)
            except Exception as exc:  # isolation: whatever one matcher does stays with it
                request.fail(_fault_reason(exc, "while filling the step's masks"))
                host[list(rows)] = self._stop_row
                return 1, request.reason
            for dont_care in rows[accepted + 1 :]:
                host[dont_care].copy_(host[rows[accepted]])
            return accepted + 1, None

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
        with request.lock:
            if request.status == "failed":
                return request.snapshot()
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
        return torch.equal(row, self._stop_row)

    # ------------------------------------------------------------------ lifetime
    def close(self) -> None:
        self._coordinator.shutdown(wait=True)
        if self._helpers is not None:
            self._helpers.shutdown(wait=True)
        if self._owns_compiler:
            self._compiler.close()

    def __enter__(self) -> MatcherPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _fault_reason(exc: BaseException, where: str) -> str:
    if isinstance(exc, RequestFault):
        return str(exc)
    return f"matcher error {where}: {type(exc).__name__}: {exc}"


def _balanced_chunks(items: list[int], weights: list[int], parts: int) -> list[list[int]]:
    """Split `items` into at most `parts` contiguous runs of similar total weight."""
    if not items:
        return []
    parts = min(parts, len(items))
    total = sum(weights)
    chunks: list[list[int]] = [[] for _ in range(parts)]
    running = 0
    for item, weight in zip(items, weights, strict=True):
        index = min(parts - 1, running * parts // max(total, 1))
        chunks[index].append(item)
        running += weight
    return [c for c in chunks if c]
