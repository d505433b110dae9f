"""The reference sampler: order of operations, seeded streams, draft verification."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from grammarmask.integrations.engine.sampling import (
    SamplingParams,
    processed_probs,
    request_generator,
    verify_drafts,
)

CHI2_CRITICAL_0_001 = {5: 20.515, 7: 24.322}


def test_rejection_sampling_under_masks_keeps_the_masked_target_distribution() -> None:
    vocab = 8
    generator = torch.Generator().manual_seed(1234)
    target = torch.randn(vocab, generator=generator) * 1.5
    allowed = torch.ones(vocab, dtype=torch.bool)
    allowed[[2, 5]] = False  # the grammar forbids two tokens
    masked_target = target.masked_fill(~allowed, float("-inf"))
    rows = torch.stack([masked_target, masked_target])
    q = torch.softmax(torch.randn(vocab, generator=generator), dim=-1)  # an unmasked drafter
    q_masked = q.masked_fill(~allowed, 0.0) / q.masked_fill(~allowed, 0.0).sum()
    trials = 12_000
    counts = torch.zeros(vocab)
    for seed in range(trials):
        draft = int(torch.multinomial(q_masked, 1, generator=request_generator(seed, 0, purpose=9)))
        result = verify_drafts(
            rows,
            [draft],
            SamplingParams(temperature=1.0, seed=seed),
            position=0,
            draft_probs=q[None],
            draft_mask=allowed[None],
        )
        counts[result.tokens[0]] += 1
    expected = torch.softmax(masked_target, dim=-1) * trials
    assert counts[~allowed].sum() == 0
    chi2 = float((((counts - expected) ** 2) / expected)[allowed].sum())
    assert chi2 < CHI2_CRITICAL_0_001[5], chi2


def test_deterministic_drafter_rejection_sampling_is_exact_too() -> None:
    """Prompt-lookup drafts (q one-hot): first token still follows the masked target."""
    vocab = 8
    target = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, 1.5, 0.2, -0.5])
    rows = torch.stack([target, target])
    trials = 8_000
    counts = torch.zeros(vocab)
    for seed in range(trials):
        result = verify_drafts(rows, [5], SamplingParams(seed=seed), position=3)
        counts[result.tokens[0]] += 1
    expected = torch.softmax(target, dim=-1) * trials
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < CHI2_CRITICAL_0_001[7], chi2


def test_greedy_verification_accepts_while_argmax_matches() -> None:
    rows = torch.full((4, 10), -5.0)
    for row, best in enumerate([3, 7, 1, 4]):
        rows[row, best] = 5.0
    result = verify_drafts(rows, [3, 7, 2], SamplingParams(temperature=0), position=0)
    assert (result.accepted, result.tokens) == (2, (3, 7, 1))
    result = verify_drafts(rows, [3, 7, 1], SamplingParams(temperature=0), position=0)
    assert (result.accepted, result.tokens) == (3, (3, 7, 1, 4))


def test_all_masked_row_never_gives_nan() -> None:
    row = torch.full((6,), float("-inf"))
    probs = processed_probs(row, SamplingParams(), fallback_token_ids=[4])
    assert not torch.isnan(probs).any() and probs[4] == 1.0
    result = verify_drafts(row[None], [], SamplingParams(), position=0, fallback_token_ids=[4])
    assert result.tokens == (4,)
    with pytest.raises(ValueError, match="needs fallback"):
        processed_probs(row, SamplingParams())


def test_filters_in_order() -> None:
    logits = torch.log(torch.tensor([0.50, 0.25, 0.15, 0.06, 0.04]))
    probs = processed_probs(logits, SamplingParams(top_p=0.8))
    assert torch.allclose(probs, torch.tensor([0.5, 0.25, 0.15, 0, 0]) / 0.9)
    probs = processed_probs(logits, SamplingParams(top_k=2, top_p=0.8))
    assert torch.allclose(probs, torch.tensor([2 / 3, 1 / 3, 0, 0, 0]))
    probs = processed_probs(logits, SamplingParams(min_p=0.35))
    assert torch.allclose(probs, torch.tensor([2 / 3, 1 / 3, 0, 0, 0]))


def test_repetition_penalty_is_sign_aware() -> None:
    logits = torch.tensor([2.0, -2.0, 1.0])
    params = SamplingParams(temperature=0, repetition_penalty=2.0)
    assert processed_probs(logits, params, previous_tokens=[0]).argmax() == 0  # 2 -> 1 still max
    penalized = processed_probs(torch.tensor([2.0, -2.0, 1.5]), params, previous_tokens=[0])
    assert penalized.argmax() == 2  # 2 -> 1 < 1.5
    soft = processed_probs(logits, SamplingParams(repetition_penalty=2.0), previous_tokens=[1])
    expected = torch.softmax(torch.tensor([2.0, -4.0, 1.0]), dim=-1)
    assert torch.allclose(soft, expected)


@given(seed=st.integers(0, 2**40), position=st.integers(0, 10_000))
def test_streams_depend_only_on_seed_and_position(seed: int, position: int) -> None:
    a = torch.rand(4, generator=request_generator(seed, position))
    b = torch.rand(4, generator=request_generator(seed, position))
    c = torch.rand(4, generator=request_generator(seed, position + 1))
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_sampling_is_independent_of_batch_company() -> None:
    """A request's tokens come from its own stream: the same whoever else is sampled."""
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(0))
    alone = verify_drafts(logits[:1], [], SamplingParams(seed=7), position=11)
    for other_seed in range(5):
        verify_drafts(logits[1:2], [], SamplingParams(seed=other_seed), position=11)
        assert verify_drafts(logits[:1], [], SamplingParams(seed=7), position=11) == alone


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"temperature": -1}, "temperature must be >= 0"),
        ({"top_k": 0}, "top_k must be -1"),
        ({"top_p": 0}, r"top_p must lie in \(0, 1\]"),
        ({"min_p": 1}, r"min_p must lie in \[0, 1\)"),
        ({"repetition_penalty": 0}, "repetition_penalty must be > 0"),
    ],
)
def test_bad_params(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)  # type: ignore[arg-type]


def test_chi2_table_is_what_it_claims() -> None:
    # Wilson-Hilferty approximation of the 0.999 quantile, to guard the constants above.
    for df, value in CHI2_CRITICAL_0_001.items():
        z = 3.0902
        approx = df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3
        assert abs(approx - value) / value < 0.03
