"""A simulated device for testing the transfer's ordering rules without a GPU.

Streams are worker threads running their queued operations in order, each after a random
delay, so copies and kernels complete late, as on a real device. Events follow CUDA's
semantics, including the sharp edge: waiting on an event that has not been recorded yet
waits for nothing.
"""

from __future__ import annotations

import queue
import random
import threading
import time
from collections.abc import Callable
from typing import Any

import torch


class SimEvent:
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.recorded = 0
        self.completed = 0

    def record_on(self, stream: SimStream) -> None:
        with self._cond:
            self.recorded += 1
            generation = self.recorded
        stream.enqueue(lambda: self._complete(generation))

    def _complete(self, generation: int) -> None:
        with self._cond:
            self.completed = max(self.completed, generation)
            self._cond.notify_all()

    def waiter(self) -> Callable[[], None]:
        """What a stream waiting on this event does: waits for the record made so far."""
        with self._cond:
            target = self.recorded

        def wait() -> None:
            with self._cond:
                self._cond.wait_for(lambda: self.completed >= target)

        return wait

    def synchronize(self) -> None:
        self.waiter()()


class SimStream:
    def __init__(self, name: str, rng: random.Random, max_delay_s: float) -> None:
        self.name = name
        self._rng = rng
        self._max_delay_s = max_delay_s
        self._queue: queue.Queue[Callable[[], None] | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name=f"sim-{name}", daemon=True)
        self._thread.start()

    def enqueue(self, op: Callable[[], None]) -> None:
        self._queue.put(op)

    def _run(self) -> None:
        while (op := self._queue.get()) is not None:
            time.sleep(self._rng.uniform(0, self._max_delay_s))
            op()

    def synchronize(self) -> None:
        done = SimEvent()
        done.record_on(self)
        done.synchronize()

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join()


class SimDevice:
    """DeviceOps over simulated streams; `main` plays the sampler's stream."""

    def __init__(self, seed: int, main_delay_s: float = 0.004, side_delay_s: float = 0.004) -> None:
        self._rng = random.Random(seed)
        self._side_delay_s = side_delay_s
        self.main = SimStream("main", random.Random(seed + 1), main_delay_s)
        self._streams = [self.main]
        self.copies = 0

    def alloc_host(self, rows: int, words: int) -> torch.Tensor:
        return torch.zeros(rows, words, dtype=torch.int32)

    def alloc_device(self, rows: int, words: int) -> torch.Tensor:
        return torch.zeros(rows, words, dtype=torch.int32)

    def current_stream(self) -> Any:
        return self.main

    def new_stream(self) -> Any:
        stream = SimStream("side", random.Random(self._rng.random()), self._side_delay_s)
        self._streams.append(stream)
        return stream

    def new_event(self) -> Any:
        return SimEvent()

    def copy_async(self, stream: Any, dst: torch.Tensor, src: torch.Tensor) -> None:
        self.copies += 1
        stream.enqueue(lambda: dst.copy_(src))

    def record(self, event: Any, stream: Any) -> None:
        event.record_on(stream)

    def stream_wait_event(self, stream: Any, event: Any) -> None:
        stream.enqueue(event.waiter())

    def stream_wait_stream(self, waiter: Any, waited: Any) -> None:
        marker = SimEvent()
        marker.record_on(waited)
        waiter.enqueue(marker.waiter())

    def event_synchronize(self, event: Any) -> None:
        event.synchronize()

    def close(self) -> None:
        for stream in self._streams:
            stream.synchronize()
            stream.close()
