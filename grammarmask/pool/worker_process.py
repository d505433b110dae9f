"""The worker processes of process isolation, one at a time: starting one (spawned, from
a daemonic process too), waiting for it to be ready, talking over its pipe, and saying why
one ended. The set of them: worker_set.py; the requests each holds: process_matchers.py."""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.connection
import signal
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import WorkerStartError
from ..masks import RequestId
from .messages import FromWorker, Ready, StartFailed, ToWorker


@dataclass(eq=False)
class WorkerProcess:
    """One worker process, its pipe, and the requests it holds."""

    index: int
    process: Any
    conn: multiprocessing.connection.Connection
    held: set[RequestId] = field(default_factory=set)
    pending_removes: list[RequestId] = field(default_factory=list)
    ready: bool = False
    """It said Ready: it started. A worker that dies before that could not start."""


@contextlib.contextmanager
def children_allowed() -> Iterator[None]:
    """Let a daemonic process start workers. Engines run their model workers as daemonic
    multiprocessing processes (vLLM does), and multiprocessing refuses children there
    because a daemon is ended without cleaning up; a grammarmask worker ends by itself when
    its pipe to the parent closes, so it cannot outlive that parent for long."""
    config = multiprocessing.current_process()._config  # type: ignore[attr-defined]
    daemon = config.get("daemon", False)
    config["daemon"] = False
    try:
        yield
    finally:
        config["daemon"] = daemon


def await_ready(workers: Sequence[WorkerProcess], timeout_s: float) -> None:
    """Wait for every worker's Ready, watching their pipes and processes; raise
    WorkerStartError naming the first that dies, fails or takes over `timeout_s`."""
    limit = time.monotonic() + timeout_s
    waiting = {worker.conn: worker for worker in workers}
    while waiting:
        watched = [*waiting, *(worker.process.sentinel for worker in waiting.values())]
        ready = multiprocessing.connection.wait(watched, max(0.0, limit - time.monotonic()))
        if not ready:
            worker = next(iter(waiting.values()))
            raise WorkerStartError(
                f"grammarmask worker process {worker.index} was not ready within "
                f"{timeout_s:g} s (start_timeout_s); a backend_factory that blocks, or a "
                "machine too loaded to import torch in that time?"
            )
        for conn in [conn for conn in waiting if conn in ready]:
            worker = waiting.pop(conn)
            message = poll(worker)
            if isinstance(message, Ready):
                worker.ready = True
                continue
            if isinstance(message, StartFailed):
                raise WorkerStartError(
                    f"grammarmask worker process {worker.index} could not start: "
                    f"{message.error}\n{message.traceback}"
                )
            raise WorkerStartError(start_death(worker))
        for worker in waiting.values():
            if worker.process.sentinel in ready:  # ended without a word
                raise WorkerStartError(start_death(worker))


def stop_all(workers: Sequence[WorkerProcess]) -> None:
    """Kill and reap every worker still running, and close their pipes."""
    for worker in workers:
        if worker.process.is_alive():
            worker.process.kill()
        worker.process.join()
        worker.conn.close()


def send(worker: WorkerProcess, message: ToWorker) -> None:
    """Send (slot lock held); a broken pipe is left for the next receive to notice."""
    with contextlib.suppress(OSError):
        worker.conn.send(message)


def poll(worker: WorkerProcess) -> FromWorker | None:
    """The next message; None at the end of the pipe (the worker is gone)."""
    try:
        message: FromWorker = worker.conn.recv()
        return message
    except (EOFError, OSError):
        return None


def last_words(worker: WorkerProcess) -> StartFailed | None:
    """Read what a stopped worker left in its pipe: whether it had said Ready, and what it
    said if it could not start."""
    said = None
    with contextlib.suppress(OSError, EOFError):
        while worker.conn.poll(0):
            message = poll(worker)
            if message is None:
                break
            if isinstance(message, Ready):
                worker.ready = True
            elif isinstance(message, StartFailed):
                said = message
    return said


def ended(worker: WorkerProcess, last: StartFailed | None, doing: str) -> str:
    """Why a worker's pipe ended: what it said if it could not start, else how it died."""
    if last is not None:
        return f"worker process could not start: {last.error}"
    return f"{death(worker)} {doing}"


def start_death(worker: WorkerProcess) -> str:
    """The error for a worker that ended before it was ready, at the pool's start."""
    return (
        f"grammarmask worker process {worker.index} ended before it was ready: "
        f"{death(worker)}; its own error, if it printed one, is on standard error above. "
        'If a script builds a MatcherPool with isolation="process" when it is imported, '
        'build it under `if __name__ == "__main__":` instead: each worker process starts '
        "by importing the main module again (multiprocessing's spawn start method)."
    )


def death(worker: WorkerProcess) -> str:
    worker.process.join(timeout=5.0)
    code = worker.process.exitcode
    if code is not None and code < 0:
        return f"worker process died ({signal.Signals(-code).name})"
    return f"worker process died (exit code {code})"
