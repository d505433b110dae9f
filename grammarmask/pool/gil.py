"""The GIL guard: the step's lock-free paths are sound only under the GIL."""

from __future__ import annotations

import sys
from collections.abc import Callable


def require_gil(gil_enabled: Callable[[], bool] | None = None) -> None:
    """Raise ImportError on a free-threaded interpreter running without the GIL.

    A step's fill threads claim requests and record outcomes without locks (StepFill),
    relying on `next()` and `dict.setdefault` being single steps under the GIL.
    `gil_enabled` stands in for `sys._is_gil_enabled` (CPython 3.13 on) in tests.
    """
    check = gil_enabled or getattr(sys, "_is_gil_enabled", None)
    if check is not None and not check():
        raise ImportError(
            "grammarmask needs the GIL: its mask fill shares a step between threads "
            "without locks, which is safe only under the GIL. This interpreter runs "
            "free-threaded; start it with PYTHON_GIL=1 (or -X gil=1), or use a default "
            "CPython build."
        )
