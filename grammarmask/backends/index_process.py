"""outlines-core index builds in child processes that can be ended.

An index build takes seconds to minutes and up to gigabytes, and outlines-core cannot be
told to stop; a build in a child process (`_index_child.py`) stops when the child is
killed. `IndexBuilder.build` watches its child while it builds: it kills it when the
budget says stop (a deadline, nobody waiting) or when its resident memory passes the
budget's bound, and then the memory is back at once. Idle children are kept for the next
build (a child's start, vocabulary included, costs about half a second).
"""

from __future__ import annotations

import contextlib
import os
import pickle
import select
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import CompileError, CompileMemoryError, GrammarError
from ._index_child import read_frame, write_frame
from .base import CompileBudget

_CHILD = Path(__file__).with_name("_index_child.py")
_POLL_S = 0.05
"""How often a build looks at its budget and its child's memory."""
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


@dataclass(frozen=True)
class BuiltIndex:
    """An index built in a child: the outlines-core Index and its pickled size (what the
    compile cache counts it by)."""

    index: Any
    pickled_bytes: int


class _Child:
    def __init__(self, vocabulary: tuple[int, dict[bytes, list[int]]]) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-I", str(_CHILD), str(os.getpid())],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            bufsize=0,  # unbuffered: a frame read ahead would hide from select
        )
        assert self.process.stdin is not None and self.process.stdout is not None
        self.inbox = self.process.stdin
        self.outbox = self.process.stdout
        self.ready = False
        self.ready_bytes: int | None = None
        """Its resident memory when it had loaded the vocabulary."""
        with contextlib.suppress(OSError):  # a child that died at once: its pipe's end says so
            write_frame(self.inbox, vocabulary)

    def resident_bytes(self) -> int | None:
        """Its resident memory now (Linux /proc; None where that cannot be read)."""
        try:
            with open(f"/proc/{self.process.pid}/statm", encoding="ascii") as statm:
                return int(statm.read().split()[1]) * _PAGE
        except (OSError, ValueError, IndexError):
            return None

    def grown(self) -> bool:
        """Holds more than twice its memory at start (a big build's heap, which Python
        does not give back): not worth keeping idle."""
        now = self.resident_bytes()
        return now is not None and self.ready_bytes is not None and now > 2 * self.ready_bytes

    def kill(self) -> None:
        with contextlib.suppress(OSError):
            self.process.kill()
        self.process.wait()
        for stream in (self.inbox, self.outbox):
            with contextlib.suppress(OSError):
                stream.close()

    def death(self) -> str:
        code = self.process.wait()
        if code < 0:
            return f"the index build process died ({signal.Signals(-code).name})"
        return f"the index build process ended (exit code {code})"


class IndexBuilder:
    """Builds outlines-core indexes for one vocabulary in child processes (see the module
    docstring); thread-safe, one child per build running at once."""

    def __init__(self, eos_id: int, by_bytes: dict[bytes, list[int]]) -> None:
        self._vocabulary = (eos_id, by_bytes)
        self._idle: list[_Child] = []
        self._busy: set[_Child] = set()
        self._lock = threading.Lock()
        self._closed = False

    def build(self, regex: str, budget: CompileBudget, what: str) -> BuiltIndex:
        """The index of `regex`; raises budget.stop()'s error, CompileMemoryError past the
        memory bound, or CompileError (`what` names the grammar) if outlines-core refuses
        it or the child dies."""
        child = self._take()
        with contextlib.suppress(OSError):  # a dead child: its pipe's end says so below
            write_frame(child.inbox, regex)
        while True:
            readable, _, _ = select.select([child.outbox], [], [], _POLL_S)
            if readable:
                answer = read_frame(child.outbox)
                if answer is None:
                    self._drop(child)
                    raise CompileError(f"outlines cannot compile {what}: {child.death()}")
                kind, value = answer
                if kind == "ready":
                    child.ready, child.ready_bytes = True, child.resident_bytes()
                    continue
                self._give_back(child)
                if kind == "error":
                    raise CompileError(f"outlines cannot compile {what}: {value}")
                return BuiltIndex(pickle.loads(value), len(value))
            error = self._over_budget(child, budget, what)
            if error is not None:
                self._drop(child)
                raise error

    @staticmethod
    def _over_budget(child: _Child, budget: CompileBudget, what: str) -> GrammarError | None:
        error = budget.stop()
        if error is not None or budget.memory_bytes is None:
            return error
        resident = child.resident_bytes()
        if resident is not None and resident > budget.memory_bytes:
            return CompileMemoryError(
                f"outlines index build for {what} went past the compile memory bound "
                f"({budget.memory_bytes / 2**20:,.0f} MiB, compile_memory_bytes); ended"
            )
        return None

    def _take(self) -> _Child:
        with self._lock:
            if self._closed:
                raise CompileError("the index builder is closed")
            child = self._idle.pop() if self._idle else _Child(self._vocabulary)
            self._busy.add(child)
            return child

    def _give_back(self, child: _Child) -> None:
        """Keep a child idle for the next build, unless a big build has grown it."""
        with self._lock:
            self._busy.discard(child)
            if not self._closed and not child.grown():
                self._idle.append(child)
                return
        child.kill()

    def _drop(self, child: _Child) -> None:
        with self._lock:
            self._busy.discard(child)
        child.kill()

    def children(self) -> list[int]:
        """Process ids of its children, idle and building (for monitoring and tests)."""
        with self._lock:
            return [child.process.pid for child in (*self._idle, *self._busy)]

    def close(self) -> None:
        """Kill every child, builds in flight included (they fail as their child dies)."""
        with self._lock:
            self._closed = True
            children = [*self._idle, *self._busy]
            self._idle = []
        for child in children:
            child.kill()
