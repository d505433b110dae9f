"""The worker processes of one process-isolated pool: starting them, the lock that
serialises what is said to each, restarting one in its place, and taking one that cannot
restart out of service. Which requests a worker holds, and what becomes of them when it
is replaced: process_matchers.py."""

from __future__ import annotations

import multiprocessing
import pickle
import threading
from collections.abc import Iterator
from multiprocessing.shared_memory import SharedMemory
from typing import cast

from ..vocabulary import Vocabulary
from .matchers import BackendFactory
from .messages import Close
from .shared_ring import SharedRing
from .worker import worker_main
from .worker_process import (
    WorkerProcess,
    await_ready,
    children_allowed,
    ended,
    last_words,
    send,
    stop_all,
)


class WorkerSet:
    """A fixed number of worker processes, each at its index for the pool's lifetime.

    `slots[i]` serialises everything said to worker i (and its replacement): take it before
    talking to a worker, restarting it or installing its replacement.
    """

    def __init__(
        self,
        vocab: Vocabulary,
        count: int,
        ring: SharedRing,
        compile_timeout_s: float,
        backend_factory: BackendFactory | None,
        start_timeout_s: float,
        compile_memory_bytes: int | None,
    ) -> None:
        """Start `count` workers and wait until each is ready; raise WorkerStartError,
        having stopped them all, if one dies or fails first or takes over
        `start_timeout_s`."""
        self._context = multiprocessing.get_context("spawn")
        payload = pickle.dumps(vocab)
        self._vocab_memory = SharedMemory(create=True, size=max(1, len(payload)))
        cast(memoryview, self._vocab_memory.buf)[: len(payload)] = payload
        self._vocab_size = len(payload)
        self.ring = ring
        self._compile_timeout_s = compile_timeout_s
        self._compile_memory_bytes = compile_memory_bytes
        self._factory = backend_factory
        self.slots = [threading.Lock() for _ in range(count)]
        self.restarts = 0
        self.broken: dict[int, str] = {}
        """Worker index -> why its replacement could not start (it is not restarted)."""
        self._workers: list[WorkerProcess] = []
        try:
            for index in range(count):
                self._workers.append(self._spawn(index))
            await_ready(self._workers, start_timeout_s)
        except BaseException:
            stop_all(self._workers)
            self._release_vocab()
            raise

    def _spawn(self, index: int) -> WorkerProcess:
        parent, child = self._context.Pipe()
        process = self._context.Process(
            target=worker_main,
            args=(
                child,
                (self._vocab_memory.name, self._vocab_size),
                self.ring.memory.name,
                self.ring.shape,
                self._compile_timeout_s,
                self._factory,
                self._compile_memory_bytes,
            ),
            name=f"grammarmask-worker-{index}",
            daemon=True,
        )
        with children_allowed():
            process.start()
        child.close()
        return WorkerProcess(index, process, parent)

    def __getitem__(self, index: int) -> WorkerProcess:
        return self._workers[index]

    def __iter__(self) -> Iterator[WorkerProcess]:
        return iter(list(self._workers))

    def __len__(self) -> int:
        return len(self._workers)

    def in_service(self) -> list[WorkerProcess]:
        """The workers not taken out of service."""
        return [w for w in self._workers if w.index not in self.broken]

    def pids(self) -> list[int]:
        """Process ids of the current workers."""
        return [int(w.process.pid) for w in self._workers]

    def restart(self, worker: WorkerProcess, reason: str, *, kill: bool) -> WorkerProcess | None:
        """Stop `worker` (its slot lock held) and start its replacement, not yet installed
        (`install`), so that its requests move over under the caller's own lock. None when
        it is out of service (`broken[index]` says why): a worker that ended before it was
        ready could not start, and its replacement would not either."""
        if kill:
            worker.process.kill()
        worker.process.join()
        last = last_words(worker)
        worker.conn.close()
        if worker.index in self.broken:
            return None
        if not worker.ready:
            why = ended(worker, last, "") if last else reason
            self.broken[worker.index] = f"worker process could not restart: {why}"
            return None
        self.restarts += 1
        return self._spawn(worker.index)

    def install(self, new: WorkerProcess) -> None:
        """Put a replacement from `restart` in its place."""
        self._workers[new.index] = new

    def close(self) -> None:
        """Ask every worker to stop, kill those that do not within 5 s, free the ring and
        the shared vocabulary."""
        for index, worker in enumerate(self._workers):
            with self.slots[index]:
                send(worker, Close())
        for worker in self._workers:
            worker.process.join(timeout=5.0)
            if worker.process.is_alive():
                worker.process.kill()
                worker.process.join()
            worker.conn.close()
        self.ring.close()
        self._release_vocab()

    def _release_vocab(self) -> None:
        self._vocab_memory.close()
        self._vocab_memory.unlink()
