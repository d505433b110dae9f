"""A backend wrapper that makes chosen matchers fail, for isolation tests."""

from __future__ import annotations

import time

import torch

import grammarmask as gm


class FaultyMatcher(gm.Matcher):
    def __init__(self, inner: gm.Matcher, fault: str) -> None:
        self._inner = inner
        self._fault = fault

    def _maybe_raise(self, where: str) -> None:
        if self._fault == where:
            raise RuntimeError(f"injected fault in {where}")

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

    def unenforced(self, grammar: gm.Grammar) -> tuple[gm.Unenforced, ...]:
        return self._inner.unenforced(grammar)

    def compile(self, grammar: gm.Grammar) -> gm.CompiledGrammar:
        if self._fault == "slow compile":
            time.sleep(2.0)
        compiled = self._inner.compile(grammar)
        return gm.CompiledGrammar(
            self.name,
            grammar,
            compiled.unenforced,
            compiled.compile_seconds,
            lambda: FaultyMatcher(compiled.matcher(), self._fault),
        )


FAULTS = ("fill", "accept", "rollback", "slow compile")


def faulty_compiler(vocab: gm.Vocabulary, compile_timeout_s: float = 60.0) -> gm.GrammarCompiler:
    """A compiler with 'xgrammar' plus one 'faulty-<kind>' backend per fault kind."""
    inner = gm.create_backend("xgrammar", vocab)
    backends: dict[str, gm.Backend] = {"xgrammar": inner}
    for fault in FAULTS:
        backends[f"faulty-{fault}"] = FaultyBackend(inner, fault, f"faulty-{fault}")
    return gm.GrammarCompiler(vocab, backends=backends, timeout_s=compile_timeout_s)
