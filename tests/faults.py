"""A backend wrapper that makes chosen matchers fail, for isolation tests.

Faults "segv", "abort" (in fill) and "segv compile" kill the process they run in: use them
only with isolation="process". "hang" makes fill sleep HANG_S seconds (deadline tests).
"""

from __future__ import annotations

import os
import signal
import time

import torch

import grammarmask as gm
from grammarmask.schema import LoweredSchema


class FaultyMatcher(gm.Matcher):
    def __init__(self, inner: gm.Matcher, fault: str) -> None:
        self._inner = inner
        self._fault = fault

    def _maybe_raise(self, where: str) -> None:
        if self._fault == where:
            raise RuntimeError(f"injected fault in {where}")
        if where == "fill":
            _maybe_crash(self._fault)

    def accept(self, token_id: int) -> bool:
        self._maybe_raise("accept")
        return self._inner.accept(token_id)

    def fill(self, bitmask: torch.Tensor, row: int) -> None:
        self._maybe_raise("fill")
        self._inner.fill(bitmask, row)

    def rollback(self, num_tokens: int) -> None:
        self._maybe_raise("rollback")
        self._inner.rollback(num_tokens)

    def is_terminated(self) -> bool:
        return self._inner.is_terminated()

    def can_stop(self) -> bool:
        return self._inner.can_stop()

    def reset(self) -> None:
        self._inner.reset()


class FaultyBackend(gm.Backend):
    """Wraps a real backend; `fault` picks the matcher call that raises, or a slow compile."""

    def __init__(self, inner: gm.Backend, fault: str, name: str) -> None:
        super().__init__(inner.vocab)
        self._inner = inner
        self._fault = fault
        self.name = name  # type: ignore[misc]

    def unenforced(
        self, grammar: gm.Grammar, lowered: LoweredSchema | None
    ) -> tuple[gm.Unenforced, ...]:
        return self._inner.unenforced(grammar, lowered)

    def compile(self, grammar: gm.Grammar, lowered: LoweredSchema | None) -> gm.CompiledGrammar:
        if self._fault == "slow compile":
            time.sleep(2.0)
        if self._fault == "stuck compile":
            time.sleep(12.0)
        if self._fault == "segv compile":
            os.kill(os.getpid(), signal.SIGSEGV)
        compiled = self._inner.compile(grammar, lowered)
        return gm.CompiledGrammar(
            self.name,
            grammar,
            compiled.unenforced,
            compiled.compile_seconds,
            lambda: FaultyMatcher(compiled.matcher(), self._fault),
        )


HANG_S = 3.0
FAULTS = ("fill", "accept", "rollback", "slow compile", "stuck compile", "hang")
CRASHES = ("segv", "abort", "segv compile")


def _maybe_crash(fault: str) -> None:
    if fault == "segv":
        os.kill(os.getpid(), signal.SIGSEGV)
    elif fault == "abort":
        os.abort()
    elif fault == "hang":
        time.sleep(HANG_S)


def faulty_backends(vocab: gm.Vocabulary) -> dict[str, gm.Backend]:
    """'xgrammar' plus one 'faulty-<kind>' backend per fault kind; picklable by reference, so
    a process pool builds them in each worker (`backend_factory=faulty_backends`)."""
    inner = gm.create_backend("xgrammar", vocab)
    backends: dict[str, gm.Backend] = {"xgrammar": inner}
    for fault in FAULTS + CRASHES:
        backends[f"faulty-{fault}"] = FaultyBackend(inner, fault, f"faulty-{fault}")
    return backends


MARKED = "crash"
"""A regex grammar whose source holds this word gets a faulty matcher from the factories
below; every other grammar is served by xgrammar as usual."""
MARKED_AFTER_FILLS = 4
"""The fill of a marked matcher that faults: mid-stream, after a few tokens."""


class FaultAfterFills(FaultyMatcher):
    """A real matcher whose MARKED_AFTER_FILLS-th fill segfaults ("segv") or raises
    ("raise"); its other calls pass through."""

    def __init__(self, inner: gm.Matcher, fault: str) -> None:
        super().__init__(inner, fault)
        self._fills = 0

    def fill(self, bitmask: torch.Tensor, row: int) -> None:
        self._fills += 1
        if self._fills == MARKED_AFTER_FILLS:
            if self._fault == "raise":
                raise RuntimeError("injected fault in fill")
            _maybe_crash(self._fault)
        self._inner.fill(bitmask, row)


class MarkedFaultBackend(gm.Backend):
    """xgrammar, whose matchers for MARKED grammars fault mid-stream (`fault`: "segv" or
    "raise"); it takes xgrammar's name, so requests inside an engine can reach it."""

    name = "xgrammar"

    def __init__(self, vocab: gm.Vocabulary, fault: str) -> None:
        super().__init__(vocab)
        self._inner = gm.create_backend("xgrammar", vocab)
        self._fault = fault

    def unenforced(
        self, grammar: gm.Grammar, lowered: LoweredSchema | None
    ) -> tuple[gm.Unenforced, ...]:
        return self._inner.unenforced(grammar, lowered)

    def compile(self, grammar: gm.Grammar, lowered: LoweredSchema | None) -> gm.CompiledGrammar:
        compiled = self._inner.compile(grammar, lowered)
        if MARKED not in grammar.source:
            return compiled
        return gm.CompiledGrammar(
            self.name,
            grammar,
            compiled.unenforced,
            compiled.compile_seconds,
            lambda: FaultAfterFills(compiled.matcher(), self._fault),
            compiled.memory_bytes,
        )


def segv_when_marked(vocab: gm.Vocabulary) -> dict[str, gm.Backend]:
    """backend_factory: xgrammar, whose MARKED matchers segfault in a fill mid-stream."""
    return {"xgrammar": MarkedFaultBackend(vocab, "segv")}


def raise_when_marked(vocab: gm.Vocabulary) -> dict[str, gm.Backend]:
    """backend_factory: xgrammar, whose MARKED matchers raise in a fill mid-stream."""
    return {"xgrammar": MarkedFaultBackend(vocab, "raise")}


def faulty_compiler(vocab: gm.Vocabulary, compile_timeout_s: float = 60.0) -> gm.GrammarCompiler:
    """A compiler with the backends of `faulty_backends`."""
    return gm.GrammarCompiler(vocab, backends=faulty_backends(vocab), timeout_s=compile_timeout_s)


# ---------------------------------------------------------------------- worker start-up
START_FAULT = "injected start-up fault"
RESTART_FAULT_DELAY_S = 3.0


def raising_factory(vocab: gm.Vocabulary) -> dict[str, gm.Backend]:
    """A backend_factory that fails in the worker process, as one needing a missing GPU
    or a missing package would."""
    raise RuntimeError(START_FAULT)


def pid_then_hang_factory(pid_file: str, vocab: gm.Vocabulary) -> dict[str, gm.Backend]:
    """Write this worker's pid to `pid_file`, then block for good (bind the path with
    functools.partial)."""
    with open(pid_file, "w", encoding="utf-8") as out:
        out.write(str(os.getpid()))
    time.sleep(3600)
    return {}


def fails_once_marked_factory(marker: str, vocab: gm.Vocabulary) -> dict[str, gm.Backend]:
    """No extra backends while the file `marker` does not exist; fails once it does (a
    worker restarted after that cannot start), after RESTART_FAULT_DELAY_S, so that a
    request added right after the restart lands on the starting replacement even on a
    loaded machine."""
    if os.path.exists(marker):
        time.sleep(RESTART_FAULT_DELAY_S)
        raise RuntimeError(START_FAULT)
    return {}


UNIMPORTABLE_MODULE = """
import multiprocessing

if multiprocessing.current_process().name != "MainProcess":
    raise ImportError("injected: this module cannot be imported in a worker process")


def factory(vocab):
    return {}
"""
"""A module whose import fails in a child process: its `factory`, handed to a worker, makes
the worker fail before any grammarmask code runs there."""

UNGUARDED_SCRIPT = """
import grammarmask as gm
from grammarmask.tools.known_vocabs import load_vocabulary

pool = gm.MatcherPool(load_vocabulary("deepseek"), workers=1, isolation="process")
print("started")
pool.close()
"""
"""A script that builds a process pool when imported, without `if __name__ == "__main__":`."""
