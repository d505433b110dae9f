"""xgrammar: pushdown automata with precomputed token masks; every grammar kind."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import xgrammar

from ..enforcement import XGRAMMAR_SUPPORT, Unenforced, find_unenforced, iter_subschemas
from ..errors import CompileError, UnsupportedGrammarError
from ..grammars import Grammar
from ..vocabulary import Vocabulary
from .base import Backend, CompiledGrammar, Matcher, fill_stop_only, pack_bits

_CONTROL_BYTES = bytes(range(0x20))
_JSON_WHITESPACE_CONTROLS = b"\t\n\r"


@dataclass(frozen=True)
class TokenFilter:
    """Tokens a grammar must never allow whatever the engine's grammar says.

    xgrammar 0.2.9 lets raw control characters into strings with minLength/maxLength
    (its character class is [^"\\\r\n]): invalid JSON. No JSON text contains a raw control
    byte outside whitespace, so those tokens are removed from every JSON row here.
    """

    allowed: torch.Tensor
    banned: frozenset[int]

    @classmethod
    def for_json(cls, vocab: Vocabulary, whitespace: str) -> TokenFilter:
        controls = _CONTROL_BYTES
        if whitespace == "flexible":
            controls = bytes(b for b in controls if b not in _JSON_WHITESPACE_CONTROLS)
        banned = frozenset(
            i
            for i, token in enumerate(vocab.token_bytes)
            if token.translate(None, controls) != token
        )
        allowed = torch.ones(vocab.size, dtype=torch.bool)
        allowed[list(banned)] = False
        return cls(pack_bits(allowed), banned)


class XGrammarMatcher(Matcher):
    def __init__(
        self,
        compiled: xgrammar.CompiledGrammar,
        stop_token_ids: tuple[int, ...],
        token_filter: TokenFilter | None,
    ) -> None:
        self._matcher = xgrammar.GrammarMatcher(
            compiled, override_stop_tokens=list(stop_token_ids), max_rollback_tokens=-1
        )
        self._stop_token_ids = stop_token_ids
        self._stops = frozenset(stop_token_ids)
        self._filter = token_filter

    def accept(self, token_id: int) -> bool:
        if self._matcher.is_terminated():
            return False
        if self._filter is not None and token_id in self._filter.banned:
            return False
        return bool(self._matcher.accept_token(token_id))

    def fill(self, bitmask: torch.Tensor, row: int) -> None:
        if self._matcher.is_terminated():
            fill_stop_only(bitmask, row, self._stop_token_ids)
            return
        self._matcher.fill_next_token_bitmask(bitmask, row)
        if self._filter is not None:
            bitmask[row].bitwise_and_(self._filter.allowed)

    def fill_drafts(self, bitmask: torch.Tensor, rows: Sequence[int], drafts: Sequence[int]) -> int:
        """The draft loop with one xgrammar call per token and one filter pass per request:
        this loop is the pool's hot path."""
        matcher = self._matcher
        if matcher.is_terminated():
            fill_stop_only(bitmask, rows[0], self._stop_token_ids)
            return 0
        banned = self._filter.banned if self._filter is not None else frozenset()
        matcher.fill_next_token_bitmask(bitmask, rows[0])
        accepted = 0
        for draft in drafts:
            if draft in banned or not matcher.accept_token(draft):
                break
            accepted += 1
            if draft in self._stops:
                fill_stop_only(bitmask, rows[accepted], self._stop_token_ids)
            else:
                matcher.fill_next_token_bitmask(bitmask, rows[accepted])
        if accepted:
            matcher.rollback(accepted)
        if self._filter is not None:
            filled = rows[: accepted + 1]
            if filled[-1] - filled[0] == len(filled) - 1:
                bitmask[filled[0] : filled[-1] + 1].bitwise_and_(self._filter.allowed)
            else:
                for row in filled:
                    bitmask[row].bitwise_and_(self._filter.allowed)
        return accepted

    def rollback(self, num_tokens: int) -> None:
        if num_tokens:
            self._matcher.rollback(num_tokens)

    def is_terminated(self) -> bool:
        return bool(self._matcher.is_terminated())

    def can_stop(self) -> bool:
        return not self._matcher.is_terminated() and bool(self._matcher.is_completed())

    def reset(self) -> None:
        self._matcher.reset()


class XGrammarBackend(Backend):
    name = "xgrammar"

    def __init__(self, vocab: Vocabulary, *, compile_threads: int = 2) -> None:
        super().__init__(vocab)
        info = xgrammar.TokenizerInfo(
            list(vocab.token_bytes),
            xgrammar.VocabType.RAW,
            vocab_size=vocab.size,
            stop_token_ids=list(vocab.stop_token_ids),
        )
        # grammarmask keeps its own bounded cache; xgrammar's would grow without limit.
        self._compiler = xgrammar.GrammarCompiler(
            info, max_threads=compile_threads, cache_enabled=False
        )
        self._filters: dict[str, TokenFilter] = {}
        self._filters_lock = threading.Lock()

    def _json_filter(self, whitespace: str) -> TokenFilter:
        with self._filters_lock:
            if whitespace not in self._filters:
                self._filters[whitespace] = TokenFilter.for_json(self.vocab, whitespace)
            return self._filters[whitespace]

    def unenforced(self, grammar: Grammar) -> tuple[Unenforced, ...]:
        if grammar.kind != "json_schema":
            return ()
        found = find_unenforced(grammar.schema, XGRAMMAR_SUPPORT)
        if grammar.whitespace == "flexible":
            found += tuple(
                Unenforced(
                    pointer,
                    "maxLength" if "maxLength" in node else "minLength",
                    "a raw TAB can enter this string under flexible whitespace",
                )
                for node, pointer in iter_subschemas(grammar.schema)
                if ("minLength" in node or "maxLength" in node)
                and "pattern" not in node
                and "format" not in node
            )
        return found

    def _compile_raw(self, grammar: Grammar) -> Any:
        if grammar.kind in ("json_schema", "json"):
            flexible = grammar.whitespace == "flexible"
            schema = grammar.source if grammar.kind == "json_schema" else "{}"
            return self._compiler.compile_json_schema(
                schema,
                any_whitespace=flexible,
                separators=None if flexible else (",", ":"),
                strict_mode=grammar.strict,
                max_whitespace_cnt=grammar.max_whitespace if flexible else None,
            )
        if grammar.kind == "regex":
            return self._compiler.compile_regex(grammar.source)
        return self._compiler.compile_grammar(grammar.as_ebnf())

    def compile(self, grammar: Grammar) -> CompiledGrammar:
        unenforced = self.unenforced(grammar)
        started = time.perf_counter()
        try:
            compiled = self._compile_raw(grammar)
        except (RuntimeError, ValueError, TypeError) as exc:
            message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            error = UnsupportedGrammarError if "nsupported" in message else CompileError
            raise error(f"xgrammar cannot compile {grammar.describe()}: {message}") from None
        elapsed = time.perf_counter() - started
        stops = self.vocab.stop_token_ids
        token_filter = (
            self._json_filter(grammar.whitespace)
            if grammar.kind in ("json_schema", "json")
            else None
        )
        return CompiledGrammar(
            self.name,
            grammar,
            unenforced,
            elapsed,
            lambda: XGrammarMatcher(compiled, stops, token_filter),
            memory_bytes=int(compiled.memory_size_bytes),
        )
