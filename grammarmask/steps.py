"""One step's row layout and its masks.

A batch entry owns len(drafts) + 1 logits rows: row 0 is sampled after the committed prefix,
row j after drafts[0:j]. By default the rows are packed in batch order (the seed engine's
layout: seqlen_q = 6, 6, 4 gives rows [0..5], [6..11], [12..15]); an engine with another
layout passes explicit row indices, and the masks land where its logits rows are.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy
import torch

from .errors import GrammarMaskError

RequestId = str
BatchEntry = tuple[RequestId | None, Sequence[int]]
"""(request id, draft tokens); a None id is a request without a grammar."""

DEFAULT_MAX_DRAFTS = 16
"""Drafts one entry may carry per step: an engine's speculation depth is configured, and a
longer list is a layout mistake, not something to fill rows for."""


class BatchError(GrammarMaskError, ValueError):
    """A batch whose layout is inconsistent: the engine's mistake, not one request's."""


@dataclass(frozen=True)
class StepPlan:
    """Where each batch entry's rows are, decided on the caller's thread before any fill."""

    request_ids: tuple[RequestId | None, ...]
    drafts: tuple[tuple[int, ...], ...]
    rows: tuple[tuple[int, ...], ...]
    num_rows: int
    packed: bool = False
    """Rows in batch order from row 0 (the default layout): the flat rows are an arange."""

    @classmethod
    def build(
        cls,
        batch: Sequence[BatchEntry],
        row_indices: Sequence[Sequence[int]] | None = None,
        num_rows: int | None = None,
        *,
        max_drafts: int = DEFAULT_MAX_DRAFTS,
    ) -> StepPlan:
        drafts = tuple(_draft_ids(index, entry, max_drafts) for index, entry in enumerate(batch))
        request_ids = tuple(entry[0] for entry in batch)
        named = [r for r in request_ids if r is not None]
        for index, request_id in enumerate(request_ids):
            if not isinstance(request_id, Hashable):
                raise BatchError(
                    f"batch entry {index} has request id {request_id!r}, which cannot be an id "
                    "(not hashable); use the string given to add()"
                )
        if len(set(named)) != len(named):
            duplicate = next(r for r in named if named.count(r) > 1)
            raise BatchError(f"request {duplicate!r} appears twice in one batch")
        if row_indices is None:
            rows, start = [], 0
            for entry_drafts in drafts:
                rows.append(tuple(range(start, start + len(entry_drafts) + 1)))
                start += len(entry_drafts) + 1
            total = start if num_rows is None else num_rows
            if total < start:
                raise BatchError(
                    f"num_rows={num_rows} is smaller than the {start} rows the batch needs"
                )
            return cls(request_ids, drafts, tuple(rows), total, packed=True)
        if len(row_indices) != len(batch):
            raise BatchError(f"{len(row_indices)} row index lists for {len(batch)} batch entries")
        explicit = tuple(tuple(int(i) for i in r) for r in row_indices)
        for index, (entry_rows, entry_drafts) in enumerate(zip(explicit, drafts, strict=True)):
            if len(entry_rows) != len(entry_drafts) + 1:
                raise BatchError(
                    f"batch entry {index} has {len(entry_drafts)} drafts and so needs "
                    f"{len(entry_drafts) + 1} rows, got {len(entry_rows)}"
                )
        flat = [i for r in explicit for i in r]
        total = num_rows if num_rows is not None else (max(flat) + 1 if flat else 0)
        if len(set(flat)) != len(flat):
            raise BatchError("two batch entries claim the same logits row")
        if flat and (min(flat) < 0 or max(flat) >= total):
            raise BatchError(f"row indices must lie in [0, {total})")
        return cls(request_ids, drafts, explicit, total)

    def block(self, rows: tuple[int, ...]) -> slice | None:
        """One entry's rows as a slice when they are a run (see `run_slice`); in the
        default layout they always are, and nothing needs checking."""
        return slice(rows[0], rows[0] + len(rows)) if self.packed else run_slice(rows)

    @functools.cached_property
    def _flat_rows(
        self,
    ) -> tuple[numpy.ndarray[Any, Any], numpy.ndarray[Any, Any], numpy.ndarray[Any, Any]]:
        """Every entry's rows in batch order, the entry each belongs to, and each entry's
        row count (found once: both the layout and the grammar rows read them)."""
        lengths = numpy.array([len(rows) for rows in self.rows], dtype=numpy.int64)
        entry = numpy.repeat(numpy.arange(len(self.rows)), lengths)
        if self.packed:
            return numpy.arange(entry.size), entry, lengths
        flat = numpy.array([row for rows in self.rows for row in rows], dtype=numpy.int64)
        return flat, entry, lengths

    def grammar_rows(self) -> tuple[torch.Tensor, torch.Tensor]:
        """has_grammar (one bool per row) and the rows of entries with a request id, in
        batch order (int64)."""
        rows, entry, _ = self._flat_rows
        named = numpy.array([rid is not None for rid in self.request_ids], dtype=bool)
        picked = rows[named[entry]]
        has_grammar = numpy.zeros(self.num_rows, dtype=bool)
        has_grammar[picked] = True
        return torch.from_numpy(has_grammar), torch.from_numpy(picked)

    def layout(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """row_to_request (-1: no entry), local_step, is_verify; one value per row. Whole-
        array numpy ops: a Python loop over the rows took ~0.15 ms at 384 rows, and torch
        calls cost more than that loop on small steps."""
        rows, entry, lengths = self._flat_rows
        step = numpy.arange(entry.size) - (numpy.cumsum(lengths) - lengths)[entry]
        row_to_request = numpy.full(self.num_rows, -1, dtype=numpy.int32)
        row_to_request[rows] = entry
        local_step = numpy.zeros(self.num_rows, dtype=numpy.int32)
        local_step[rows] = step
        is_verify = numpy.zeros(self.num_rows, dtype=bool)
        is_verify[rows] = step < (lengths - 1)[entry]
        return (
            torch.from_numpy(row_to_request),
            torch.from_numpy(local_step),
            torch.from_numpy(is_verify),
        )


def _draft_ids(index: int, entry: BatchEntry, max_drafts: int) -> tuple[int, ...]:
    """An entry's drafts as token ids; anything that is not an integer is refused rather
    than truncated (int(2.7) would silently try token 2)."""
    if not isinstance(entry, (tuple, list)) or len(entry) != 2:
        raise BatchError(f"batch entry {index} must be a (request id, drafts) pair, not {entry!r}")
    drafts = entry[1]
    if len(drafts) > max_drafts:
        raise BatchError(
            f"batch entry {index} has {len(drafts)} drafts; the pool is configured for at most "
            f"max_drafts={max_drafts}"
        )
    return integer_ids(
        drafts,
        lambda draft: BatchError(
            f"batch entry {index} has draft {draft!r} ({type(draft).__name__}); "
            "drafts must be integer token ids"
        ),
    )


def integer_ids(values: Iterable[Any], refusal: Callable[[Any], Exception]) -> tuple[int, ...]:
    """Token ids; a value that is not an integer raises `refusal(value)` rather than being
    truncated (int(2.7) would silently be token 2)."""
    ids = []
    for value in values:
        try:
            ids.append(operator.index(value))
        except TypeError:
            raise refusal(value) from None
    return tuple(ids)


@dataclass(frozen=True)
class StepMasks:
    """The masks of one step, ready for `apply_bitmask` and draft verification.

    `bitmask` (on the pool's device) rows are meaningful where `has_grammar` is True; rows of
    a request past its `valid_rows` are "don't care" (after the first forbidden draft) but
    never all zero. The row metadata tensors stay on the host: the coordinator thread never
    issues device work besides the side-stream copy.
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


def run_slice(rows: Sequence[int]) -> slice | None:
    """`rows` as a slice when they are consecutive and in order, so one block operation can
    serve them; None otherwise (rows 0, 2, 1, 3 span a block but are not a run)."""
    if not rows:
        return None
    if isinstance(rows, range):  # the pool's own rows: no list to build
        return slice(rows.start, rows.stop) if rows.step == 1 else None
    first = rows[0]
    return (
        slice(first, first + len(rows))
        if list(rows) == list(range(first, first + len(rows)))
        else None
    )
