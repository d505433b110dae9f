"""Host mask buffers, the side-stream copy to the device, and the ordering rules around it.

Three rules keep the masks a sampler applies equal to the masks of its own step:

1. The consumer joins the CPU fill before its stream waits on the copy event: in CUDA,
   waiting on an event that is not recorded yet is a silent no-op.
2. A host slot is refilled only after the copy that reads it has completed.
3. A device slot is overwritten only after the kernels that read it have run: the side
   stream waits on the consumer stream before each copy.

Buffers are allocated (and pinned, on CUDA) once. Without a device the host buffer is the
mask buffer and nothing is copied.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, TypeVar

import torch

T = TypeVar("T")


class DeviceOps(Protocol):
    """The stream and event primitives the transfer needs (CUDA, or a simulation in tests)."""

    def alloc_host(self, rows: int, words: int) -> torch.Tensor: ...
    def alloc_device(self, rows: int, words: int) -> torch.Tensor: ...
    def current_stream(self) -> Any: ...
    def new_stream(self) -> Any: ...
    def new_event(self) -> Any: ...
    def copy_async(self, stream: Any, dst: torch.Tensor, src: torch.Tensor) -> None: ...
    def record(self, event: Any, stream: Any) -> None: ...
    def stream_wait_event(self, stream: Any, event: Any) -> None: ...
    def stream_wait_stream(self, waiter: Any, waited: Any) -> None: ...
    def event_synchronize(self, event: Any) -> None: ...


class CudaOps:
    """DeviceOps on torch.cuda: pinned host memory, non-blocking copies, real events."""

    def __init__(self, device: torch.device) -> None:
        if not torch.cuda.is_available():
            raise RuntimeError(f"device {device} requested but CUDA is not available")
        self.device = device

    def alloc_host(self, rows: int, words: int) -> torch.Tensor:
        return torch.zeros(rows, words, dtype=torch.int32, pin_memory=True)

    def alloc_device(self, rows: int, words: int) -> torch.Tensor:
        return torch.zeros(rows, words, dtype=torch.int32, device=self.device)

    def current_stream(self) -> Any:
        return torch.cuda.current_stream(self.device)

    def new_stream(self) -> Any:
        return torch.cuda.Stream(self.device)  # type: ignore[no-untyped-call]

    def new_event(self) -> Any:
        return torch.cuda.Event()  # type: ignore[no-untyped-call]

    def copy_async(self, stream: Any, dst: torch.Tensor, src: torch.Tensor) -> None:
        with torch.cuda.stream(stream):
            dst.copy_(src, non_blocking=True)

    def record(self, event: Any, stream: Any) -> None:
        event.record(stream)

    def stream_wait_event(self, stream: Any, event: Any) -> None:
        stream.wait_event(event)

    def stream_wait_stream(self, waiter: Any, waited: Any) -> None:
        waiter.wait_stream(waited)

    def event_synchronize(self, event: Any) -> None:
        event.synchronize()


class MaskTransfer:
    """A ring of host slots (and device slots) for the masks of consecutive steps."""

    def __init__(
        self,
        ops: DeviceOps | None,
        rows: int,
        words: int,
        slots: int = 2,
        host: list[torch.Tensor] | None = None,
    ) -> None:
        """`host`: ready host slots (shared memory for worker processes, pinned on a device)."""
        if slots < 2:
            raise ValueError(f"the ring needs at least 2 slots to overlap steps, not {slots}")
        self._ops = ops
        self.rows = rows
        if ops is None:
            self._host = host or [torch.zeros(rows, words, dtype=torch.int32) for _ in range(slots)]
            self._device = self._host
            self._copied: list[Any] = [None] * slots
            self._side: Any = None
        else:
            self._host = host or [ops.alloc_host(rows, words) for _ in range(slots)]
            self._device = [ops.alloc_device(rows, words) for _ in range(slots)]
            self._copied = [ops.new_event() for _ in range(slots)]
            self._side = ops.new_stream()
        self._recorded = [False] * slots
        self._next = 0

    @property
    def host_slots(self) -> tuple[torch.Tensor, ...]:
        """The host slots now (a late step replaces its slot): for tests."""
        return tuple(self._host)

    @property
    def on_device(self) -> bool:
        return self._ops is not None

    def consumer_stream(self) -> Any:
        """The stream that will read the masks: the caller's current stream."""
        return None if self._ops is None else self._ops.current_stream()

    def acquire(self) -> tuple[int, torch.Tensor]:
        """The next host slot, free to be written (rule 2)."""
        slot = self._next
        self._next = (slot + 1) % len(self._host)
        self.wait_host_free(slot)
        return slot, self._host[slot]

    def replace_host(self, slot: int, rows: torch.Tensor) -> None:
        """A new host buffer for `slot`, holding `rows` (the old one may still be written
        into by fills that came back late). On a device it is pinned like the others."""
        if self._ops is None:
            self._host[slot] = rows  # also the "device" slot: one list
            return
        buffer = self._ops.alloc_host(*rows.shape)
        buffer.copy_(rows)
        self._host[slot] = buffer

    def wait_host_free(self, slot: int) -> None:
        if self._ops is not None and self._recorded[slot]:
            self._ops.event_synchronize(self._copied[slot])

    def order_after_consumers(self, consumer: Any) -> None:
        """Rule 3: the next copy starts after everything the consumer stream has queued."""
        if self._ops is not None:
            self._ops.stream_wait_stream(self._side, consumer)

    def publish(self, slot: int, num_rows: int, consumer: Any) -> tuple[torch.Tensor, Any]:
        """Copy the first `num_rows` of a filled slot to the device; returns (view, event)."""
        if self._ops is None:
            return self._host[slot][:num_rows], None
        self.order_after_consumers(consumer)
        self._ops.copy_async(self._side, self._device[slot][:num_rows], self._host[slot][:num_rows])
        self._ops.record(self._copied[slot], self._side)
        self._recorded[slot] = True
        return self._device[slot][:num_rows], self._copied[slot]

    def device_view(self, slot: int, num_rows: int) -> torch.Tensor:
        """The slot's device buffer without copying (steps without any grammar row)."""
        return self._device[slot][:num_rows]

    def join_then_wait(self, join: Callable[[], tuple[T, Any]], consumer: Any) -> T:
        """Rule 1: finish the CPU work (so the copy event is recorded), then make the consumer
        stream wait on that event."""
        value, event = join()
        self.make_wait(consumer, event)
        return value

    def make_wait(self, consumer: Any, event: Any) -> None:
        """The consumer stream waits for the copy event."""
        if self._ops is not None and event is not None:
            self._ops.stream_wait_event(consumer, event)
