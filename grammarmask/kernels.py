"""Applying packed int32 bitmasks to logits rows, in place."""

from __future__ import annotations

import torch

from .errors import GrammarMaskError
from .steps import StepMasks

SUPPORTED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


class ApplyError(GrammarMaskError, ValueError):
    """Logits that do not fit the masks: the engine's mistake, raised at once."""


def _check(logits: torch.Tensor, masks: StepMasks) -> None:
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


def apply_bitmask(logits: torch.Tensor, masks: StepMasks) -> None:
    """Set forbidden tokens to -inf in the rows that have a grammar; other rows untouched."""
    _check(logits, masks)
    if masks.grammar_rows.numel() == 0:
        return
    rows = masks.grammar_rows.to(logits.device, non_blocking=True)
    allowed = unpack_rows(masks.bitmask.index_select(0, rows), masks.vocab_size)
    selected = logits.index_select(0, rows)
    selected.masked_fill_(~allowed, float("-inf"))
    logits.index_copy_(0, rows, selected)
