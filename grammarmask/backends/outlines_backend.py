"""outlines-core: a regex compiled to a token-level DFA index; regular languages only."""

from __future__ import annotations

import pickle
import threading
import time
from collections.abc import Iterable
from typing import Any

import torch

from ..errors import CompileError, UnsupportedGrammarError
from ..grammars import Grammar
from ..schema import KeywordSupport, LoweredSchema, Unenforced, find_unenforced
from ..schema.judge import (
    COMMON_FORMATS,
    COMMON_KEYWORDS,
    beside_any_of,
    beside_enum,
    beside_ref,
    required_outside_properties,
)
from ..vocabulary import Vocabulary
from .base import (
    Backend,
    CompileBudget,
    CompiledGrammar,
    Matcher,
    fill_stop_only,
    row_pointer,
    set_token_bits,
)
from .index_process import IndexBuilder


def pattern_beside_length(node: dict[str, Any], pointer: str) -> Iterable[Unenforced]:
    """outlines-core builds a string with minLength/maxLength from the lengths alone,
    dropping its pattern."""
    if "pattern" in node and ("minLength" in node or "maxLength" in node):
        yield Unenforced(pointer, "pattern", "ignored when combined with minLength/maxLength")


def format_beside_pattern(node: dict[str, Any], pointer: str) -> Iterable[Unenforced]:
    """outlines-core builds a string with a `pattern` from the pattern alone: `"abc"`
    passes `{"format": "email", "pattern": "^[a-z@.]+$"}`."""
    if "pattern" in node and "format" in node:
        yield Unenforced(pointer, "format", "ignored beside pattern")


OUTLINES_SUPPORT = KeywordSupport(
    enforced=COMMON_KEYWORDS,
    measured_on=("0.2.14",),
    formats=COMMON_FORMATS,
    rules=(
        required_outside_properties,
        pattern_beside_length,
        format_beside_pattern,
        beside_any_of,
        beside_ref,
        beside_enum,
    ),
    format_notes=(
        ("date", "is approximated: Unicode digits and day 31 in every month pass"),
        ("date-time", "is approximated: negative years, a missing offset and day 31 pass"),
        ("time", "is approximated: a missing offset passes"),
    ),
)
"""Drops numeric bounds, multipleOf, min/maxProperties (minProperties holds only on an
object with nothing else to check), patternProperties, propertyNames, oneOf exclusivity,
not, if/then/else, dependentRequired, unevaluated*; refuses allOf. Beside
`$ref`, a combinator, `enum` or `const` the other keywords go unchecked."""

_INDEX_MEMORY_PER_SERIALIZED_BYTE = 3
"""An Index gives no size: its in-memory transition maps, measured by RSS, hold about three
times its serialized form."""


class OutlinesMatcher(Matcher):
    """Wraps a Guide; stop tokens are handled here because outlines-core knows one EOS only
    and refuses to advance on it."""

    def __init__(self, index: Any, vocab: Vocabulary, max_rollback: int) -> None:
        import outlines_core

        self._index = index
        self._guide = outlines_core.Guide(index, max_rollback=max_rollback)
        self._stop_token_ids = vocab.stop_token_ids
        self._extra_stops = vocab.stop_token_ids[1:]
        self._eos = vocab.stop_token_ids[0]
        self._words = (vocab.size + 31) // 32
        self._terminated = False

    def accept(self, token_id: int) -> bool:
        if self._terminated:
            return False
        if token_id in self._stop_token_ids:
            if not self.can_stop():
                return False
            self._terminated = True
            return True
        try:
            self._guide.advance(token_id)
        except ValueError:
            return False
        return True

    def fill(self, bitmask: torch.Tensor, row: int) -> None:
        if self._terminated:
            fill_stop_only(bitmask, row, self._stop_token_ids)
            return
        self._guide.write_mask_into(row_pointer(bitmask, row, self._words), self._words, 4)
        if self._extra_stops and self.can_stop():
            set_token_bits(bitmask, row, self._extra_stops)

    def rollback(self, num_tokens: int) -> None:
        if num_tokens and self._terminated:
            self._terminated = False
            num_tokens -= 1
        if num_tokens:
            self._guide.rollback_state(num_tokens)

    def is_terminated(self) -> bool:
        return self._terminated

    def can_stop(self) -> bool:
        return not self._terminated and bool(self._index.is_final_state(self._guide.get_state()))

    def reset(self) -> None:
        self._guide.reset()
        self._terminated = False


class OutlinesBackend(Backend):
    """`compile` builds the index in this process; `compile_within` (what GrammarCompiler
    calls) builds it in a child process that is killed when the budget says stop."""

    name = "outlines"
    stoppable = True
    support = OUTLINES_SUPPORT
    distribution = "outlines_core"

    def __init__(self, vocab: Vocabulary, *, max_rollback: int = 64) -> None:
        import outlines_core

        super().__init__(vocab)
        self._max_rollback = max_rollback
        by_bytes: dict[bytes, list[int]] = {}
        for token_id, token in enumerate(vocab.token_bytes):
            if token:
                by_bytes.setdefault(token, []).append(token_id)
        self._by_bytes = by_bytes
        self._vocabulary = outlines_core.Vocabulary(vocab.stop_token_ids[0], by_bytes)
        self._builder: IndexBuilder | None = None
        self._builder_lock = threading.Lock()

    def _regex(self, grammar: Grammar, lowered: LoweredSchema | None) -> str:
        from outlines_core.json_schema import build_regex_from_schema

        if lowered is not None:
            whitespace = (
                ""
                if grammar.whitespace == "compact"
                else f"[ \\t\\n\\r]{{0,{grammar.max_whitespace}}}"
            )
            try:
                return str(build_regex_from_schema(lowered.source, whitespace_pattern=whitespace))
            except (ValueError, TypeError, RuntimeError) as exc:
                raise UnsupportedGrammarError(
                    f"outlines cannot express {grammar.describe()}: {exc}"
                ) from None
        if grammar.kind in ("regex", "choice"):
            return grammar.as_regex()
        raise UnsupportedGrammarError(
            f"outlines serves regular languages only; {grammar.kind} grammars need xgrammar"
        )

    def unenforced(self, grammar: Grammar, lowered: LoweredSchema | None) -> tuple[Unenforced, ...]:
        if grammar.kind in ("json", "ebnf"):
            self._regex(grammar, lowered)
        return () if lowered is None else find_unenforced(lowered.schema, OUTLINES_SUPPORT)

    def compile(self, grammar: Grammar, lowered: LoweredSchema | None) -> CompiledGrammar:
        import outlines_core

        unenforced = self.unenforced(grammar, lowered)
        regex = self._regex(grammar, lowered)
        started = time.perf_counter()
        try:
            index = outlines_core.Index(regex, self._vocabulary)
        except (ValueError, TypeError, RuntimeError) as exc:
            raise CompileError(f"outlines cannot compile {grammar.describe()}: {exc}") from None
        return self._compiled(grammar, unenforced, started, index, len(pickle.dumps(index)))

    def compile_within(
        self, grammar: Grammar, lowered: LoweredSchema | None, budget: CompileBudget
    ) -> CompiledGrammar:
        unenforced = self.unenforced(grammar, lowered)
        regex = self._regex(grammar, lowered)
        started = time.perf_counter()
        built = self._index_builder().build(regex, budget, grammar.describe())
        return self._compiled(grammar, unenforced, started, built.index, built.pickled_bytes)

    def _compiled(
        self,
        grammar: Grammar,
        unenforced: tuple[Unenforced, ...],
        started: float,
        index: Any,
        pickled_bytes: int,
    ) -> CompiledGrammar:
        return CompiledGrammar(
            self.name,
            grammar,
            unenforced,
            time.perf_counter() - started,
            lambda: OutlinesMatcher(index, self.vocab, self._max_rollback),
            memory_bytes=_INDEX_MEMORY_PER_SERIALIZED_BYTE * pickled_bytes,
        )

    def _index_builder(self) -> IndexBuilder:
        with self._builder_lock:
            if self._builder is None:
                self._builder = IndexBuilder(self.vocab.stop_token_ids[0], self._by_bytes)
            return self._builder

    def close(self) -> None:
        with self._builder_lock:
            builder, self._builder = self._builder, None
        if builder is not None:
            builder.close()
