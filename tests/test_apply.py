"""apply_bitmask against a plain reference, and the engine mistakes it refuses at once."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator
from unittest import mock

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import grammarmask as gm
from grammarmask.device import kernels
from grammarmask.device.kernels import unpack_rows


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


PATHS = ["compiled", "tensor ops"]
"""apply_bitmask's two ways on CPU: the compiled kernel, and the tensor ops GPUs run
(which CPU falls back to when the kernel is not built)."""


@contextlib.contextmanager
def _on(path: str) -> Iterator[None]:
    if path == "compiled":
        assert kernels._native is not None, "the compiled kernel is not built"
        yield
    else:
        with mock.patch.object(kernels, "_native", None):
            yield


def test_the_compiled_kernel_is_built() -> None:
    """`pip install` builds it wherever a C compiler is (setup.py); without it, CPU apply
    falls back to tensor ops, several times slower: CI must notice."""
    assert kernels._native is not None


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


@pytest.mark.parametrize("path", PATHS)
@given(
    rows=st.integers(1, 5),
    vocab=st.integers(1, 200),
    seed=st.integers(0, 2**31),
    dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]),
    data=st.data(),
)
def test_matches_reference_on_random_masks(
    path: str, rows: int, vocab: int, seed: int, dtype: torch.dtype, data: st.DataObject
) -> None:
    generator = torch.Generator().manual_seed(seed)
    words = gm.words_per_row(vocab)
    bitmask = torch.randint(
        -(2**31), 2**31 - 1, (rows, words), dtype=torch.int32, generator=generator
    )
    grammar_rows = sorted(data.draw(st.lists(st.integers(0, rows - 1), unique=True)))
    logits = torch.randn(rows, vocab, generator=generator).to(dtype)
    expected = _reference(logits, bitmask, grammar_rows)
    with _on(path):
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


@pytest.mark.parametrize("path", PATHS)
@given(
    kinds=st.lists(
        st.sampled_from(["all", "none", "most", "few", "random"]), min_size=1, max_size=6
    ),
    vocab=st.integers(260, 2100),
    seed=st.integers(0, 2**31),
    dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]),
)
def test_every_kernel_path_matches_reference(
    path: str, kinds: list[str], vocab: int, seed: int, dtype: torch.dtype
) -> None:
    generator = torch.Generator().manual_seed(seed)
    words = gm.words_per_row(vocab)
    bitmask = torch.stack([_structured_row(kind, words, generator) for kind in kinds])
    rows = len(kinds)
    logits = torch.randn(rows + 1, vocab, generator=generator).to(dtype)
    grammar_rows = list(range(1, rows + 1))  # row 0 has no grammar
    full_mask = torch.cat([torch.zeros(1, words, dtype=torch.int32), bitmask])
    expected = _reference(logits, full_mask, grammar_rows)
    with _on(path):
        gm.apply_bitmask(logits, _masks(full_mask, grammar_rows, vocab))
    assert torch.equal(logits, expected)


@pytest.mark.parametrize("path", PATHS)
def test_rows_in_any_order_and_with_gaps_match_reference(path: str) -> None:
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
        with _on(path):
            gm.apply_bitmask(logits, _masks(bitmask, grammar_rows, vocab))
        assert torch.equal(logits, expected)


_SPECIALS = [float("nan"), float("inf"), float("-inf"), -0.0]


def _bits(tensor: torch.Tensor) -> torch.Tensor:
    """The raw bits: NaN payloads and the sign of zero compare too."""
    return tensor.view(torch.int32 if tensor.element_size() == 4 else torch.int16)


def _plain(logits: torch.Tensor, bitmask: torch.Tensor, grammar_rows: list[int]) -> torch.Tensor:
    """The definition, unpacked whole: where(allowed, logits, -inf) on the grammar rows."""
    allowed = unpack_rows(bitmask, logits.shape[1])
    masked = torch.where(allowed, logits, torch.tensor(float("-inf"), dtype=logits.dtype))
    out = logits.clone()
    out[grammar_rows] = masked[grammar_rows]
    return out


def _kind_row(kind: str, words: int, vocab: int, generator: torch.Generator) -> torch.Tensor:
    """One mask row like the real ones (see _structured_row), or half of the words set, or
    runs of whole forbidden words; the bits past the vocabulary are random junk."""
    if kind == "half":
        row = torch.where(torch.rand(words, generator=generator) < 0.5, -1, 0).to(torch.int32)
    elif kind == "runs":
        row = torch.full((words,), -1, dtype=torch.int32)
        start = int(torch.randint(0, words, (1,), generator=generator))
        row[start : start + 3] = 0
        row[-1] ^= 1 << 7
    else:
        row = _structured_row(kind, words, generator)
    if vocab % 32:
        junk = int(torch.randint(0, 2**31 - 1, (1,), generator=generator)) << (vocab % 32)
        row[-1] = (int(row[-1]) & ((1 << (vocab % 32)) - 1)) | (junk & 0x7FFFFFFF)
    return row


@pytest.mark.parametrize("path", PATHS)
@given(
    kinds=st.lists(
        st.sampled_from(["all", "none", "most", "few", "random", "half", "runs", "copy"]),
        min_size=1,
        max_size=8,
    ),
    vocab=st.integers(1, 5000),
    seed=st.integers(0, 2**31),
    dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]),
    data=st.data(),
)
def test_every_path_matches_the_definition_bit_for_bit(
    path: str, kinds: list[str], vocab: int, seed: int, dtype: torch.dtype, data: st.DataObject
) -> None:
    """Any mix of rows (duplicates included: "copy" repeats an earlier row), junk bits
    past the vocabulary, NaN/inf/-0.0 logits: allowed logits keep their bits, forbidden
    ones become -inf, rows without a grammar stay as they were."""
    generator = torch.Generator().manual_seed(seed)
    words = gm.words_per_row(vocab)
    rows: list[torch.Tensor] = []
    for kind in kinds:
        if kind == "copy" and rows:
            rows.append(rows[data.draw(st.integers(0, len(rows) - 1))].clone())
        else:
            rows.append(_kind_row("random" if kind == "copy" else kind, words, vocab, generator))
    bitmask = torch.stack(rows)
    grammar_rows = sorted(data.draw(st.lists(st.integers(0, len(rows) - 1), unique=True)))
    logits = torch.randn(len(rows), vocab, generator=generator).to(dtype)
    specials = torch.randint(0, len(_SPECIALS), (len(rows), vocab), generator=generator)
    where = torch.rand(len(rows), vocab, generator=generator) < 0.05
    for index, value in enumerate(_SPECIALS):
        logits[where & (specials == index)] = value
    expected = _plain(logits, bitmask, grammar_rows)
    with _on(path):
        gm.apply_bitmask(logits, _masks(bitmask, grammar_rows, vocab))
    assert torch.equal(_bits(logits), _bits(expected))


def test_rows_at_the_path_thresholds_take_each_path_and_match() -> None:
    """Rows whose sampled words put them exactly at, and one sample past, each cost
    threshold: every path is taken and each matches the definition."""
    vocab = 64 * 32 * 10  # ten sampled words per row
    words = gm.words_per_row(vocab)
    stride, width = kernels._SAMPLE_STRIDE, 10
    per_sample = kernels._EXTRACT_COST / width
    dense_at = int((kernels._WHOLE_COST - kernels._FILL_COST) / per_sample)
    sparse_at = int(kernels._WHOLE_COST / per_sample)

    def row(sampled: int, base: int) -> torch.Tensor:
        out = torch.full((words,), base, dtype=torch.int32)
        out[: sampled * stride : stride] = ~base  # set (or clear) whole sampled words
        out[1] ^= 1 << 5  # an unsampled word that differs too
        return out

    bitmask = torch.stack(
        [row(dense_at, 0), row(dense_at + 1, 0), row(sparse_at, -1), row(sparse_at + 1, -1)]
    )
    sparse, dense, whole = kernels._classify(bitmask, torch.arange(4))
    assert dense.tolist() == [True, False, False, False]
    assert sparse.tolist() == [False, False, True, False]
    assert whole.tolist() == [False, True, False, True]
    generator = torch.Generator().manual_seed(3)
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        logits = torch.randn(4, vocab, generator=generator).to(dtype)
        expected = _plain(logits, bitmask, [0, 1, 2, 3])
        with _on("tensor ops"):
            gm.apply_bitmask(logits, _masks(bitmask, [0, 1, 2, 3], vocab))
        assert torch.equal(_bits(logits), _bits(expected))


def test_rows_sharing_a_hash_but_not_their_words_keep_their_own_masks() -> None:
    """Rows that differ only outside the hashed sample share a hash: each keeps its own
    mask, and a true duplicate of the second still shares the second's expansion."""
    first = torch.zeros(4 * kernels._HASH_STRIDE, dtype=torch.int32)
    second = first.clone()
    second[2] = 0x10  # in the second 64-bit group, which is not sampled
    bitmask = torch.stack([first, second, second])
    assert kernels._duplicates(bitmask) == {0: [0], 1: [1, 2]}
    vocab = bitmask.shape[1] * 32
    logits = torch.randn(3, vocab)
    expected = _plain(logits, bitmask, [0, 1, 2])
    with _on("tensor ops"), mock.patch.object(kernels, "_classify", _all_whole):
        gm.apply_bitmask(logits, _masks(bitmask, [0, 1, 2], vocab))
    assert torch.equal(_bits(logits), _bits(expected))


def _all_whole(
    bitmask: torch.Tensor, rows: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    none = torch.zeros(rows.shape[0], dtype=torch.bool)
    return none, none, ~none


@given(
    words=st.lists(
        st.lists(st.integers(-(2**31), 2**31 - 1), min_size=1, max_size=9),
        min_size=1,
        max_size=4,
    ),
    vocab_cut=st.integers(0, 31),
    unpack_below=st.sampled_from([0, 3, 1024]),
    max_rounds=st.sampled_from([1, 6, 70]),
)
def test_bit_positions_match_a_plain_unpack(
    words: list[list[int]], vocab_cut: int, unpack_below: int, max_rounds: int
) -> None:
    """The lowest-bit rounds and the unpack of what they leave find exactly the set bits
    (bit 31 and bit 63 of a group included), whatever the split between them; bits past
    the vocabulary are never reported."""
    width = max(len(row) for row in words)
    bitmask = torch.tensor([row + [-1] * (width - len(row)) for row in words], dtype=torch.int32)
    vocab = max(1, width * 32 - vocab_cut)
    bitmask = bitmask[:, : gm.words_per_row(vocab)].contiguous()
    rows = torch.arange(bitmask.shape[0]) * 5 + 1  # logits rows with gaps
    allowed = unpack_rows(bitmask, vocab)
    expected = (rows.unsqueeze(1) * vocab + torch.arange(vocab))[allowed]
    with (
        mock.patch.object(kernels, "_UNPACK_BELOW", unpack_below),
        mock.patch.object(kernels, "_MAX_ROUNDS", max_rounds),
    ):
        found = kernels._positions(bitmask.clone(), rows, vocab)
    assert torch.equal(found.sort().values, expected)


def _zero_bits_rows(vocab: int) -> torch.Tensor:
    """Row k: every word with k zero bits (k = 0..32, spread over the word), so each of the
    kernel's per-word cases (skip, store at up to 3 zero bits, select, all -inf) and the
    boundaries between them are hit."""
    words = gm.words_per_row(vocab)
    out = torch.empty(33, words, dtype=torch.int32)
    for zeros in range(33):
        for word in range(words):
            value = 0xFFFFFFFF
            for i in range(zeros):
                value &= ~(1 << ((word * 7 + 11 * i) % 32))  # 11 is prime to 32: distinct
            out[zeros, word] = value - (1 << 32) if value >= 1 << 31 else value
    return out


@pytest.mark.parametrize("vocab", [32 * 40, 32 * 40 - 5])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_each_count_of_zero_bits_per_word_matches_the_definition(
    vocab: int, dtype: torch.dtype
) -> None:
    bitmask = _zero_bits_rows(vocab)
    generator = torch.Generator().manual_seed(5)
    logits = torch.randn(bitmask.shape[0], vocab, generator=generator).to(dtype)
    grammar_rows = list(range(bitmask.shape[0]))
    expected = _plain(logits, bitmask, grammar_rows)
    with _on("compiled"):
        gm.apply_bitmask(logits, _masks(bitmask, grammar_rows, vocab))
    assert torch.equal(_bits(logits), _bits(expected))


@given(
    rows=st.integers(1, 40),
    threads=st.integers(1, 9),
    vocab=st.integers(1, 700),
    seed=st.integers(0, 2**31),
    data=st.data(),
)
def test_the_compiled_kernel_on_any_thread_count_matches_the_definition(
    rows: int, threads: int, vocab: int, seed: int, data: st.DataObject
) -> None:
    """Rows are handed out to up to `threads` threads: each listed row is masked once,
    whichever thread takes it, and no other row is touched."""
    assert kernels._native is not None
    generator = torch.Generator().manual_seed(seed)
    words = gm.words_per_row(vocab)
    kinds = data.draw(
        st.lists(
            st.sampled_from(["all", "none", "most", "few", "random"]), min_size=rows, max_size=rows
        )
    )
    bitmask = torch.stack([_kind_row(kind, words, vocab, generator) for kind in kinds])
    grammar_rows = data.draw(st.lists(st.integers(0, rows - 1), unique=True))
    logits = torch.randn(rows, vocab, generator=generator)
    expected = _plain(logits, bitmask, grammar_rows)
    kernels._native.apply_rows(
        logits.view(torch.int32).numpy(),
        bitmask.numpy(),
        np.array(grammar_rows, dtype=np.int64),
        kernels._minus_inf_bits(torch.float32),
        threads,
    )
    assert torch.equal(_bits(logits), _bits(expected))


def _native_call(**change: object) -> None:
    """The compiled kernel on a valid 4 x 64 fp32 step, with one argument replaced."""
    assert kernels._native is not None
    arguments: dict[str, object] = {
        "logits": np.zeros((4, 64), dtype=np.int32),
        "bitmask": np.zeros((4, 2), dtype=np.int32),
        "rows": np.array([0, 3], dtype=np.int64),
        "minus_inf": kernels._minus_inf_bits(torch.float32),
        "threads": 2,
    }
    arguments.update(change)
    kernels._native.apply_rows(*arguments.values())


def test_the_compiled_kernel_takes_a_valid_call() -> None:
    logits = np.ones((4, 64), dtype=np.int32)
    _native_call(logits=logits)
    assert (logits[[0, 3]] == kernels._minus_inf_bits(torch.float32)).all()
    assert (logits[[1, 2]] == 1).all()


@pytest.mark.parametrize(
    ("change", "error", "message"),
    [
        ({"rows": np.array([0, 4], dtype=np.int64)}, IndexError, "row 4 is outside the 4"),
        ({"rows": np.array([-1], dtype=np.int64)}, IndexError, "row -1 is outside"),
        ({"rows": np.array([0], dtype=np.int32)}, ValueError, "rows has 4-byte items"),
        ({"bitmask": np.zeros((4, 3), dtype=np.int32)}, ValueError, r"bitmask \[4, 3\] does"),
        ({"bitmask": np.zeros((3, 2), dtype=np.int32)}, ValueError, r"bitmask \[3, 2\] does"),
        ({"logits": np.zeros((4, 64), dtype=np.float64)}, ValueError, "8-byte items"),
        ({"logits": np.zeros(256, dtype=np.int32)}, ValueError, "logits must be 2-D"),
        ({"logits": np.zeros((64, 4), dtype=np.int32).T}, ValueError, "not C-contiguous"),
        ({"logits": b"\0" * 1024}, BufferError, "not writable"),
    ],
)
def test_the_compiled_kernel_refuses_what_does_not_fit_and_writes_nothing(
    change: dict[str, object], error: type[Exception], message: str
) -> None:
    """Its own checks stand behind apply_bitmask's: nothing is written out of bounds, and
    a refused call leaves the logits as they were."""
    logits = change.setdefault("logits", np.ones((4, 64), dtype=np.int32))
    before = bytes(logits) if isinstance(logits, bytes) else np.array(logits, copy=True)
    with pytest.raises(error, match=message):
        _native_call(**change)
    if isinstance(logits, np.ndarray):
        assert np.array_equal(logits, before)


def test_without_the_compiled_kernel_apply_says_so_and_still_masks() -> None:
    """An install without a C compiler: a warning names the missing kernel, and CPU apply
    runs the tensor-op path."""
    script = (
        "import sys; sys.modules['grammarmask.device._maskkernel'] = None\n"
        "import torch, grammarmask as gm\n"
        "from grammarmask.device import kernels\n"
        "assert kernels._native is None\n"
        "logits = torch.zeros(1, 40)\n"
        "masks = gm.StepMasks(bitmask=torch.tensor([[5, 0]], dtype=torch.int32),"
        " has_grammar=torch.ones(1, dtype=torch.bool), grammar_rows=torch.tensor([0]),"
        " row_to_request=torch.zeros(1, dtype=torch.int32),"
        " local_step=torch.zeros(1, dtype=torch.int32), is_verify=torch.zeros(1, dtype=torch.bool),"
        " request_ids=('r',), rows=((0,),), valid_rows=(1,), vocab_size=40, step=1)\n"
        "gm.apply_bitmask(logits, masks)\n"
        "print(torch.isfinite(logits[0]).nonzero().flatten().tolist())\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True
    )
    assert "grammarmask.device._maskkernel is not built" in result.stderr
    assert result.stdout.strip() == "[0, 2]"
