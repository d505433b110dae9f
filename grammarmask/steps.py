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
from typing import Any, NamedTuple, NoReturn

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
        request_ids: list[RequestId | None] = []
        draft_lists: list[tuple[int, ...]] = []
        packed_rows: list[tuple[int, ...]] = []
        start = 0
        # one pass, no call per entry on the usual path: fill_async's caller waits for it
        # (and meets it with the caches cold after a forward: ~4x its warm cost)
        for index, entry in enumerate(batch):
            if not isinstance(entry, (tuple, list)) or len(entry) != 2:
                raise BatchError(
                    f"batch entry {index} must be a (request id, drafts) pair, not {entry!r}"
                )
            request_id, given = entry
            try:
                ids = tuple(map(operator.index, given))
            except TypeError:
                _refuse_drafts(index, given)
            if len(ids) > max_drafts:
                raise BatchError(
                    f"batch entry {index} has {len(ids)} drafts; the pool is configured for "
                    f"at most max_drafts={max_drafts}"
                )
            if type(request_id) is not str and not isinstance(request_id, Hashable | None):
                raise BatchError(
                    f"batch entry {index} has request id {request_id!r}, which cannot be an id "
                    "(not hashable); use the string given to add()"
                )
            request_ids.append(request_id)
            draft_lists.append(ids)
            end = start + len(ids) + 1
            packed_rows.append(tuple(range(start, end)))  # the default layout's
            start = end
        unnamed = request_ids.count(None)
        if len(set(request_ids)) != len(request_ids) - unnamed + (unnamed > 0):
            named = [r for r in request_ids if r is not None]
            duplicate = next(r for r in named if named.count(r) > 1)
            raise BatchError(f"request {duplicate!r} appears twice in one batch")
        if row_indices is None:
            total = start if num_rows is None else num_rows
            if total < start:
                raise BatchError(
                    f"num_rows={num_rows} is smaller than the {start} rows the batch needs"
                )
            return cls(
                tuple(request_ids), tuple(draft_lists), tuple(packed_rows), total, packed=True
            )
        drafts = tuple(draft_lists)
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
        return cls(tuple(request_ids), drafts, explicit, total)

    @property
    def without_grammar(self) -> bool:
        """No entry has a request id: the step costs (almost) nothing."""
        return all(request_id is None for request_id in self.request_ids)

    def block(self, rows: tuple[int, ...]) -> slice | None:
        """One entry's rows as a slice when they are a run (see `run_slice`); in the
        default layout they always are, and nothing needs checking."""
        return slice(rows[0], rows[0] + len(rows)) if self.packed else run_slice(rows)

    @functools.cached_property
    def metadata(self) -> RowMetadata:
        """The per-row arrays of the step's masks. Steps of one layout share them (an
        engine repeats its layouts step after step): finding them cost 12-17 us of numpy
        per step, a cache hit costs the key."""
        unnamed = (
            tuple(i for i, rid in enumerate(self.request_ids) if rid is None)
            if None in self.request_ids
            else ()
        )
        counts = tuple(map(len, self.rows))
        return _row_metadata(counts, None if self.packed else self.rows, self.num_rows, unnamed)


_LAYOUTS_KEPT = 256
"""Distinct step layouts whose row metadata is kept (a few hundred bytes each)."""


@functools.lru_cache(maxsize=_LAYOUTS_KEPT)
def _row_metadata(
    counts: tuple[int, ...],
    explicit: tuple[tuple[int, ...], ...] | None,
    num_rows: int,
    unnamed: tuple[int, ...],
) -> RowMetadata:
    """Row metadata of a layout: each entry's row count, its rows when given explicitly
    (None: in batch order from row 0), and the entries without a grammar. Whole-array
    numpy ops: a Python loop over the rows took ~0.15 ms at 384 rows, and torch calls
    cost more than that loop on small steps."""
    lengths = numpy.array(counts, dtype=numpy.int64)
    entry = numpy.arange(len(counts), dtype=numpy.int32).repeat(lengths)
    if explicit is None:
        rows = numpy.arange(entry.size)
    else:
        rows = numpy.fromiter(
            (row for entry_rows in explicit for row in entry_rows),
            dtype=numpy.int64,
            count=entry.size,
        )
    # rows 0..num_rows-1 in batch order, no spare row: nothing to scatter
    dense = explicit is None and entry.size == num_rows
    step = (numpy.arange(entry.size) - (lengths.cumsum() - lengths).repeat(lengths)).astype(
        numpy.int32
    )
    verify = step < (lengths - 1).repeat(lengths)
    per_row = (entry, step, verify)
    if not dense:
        per_row = (
            numpy.full(num_rows, -1, dtype=numpy.int32),
            numpy.zeros(num_rows, dtype=numpy.int32),
            numpy.zeros(num_rows, dtype=bool),
        )
        for scattered, values in zip(per_row, (entry, step, verify), strict=True):
            scattered[rows] = values
    if dense and not unnamed:
        has_grammar, grammar_rows = torch.ones(num_rows, dtype=torch.bool), rows
    else:
        named = numpy.ones(len(counts), dtype=bool)
        named[list(unnamed)] = False
        grammar_rows = rows[named[entry]]
        grammar_mask = numpy.zeros(num_rows, dtype=bool)
        grammar_mask[grammar_rows] = True
        has_grammar = torch.from_numpy(grammar_mask)
    row_to_request, local_step, is_verify = map(torch.from_numpy, per_row)
    return RowMetadata(
        row_to_request, local_step, is_verify, has_grammar, torch.from_numpy(grammar_rows)
    )


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


def _refuse_drafts(index: int, drafts: Any) -> NoReturn:
    """Raise the BatchError naming why an entry's drafts are not integer token ids (int(2.7)
    would silently try token 2)."""
    values = listed(drafts)
    if values is not None:  # raises at the first draft that is not an integer
        integer_ids(
            values,
            lambda draft: BatchError(
                f"batch entry {index} has draft {draft!r} ({type(draft).__name__}); "
                "drafts must be integer token ids"
            ),
        )
    raise BatchError(
        f"batch entry {index} has drafts {drafts!r}, not a sequence of integer token ids"
    )


def listed(values: Any) -> list[Any] | None:
    """`values` as a list, or None when they are not a sequence of values (text, a scalar,
    a 0-d tensor)."""
    if isinstance(values, (str, bytes)):
        return None
    try:
        return list(values)
    except TypeError:
        return None


def integer_ids(values: Iterable[Any], refusal: Callable[[Any], Exception]) -> tuple[int, ...]:
    """Token ids; a value that is not an integer raises `refusal(value)` rather than being
    truncated (int(2.7) would silently be token 2)."""
    try:
        return tuple(map(operator.index, values))
    except TypeError:
        pass
    for value in values:
        try:
            operator.index(value)
        except TypeError:
            raise refusal(value) from None
    raise refusal(values)


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


def run_slice(rows: Sequence[int]) -> slice | None:
    """`rows` as a slice when they are consecutive and in order, so one block operation can
    serve them; None otherwise (rows 0, 2, 1, 3 span a block but are not a run)."""
    if not rows:
        return None
    first = rows[0]
    return (
        slice(first, first + len(rows))
        if list(rows) == list(range(first, first + len(rows)))
        else None
    )
