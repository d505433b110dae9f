"""llguidance: an Earley parser over lazily built lexers; every grammar kind, compiles in ms.

It refuses up front the JSON Schema keywords it does not implement (`lenient` is forced
off), so what it compiles it enforces; its support table below says which keywords those
are.
"""

from __future__ import annotations

import copy
import importlib.metadata
import json
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

import llguidance
import torch
from llguidance.gbnf_to_lark import any_to_lark

from ..errors import CompileError, UnsupportedGrammarError, VocabularyError
from ..grammars import Grammar
from ..schema import (
    KeywordSupport,
    LoweredSchema,
    Unenforced,
    find_unenforced,
    iter_reachable_subschemas,
    iter_subschemas,
    json_pointer,
)
from ..schema.judge import COMMON_FORMATS, COMMON_KEYWORDS
from ..schema.patterns import (
    holds_nul_without_quote_or_backslash,
    pattern_rule,
    without_nul_in_negated_classes,
)
from ..schema.walk import child_schemas
from ..vocabulary import Vocabulary
from .base import Backend, CompiledGrammar, Matcher, fill_stop_only, row_pointer


def nul_beside_no_quote_or_backslash(node: dict[str, Any], pointer: str) -> Iterable[Unenforced]:
    r"""llguidance lets the JSON escapes `\"` and `\\` through where the characters a
    pattern allows at one place hold U+0000 but not both of them: `"a\\b"` passes
    `^[\x00-\x1fa-z]+$` and `^(?:[a-z\x01-\x1f]|\x00)+$` (`[\x01-\x1fa-z]` is read right)."""
    reason = (
        "a character class or an alternative that holds U+0000 but not a quote or a"
        " backslash lets them through as JSON escapes"
    )
    yield from pattern_rule(node, pointer, holds_nul_without_quote_or_backslash, reason)


LLGUIDANCE_SUPPORT = KeywordSupport(
    enforced=COMMON_KEYWORDS
    | {
        "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf",
        "minProperties", "maxProperties", "allOf", "oneOf", "patternProperties",
    },
    measured_on=("1.7.6", "1.9.1"),
    formats=COMMON_FORMATS | {"ipv4", "ipv6", "hostname", "time", "duration"},
    rules=(nul_beside_no_quote_or_backslash,),
    format_notes=(
        ("date", "is approximated: February 29 passes in every year"),
        ("date-time", "is approximated: February 29 passes in every year"),
    ),
)  # fmt: skip
"""With lenient=False. llguidance refuses at compile time what it does not implement (not,
if/then/else, contains, uniqueItems, propertyNames, dependentRequired, dependentSchemas,
unevaluated*, unknown formats, oneOf it cannot prove exclusive), so this table only has to
be honest about what it compiles."""

_SPECIAL_MARKER = b"\xff"
"""llguidance's prefix for special tokens: never valid UTF-8, so never grammar text."""

_NO_FORCING = '%llguidance {"no_forcing": true}\n'
"""By default llguidance lets through only one tokenization of text the grammar forces
(the first token of its encoder's split); without forcing, a mask allows every token that
keeps the text in the grammar, as the other backends' masks do."""

_LEXER_FUEL = 4_000_000
"""llguidance's budget (`initial_lexer_fuel`) for the regex derivatives its lexer builds,
spent by all copies of a compiled grammar together; its default, 1,000,000, runs out inside
the first answer of a word-count pattern (`^(?:\\S+\\s+){0,49}\\S+$`) within a maxLength.
What it costs in memory is in docs/backends.md."""

_ITEMS_IN_ROW = 5_000
"""llguidance's bound on the Earley items of one row (`max_items_in_row`, default 2,000):
a schema with a few thousand alternatives open at once (an `anyOf` of 3,000 objects, the
JSON Schema Store's tmlanguage) failed at its first tokens. What a step may cost stays
bounded by `step_max_items` (50,000 items)."""

_LEXER_SPENT = "lexer error: too many"
"""How llguidance reports a lexer past its expression budget or its state bound; every
copy sharing that lexer fails from then on, at its next new lexer state."""

_REFUSALS = ("failed to compile JSON schema", "Unknown format", "not supported", "unsupported")
"""Messages of a valid spec that llguidance declines (unimplemented keywords, oneOf it cannot
prove exclusive, overlapping patternProperties, ...), as opposed to a failure."""


class _TokenSource(llguidance.TokenizerWrapper):
    """The tokenizer object `llguidance.LLTokenizer` reads: token bytes, specials, an encoder.

    The encoder is llguidance's own greedy longest match over these exact bytes. It must
    reproduce the text it is given (an encoder returning nothing made llguidance allow
    tokens outside the grammar). With forcing off, masks do not depend on its split, and
    walks over the bundled schemas never called it.
    It sets the attributes LLTokenizer reads itself: the base constructor wants a tokenizer
    object to wrap.
    """

    def __init__(self, vocab: Vocabulary) -> None:
        self.is_tokenizer_wrapper = True
        specials = vocab.special_token_ids
        self.eos_token_id = vocab.stop_token_ids[0]
        self.bos_token_id = None
        self.tokens = [
            _SPECIAL_MARKER + vocab.token_name(i).encode("utf-8")
            if i in specials
            else vocab.token_bytes[i]
            for i in range(vocab.num_tokens)
        ] + [_SPECIAL_MARKER + b"<padding>"] * (vocab.size - vocab.num_tokens)
        self.special_token_ids = sorted(specials) + list(range(vocab.num_tokens, vocab.size))
        self.greedy: llguidance.LLTokenizer | None = None

    def __call__(self, text: str | bytes) -> list[int]:
        assert self.greedy is not None, "the LLTokenizer is built before any grammar"
        if isinstance(text, bytes):
            text = text.decode("utf-8", "surrogateescape")
        return list(self.greedy.greedy_tokenize(text))


def _first_line(message: str) -> str:
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    return lines[0] if lines else "unknown error"


class LLGuidanceMatcher(Matcher):
    """Wraps an LLMatcher; stop tokens are handled here, as for outlines, so that llguidance
    never consumes one and a rollback over the stop token is exact.

    It keeps the tokens it accepted, so that when the lexer its grammar's copies share has
    spent its budget it moves onto a renewed one and replays them: what other requests
    spent never fails this one."""

    def __init__(self, template: _Template, vocab: Vocabulary) -> None:
        self._template = template
        self._matcher, self._generation = template.copy()
        self._stop_token_ids = vocab.stop_token_ids
        self._stops = frozenset(vocab.stop_token_ids)
        self._words = (vocab.size + 31) // 32
        self._terminated = False
        self._accepted: list[int] = []

    def _check_error(self) -> None:
        if self._matcher.is_error():
            raise RuntimeError(
                f"llguidance matcher error: {_first_line(self._matcher.get_error())}"
            )

    def _spent_alone(self) -> RuntimeError:
        return RuntimeError(
            f"llguidance's lexer spent its whole budget (initial_lexer_fuel={_LEXER_FUEL}) "
            f"on this request's own {len(self._accepted)} tokens"
        )

    def _renew(self) -> None:
        """Go on from a fresh lexer: replay the accepted tokens on a copy of the renewed
        template; RuntimeError if they alone spend its whole budget."""
        self._matcher, self._generation = self._template.renew(self._generation)
        replayed = self._matcher.try_consume_tokens(self._accepted)
        if replayed < len(self._accepted) or _lexer_spent(self._matcher):
            raise self._spent_alone()

    def _consume(self, token_id: int) -> bool:
        """try_consume_tokens never enters llguidance's sticky error state on a bad token."""
        if self._matcher.try_consume_tokens([token_id]) == 1:
            self._accepted.append(token_id)
            return True
        if not _lexer_spent(self._matcher):
            self._check_error()
        return False

    def _spent_on(self, token_id: int) -> bool:
        """Whether a refusal of `token_id` came from a spent lexer: the matcher's error says
        so, or, where try_consume_tokens said nothing, consuming it on a copy does."""
        if _lexer_spent(self._matcher):
            return True
        probe = self._matcher.deep_copy()
        probe.consume_token(token_id)
        return _lexer_spent(probe)

    def _write_mask(self, bitmask: torch.Tensor, row: int) -> None:
        self._matcher.unsafe_compute_mask_ptr(
            row_pointer(bitmask, row, self._words), self._words * 4
        )

    def accept(self, token_id: int) -> bool:
        if self._terminated:
            return False
        if token_id in self._stops:
            if not self._matcher.is_accepting():
                return False
            self._terminated = True
            return True
        if self._consume(token_id):
            return True
        if not self._spent_on(token_id):
            return False
        self._renew()
        if self._consume(token_id):
            return True
        if self._spent_on(token_id):
            raise self._spent_alone()
        return False

    def fill(self, bitmask: torch.Tensor, row: int) -> None:
        if self._terminated:
            fill_stop_only(bitmask, row, self._stop_token_ids)
            return
        self._write_mask(bitmask, row)
        if _lexer_spent(self._matcher):
            self._renew()
            self._write_mask(bitmask, row)
            if _lexer_spent(self._matcher):
                raise self._spent_alone()
        self._check_error()

    def rollback(self, num_tokens: int) -> None:
        if num_tokens and self._terminated:
            self._terminated = False
            num_tokens -= 1
        if num_tokens and not self._matcher.rollback(num_tokens):
            raise ValueError(f"cannot roll back {num_tokens} tokens: fewer were accepted")
        if num_tokens:
            del self._accepted[-num_tokens:]

    def is_terminated(self) -> bool:
        return self._terminated

    def can_stop(self) -> bool:
        return not self._terminated and bool(self._matcher.is_accepting())

    def reset(self) -> None:
        self._matcher.reset()
        self._terminated = False
        self._accepted.clear()


def _lexer_spent(matcher: Any) -> bool:
    """Whether `matcher` stopped on a lexer past its budget (`_LEXER_SPENT`)."""
    return bool(matcher.is_error()) and _LEXER_SPENT in matcher.get_error()


class _Template:
    """A compiled LLMatcher at the start of its grammar; requests get deep copies of it
    (sharing the compiled lexer and parser tables) instead of compiling again.

    The copies share one lexer and its budget; once a copy finds it spent, `renew` builds
    the template again from the same grammar, so later copies start with a fresh budget."""

    def __init__(self, build: Callable[[], Any]) -> None:
        self._build = build
        self._matcher = build()
        self._generation = 0
        self._lock = threading.Lock()

    @property
    def error(self) -> str | None:
        """llguidance's first error line where the grammar did not compile, else None."""
        return _first_line(self._matcher.get_error()) if self._matcher.is_error() else None

    def copy(self) -> tuple[Any, int]:
        """A copy at the start of the grammar, and the generation it came from."""
        with self._lock:
            return self._matcher.deep_copy(), self._generation

    def renew(self, spent_generation: int) -> tuple[Any, int]:
        """A copy from a template newer than `spent_generation` (built now where none is)."""
        with self._lock:
            if self._generation == spent_generation:
                self._matcher = self._build()
                self._generation += 1
            return self._matcher.deep_copy(), self._generation


def _closed_objects(schema: Any) -> Any:
    """strict=True: every object schema without its own rule for extra keys is closed."""
    closed = copy.deepcopy(schema)
    for node, _ in iter_subschemas(closed):
        is_object = node.get("type") == "object" or "properties" in node
        open_rules = ("additionalProperties", "patternProperties", "unevaluatedProperties")
        if is_object and not any(rule in node for rule in open_rules):
            node["additionalProperties"] = False
    return closed


_NEGATING = ("not", "oneOf", "if", "contains")
"""Keywords under which a stricter subschema can let more through (`oneOf` of overlapping
branches, `maxContains`)."""


def _leads_off_the_walk(node: dict[str, Any]) -> bool:
    """`node` refers somewhere other than by a local JSON pointer (`#/...`)."""
    reference = node.get("$ref", "#/")
    dynamic = "$dynamicRef" in node or "$recursiveRef" in node
    return dynamic or not (isinstance(reference, str) and reference.startswith("#/"))


def _nul_free_negated_classes(schema: Any) -> Any:
    """`schema` with U+0000 added to the negated classes of each `pattern` that llguidance
    would misread (`without_nul_in_negated_classes`), except in the subschemas a keyword
    negates (and what their `$ref`s lead to), where stricter could mean looser; `schema`
    itself where nothing changes. The cost is strings that hold U+0000 there;
    `patternProperties` keys stay as written, since a name such a key no longer matched
    would be let through."""
    if not isinstance(schema, dict) or not any(
        isinstance(pattern := node.get("pattern"), str)
        and without_nul_in_negated_classes(pattern) != pattern
        for node, _ in iter_reachable_subschemas(schema)
    ):
        return schema
    rewritten = copy.deepcopy(schema)
    nodes = list(iter_reachable_subschemas(rewritten))
    negated = [
        pointer + json_pointer(step)
        for node, pointer in nodes
        for step, _ in child_schemas(node)
        if step[0] in _NEGATING
    ]
    under_negation = [node for node, _ in iter_reachable_subschemas(rewritten, negated)]
    if any(_leads_off_the_walk(node) for node in under_negation):
        return schema  # a reference the walk does not follow ("#", "$dynamicRef")
    left = {id(node) for node in under_negation}
    for node, _ in nodes:
        if isinstance(pattern := node.get("pattern"), str) and id(node) not in left:
            node["pattern"] = without_nul_in_negated_classes(pattern)
    return rewritten


def _served_schema(lowered: LoweredSchema | None) -> Any:
    """The schema llguidance is given for `lowered` (None where there is none): judged and
    compiled alike, and rewritten once per compile."""
    return None if lowered is None else _nul_free_negated_classes(lowered.schema)


def _unenforced_in(served: Any) -> tuple[Unenforced, ...]:
    return () if served is None else find_unenforced(served, LLGUIDANCE_SUPPORT)


def _general_escapes_option() -> dict[str, bool]:
    """`json_allow_general_unicode_escapes` where this llguidance knows it (1.9 does):
    strings may then hold any printable \\u escape. 1.7, which vLLM pins, refuses the key;
    without it fewer escapes pass, which is sound but rejects some valid instances."""
    option = {"json_allow_general_unicode_escapes": True}
    probe = json.dumps({"type": "string", "x-guidance": option})
    error = llguidance.LLMatcher.validate_grammar(
        llguidance.LLMatcher.grammar_from_lark(f"start: %json {probe}")
    )
    return {} if error else option


_GENERAL_ESCAPES = _general_escapes_option()
_VERSION = importlib.metadata.version("llguidance")


class LLGuidanceBackend(Backend):
    name = "llguidance"
    support = LLGUIDANCE_SUPPORT
    distribution = "llguidance"

    def __init__(self, vocab: Vocabulary) -> None:
        super().__init__(vocab)
        source = _TokenSource(vocab)
        self._tokenizer = llguidance.LLTokenizer(source, eos_token=list(vocab.stop_token_ids))
        source.greedy = self._tokenizer
        if self._tokenizer.vocab_size != vocab.size:
            raise VocabularyError(
                f"llguidance built a vocabulary of {self._tokenizer.vocab_size} ids "
                f"for logits width {vocab.size}"
            )
        self.bounds_whitespace_runs = self._whitespace_runs_bounded()
        """False on llguidance releases that let whitespace runs grow past the bound."""

    def _whitespace_runs_bounded(self) -> bool:
        """Whether this llguidance holds a whitespace run to `whitespace_pattern` (1.9 does).
        1.7, which vLLM pins, accepts runs of any length there, so flexible grammars, whose
        runs grammarmask bounds, are refused on it (auto then serves them elsewhere)."""
        options = {"whitespace_flexible": True, "whitespace_pattern": "[\\x20]{1,2}"}
        probe = json.dumps({"type": "array", "x-guidance": options})
        matcher = llguidance.LLMatcher(
            self._tokenizer,
            llguidance.LLMatcher.grammar_from_lark(f"start: %json {probe}"),
            log_level=0,
        )
        tokens = self._tokenizer.tokenize_bytes(b"[   ]")
        return matcher.try_consume_tokens(tokens) < len(tokens)

    def unenforced(self, grammar: Grammar, lowered: LoweredSchema | None) -> tuple[Unenforced, ...]:
        return _unenforced_in(_served_schema(lowered))

    def _lark(self, grammar: Grammar, served: Any) -> str:
        """The grammar as llguidance's Lark dialect (JSON Schema inline via %json); `served`
        is `_served_schema` of its lowered schema."""
        if grammar.kind in ("json_schema", "json"):
            if served is False:
                raise UnsupportedGrammarError(
                    f"llguidance cannot serve {grammar.describe()}: it accepts no JSON at all"
                )
            schema: Any = {} if served is None or served is True else served
            if grammar.strict:
                schema = _closed_objects(schema)
            flexible = grammar.whitespace == "flexible"
            if flexible and not self.bounds_whitespace_runs:
                raise UnsupportedGrammarError(
                    f"llguidance {_VERSION} cannot serve {grammar.describe()}: it does not "
                    f"bound whitespace runs to max_whitespace={grammar.max_whitespace}"
                )
            # Replaces any "x-guidance" of the schema's own: it must not turn on lenient
            # (ignore unknown keywords) or unbounded whitespace.
            options: dict[str, Any] = {
                "item_separator": ",",
                "key_separator": ":",
                "whitespace_flexible": flexible,
                "coerce_one_of": False,
                "lenient": False,
                **_GENERAL_ESCAPES,
            }
            if flexible:
                options["whitespace_pattern"] = (
                    f"[\\x20\\x0A\\x0D\\x09]{{1,{grammar.max_whitespace}}}"
                )
            return f"start: %json {json.dumps({**schema, 'x-guidance': options})}"
        if grammar.kind == "regex":
            return f"start: /{llguidance.regex_to_lark(grammar.source)}/"
        if grammar.kind == "choice":
            return "start: " + " | ".join(json.dumps(c) for c in grammar.choices)
        try:
            lark = any_to_lark(grammar.source)
        except Exception as exc:  # the converter raises several unrelated types
            raise UnsupportedGrammarError(
                f"llguidance cannot read {grammar.describe()}: {_first_line(str(exc))}"
            ) from None
        return "\n".join(line for line in lark.splitlines() if not line.startswith("%llguidance"))

    def compile(self, grammar: Grammar, lowered: LoweredSchema | None) -> CompiledGrammar:
        served = _served_schema(lowered)
        unenforced = _unenforced_in(served)
        started = time.perf_counter()
        lark = self._lark(grammar, served)
        text = llguidance.LLMatcher.grammar_from_lark(_NO_FORCING + lark)
        limits = llguidance.LLParserLimits(
            initial_lexer_fuel=_LEXER_FUEL, max_items_in_row=_ITEMS_IN_ROW
        )
        template = _Template(
            lambda: llguidance.LLMatcher(self._tokenizer, text, log_level=0, limits=limits)
        )
        if template.error is not None:
            refused = any(marker in template.error for marker in _REFUSALS)
            error = UnsupportedGrammarError if refused else CompileError
            raise error(f"llguidance cannot compile {grammar.describe()}: {template.error}")
        elapsed = time.perf_counter() - started
        return CompiledGrammar(
            self.name,
            grammar,
            unenforced,
            elapsed,
            lambda: LLGuidanceMatcher(template, self.vocab),
        )
