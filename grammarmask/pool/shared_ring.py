"""SharedRing: the host mask ring (and per-entry progress) in shared memory, where worker
processes write masks that the parent copies to the device without another copy."""

from __future__ import annotations

import contextlib
from multiprocessing.shared_memory import SharedMemory

import torch


class SharedRing:
    """The host mask ring (and per-entry progress) in shared memory, one block for all
    slots; on a device it is registered with CUDA (pinned) for the side-stream copy."""

    def __init__(self, slots: int, rows: int, words: int, *, pinned: bool = False) -> None:
        if slots < 2:
            raise ValueError(f"the ring needs at least 2 slots to overlap steps, not {slots}")
        self.shape = (slots, rows, words)
        self._masks_bytes = slots * rows * words * 4
        self.memory = SharedMemory(create=True, size=self._masks_bytes + slots * rows * 4)
        self.host, self.progress = self.views(self.memory, self.shape)
        self._pinned = False
        if pinned and torch.cuda.is_available():
            ptr = self.host[0].data_ptr()
            status = torch.cuda.cudart().cudaHostRegister(  # type: ignore[no-untyped-call]
                ptr, self._masks_bytes, 0
            )
            if int(status) != 0:
                raise RuntimeError(f"cudaHostRegister of the shared mask ring failed: {status}")
            self._pinned = True

    @staticmethod
    def views(
        memory: SharedMemory, shape: tuple[int, int, int]
    ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        slots, rows, words = shape
        flat = torch.frombuffer(memory.buf, dtype=torch.int32)
        masks = flat[: slots * rows * words].view(slots, rows, words)
        progress = flat[slots * rows * words :].view(slots, rows)
        return list(masks.unbind(0)), list(progress.unbind(0))

    def close(self) -> None:
        if self._pinned:
            torch.cuda.cudart().cudaHostUnregister(  # type: ignore[no-untyped-call]
                self.host[0].data_ptr()
            )
        self.host, self.progress = [], []
        with contextlib.suppress(BufferError):  # masks handed out may still view it
            self.memory.close()
        self.memory.unlink()
