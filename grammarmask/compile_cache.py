"""The compiler's cache: compiled grammars by key, bounded in entries and in bytes.

Entries are futures, so a request for a grammar already compiling joins that compile. The
bytes are each finished grammar's `memory_bytes`, counted once it lands; the least recently
used entries go first when either bound is passed. Eviction only drops the cache's
reference: requests already serving a grammar keep it.
"""

from __future__ import annotations

from collections import OrderedDict
from concurrent.futures import Future

from .backends import CompiledGrammar

CacheKey = tuple[str, tuple[str, str, str, bool, int], str]
"""Backend (or auto label), the grammar's key, the vocabulary's fingerprint."""


class CompileCache:
    """An LRU of compile futures. Not locked: its owner calls it under its own lock, the
    one that also guards the compiles in flight."""

    def __init__(self, entries: int, max_bytes: int) -> None:
        if entries < 1:
            raise ValueError(f"cache_size must be at least 1, not {entries}")
        if max_bytes < 1:
            raise ValueError(f"cache_bytes must be at least 1, not {max_bytes}")
        self._entries = entries
        self._max_bytes = max_bytes
        self._futures: OrderedDict[CacheKey, Future[CompiledGrammar]] = OrderedDict()
        self._sizes: dict[CacheKey, int] = {}
        self.bytes = 0
        """The counted bytes of the finished grammars it holds."""

    def __len__(self) -> int:
        return len(self._futures)

    def get(self, key: CacheKey) -> Future[CompiledGrammar] | None:
        """The entry, without marking it used."""
        return self._futures.get(key)

    def touch(self, key: CacheKey) -> None:
        """Mark an entry most recently used."""
        self._futures.move_to_end(key)

    def put(self, key: CacheKey, future: Future[CompiledGrammar]) -> None:
        """Keep `future` under `key` (replacing what was there), then evict."""
        self.bytes -= self._sizes.pop(key, 0)
        self._futures[key] = future
        self._evict()

    def count(self, key: CacheKey, memory_bytes: int) -> None:
        """Count a landed grammar's bytes, once, if its entry is still kept; then evict."""
        if key in self._futures and key not in self._sizes:
            self._sizes[key] = memory_bytes
            self.bytes += memory_bytes
            self._evict()

    def drop(self, key: CacheKey, future: Future[CompiledGrammar]) -> None:
        """Forget the entry if it is still `future` (a newer compile under the key stays)."""
        if self._futures.get(key) is future:
            del self._futures[key]
            self.bytes -= self._sizes.pop(key, 0)

    def _evict(self) -> None:
        while self._futures and (
            len(self._futures) > self._entries or self.bytes > self._max_bytes
        ):
            key, _ = self._futures.popitem(last=False)
            self.bytes -= self._sizes.pop(key, 0)
