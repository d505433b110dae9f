"""MaskFuture: the masks of one step being filled, and the wait that joins them."""

from __future__ import annotations

from typing import Any

from ..device.transfer import MaskTransfer
from ..masks import StepMasks
from .sync import StepSync


class MaskFuture:
    """The masks of one step, being filled; `wait` joins and orders the device stream.

    The step thread hands the result over under the step's own condition (the StepSync's),
    not through a concurrent.futures Future: one is built per step on the engine's thread,
    where every microsecond is exposed."""

    def __init__(self, transfer: MaskTransfer, consumer: Any, sync: StepSync) -> None:
        self._transfer = transfer
        self._consumer = consumer
        self._sync = sync
        self._finished = False
        self._value: tuple[StepMasks, Any] | None = None
        self._error: BaseException | None = None

    def finish(self, value: tuple[StepMasks, Any] | None, error: BaseException | None) -> None:
        """The step's masks and copy event, or the exception that ended it."""
        with self._sync.condition:
            self._value, self._error, self._finished = value, error, True
            self._sync.condition.notify_all()

    def done(self) -> bool:
        return self._finished

    def _result(self) -> tuple[StepMasks, Any]:
        condition = self._sync.condition
        with condition:
            condition.wait_for(lambda: self._finished)
        if self._error is not None:
            raise self._error
        assert self._value is not None
        return self._value

    def wait(self, timeout: float | None = None) -> StepMasks:
        """Join the CPU fill, then (on a device) make the consumer stream wait on the copy.

        With `timeout`, requests whose masks are not ready `timeout` seconds from now fail
        alone ("mask deadline exceeded"); the others get their masks.
        """
        if timeout is not None:
            self._sync.tighten(timeout)
        elif self._sync.at is None and not self._finished:
            self._sync.help()  # nothing to do but wait: fill instead (thread isolation)
        masks: StepMasks = self._transfer.join_then_wait(self._result, self._consumer)
        return masks
