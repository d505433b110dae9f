"""One step's row layout: which logits rows each batch entry owns, and the batch checked.

A batch entry owns len(drafts) + 1 logits rows: row 0 is sampled after the committed prefix,
row j after drafts[0:j]. By default the rows are packed in batch order (seqlen_q = 6, 6, 4
gives rows [0..5], [6..11], [12..15]); an engine with another layout passes explicit row
indices, and the masks land where its logits rows are.
"""

from __future__ import annotations

import functools
import itertools
import operator
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, NoReturn

import numpy
import torch

from ..errors import BatchError
from ..masks import RequestId, RowMetadata

BatchEntry = tuple[RequestId | None, Sequence[int]]
"""(request id, draft tokens); a None id is a request without a grammar."""

DEFAULT_MAX_DRAFTS = 16
"""Drafts one entry may carry per step: an engine's speculation depth is configured, and a
longer list is a layout mistake, not something to fill rows for."""


@dataclass(frozen=True)
class StepPlan:
    """Where each batch entry's rows are, decided on the caller's thread before any fill."""

    request_ids: tuple[RequestId | None, ...]
    drafts: tuple[tuple[int, ...], ...]
    rows: tuple[tuple[int, ...], ...]
    num_rows: int
    packed: bool = False
    """Rows in batch order from row 0 (the default layout): the flat rows are an arange."""
    counts: tuple[int, ...] = ()
    """Each entry's number of rows (len(drafts) + 1)."""

    @classmethod
    def build(
        cls,
        batch: Sequence[BatchEntry],
        row_indices: Sequence[Sequence[int]] | None = None,
        num_rows: int | None = None,
        *,
        max_drafts: int = DEFAULT_MAX_DRAFTS,
    ) -> StepPlan:
        request_ids, drafts, draft_counts = _entries(batch, max_drafts)
        if row_indices is None:
            layout = _packed_layout(draft_counts)
            packed_rows, counts = layout.rows, layout.counts
            needed = sum(counts)
            total = needed if num_rows is None else num_rows
            if total < needed:
                raise BatchError(
                    f"num_rows={num_rows} is smaller than the {needed} rows the batch needs"
                )
            return cls(request_ids, drafts, packed_rows, total, True, counts)
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
        return cls(request_ids, drafts, explicit, total, False, tuple(map(len, explicit)))

    @property
    def without_grammar(self) -> bool:
        """No entry has a request id: the step costs (almost) nothing."""
        return self.request_ids.count(None) == len(self.request_ids)

    @property
    def blocks(self) -> tuple[slice | None, ...]:
        """Each entry's rows as a slice when they are a run (see `run_slice`); in the
        default layout they always are, and nothing needs checking."""
        if self.packed:
            return _packed_layout(tuple(map(len, self.drafts))).blocks
        return tuple(map(run_slice, self.rows))

    @functools.cached_property
    def metadata(self) -> RowMetadata:
        """The per-row arrays of the step's masks. Steps of one layout share them (an
        engine repeats its layouts step after step), so a step usually pays a cache lookup."""
        unnamed = (
            tuple(i for i, rid in enumerate(self.request_ids) if rid is None)
            if None in self.request_ids
            else ()
        )
        explicit = None if self.packed else self.rows
        return _row_metadata(self.counts, explicit, self.num_rows, unnamed)


_LAYOUTS_KEPT = 256
"""Distinct step layouts whose row metadata is kept (a few hundred bytes each)."""


class _PackedLayout(NamedTuple):
    """The default layout of entries with given draft counts."""

    rows: tuple[tuple[int, ...], ...]
    counts: tuple[int, ...]
    """Each entry's number of rows."""
    blocks: tuple[slice, ...]
    """Each entry's rows as a slice."""


@functools.lru_cache(maxsize=_LAYOUTS_KEPT)
def _packed_layout(draft_counts: tuple[int, ...]) -> _PackedLayout:
    """Built once per layout, not once per step: an engine repeats its layouts."""
    counts = tuple(drafts + 1 for drafts in draft_counts)
    starts = tuple(itertools.accumulate(counts, initial=0))
    spans = list(zip(starts, counts, strict=False))
    return _PackedLayout(
        tuple(tuple(range(s, s + c)) for s, c in spans),
        counts,
        tuple(slice(s, s + c) for s, c in spans),
    )


@functools.lru_cache(maxsize=_LAYOUTS_KEPT)
def _row_metadata(
    counts: tuple[int, ...],
    explicit: tuple[tuple[int, ...], ...] | None,
    num_rows: int,
    unnamed: tuple[int, ...],
) -> RowMetadata:
    """Row metadata of a layout: each entry's row count, its rows when given explicitly
    (None: in batch order from row 0), and the entries without a grammar. Whole-array
    numpy ops: cheaper than a Python loop over rows, and than torch calls on small steps."""
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


def _entries(
    batch: Sequence[BatchEntry], max_drafts: int
) -> tuple[tuple[RequestId | None, ...], tuple[tuple[int, ...], ...], tuple[int, ...]]:
    """The batch's request ids, drafts and draft counts, checked in whole-batch passes
    (each one C loop: fill_async's caller waits for them, right after a forward); anything
    unusual goes through `_entries_one_by_one`, which names it."""
    if not isinstance(batch, (list, tuple)):
        batch = list(batch)
    if set(map(type, batch)) <= _PAIR_TYPES:
        try:
            request_ids = tuple([request_id for request_id, _ in batch])
            drafts = tuple(map(tuple, [given for _, given in batch]))
            distinct = len(set(request_ids))
        except (TypeError, ValueError):
            pass
        else:
            unnamed = request_ids.count(None)
            counts = tuple(map(len, drafts))
            if (
                distinct == len(request_ids) - unnamed + (unnamed > 0)
                and (not counts or max(counts) <= max_drafts)
                and set(map(type, itertools.chain.from_iterable(drafts))) <= _INT_TYPE
            ):
                return request_ids, drafts, counts
    request_ids, drafts = _entries_one_by_one(batch, max_drafts)
    return request_ids, drafts, tuple(map(len, drafts))


_PAIR_TYPES = frozenset((tuple, list))
_INT_TYPE = frozenset((int,))


def _entries_one_by_one(
    batch: Sequence[BatchEntry], max_drafts: int
) -> tuple[tuple[RequestId | None, ...], tuple[tuple[int, ...], ...]]:
    """`_entries` entry by entry: raises the BatchError naming the first bad entry."""
    request_ids: list[RequestId | None] = []
    drafts: list[tuple[int, ...]] = []
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
        if not isinstance(request_id, Hashable | None):
            raise BatchError(
                f"batch entry {index} has request id {request_id!r}, which cannot be an id "
                "(not hashable); use the string given to add()"
            )
        request_ids.append(request_id)
        drafts.append(ids)
    named = [r for r in request_ids if r is not None]
    if len(set(named)) != len(named):
        duplicate = next(r for r in named if named.count(r) > 1)
        raise BatchError(f"request {duplicate!r} appears twice in one batch")
    return tuple(request_ids), tuple(drafts)


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
