"""xgrammar: pushdown automata with precomputed token masks; every grammar kind."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy
import torch
import xgrammar

from ..errors import CompileError, UnsupportedGrammarError
from ..grammars import Grammar
from ..schema import (
    KeywordSupport,
    LoweredSchema,
    Unenforced,
    find_unenforced,
    iter_reachable_subschemas,
)
from ..schema.formats import FIXED_LENGTH_PATTERNS
from ..schema.judge import (
    COMMON_FORMATS,
    COMMON_KEYWORDS,
    beside_any_of,
    beside_enum,
    beside_ref,
    required_outside_properties,
)
from ..schema.patterns import (
    astral_beside_backslash,
    class_rule,
    has_optional_group_ending_in_repetition,
    may_exclude_non_ascii,
)
from ..vocabulary import Vocabulary
from .base import Backend, CompiledGrammar, Matcher, fill_stop_only, pack_bits, words_per_row


def length_beside_pattern_or_format(node: dict[str, Any], pointer: str) -> Iterable[Unenforced]:
    """xgrammar drops minLength/maxLength next to pattern or format (a warning only), which
    changes nothing where the pattern fixes the length within them."""
    if "pattern" in node or "format" in node:
        pattern = node.get("pattern")
        fixed = FIXED_LENGTH_PATTERNS.get(pattern) if isinstance(pattern, str) else None
        for keyword in ("minLength", "maxLength"):
            value = node.get(keyword)
            if value is None:
                continue
            implied = (
                fixed is not None
                and "format" not in node
                and isinstance(value, int)
                and (value >= fixed if keyword == "maxLength" else value <= fixed)
            )
            if implied:
                continue
            yield Unenforced(pointer, keyword, "ignored when combined with pattern or format")


def optional_group_ending_in_repetition(node: dict[str, Any], pointer: str) -> Iterable[Unenforced]:
    """xgrammar compiles a schema pattern's `(bc+)?` as if `b` were optional too (`acZ`
    passes `^a(bc+)?Z$`): such a pattern is not enforced."""
    pattern = node.get("pattern")
    if isinstance(pattern, str) and has_optional_group_ending_in_repetition(pattern):
        yield Unenforced(pointer, "pattern", "an optional group ending in a repetition")


def negated_class_excluding_non_ascii(node: dict[str, Any], pointer: str) -> Iterable[Unenforced]:
    r"""xgrammar lets a `\uXXXX` escape through a negated class that excludes that non-ASCII
    character: `"\u00e9"` passes `^[^é]+$`."""
    reason = (
        "a negated character class that excludes a non-ASCII character lets it through"
        " as a JSON escape"
    )
    yield from class_rule(node, pointer, may_exclude_non_ascii, reason)


def astral_class_beside_backslash(node: dict[str, Any], pointer: str) -> Iterable[Unenforced]:
    r"""xgrammar reads a class that holds a character above U+FFFF and the backslash on the
    written text: `"a\u0022b"` (a quote) and `"a\nb"` pass `^[!#-~\U00010000-\U0010ffff]+$`
    written with the characters themselves."""
    reason = (
        "a character class with characters above U+FFFF and the backslash lets JSON escapes through"
    )
    yield from class_rule(node, pointer, astral_beside_backslash, reason)


_ONE_TYPE_KEYWORDS = frozenset(
    {
        "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf",
        "minLength", "maxLength", "pattern", "format", "minItems", "maxItems",
        "minProperties", "maxProperties",
    }
)  # fmt: skip
"""Keywords that constrain values of one type only."""


def one_type_keywords_without_type(node: dict[str, Any], pointer: str) -> Iterable[Unenforced]:
    """xgrammar applies the keywords of one type only where the schema object names its
    type: `"b"` passes `{"pattern": "^a$"}`, `2` passes `{"minimum": 3}`. Beside `enum` or
    `const`, `beside_enum` judges them against the listed values."""
    if "type" in node or "enum" in node or "const" in node:
        return
    for keyword in node:
        if keyword in _ONE_TYPE_KEYWORDS:
            yield Unenforced(pointer, keyword, "ignored where the schema names no type")


def pattern_beside_format(node: dict[str, Any], pointer: str) -> Iterable[Unenforced]:
    """xgrammar builds a string with a `format` from the format alone: `"ftp://a.b"` passes
    `{"format": "uri", "pattern": "^wss?://"}`."""
    if "pattern" in node and "format" in node:
        yield Unenforced(pointer, "pattern", "ignored beside format")


def properties_beside_pattern_properties(
    node: dict[str, Any], pointer: str
) -> Iterable[Unenforced]:
    """Beside `patternProperties` xgrammar lets any value through a listed property (its
    names and `required` still hold): `{"a": 0}` passes `{"properties": {"a": {"type":
    "string"}}, "patternProperties": {"^x-": {}}}`."""
    if isinstance(node.get("patternProperties"), dict) and isinstance(node.get("properties"), dict):
        yield Unenforced(pointer, "properties", "ignored beside patternProperties")


def anchor_reference(node: dict[str, Any], pointer: str) -> Iterable[Unenforced]:
    """xgrammar follows `#` and `#/pointer` references only: through `"#name"` any value
    passes. Lowering rewrites those it can locate as pointers."""
    ref = node.get("$ref")
    if isinstance(ref, str) and ref.startswith("#") and ref != "#" and ref[1] != "/":
        yield Unenforced(pointer, "$ref", "a reference to an anchor is not followed")


XGRAMMAR_SUPPORT = KeywordSupport(
    enforced=COMMON_KEYWORDS
    | {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}
    | {"minProperties", "maxProperties"},
    measured_on=("0.2.8", "0.2.9"),
    formats=COMMON_FORMATS | {"ipv4", "hostname", "time"},
    rules=(
        required_outside_properties,
        length_beside_pattern_or_format,
        beside_any_of,
        beside_ref,
        beside_enum,
        one_type_keywords_without_type,
        anchor_reference,
        pattern_beside_format,
        properties_beside_pattern_properties,
        optional_group_ending_in_repetition,
        negated_class_excluding_non_ascii,
        astral_class_beside_backslash,
    ),
    format_notes=(
        ("date", "is approximated: any day 01-31 passes in every month"),
        ("date-time", "is approximated: any day 01-31 passes in every month"),
    ),
)
"""Compiled but not enforced: uniqueItems, contains, not, if/then/else, oneOf exclusivity,
allOf beyond types, dependentRequired, unevaluated*; multipleOf, patternProperties and
propertyNames only in some shapes, so never trusted. Beside `$ref` or a combinator the
other keywords go unchecked, and so do keywords beside `enum`/`const` and the keywords of one
type where no type is named."""

_REFUSALS = ("nsupported", "cannot accept any value")
"""Compile errors that are xgrammar refusing a shape (a `false` subschema among them), not
a fault: the grammar is unsupported there, and another backend may take it."""

_CONTROL_BYTES = bytes(range(0x20))
_JSON_WHITESPACE_CONTROLS = b"\t\n\r"
_SURROGATE_LEAD = 0xED
_SURROGATE_SECOND = range(0xA0, 0xC0)
"""ED A0..BF starts the UTF-8 form of a UTF-16 surrogate (U+D800..U+DFFF): never valid."""


def _has_surrogate(token: bytes) -> bool:
    return any(
        first == _SURROGATE_LEAD and second in _SURROGATE_SECOND
        for first, second in itertools.pairwise(token)
    )


@dataclass(frozen=True, slots=True)
class TokenFilter:
    """Tokens a grammar must never allow whatever xgrammar says.

    xgrammar 0.2.9 lets raw control characters into strings with minLength/maxLength
    (its character class is [^"\\\r\n]): invalid JSON. No JSON text contains a raw control
    byte outside whitespace, so those tokens are removed from every JSON row here.

    It also accepts the UTF-8 form of surrogates (ED A0..BF ..) in every grammar kind:
    invalid UTF-8. Tokens holding ED A0..BF are removed everywhere; after a token ending in
    ED, tokens starting with A0..BF are removed too (`after_lead`), since the pair can
    straddle two tokens.

    The `banned` tokens are hidden from xgrammar itself (its vocabulary gets them as b"",
    which it never allows), so its rows come without them and a fill needs no pass over
    the row; only the rare row after a lead is narrowed here.
    """

    banned: frozenset[int]
    after_lead: numpy.ndarray[Any, Any]
    """Packed words without the continuations (numpy: a torch call on one row costs more
    than the AND itself)."""
    leads: frozenset[int]
    """Tokens whose last byte is ED."""
    continuations: frozenset[int]
    """Tokens whose first byte is A0..BF: refused after a lead."""
    stop_only: numpy.ndarray[Any, Any]
    """The row after an accepted stop token."""

    @classmethod
    def build(cls, vocab: Vocabulary, controls: bytes) -> TokenFilter:
        tokens = vocab.token_bytes
        banned = frozenset(
            i
            for i, token in enumerate(tokens)
            if token.translate(None, controls) != token or _has_surrogate(token)
        )
        continuations = frozenset(
            i for i, token in enumerate(tokens) if token and token[0] in _SURROGATE_SECOND
        )
        after_lead = torch.ones(vocab.size, dtype=torch.bool)
        after_lead[list(continuations)] = False
        stop_only = torch.zeros(1, words_per_row(vocab.size), dtype=torch.int32)
        fill_stop_only(stop_only, 0, vocab.stop_token_ids)
        return cls(
            banned,
            pack_bits(after_lead).numpy(),
            frozenset(i for i, token in enumerate(tokens) if token[-1:] == b"\xed"),
            continuations,
            stop_only[0].numpy(),
        )

    @classmethod
    def for_grammar(cls, vocab: Vocabulary, kind: str, whitespace: str) -> TokenFilter:
        if kind not in ("json_schema", "json"):
            return cls.build(vocab, b"")
        controls = _CONTROL_BYTES
        if whitespace == "flexible":
            controls = bytes(b for b in controls if b not in _JSON_WHITESPACE_CONTROLS)
        return cls.build(vocab, controls)


@dataclass(frozen=True)
class _Dialect:
    """An xgrammar compiler whose vocabulary hides one filter's banned tokens."""

    token_filter: TokenFilter
    compiler: Any


_batchers = threading.local()


def _thread_batcher() -> xgrammar.BatchGrammarMatcher:
    """This thread's batch matcher (max_threads=1: the pool's fill threads are the
    parallelism, and one batch matcher is not known to be safe to share)."""
    batcher: xgrammar.BatchGrammarMatcher | None = getattr(_batchers, "batcher", None)
    if batcher is None:
        batcher = _batchers.batcher = xgrammar.BatchGrammarMatcher(max_threads=1)
    return batcher


class XGrammarMatcher(Matcher):
    """Rows are handled as numpy views: on one row, a torch call's dispatch costs several
    times the numpy operation."""

    __slots__ = ("_ends_with_lead", "_filter", "_matcher", "_stopped", "_stops")

    def __init__(
        self,
        compiled: xgrammar.CompiledGrammar,
        stop_token_ids: tuple[int, ...],
        token_filter: TokenFilter,
    ) -> None:
        self._matcher = xgrammar.GrammarMatcher(
            compiled, override_stop_tokens=list(stop_token_ids), max_rollback_tokens=-1
        )
        self._stops = frozenset(stop_token_ids)
        self._filter = token_filter
        self._ends_with_lead: list[bool] = []
        """Per accepted token: does it end with ED? (rolled back with the tokens)"""
        self._stopped = False
        """A stop token was accepted (always the last token: nothing is accepted after it)."""

    def _after_lead(self) -> bool:
        return bool(self._ends_with_lead) and self._ends_with_lead[-1]

    def accept(self, token_id: int) -> bool:
        if self._stopped:
            return False
        if token_id in self._filter.banned or (
            self._after_lead() and token_id in self._filter.continuations
        ):
            return False
        if not self._matcher.accept_token(token_id):
            return False
        self._ends_with_lead.append(token_id in self._filter.leads)
        self._stopped = token_id in self._stops
        return True

    def fill(self, bitmask: torch.Tensor, row: int) -> None:
        if self._stopped:
            bitmask[row].numpy()[:] = self._filter.stop_only
            return
        self._matcher.fill_next_token_bitmask(bitmask, row)
        ends_with_lead = self._ends_with_lead
        if ends_with_lead and ends_with_lead[-1]:  # not _after_lead(): the hot path
            words = bitmask[row].numpy()
            words &= self._filter.after_lead

    @classmethod
    def fill_many(
        cls, matchers: Sequence[Matcher], bitmask: torch.Tensor, rows: Sequence[int]
    ) -> bool:
        """One batch call for the matchers not stopped (it releases the GIL once for all of
        them: two fill threads that each released and took it back per request queued on
        it), then the stop rows and the rows after a lead, as `fill` writes them."""
        ours = cast(Sequence[XGrammarMatcher], matchers)
        live = [m._matcher for m in ours if not m._stopped]
        if live:
            live_rows = [row for m, row in zip(ours, rows, strict=True) if not m._stopped]
            _thread_batcher().batch_fill_next_token_bitmask(live, bitmask, live_rows)
        words = None
        for matcher, row in zip(ours, rows, strict=True):
            ends_with_lead = matcher._ends_with_lead
            if matcher._stopped or (ends_with_lead and ends_with_lead[-1]):
                words = bitmask.numpy() if words is None else words
                if matcher._stopped:
                    words[row] = matcher._filter.stop_only
                else:
                    words[row] &= matcher._filter.after_lead
        return True

    def fill_drafts(self, bitmask: torch.Tensor, rows: Sequence[int], drafts: Sequence[int]) -> int:
        """The draft loop, one xgrammar call per token: the pool's hot path (why not
        xgrammar's traverse_draft_tree: docs/performance.md). The banned tokens never reach
        a row (see TokenFilter): only a stop row or a row after a lead is written here."""
        if not drafts:  # one row: a decode step without speculation
            self.fill(bitmask, rows[0])
            return 0
        token_filter = self._filter
        if self._stopped:
            bitmask[rows[0]].numpy()[:] = token_filter.stop_only
            return 0
        matcher = self._matcher
        banned, leads, continuations = (
            token_filter.banned,
            token_filter.leads,
            token_filter.continuations,
        )
        matcher.fill_next_token_bitmask(bitmask, rows[0])
        after_lead = self._after_lead()
        lead_rows = [rows[0]] if after_lead else []
        stop_row = None
        accepted = 0
        for draft in drafts:
            if (
                draft in banned
                or (after_lead and draft in continuations)
                or not matcher.accept_token(draft)
            ):
                break
            accepted += 1
            after_lead = draft in leads
            if after_lead:
                lead_rows.append(rows[accepted])
            if draft in self._stops:
                stop_row = rows[accepted]
            else:
                matcher.fill_next_token_bitmask(bitmask, rows[accepted])
        if accepted:
            matcher.rollback(accepted)
        if stop_row is not None or lead_rows:
            words = bitmask.numpy()
            for row in lead_rows:
                words[row] &= token_filter.after_lead
            if stop_row is not None:
                words[stop_row] = token_filter.stop_only
        return accepted

    def rollback(self, num_tokens: int) -> None:
        if num_tokens:
            self._matcher.rollback(num_tokens)
            del self._ends_with_lead[-num_tokens:]
            self._stopped = False

    def is_terminated(self) -> bool:
        return self._stopped

    def can_stop(self) -> bool:
        return not self._stopped and bool(self._matcher.is_completed())

    def reset(self) -> None:
        self._matcher.reset()
        self._ends_with_lead.clear()
        self._stopped = False


class XGrammarBackend(Backend):
    name = "xgrammar"
    support = XGRAMMAR_SUPPORT
    distribution = "xgrammar"

    def __init__(self, vocab: Vocabulary, *, compile_threads: int = 2) -> None:
        super().__init__(vocab)
        self._compile_threads = compile_threads
        self._dialects: dict[str, _Dialect] = {}
        self._dialects_lock = threading.Lock()

    def _dialect(self, grammar: Grammar) -> _Dialect:
        """The filter and compiler for `grammar`'s kind, built on first use (JSON with either
        whitespace, or text): each hides other tokens from xgrammar's vocabulary."""
        json_kind = grammar.kind in ("json_schema", "json")
        key = f"json/{grammar.whitespace}" if json_kind else "text"
        with self._dialects_lock:
            if key not in self._dialects:
                token_filter = TokenFilter.for_grammar(self.vocab, grammar.kind, grammar.whitespace)
                visible = [
                    b"" if i in token_filter.banned else token
                    for i, token in enumerate(self.vocab.token_bytes)
                ]
                info = xgrammar.TokenizerInfo(
                    visible,
                    xgrammar.VocabType.RAW,
                    vocab_size=self.vocab.size,
                    stop_token_ids=list(self.vocab.stop_token_ids),
                )
                # grammarmask keeps its own bounded cache; xgrammar's would grow without limit
                compiler = xgrammar.GrammarCompiler(
                    info, max_threads=self._compile_threads, cache_enabled=False
                )
                self._dialects[key] = _Dialect(token_filter, compiler)
            return self._dialects[key]

    def unenforced(self, grammar: Grammar, lowered: LoweredSchema | None) -> tuple[Unenforced, ...]:
        if lowered is None:
            return ()
        schema = lowered.schema
        found = find_unenforced(schema, XGRAMMAR_SUPPORT)
        if grammar.whitespace == "flexible":
            found += tuple(
                Unenforced(
                    pointer,
                    "maxLength" if "maxLength" in node else "minLength",
                    "a raw TAB can enter this string under flexible whitespace",
                )
                for node, pointer in iter_reachable_subschemas(schema)
                if ("minLength" in node or "maxLength" in node)
                and "pattern" not in node
                and "format" not in node
            )
        return found

    @staticmethod
    def _compile_raw(grammar: Grammar, lowered: LoweredSchema | None, compiler: Any) -> Any:
        if grammar.kind in ("json_schema", "json"):
            flexible = grammar.whitespace == "flexible"
            schema = lowered.source if lowered is not None else "{}"
            return compiler.compile_json_schema(
                schema,
                any_whitespace=flexible,
                separators=None if flexible else (",", ":"),
                strict_mode=grammar.strict,
                max_whitespace_cnt=grammar.max_whitespace if flexible else None,
            )
        if grammar.kind == "regex":
            return compiler.compile_regex(grammar.source)
        return compiler.compile_grammar(grammar.as_ebnf())

    def compile(self, grammar: Grammar, lowered: LoweredSchema | None) -> CompiledGrammar:
        unenforced = self.unenforced(grammar, lowered)
        dialect = self._dialect(grammar)
        started = time.perf_counter()
        try:
            compiled = self._compile_raw(grammar, lowered, dialect.compiler)
        except (RuntimeError, ValueError, TypeError) as exc:
            message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            refused = any(marker in message for marker in _REFUSALS)
            error = UnsupportedGrammarError if refused else CompileError
            raise error(f"xgrammar cannot compile {grammar.describe()}: {message}") from None
        elapsed = time.perf_counter() - started
        stops = self.vocab.stop_token_ids
        token_filter = dialect.token_filter
        return CompiledGrammar(
            self.name,
            grammar,
            unenforced,
            elapsed,
            lambda: XGrammarMatcher(compiled, stops, token_filter),
            memory_bytes=int(compiled.memory_size_bytes),
        )
