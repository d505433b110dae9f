"""Invariant 5 (CUDA ordering), on a simulated device whose copies and kernels run late.

Over many steps, the masks a "kernel" on the sampler's stream reads must be exactly those of
its own step. Removing any one of the three ordering rules must make that fail.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
import torch
from conftest import ids_in_row
from faults import HANG_S, faulty_backends
from simdevice import SimDevice

import grammarmask as gm

SENTENCES = {
    "r1": "grammar masks keep every sampled token inside the language of the request",
    "r2": "quick brown foxes jump over lazy dogs while the copy stream lags behind",
    "r3": "seven wizards vexed by jumping quarks find a zebra in the equation",
}
STEPS = 60


def _single_char_ids(vocab: gm.Vocabulary, text: str) -> list[int]:
    table = {token: i for i, token in enumerate(vocab.token_bytes) if len(token) == 1}
    return [table[ch.encode()] for ch in text]


def _run_engine(
    pool: gm.MatcherPool, vocab: gm.Vocabulary, device: SimDevice | None
) -> list[torch.Tensor]:
    """An overlapped engine loop: the CPU never waits for the device."""
    for rid, text in SENTENCES.items():
        pool.add(rid, gm.Grammar.choice([text]))
    tokens = {rid: _single_char_ids(vocab, text) for rid, text in SENTENCES.items()}
    seen: list[Any] = [None] * STEPS
    for step in range(STEPS):
        future = pool.fill_async([(rid, []) for rid in SENTENCES])
        if device is not None:
            device.main.enqueue(lambda: time.sleep(0.002))  # the forward
        masks = future.wait()

        def kernel(view: torch.Tensor = masks.bitmask, step: int = step) -> None:
            seen[step] = view.clone()

        if device is None:
            kernel()
        else:
            device.main.enqueue(kernel)
        for rid, ids in tokens.items():
            assert pool.commit(rid, [ids[step]]).status == "active"
    if device is not None:
        device.main.synchronize()
    return seen


@pytest.fixture(scope="module")
def expected(deepseek: gm.Vocabulary) -> list[torch.Tensor]:
    with gm.MatcherPool(deepseek, workers=1) as pool:
        masks = _run_engine(pool, deepseek, None)
    distinct = sum(not torch.equal(a, b) for a, b in zip(masks, masks[2:], strict=False))
    assert distinct > STEPS // 2  # steps are told apart by their masks
    return masks


def _mismatches(
    deepseek: gm.Vocabulary,
    expected: list[torch.Tensor],
    seed: int,
    broken: str | None,
    monkeypatch: pytest.MonkeyPatch,
) -> int:
    device = SimDevice(seed)
    pool = gm.MatcherPool(deepseek, workers=2, device_ops=device, max_rows=8)
    transfer = pool.transfer
    if broken == "join before wait":

        def wait_first(join: Any, consumer: Any) -> Any:
            event = transfer._copied[
                (transfer._next - 1) % 2
            ]  # the slot's event, not yet re-recorded
            transfer.make_wait(consumer, event)
            return join()[0]

        monkeypatch.setattr(transfer, "join_then_wait", wait_first)
    elif broken == "host slot free":
        monkeypatch.setattr(transfer, "wait_host_free", lambda slot: None)
    elif broken == "device slot free":
        monkeypatch.setattr(transfer, "order_after_consumers", lambda consumer: None)
    try:
        seen = _run_engine(pool, deepseek, device)
    finally:
        pool.close()
        device.close()
    assert device.copies == STEPS
    return sum(not torch.equal(s, e) for s, e in zip(seen, expected, strict=True))


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_masks_applied_are_always_those_of_their_step(
    deepseek: gm.Vocabulary,
    expected: list[torch.Tensor],
    seed: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert _mismatches(deepseek, expected, seed, None, monkeypatch) == 0


@pytest.mark.parametrize("broken", ["join before wait", "host slot free", "device slot free"])
def test_removing_any_ordering_rule_breaks_it(
    deepseek: gm.Vocabulary,
    expected: list[torch.Tensor],
    broken: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert _mismatches(deepseek, expected, 7, broken, monkeypatch) > 0


def test_ring_needs_two_slots() -> None:
    with pytest.raises(ValueError, match="at least 2 slots"):
        gm.MatcherPool(gm.Vocabulary([b"a", b""], stop_token_ids=[1]), ring_slots=1)


def test_a_step_closed_at_its_deadline_moves_to_a_new_host_slot(deepseek: gm.Vocabulary) -> None:
    """On a device too: the hung fill of a late request writes, when it comes back, into
    the host slot it was given; the step took a new one from the device's allocator (pinned
    on CUDA), so its device masks keep the late request fail-closed and later steps, which
    reuse the slots, are untouched."""
    device = SimDevice(5)
    pool = gm.MatcherPool(
        deepseek, workers=2, device_ops=device, max_rows=8, backend_factory=faulty_backends
    )
    try:
        pool.add("ok", gm.Grammar.json())
        pool.add("late", gm.Grammar.json(), backend="faulty-hang")
        first = pool.fill([("ok", [])])
        device.main.synchronize()  # the copy has run
        want = first.bitmask.clone()
        slots = list(pool.transfer.host_slots)
        got = pool.fill_async([("late", []), ("ok", [])]).wait(timeout=0.5)
        device.main.synchronize()
        assert got.failures == {"late": "mask deadline exceeded"}
        assert ids_in_row(got.bitmask[0], deepseek.size) == set(deepseek.stop_token_ids)
        assert torch.equal(got.bitmask[1], want[0])
        replaced = [a is not b for a, b in zip(slots, pool.transfer.host_slots, strict=True)]
        assert sum(replaced) == 1
        time.sleep(HANG_S + 0.5)  # the hung fill comes back and writes into the old slot
        for _ in range(2):
            later = pool.fill([("ok", [])])
            device.main.synchronize()
            assert torch.equal(later.bitmask[0], want[0])
    finally:
        pool.close()
        device.close()
