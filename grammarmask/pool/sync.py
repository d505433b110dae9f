"""A step's synchronisation: its deadline, and the hand-offs between the threads that fill it
and the engine's thread that waits for it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

DEADLINE_REASON = "mask deadline exceeded"


class StepSync:
    """When a step must be done; `wait(timeout=...)` may bring it forward while it runs,
    unless `fixed` (a synchronous fill: nobody holds its future)."""

    def __init__(self, seconds: float | None, *, fixed: bool = False) -> None:
        if seconds is not None and seconds <= 0:
            raise ValueError(f"deadline_s must be positive, not {seconds}")
        self.condition = threading.Condition()
        self.at = None if seconds is None else time.monotonic() + seconds
        self.fixed = fixed
        self.helper: Callable[[], None] | None = None
        """Set once the step's fill runs on fill threads: lets a thread that would only
        wait for the step fill too (see StepFill.help)."""
        self.started = False
        """The step's fill has started (and `helper` is set, if it will be): see
        `mark_started`. A flag under `condition`, not an Event: one is built per step on the
        engine's thread, where a second condition costs more than the step's own work."""

    @property
    def never(self) -> bool:
        """No deadline now and none can come: the waiting thread may fill too, since
        nothing needs it free to fail late requests."""
        return self.at is None and self.fixed

    def tighten(self, seconds: float) -> None:
        with self.condition:
            at = time.monotonic() + max(0.0, seconds)
            self.at = at if self.at is None else min(self.at, at)
            self.condition.notify_all()

    def remaining(self) -> float | None:
        return None if self.at is None else self.at - time.monotonic()

    def mark_started(self) -> None:
        with self.condition:
            self.started = True
            self.condition.notify_all()

    def help(self) -> None:
        """Fill with the step's threads until nothing is left to take, once the fill has
        started (a no-op after it has ended, or where it runs in worker processes)."""
        with self.condition:
            self.condition.wait_for(lambda: self.started)
            helper = self.helper
        if helper is not None:
            helper()
