"""Which request sits in which row of vLLM's persistent batch, followed through its updates.

vLLM reports each step's changes as removed indices, added (index, request) pairs and
moves (one-way or swaps), to be applied in that order; finished requests compact the batch,
so a request's row changes while it runs. The plugin keys everything by the request itself
and asks this table for its current row, so a move can never hand one request's grammar
to another.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Generic, TypeVar

Item = TypeVar("Item")


class BatchRows(Generic[Item]):
    """Row index -> item, for the rows that hold one (rows of other requests are absent)."""

    def __init__(self) -> None:
        self._rows: dict[int, Item] = {}

    def update(
        self,
        removed: Iterable[int],
        added: Iterable[tuple[int, Item | None]],
        moved: Iterable[tuple[int, int, bool]],
    ) -> list[Item]:
        """Apply one step's changes in vLLM's order; `moved` holds (from, to, is_swap).
        Returns the items that left the batch: removed, or replaced by an add or a one-way
        move onto their row (vLLM lists such a row as removed first; an item is never lost
        either way)."""
        rows = self._rows
        gone: list[Item] = []
        for index in removed:
            item = rows.pop(index, None)
            if item is not None:
                gone.append(item)
        for index, new in added:
            old = rows.pop(index, None)
            if old is not None:
                gone.append(old)
            if new is not None:
                rows[index] = new
        for source, target, swap in moved:
            first, second = rows.pop(source, None), rows.pop(target, None)
            if first is not None:
                rows[target] = first
            if second is not None:
                if swap:
                    rows[source] = second
                else:
                    gone.append(second)
        return gone

    def items(self) -> Iterator[tuple[int, Item]]:
        return iter(self._rows.items())

    def values(self) -> Iterator[Item]:
        return iter(self._rows.values())

    def __len__(self) -> int:
        return len(self._rows)

    def __bool__(self) -> bool:
        return bool(self._rows)
