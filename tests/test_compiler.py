"""Compile cache and background compilation with a timeout."""

from __future__ import annotations

import os
import sys
import threading

import pytest

import grammarmask as gm
from grammarmask.backends.base import CompileBudget
from grammarmask.schema import LoweredSchema


def test_second_request_for_a_slow_grammar_does_not_pay_again(qwen: gm.Vocabulary) -> None:
    """The same schema again (as text this time) is a cache hit: the backend builds its
    index once. Counted on the real backend, not timed (a fast machine builds this one
    in under 0.1 s)."""
    compiler = gm.GrammarCompiler(qwen, timeout_s=300)
    backend = compiler.backend("outlines")
    builds: list[gm.Grammar] = []
    real_compile = backend.compile_within

    def counted(
        grammar: gm.Grammar, lowered: LoweredSchema | None, budget: CompileBudget
    ) -> gm.CompiledGrammar:
        builds.append(grammar)
        return real_compile(grammar, lowered, budget)

    backend.compile_within = counted  # type: ignore[method-assign]
    grammar = gm.Grammar.json_schema(
        {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    )
    first = compiler.compile(grammar, "outlines")
    second = compiler.compile(
        gm.Grammar.json_schema(
            '{"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}'
        ),
        "outlines",
    )
    assert second is first
    assert builds == [grammar]
    assert first.compile_seconds > 0  # a real index build happened, once
    compiler.close()


def test_a_compile_that_cannot_be_ended_lands_in_the_cache_after_its_timeout(
    qwen: gm.Vocabulary,
) -> None:
    """xgrammar compiles cannot be ended: the one a timed-out caller left serves the next."""
    compiler = gm.GrammarCompiler(qwen)
    grammar = gm.Grammar.regex(r"[a-z]{1,40}@[a-z]{1,20}\.(com|org|net)")
    with pytest.raises(
        gm.CompileTimeoutError, match=r"regex\(.*\) on xgrammar took longer than 0.001 s"
    ):
        compiler.compile(grammar, "xgrammar", timeout_s=0.001)
    compiled = compiler.submit(grammar, "xgrammar").result(timeout=300)
    assert compiler.compile(grammar, "xgrammar", timeout_s=0.001) is compiled
    compiler.close()


def test_concurrent_requests_share_one_compilation(deepseek: gm.Vocabulary) -> None:
    compiler = gm.GrammarCompiler(deepseek)
    grammar = gm.Grammar.regex(r"(ab|cd){2,9}")
    futures = [compiler.submit(grammar, "xgrammar") for _ in range(5)]
    assert all(f is futures[0] for f in futures)
    assert compiler.cached() == 1
    compiler.close()


def test_a_cancelled_compilation_is_compiled_anew(deepseek: gm.Vocabulary) -> None:
    """A caller may cancel a compilation still queued (the bench drops the candidates it
    no longer needs): the next request for that grammar must compile it, not get the
    cancelled future."""
    compiler = gm.GrammarCompiler(deepseek, threads=1)
    busy = compiler.submit(gm.Grammar.regex(r"(ab|cd){2,9}x"), "xgrammar")
    grammar = gm.Grammar.regex(r"[a-c]{3}")
    queued = compiler.submit(grammar, "xgrammar")
    assert queued.cancel()
    again = compiler.submit(grammar, "xgrammar")
    assert again is not queued
    assert again.result(timeout=60).matcher().accept(deepseek.token_bytes.index(b"a"))
    busy.result(timeout=60)
    compiler.close()


def test_failures_are_cached_and_repeat_the_same_error(deepseek: gm.Vocabulary) -> None:
    compiler = gm.GrammarCompiler(deepseek)
    bad = gm.Grammar.json_schema({"type": "object", "properties": {"a": False}, "required": ["a"]})
    with pytest.raises(gm.GrammarError) as first:
        compiler.compile(bad, "xgrammar")
    with pytest.raises(gm.GrammarError) as second:
        compiler.compile(bad, "xgrammar")
    assert str(first.value) == str(second.value)
    assert compiler.cached() == 1
    compiler.close()


def test_cache_is_bounded_and_keyed_by_options(deepseek: gm.Vocabulary) -> None:
    compiler = gm.GrammarCompiler(deepseek, cache_size=2)
    schema = {"type": "array", "items": {"type": "integer"}}
    compact = compiler.compile(gm.Grammar.json_schema(schema), "xgrammar")
    flexible = compiler.compile(gm.Grammar.json_schema(schema, whitespace="flexible"), "xgrammar")
    assert flexible is not compact
    compiler.compile(gm.Grammar.regex("x+"), "xgrammar")
    assert compiler.cached() == 2
    again = compiler.compile(gm.Grammar.json_schema(schema), "xgrammar")
    assert again is not compact  # evicted as least recently used, compiled anew
    compiler.close()


def test_cache_size_must_be_positive(deepseek: gm.Vocabulary) -> None:
    with pytest.raises(ValueError, match="cache_size must be at least 1"):
        gm.GrammarCompiler(deepseek, cache_size=0)


class _PriorityProbe(gm.Backend):
    """xgrammar, noting the nice value of the thread that compiles."""

    name = "priority-probe"

    def __init__(self, vocab: gm.Vocabulary) -> None:
        super().__init__(vocab)
        self._inner = gm.create_backend("xgrammar", vocab)
        self.seen: list[int] = []

    def unenforced(
        self, grammar: gm.Grammar, lowered: LoweredSchema | None
    ) -> tuple[gm.Unenforced, ...]:
        return self._inner.unenforced(grammar, lowered)

    def compile(self, grammar: gm.Grammar, lowered: LoweredSchema | None) -> gm.CompiledGrammar:
        self.seen.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))
        return self._inner.compile(grammar, lowered)


@pytest.mark.skipif(sys.platform != "linux", reason="per-thread nice is Linux's")
@pytest.mark.parametrize("nice", [0, 10])
def test_compile_threads_yield_the_cpu(nice: int, deepseek: gm.Vocabulary) -> None:
    """Compiles run `nice` steps below the caller, so they cannot stall the mask fills."""
    probe = _PriorityProbe(deepseek)
    compiler = gm.GrammarCompiler(deepseek, backends={probe.name: probe}, nice=nice)
    compiler.compile(gm.Grammar.regex("[a-z]+"), probe.name)
    caller = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    assert probe.seen == [min(19, caller + nice)]
    compiler.close()
