"""Thread isolation: matchers in this process, each step filled by a few fill threads that
claim its requests in turn."""

from __future__ import annotations

import statistics
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import cast

import torch

from ..compiler import GrammarCompiler
from ..masks import RequestId
from ..vocabulary import Vocabulary
from .matchers import StepRun
from .plan import StepPlan
from .requests import RequestTable
from .step_fill import FillResult, StepEntries, StepFill
from .sync import StepSync


class ThreadMode:
    """Chooses, per step, between filling on one thread and on all of them, whichever took
    less time per request in recent steps.

    Where the line falls depends on the machine and on the fills (on two cores, two threads
    cost more than the second core gives when fills are cheap), so both modes are timed and
    every `EXPLORE_EVERY`-th step tries the one not chosen, to follow the traffic. Steps that
    waited for a compilation are not noted: their time says little about fills.
    """

    EXPLORE_EVERY = 16
    WARM_UP = 4
    """Steps of each mode taken in turn before choosing; the first of each is not counted
    (a pool's first steps touch cold matchers)."""
    RECENT = 5
    """Steps of each mode whose median time per request stands for it: a median, because a
    shared machine's speed drifts and a mean follows two slow steps."""

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
        """A step of `requests` took `seconds` in that mode."""
        if requests < 2:
            return
        self._taken[alone] += 1
        if self._taken[alone] == 1:
            return  # cold
        recent = self._recent[alone]
        recent.append(seconds / requests)
        self._per_request[alone] = statistics.median_high(recent)


SETTLING_STEPS = 2 * ThreadMode.WARM_UP
"""Steps a thread-isolated pool takes in both thread modes before it keeps to the faster:
what a benchmark should run untimed first."""

_WIDEN_AFTER_S = 2e-3
"""A step filled on one thread that is still running this long after it started, and twice
what it was expected to take, gets the other fill threads (see StepFill.run): a hanging
matcher must not hold up the rest."""


class ThreadMatchers:
    """The pool's Matchers in this process: a RequestTable (whose add, remove, state and
    commit it serves as its own), and `threads` fill threads that pull each step's requests."""

    def __init__(
        self, vocab: Vocabulary, compiler: GrammarCompiler, compile_timeout_s: float, threads: int
    ) -> None:
        self.table = RequestTable(vocab, compiler, compile_timeout_s)
        self.add, self.remove = self.table.add, self.table.remove
        self.state, self.commit = self.table.state, self.table.commit
        self._threads = threads
        self.fill_threads = ThreadPoolExecutor(threads, thread_name_prefix="grammarmask-fill")
        """Replaced when a late step leaves threads stuck in matcher calls (see `_renew`)."""
        self.mode = ThreadMode()

    def begin(self, plan: StepPlan) -> StepRun:
        ids = plan.request_ids
        named = (  # the ids alone: the step's entries are built on the fill thread
            cast(tuple[RequestId, ...], ids)
            if None not in ids
            else [rid for rid in ids if rid is not None]
        )
        requests = self.table.lookup(named)

        def run(
            slot: int, host: torch.Tensor, sync: StepSync, meanwhile: Callable[[], object]
        ) -> FillResult:
            step = StepFill(self.table, StepEntries.of_plan(plan), requests)
            alone = self._threads == 1 or self.mode.alone(step.requests)
            widen = max(_WIDEN_AFTER_S, 2 * self.mode.alone_seconds(step.requests))
            started = time.perf_counter()
            result = step.run(
                host,
                sync,
                self.fill_threads,
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
        stuck = self.fill_threads
        self.fill_threads = ThreadPoolExecutor(self._threads, thread_name_prefix="grammarmask-fill")
        stuck.shutdown(wait=False, cancel_futures=True)

    def close(self) -> None:
        """Does not wait: a fill that hangs past its deadline must not hang `close` too."""
        self.fill_threads.shutdown(wait=False, cancel_futures=True)
