"""The masks of one step as the pool hands them to the device and the engine: `StepMasks`
and the per-row metadata beside them. Below both pool/ and device/, which import it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import torch

RequestId = str
"""A request's id in the pool (the engine's own)."""


class RowMetadata(NamedTuple):
    """One value per logits row of a step (grammar_rows: one per row with a grammar)."""

    row_to_request: torch.Tensor
    """The batch entry owning the row; -1 for a row no entry owns."""
    local_step: torch.Tensor
    """The row's position among its entry's rows (0: after the committed prefix)."""
    is_verify: torch.Tensor
    """The row verifies a draft (every row of an entry but its last)."""
    has_grammar: torch.Tensor
    grammar_rows: torch.Tensor
    """The rows of entries with a request id, in batch order (int64)."""


@dataclass(frozen=True)
class StepMasks:
    """The masks of one step, ready for `apply_bitmask` and draft verification.

    `bitmask` (on the pool's device) rows are meaningful where `has_grammar` is True; rows of
    a request past its `valid_rows` are "don't care" (after the first forbidden draft) but
    never all zero. The row metadata tensors stay on the host: the coordinator thread never
    issues device work besides the side-stream copy. Steps with the same layout share them:
    read them, never write into them.
    """

    bitmask: torch.Tensor
    has_grammar: torch.Tensor
    grammar_rows: torch.Tensor
    row_to_request: torch.Tensor
    local_step: torch.Tensor
    is_verify: torch.Tensor
    request_ids: tuple[RequestId | None, ...]
    rows: tuple[tuple[int, ...], ...]
    valid_rows: tuple[int, ...]
    vocab_size: int
    step: int
    failures: dict[RequestId, str] = field(default_factory=dict)
    fill_seconds: float = 0.0
    """CPU time the fill of this step took (on the worker threads, overlapped)."""

    @property
    def num_rows(self) -> int:
        return int(self.bitmask.shape[0])
