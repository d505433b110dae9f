"""Scenario `overlap`: the fill hidden behind the forward.

`fill_async` fills the step's masks while a stand-in forward releases the GIL; the step
with masks (fill_async, forward, wait) is timed against the forward alone, for two
forwards of the same length:

- a blocking forward: the engine's thread only waits (a sleep), as it waits for a GPU
  forward; what shows is what the pool itself costs the step;
- a torch matmul on one thread: CPU work that shares the machine's caches and memory with
  the fill, so it also slows down beside it (on a GPU the forward does not).

The forward takes 10 ms, or 1.5x the fill alone if that is longer, so that the target
(which holds when the fill is the shorter) applies. One thread, because a GPU forward
keeps at most one CPU thread busy launching kernels; a matmul on every core would leave
none for the fill, which no GPU engine does. The pool fills on the cores the forward leaves
free (at most 4 workers): with a worker on the forward's core too, "the fill alone" would
be timed on more cores than the fill gets beside the forward (2 workers on this 2-core
machine: fill alone 0.53 of the forward, exposed 22 %). A few steps with the matmul are
also recorded as a timeline (fill, forward, wait, apply) for the plot. Each step's row
notes where its time goes, each part over the forward alone: fill_async's own part on the
caller, the forward run beside the fill, and the wait after it.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import time
from collections.abc import Callable

import torch

from ...device.kernels import apply_bitmask
from ...pool import MatcherPool
from .context import Bench, Outcome
from .fill import build_pool
from .report import Target, compare, interleave

TARGET = Target("<=", 1.02)
BASELINE = "forward alone"


def _median_seconds(call: Callable[[], object], times: int = 5) -> float:
    """The median time of `times` calls, to size a forward against what it stands beside."""
    took = []
    for _ in range(times):
        started = time.perf_counter()
        call()
        took.append(time.perf_counter() - started)
    return statistics.median(took)


def stand_in_forward(target_s: float = 0.010) -> Callable[[], torch.Tensor]:
    """A one-thread matmul sized so that one call takes about `target_s` here (median of 5)."""
    size = 256
    while True:
        a = torch.randn(size, size)

        def forward(a: torch.Tensor = a) -> torch.Tensor:
            threads = torch.get_num_threads()
            torch.set_num_threads(1)
            try:
                return a @ a
            finally:
                torch.set_num_threads(threads)

        median = _median_seconds(forward)
        if median >= target_s or size >= 8192:
            return forward
        size = int(size * min(2.0, max(1.1, (target_s / max(median, 1e-6)) ** (1 / 3))))


def _timeline(
    pool: MatcherPool, batch: list[tuple[str, tuple[int, ...]]], forward: Callable[[], object]
) -> list[tuple[int, str, float, float]]:
    spans = []
    logits = torch.randn(sum(len(d) + 1 for _, d in batch), pool.vocab.size)
    origin = time.perf_counter()
    for step in range(3):
        start = time.perf_counter() - origin
        future = pool.fill_async(batch)
        forward()
        forward_end = time.perf_counter() - origin
        masks = future.wait()
        wait_end = time.perf_counter() - origin
        apply_bitmask(logits, masks)
        apply_end = time.perf_counter() - origin
        spans += [
            (step, "fill (worker threads)", start, start + masks.fill_seconds),
            (step, "forward", start, forward_end),
            (step, "wait", forward_end, wait_end),
            (step, "apply", wait_end, apply_end),
        ]
    return spans


def blocking_forward(seconds: float) -> Callable[[], None]:
    """The CPU side of a GPU forward: the engine's thread waits, holding no core and no
    cache (and not the GIL) for `seconds`."""
    return lambda: time.sleep(seconds)


FORWARDS = ("blocking", "CPU matmul")
"""The two stand-in forwards, each a point of the scenario."""
WITH_MASKS = "forward + fill_async + wait"
FILL_ALONE = "fill alone"
REPEATS_PER_REPEAT = 3
"""A step takes ~15 ms, a repeat's five runs ~60 ms: three times the repeats asked for, so
that one slow step does not decide a median of ten."""


def _with_masks(
    pool: MatcherPool,
    batch: list[tuple[str, tuple[int, ...]]],
    forward: Callable[[], object],
    parts: dict[str, list[float]],
) -> Callable[[], None]:
    """A step: fill_async, the forward, wait; each part's seconds go into `parts`."""

    def step() -> None:
        started = time.perf_counter()
        future = pool.fill_async(batch)
        returned = time.perf_counter()
        forward()
        forward_end = time.perf_counter()
        future.wait()
        parts["caller"].append(returned - started)
        parts["forward"].append(forward_end - returned)
        parts["wait"].append(time.perf_counter() - forward_end)

    return step


def run_overlap(bench: Bench) -> Outcome:
    config = bench.config
    requests, drafts = config.pick((4, 2), (64, 5), (64, 5))
    plans = bench.replays("deepseek", requests, drafts)
    workers = min(4, max(1, (os.cpu_count() or 2) - 1))
    pool, batch = build_pool(bench, "deepseek", plans, workers)
    matmul = stand_in_forward(max(0.010, 1.5 * _median_seconds(lambda: pool.fill(batch))))
    forwards = dict(zip(FORWARDS, (blocking_forward(_median_seconds(matmul)), matmul), strict=True))
    repeats = REPEATS_PER_REPEAT * config.repeats
    bench.plan(repeats, "overlap")

    parts: dict[str, dict[str, list[float]]] = {
        kind: {"caller": [], "forward": [], "wait": []} for kind in FORWARDS
    }
    runs: dict[str, Callable[[], object]] = {FILL_ALONE: lambda: pool.fill(batch)}
    for kind, forward in forwards.items():
        runs[f"{kind}: {BASELINE}"] = forward
        runs[f"{kind}: {WITH_MASKS}"] = _with_masks(pool, batch, forward, parts[kind])
    timings = interleave(runs, repeats, bench.rng, bench.tick)
    spans = _timeline(pool, batch, matmul)
    pool.close()
    rows = []
    for kind in FORWARDS:
        alone = statistics.median(timings[f"{kind}: {BASELINE}"])
        shorter = statistics.median(timings[FILL_ALONE]) < alone
        exposed = {  # where the step's extra time goes, each a fraction of the forward alone
            "caller_part": statistics.median(parts[kind]["caller"]) / alone,
            "forward_beside_fill": statistics.median(parts[kind]["forward"]) / alone,
            "wait": statistics.median(parts[kind]["wait"]) / alone,
        }
        point = (
            f"deepseek B={requests} D={drafts}, {workers} worker{'s' if workers > 1 else ''}, "
            f"{kind} forward"
        )
        point_timings = {
            BASELINE: timings[f"{kind}: {BASELINE}"],
            WITH_MASKS: timings[f"{kind}: {WITH_MASKS}"],
            FILL_ALONE: timings[FILL_ALONE],
        }
        rows += [
            dataclasses.replace(r, target=TARGET if shorter else None, extra=exposed)
            if r.variant == WITH_MASKS
            else r
            for r in compare("overlap", point, point_timings, BASELINE)
        ]
    return Outcome(rows, spans)
