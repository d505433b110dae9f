"""Giving a worker process's freed heap back to the operating system.

glibc keeps the memory that compiled grammars and matchers freed in its arenas, so a
worker's resident memory ratchets up over thousands of different grammars even though
nothing is still held; `malloc_trim` returns it. Elsewhere (no glibc) this does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import time
from collections.abc import Callable

TRIM_INTERVAL_S = 5.0
"""The least time between two trims: one costs milliseconds, and a burst of removals
needs only one."""


def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        trim: Callable[[int], int] = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):
        return None
    return trim


class HeapTrimmer:
    """`maybe_trim()` after work that freed memory; trims at most every `interval_s`."""

    def __init__(self, interval_s: float = TRIM_INTERVAL_S) -> None:
        self._trim = _malloc_trim()
        self._interval_s = interval_s
        self._last = time.monotonic()

    def maybe_trim(self) -> bool:
        """Trim if the interval has passed since the last; True when it trimmed."""
        now = time.monotonic()
        if self._trim is None or now - self._last < self._interval_s:
            return False
        self._last = now
        self._trim(0)
        return True
