"""Scenario `cuda` (`--device cuda`): the fill and apply scenarios on a GPU, and the copy of
the masks on the side stream hidden behind the forward.

- apply: the `apply` scenario with logits and masks on the device; xgrammar's kernel is its
  CUDA/Triton one there.
- copy: a pool with device="cuda" (pinned host ring, side-stream copy, event) against the
  same pool on the host, both with a GPU matmul as the forward: how much of the copy shows.
Without a CUDA device every row says so.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from ...pool import MatcherPool
from .apply import measure_apply
from .context import Bench, Outcome
from .fill import build_pool
from .report import Row, compare, interleave

NO_DEVICE = "no CUDA device"


def _gpu_forward(device: torch.device, target_s: float = 0.010) -> Callable[[], None]:
    """A matmul on the device sized to about `target_s`, synchronized at the end."""
    size = 1024
    while True:
        a = torch.randn(size, size, device=device)
        torch.cuda.synchronize(device)
        started = time.perf_counter()
        a @ a
        torch.cuda.synchronize(device)
        if time.perf_counter() - started >= target_s or size >= 16384:
            break
        size *= 2
    return lambda: (a @ a, None)[1]


def _copy_rows(bench: Bench) -> list[Row]:
    config = bench.config
    device = torch.device("cuda")
    requests, drafts = config.pick((4, 2), (64, 5), (64, 5))
    plans = bench.replays("deepseek", requests, drafts)
    host_pool, batch = build_pool(bench, "deepseek", plans, 2)
    vocab = bench.vocab("deepseek")
    gpu_pool = MatcherPool(
        vocab,
        workers=2,
        device=device,
        compiler=bench.compiler("deepseek"),
        max_rows=sum(len(p.drafts) + 1 for p in plans),
    )
    for index, plan in enumerate(plans):
        gpu_pool.add(f"r{index}", plan.compiled.grammar)
        gpu_pool.commit(f"r{index}", plan.prefix)
    forward = _gpu_forward(device)

    def step(pool: MatcherPool) -> Callable[[], None]:
        def run() -> None:
            future = pool.fill_async(batch)
            forward()
            masks = future.wait()
            masks.bitmask.sum()
            torch.cuda.synchronize(device)

        return run

    runs = {
        "forward + host masks": step(host_pool),
        "forward + device masks (side-stream copy)": step(gpu_pool),
    }
    for run in runs.values():
        run()
    timings = interleave(runs, config.repeats, bench.rng, bench.tick)
    host_pool.close()
    gpu_pool.close()
    return compare(
        "cuda", f"copy, deepseek B={requests} D={drafts}", timings, "forward + host masks"
    )


def run_cuda(bench: Bench) -> Outcome:
    if not torch.cuda.is_available():
        return Outcome(
            [Row("cuda", part, "-", "-", unavailable=NO_DEVICE) for part in ("apply", "copy")]
        )
    bench.plan(3 * bench.config.repeats, "cuda")
    return Outcome(measure_apply(bench, "cuda", "cuda") + _copy_rows(bench))
