"""Applying packed int32 bitmasks to logits rows, in place."""

from __future__ import annotations

import functools

import torch

from .backends.base import words_per_row
from .errors import GrammarMaskError
from .steps import StepMasks

SUPPORTED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


class ApplyError(GrammarMaskError, ValueError):
    """Logits that do not fit the masks: the engine's mistake, raised at once."""


def _check(logits: torch.Tensor, masks: StepMasks) -> None:
    if not isinstance(masks, StepMasks):
        raise ApplyError(
            f"masks must be the StepMasks of a fill, not {type(masks).__name__}; "
            "pass future.wait() or pool.fill(...)"
        )
    if not isinstance(logits, torch.Tensor):
        raise ApplyError(f"logits must be a torch.Tensor, not {type(logits).__name__}")
    bitmask = masks.bitmask
    if bitmask.dtype != torch.int32 or bitmask.shape[1:] != (words_per_row(masks.vocab_size),):
        raise ApplyError(
            f"the bitmask is {bitmask.dtype} {tuple(bitmask.shape)}; masks for a vocabulary "
            f"of {masks.vocab_size} need int32 [rows, {words_per_row(masks.vocab_size)}]"
        )
    if logits.dim() != 2:
        raise ApplyError(f"logits must be 2-D [rows, vocab], got shape {tuple(logits.shape)}")
    if logits.dtype not in SUPPORTED_DTYPES:
        raise ApplyError(
            f"logits dtype {logits.dtype} is not supported; use float32, bfloat16 or float16"
        )
    if logits.shape[0] != masks.num_rows:
        raise ApplyError(f"logits have {logits.shape[0]} rows, the step's masks {masks.num_rows}")
    if logits.shape[1] != masks.vocab_size:
        raise ApplyError(
            f"logits width {logits.shape[1]} differs from the vocabulary width {masks.vocab_size}"
        )
    if logits.device != masks.bitmask.device:
        raise ApplyError(f"logits are on {logits.device}, the masks on {masks.bitmask.device}")
    if not logits.is_contiguous():
        raise ApplyError("logits must be contiguous")


def unpack_rows(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Packed int32 rows -> bool [rows, vocab_size] (True = allowed)."""
    shifts = torch.arange(32, device=bitmask.device, dtype=torch.int32)
    bits = (bitmask.unsqueeze(-1) >> shifts) & 1
    return bits.reshape(bitmask.shape[0], -1)[:, :vocab_size].bool()


def _bit_positions(
    words: torch.Tensor, interesting: torch.Tensor, bit: int, vocab_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(row, token) of every bit equal to `bit` inside the words flagged `interesting`;
    only those words are unpacked."""
    row, word = interesting.nonzero(as_tuple=True)
    shifts = torch.arange(32, device=words.device, dtype=torch.int32)
    bits = (words[row, word].unsqueeze(1) >> shifts) & 1
    hit, offset = (bits == bit).nonzero(as_tuple=True)
    token = word[hit] * 32 + offset
    inside = token < vocab_size
    return row[hit][inside], token[inside]


_FORBIDDEN_BITS = ((torch.arange(256).unsqueeze(1) >> torch.arange(8)) & 1) == 0
"""Row b: for byte value b, True where bit i is clear (token forbidden)."""
_CHUNK_ROWS = 4
"""Rows unpacked at once: their bias (~2 MB for fp32 at 129k tokens) stays in cache."""


@functools.lru_cache(maxsize=16)
def _bias_table(dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Row b: for byte value b, -inf where bit i is clear and +inf where it is set."""
    return torch.where(_FORBIDDEN_BITS, float("-inf"), float("inf")).to(dtype).to(device)


def _apply_unpacked(
    logits: torch.Tensor, rows: torch.Tensor, words: torch.Tensor, vocab: int
) -> None:
    """Rows with no short list either way, in place, a few consecutive rows at a time: each
    mask byte looks up 8 biases (+inf allowed, -inf forbidden) and one `minimum` writes the
    logits slice (min(x, +inf) = x bit for bit; masked_fill_ and where are several times
    slower on CPU). A NaN logit stays NaN."""
    table = _bias_table(logits.dtype, logits.device)
    rows, order = rows.sort()
    words = words[order]
    starts = rows.tolist()
    first = 0
    while first < len(starts):
        last = first + 1
        while (
            last < len(starts)
            and last - first < _CHUNK_ROWS
            and starts[last] == starts[last - 1] + 1
        ):
            last += 1
        packed = words[first:last].contiguous().view(torch.uint8).long()
        bias = torch.nn.functional.embedding(packed, table).view(last - first, -1)
        block = logits[starts[first] : starts[last - 1] + 1]
        torch.minimum(block, bias[:, :vocab], out=block)
        first = last


def apply_bitmask(logits: torch.Tensor, masks: StepMasks) -> None:
    """Set forbidden tokens to -inf in the rows that have a grammar; other rows untouched.

    Never unpacks more than it must. A row that allows almost everything (inside a string)
    gets -inf at its few forbidden tokens, found from its few non-full words; a row that
    forbids almost everything (a structural position) is filled with -inf and its few
    allowed logits restored, found from its few non-zero words; only rows with neither short
    list are unpacked whole, through a byte lookup table.
    """
    _check(logits, masks)
    if masks.grammar_rows.numel() == 0:
        return
    rows = masks.grammar_rows.to(logits.device, non_blocking=True)
    words = masks.bitmask.index_select(0, rows)
    vocab_size = masks.vocab_size
    short = words.shape[1] // 8
    not_full, not_zero = words != -1, words != 0
    sparse = not_full.sum(dim=1) <= short
    dense = ~sparse & (not_zero.sum(dim=1) <= short)
    mixed = ~sparse & ~dense
    if sparse.any():
        row, token = _bit_positions(words[sparse], not_full[sparse], 0, vocab_size)
        minus_inf = torch.tensor(float("-inf"), dtype=logits.dtype, device=logits.device)
        logits.index_put_((rows[sparse][row], token), minus_inf)
    if dense.any():
        dense_rows = rows[dense]
        row, token = _bit_positions(words[dense], not_zero[dense], 1, vocab_size)
        kept = logits[dense_rows[row], token]
        logits.index_fill_(0, dense_rows, float("-inf"))
        logits.index_put_((dense_rows[row], token), kept)
    if mixed.any():
        _apply_unpacked(logits, rows[mixed], words[mixed], vocab_size)
