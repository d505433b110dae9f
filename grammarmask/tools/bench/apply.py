"""Scenario `apply`: masking the logits of one step, against one in-place pass over them.

The masks are real: a pool fills B requests x 5 drafts replaying corpus instances, so rows
at structural positions allow few tokens and rows inside strings almost all; a quarter of
the rows have no grammar. Every variant's result is checked bit for bit against the
reference (unpack everything, then where) before timing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
import xgrammar

from ...device.kernels import _apply_tensor_ops, apply_bitmask, unpack_rows
from ...masks import StepMasks
from .context import Bench, Outcome
from .fill import build_pool
from .report import Row, Target, compare, interleave

BASELINE = "one in-place pass (logits.mul_(1.0))"
TARGET = Target("<=", 1.5)


def real_masks(bench: Bench, rows: int, device: str = "cpu") -> StepMasks:
    """`rows` rows of real DeepSeek masks (5 drafts per request), every 4th without grammar."""
    requests = max(1, rows // 6)
    plans = bench.replays("deepseek", requests, 5)
    pool, batch = build_pool(bench, "deepseek", plans, 2)
    entries = [(rid if i % 4 else None, drafts) for i, (rid, drafts) in enumerate(batch)]
    masks = pool.fill(entries)
    pool.close()
    return dataclasses.replace(masks, bitmask=masks.bitmask.clone().to(device))


def reference(logits: torch.Tensor, masks: StepMasks) -> torch.Tensor:
    """The plain definition: every grammar row's forbidden tokens at -inf."""
    allowed = unpack_rows(masks.bitmask, masks.vocab_size)
    allowed[~masks.has_grammar.to(allowed.device)] = True
    return torch.where(
        allowed, logits, torch.tensor(float("-inf"), dtype=logits.dtype, device=logits.device)
    )


def variants(masks: StepMasks, logits: torch.Tensor) -> dict[str, Callable[[], object]]:
    """What masks one step's logits in place: the baseline pass, grammarmask (on CPU also
    its tensor-op path, for the record), xgrammar's kernel (CPU, or CUDA/Triton on a GPU),
    and unpack + masked_fill."""
    indices = masks.grammar_rows.tolist()
    no_grammar = ~masks.has_grammar.to(logits.device).unsqueeze(1)

    def unpack_fill() -> None:
        forbidden = ~unpack_rows(masks.bitmask, masks.vocab_size) & ~no_grammar
        logits.masked_fill_(forbidden, float("-inf"))

    on_cpu = logits.device.type == "cpu"
    kernel = "cpu" if on_cpu else "auto"
    return {
        BASELINE: lambda: logits.mul_(1.0),
        "grammarmask apply_bitmask": lambda: apply_bitmask(logits, masks),
        **(
            {
                "grammarmask tensor ops (its GPU path)": (
                    lambda: _apply_tensor_ops(logits, masks.bitmask, masks.grammar_rows)
                )
            }
            if on_cpu
            else {}
        ),
        f"xgrammar apply_token_bitmask_inplace ({kernel})": lambda: (
            xgrammar.apply_token_bitmask_inplace(
                logits,
                masks.bitmask,
                indices=indices,
                backend=kernel,  # type: ignore[arg-type]
            )
        ),
        "unpack to bool + masked_fill_": unpack_fill,
    }


def measure_apply(bench: Bench, device: str, scenario: str) -> list[Row]:
    """fp32 and bf16 logits [rows, 129280] under the same real masks."""
    config = bench.config
    masks = real_masks(bench, config.pick(12, 384, 384), device)
    sync: Callable[[], None] = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    rows_out: list[Row] = []
    for dtype in (torch.float32, torch.bfloat16):
        generator = torch.Generator().manual_seed(config.seed)
        logits = (
            torch.randn(masks.num_rows, masks.vocab_size, generator=generator).to(dtype).to(device)
        )
        expected = reference(logits, masks)
        runs = variants(masks, logits)
        for name in runs:
            if name == BASELINE:
                continue
            trial = logits.clone()
            variants(masks, trial)[name]()
            if not torch.equal(trial, expected):
                raise RuntimeError(f"{name} differs from the reference on {dtype} logits")

        def timed(run: Callable[[], object]) -> Callable[[], None]:
            def call() -> None:
                run()
                sync()

            return call

        timings = interleave(
            {k: timed(v) for k, v in runs.items()}, config.repeats, bench.rng, bench.tick
        )
        point = f"{str(dtype).removeprefix('torch.')} [{masks.num_rows}, {masks.vocab_size}]"
        for row in compare(scenario, point, timings, BASELINE):
            if row.variant == "grammarmask apply_bitmask":
                row = dataclasses.replace(row, target=TARGET)
            rows_out.append(row)
    return rows_out


def run_apply(bench: Bench) -> Outcome:
    bench.plan(2 * bench.config.repeats, "apply")
    return Outcome(measure_apply(bench, "cpu", "apply"))
