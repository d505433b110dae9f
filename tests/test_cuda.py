"""The CUDA path, on a machine with a GPU: `pytest -m cuda` (not part of the default run).

The same pool on device="cuda": pinned host ring, side-stream copies and events. Masks on
the device must equal the CPU path's; apply_bitmask on CUDA must equal the CPU result; and
with a slow kernel queued on the sampler's stream every step's masks are its own.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

import grammarmask as gm

pytestmark = pytest.mark.cuda


@pytest.fixture(scope="module")
def cuda() -> torch.device:
    if not torch.cuda.is_available():
        pytest.fail("pytest -m cuda needs a CUDA device")
    return torch.device("cuda")


def _run(
    pool: gm.MatcherPool, vocab: gm.Vocabulary, steps: int, slow_kernel: bool
) -> list[torch.Tensor]:
    text = "constrained decoding on the device keeps the sampler honest"
    table = {t: i for i, t in enumerate(vocab.token_bytes) if len(t) == 1}
    ids = [table[c.encode()] for c in text]
    pool.add("r", gm.Grammar.choice([text]))
    seen = []
    for step in range(steps):
        future = pool.fill_async([("r", ids[step + 1 : step + 3])])
        if slow_kernel:
            torch.cuda._sleep(2_000_000)  # a long "forward" on the sampler's stream
        masks = future.wait()
        seen.append(masks.bitmask.clone())  # queued on the sampler's stream after the wait
        pool.commit("r", [ids[step]])
    torch.cuda.synchronize()
    return [s.cpu() for s in seen]


def test_device_masks_equal_cpu_masks(cuda: torch.device, deepseek: gm.Vocabulary) -> None:
    with gm.MatcherPool(deepseek, workers=1) as cpu_pool:
        expected = _run(cpu_pool, deepseek, 40, slow_kernel=False)
    with gm.MatcherPool(deepseek, workers=2, device=cuda) as pool:
        got = _run(pool, deepseek, 40, slow_kernel=True)
    for step, (e, g) in enumerate(zip(expected, got, strict=True)):
        assert torch.equal(e, g), step


def test_apply_on_cuda_equals_cpu(cuda: torch.device, deepseek: gm.Vocabulary) -> None:
    with gm.MatcherPool(deepseek, workers=1, device=cuda) as pool:
        pool.add("a", gm.Grammar.json())
        pool.add("b", gm.Grammar.regex("[0-9]+"))
        masks = pool.fill([("a", []), (None, []), ("b", [18])])
        assert masks.bitmask.is_cuda
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            logits = torch.randn(masks.num_rows, deepseek.size, device=cuda).to(dtype)
            expected = logits.cpu()
            cpu_masks = dataclasses.replace(masks, bitmask=masks.bitmask.cpu())
            gm.apply_bitmask(expected, cpu_masks)
            gm.apply_bitmask(logits, masks)
            assert torch.equal(logits.cpu(), expected)
