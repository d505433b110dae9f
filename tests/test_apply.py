"""apply_bitmask against a plain reference, and the engine mistakes it refuses at once."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import grammarmask as gm


def _masks(bitmask: torch.Tensor, grammar_rows: list[int], vocab_size: int) -> gm.StepMasks:
    rows = bitmask.shape[0]
    has_grammar = torch.zeros(rows, dtype=torch.bool)
    has_grammar[grammar_rows] = True
    return gm.StepMasks(
        bitmask=bitmask,
        has_grammar=has_grammar,
        grammar_rows=torch.tensor(grammar_rows, dtype=torch.long),
        row_to_request=torch.arange(rows, dtype=torch.int32),
        local_step=torch.zeros(rows, dtype=torch.int32),
        is_verify=torch.zeros(rows, dtype=torch.bool),
        request_ids=tuple(f"r{i}" for i in range(rows)),
        rows=tuple((i,) for i in range(rows)),
        valid_rows=(1,) * rows,
        vocab_size=vocab_size,
        step=1,
    )


def _reference(
    logits: torch.Tensor, bitmask: torch.Tensor, grammar_rows: list[int]
) -> torch.Tensor:
    out = logits.clone()
    for row in grammar_rows:
        for token in range(logits.shape[1]):
            word = int(bitmask[row, token // 32]) & 0xFFFFFFFF
            if not (word >> (token % 32)) & 1:
                out[row, token] = float("-inf")
    return out


@given(
    rows=st.integers(1, 5),
    vocab=st.integers(1, 200),
    seed=st.integers(0, 2**31),
    dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]),
    data=st.data(),
)
def test_matches_reference_on_random_masks(
    rows: int, vocab: int, seed: int, dtype: torch.dtype, data: st.DataObject
) -> None:
    generator = torch.Generator().manual_seed(seed)
    words = gm.words_per_row(vocab)
    bitmask = torch.randint(
        -(2**31), 2**31 - 1, (rows, words), dtype=torch.int32, generator=generator
    )
    grammar_rows = sorted(data.draw(st.lists(st.integers(0, rows - 1), unique=True)))
    logits = torch.randn(rows, vocab, generator=generator).to(dtype)
    expected = _reference(logits, bitmask, grammar_rows)
    gm.apply_bitmask(logits, _masks(bitmask, grammar_rows, vocab))
    assert torch.equal(logits, expected)


def test_rows_without_grammar_are_untouched() -> None:
    logits = torch.randn(3, 64)
    before = logits.clone()
    gm.apply_bitmask(logits, _masks(torch.zeros(3, 2, dtype=torch.int32), [1], 64))
    assert torch.equal(logits[[0, 2]], before[[0, 2]])
    assert torch.isinf(logits[1]).all()


@pytest.mark.parametrize(
    ("logits", "message"),
    [
        (torch.zeros(2, 65), "logits width 65 differs from the vocabulary width 64"),
        (torch.zeros(3, 64), "logits have 3 rows, the step's masks 2"),
        (torch.zeros(2, 64, dtype=torch.float64), "dtype torch.float64 is not supported"),
        (torch.zeros(2, 64, dtype=torch.int32), "dtype torch.int32 is not supported"),
        (torch.zeros(64, 2).t(), "must be contiguous"),
        (torch.zeros(2, 64, device="meta"), "logits are on meta, the masks on cpu"),
        (torch.zeros(128), "must be 2-D"),
    ],
)
def test_engine_mistakes_raise_at_once(logits: torch.Tensor, message: str) -> None:
    with pytest.raises(gm.ApplyError, match=message):
        gm.apply_bitmask(logits, _masks(torch.zeros(2, 2, dtype=torch.int32), [0], 64))


def test_masked_rows_never_become_nan_after_softmax(deepseek: gm.Vocabulary) -> None:
    """A real step with a forbidden draft: every row, don't-care rows included, keeps a token."""
    with gm.MatcherPool(deepseek, workers=1) as pool:
        pool.add("r", gm.Grammar.regex("[0-9]{2,4}"))
        masks = pool.fill([("r", [18, 25, 24313, 18])])  # "0", "7", then "{\"" is forbidden
    assert masks.valid_rows == (3,)
    logits = torch.randn(5, deepseek.size)
    gm.apply_bitmask(logits, masks)
    assert not torch.isnan(torch.softmax(logits, dim=-1)).any()


def _structured_row(kind: str, words: int, generator: torch.Generator) -> torch.Tensor:
    """Rows like real masks: all allowed, none, almost all (inside a string), almost none
    (a structural position), or random bits."""
    if kind == "random":
        return torch.randint(-(2**31), 2**31 - 1, (words,), dtype=torch.int32, generator=generator)
    row = torch.full((words,), -1 if kind in ("all", "most") else 0, dtype=torch.int32)
    if kind in ("most", "few"):
        for _ in range(3):
            word = int(torch.randint(0, words, (1,), generator=generator))
            bit = int(torch.randint(0, 31, (1,), generator=generator))
            row[word] = row[word] ^ (1 << bit)
    return row


@given(
    kinds=st.lists(
        st.sampled_from(["all", "none", "most", "few", "random"]), min_size=1, max_size=6
    ),
    vocab=st.integers(260, 2100),
    seed=st.integers(0, 2**31),
    dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]),
)
def test_every_kernel_path_matches_reference(
    kinds: list[str], vocab: int, seed: int, dtype: torch.dtype
) -> None:
    generator = torch.Generator().manual_seed(seed)
    words = gm.words_per_row(vocab)
    bitmask = torch.stack([_structured_row(kind, words, generator) for kind in kinds])
    rows = len(kinds)
    logits = torch.randn(rows + 1, vocab, generator=generator).to(dtype)
    grammar_rows = list(range(1, rows + 1))  # row 0 has no grammar
    full_mask = torch.cat([torch.zeros(1, words, dtype=torch.int32), bitmask])
    expected = _reference(logits, full_mask, grammar_rows)
    gm.apply_bitmask(logits, _masks(full_mask, grammar_rows, vocab))
    assert torch.equal(logits, expected)


def test_rows_in_any_order_and_with_gaps_match_reference() -> None:
    """The unpacking path works on runs of consecutive rows: grammar rows given out of order,
    with gaps, and more than one chunk of consecutive rows."""
    generator = torch.Generator().manual_seed(7)
    vocab, rows = 320, 12
    words = gm.words_per_row(vocab)
    bitmask = torch.randint(
        -(2**31), 2**31 - 1, (rows, words), dtype=torch.int32, generator=generator
    )
    grammar_rows = [9, 2, 3, 4, 5, 6, 7, 11, 0]
    for dtype in (torch.float32, torch.bfloat16):
        logits = torch.randn(rows, vocab, generator=generator).to(dtype)
        expected = _reference(logits, bitmask, sorted(grammar_rows))
        gm.apply_bitmask(logits, _masks(bitmask, grammar_rows, vocab))
        assert torch.equal(logits, expected)
