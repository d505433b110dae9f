"""Grammar specs: what a request asks the output to be, checked up front.

A `Grammar` is an immutable, hashable value. Construction validates the spec (JSON syntax,
the JSON Schema metaschema, regex syntax, EBNF syntax) so that a bad spec fails with a
clear message before any backend sees it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Literal

from .errors import (
    GrammarTooLargeError,
    InvalidChoiceError,
    InvalidEBNFError,
    InvalidJSONError,
    InvalidRegexError,
    InvalidSchemaError,
)
from .schema.lowering import LoweredSchema, lower_schema
from .schema.pointers import check_references, json_pointer, references

GrammarKind = Literal["json_schema", "json", "regex", "ebnf", "choice"]
Whitespace = Literal["compact", "flexible"]

DEFAULT_MAX_WHITESPACE = 16
"""Flexible whitespace allows at most this many characters per run: unbounded runs let
weak models wander in whitespace for hundreds of tokens."""


@dataclass(frozen=True)
class GrammarLimits:
    """Bounds checked when a grammar is built, so that one huge or deeply nested spec cannot
    exhaust a server's memory, its compile threads or Python's recursion limit.

    The defaults admit every MaskBench schema (largest 915 KB, deepest 63 levels); schema
    validation recurses several Python frames per level and fails near 200 levels.
    """

    max_source_bytes: int = 1 << 20
    """Size of the schema (compact JSON, and the text as given), regex, EBNF or choices."""
    max_depth: int = 100
    """Nesting of objects and arrays in a JSON Schema document."""

    def __post_init__(self) -> None:
        for name in ("max_source_bytes", "max_depth"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, not {getattr(self, name)}")


DEFAULT_LIMITS = GrammarLimits()


def _check_size(what: str, size: int, limits: GrammarLimits) -> None:
    if size > limits.max_source_bytes:
        raise GrammarTooLargeError(
            f"{what}: {size:,} bytes, over the limit of {limits.max_source_bytes:,} "
            "(GrammarLimits.max_source_bytes)"
        )


def _parse_schema(schema: Mapping[str, Any] | bool | str, limits: GrammarLimits) -> tuple[Any, str]:
    """(parsed schema, compact JSON source), checked against the limits and the metaschema."""
    if isinstance(schema, str):
        _check_size("the schema text", len(schema.encode("utf-8", "surrogatepass")), limits)
        try:
            parsed = json.loads(schema)
        except json.JSONDecodeError as exc:
            raise InvalidJSONError(
                f"schema text is not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
            ) from None
        except RecursionError:
            raise GrammarTooLargeError(
                f"the schema text nests too deep to parse; the limit is {limits.max_depth} "
                "levels (GrammarLimits.max_depth)"
            ) from None
    else:
        parsed = schema
    if not isinstance(parsed, (dict, bool)):
        raise InvalidSchemaError(
            f"a JSON Schema must be an object or a boolean, not {type(parsed).__name__}"
        )
    refs, anchors = references(parsed, limits.max_depth)
    try:
        source = json.dumps(parsed, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidSchemaError(f"the schema is not plain JSON data: {exc}") from None
    _check_size("the schema", len(source.encode("utf-8", "surrogatepass")), limits)
    import jsonschema  # here: seconds to import with its format checkers

    validator = jsonschema.validators.validator_for(parsed, default=jsonschema.Draft202012Validator)
    try:
        validator.check_schema(parsed)
    except jsonschema.SchemaError as exc:
        raise InvalidSchemaError(
            f"not a valid JSON Schema: {exc.message}", json_pointer(exc.absolute_path)
        ) from None
    check_references(parsed, refs, anchors)
    return parsed, source


def _ebnf_literal(text: str) -> str:
    escaped = []
    for ch in text:
        if ch in '"\\':
            escaped.append("\\" + ch)
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            escaped.append(f"\\x{ord(ch):02x}")
        else:
            escaped.append(ch)
    return '"' + "".join(escaped) + '"'


_REGEX_SPECIAL = set("\\.^$|?*+()[]{}")


def _regex_literal(text: str) -> str:
    """Escape only regex metacharacters: other escapes differ between regex dialects."""
    return "".join("\\" + ch if ch in _REGEX_SPECIAL else ch for ch in text)


@dataclass(frozen=True)
class Grammar:
    """An output constraint. Build with the classmethods, not the constructor."""

    kind: GrammarKind
    source: str
    whitespace: Whitespace = "compact"
    strict: bool = False
    max_whitespace: int = DEFAULT_MAX_WHITESPACE

    # ------------------------------------------------------------------ constructors
    @classmethod
    def json_schema(
        cls,
        schema: Mapping[str, Any] | bool | str,
        *,
        whitespace: Whitespace = "compact",
        strict: bool = False,
        max_whitespace: int = DEFAULT_MAX_WHITESPACE,
        limits: GrammarLimits = DEFAULT_LIMITS,
    ) -> Grammar:
        """JSON that validates against `schema` (a dict or JSON text).

        strict=True treats objects without `additionalProperties` as closed.
        """
        _, source = _parse_schema(schema, limits)
        _check_whitespace(whitespace, max_whitespace)
        return cls("json_schema", source, whitespace, strict, max_whitespace)

    @classmethod
    def json(
        cls, *, whitespace: Whitespace = "compact", max_whitespace: int = DEFAULT_MAX_WHITESPACE
    ) -> Grammar:
        """Any JSON value."""
        _check_whitespace(whitespace, max_whitespace)
        return cls("json", "", whitespace, False, max_whitespace)

    @classmethod
    def regex(cls, pattern: str, *, limits: GrammarLimits = DEFAULT_LIMITS) -> Grammar:
        """Text fully matching `pattern` (no anchors needed)."""
        if not isinstance(pattern, str):
            raise InvalidRegexError(f"a regex must be a string, not {type(pattern).__name__}")
        _check_size("the regex", len(pattern.encode("utf-8", "surrogatepass")), limits)
        try:
            re.compile(pattern)
        except re.error as exc:
            raise InvalidRegexError(f"invalid regex {pattern!r}: {exc}") from None
        return cls("regex", pattern)

    @classmethod
    def ebnf(cls, text: str, *, limits: GrammarLimits = DEFAULT_LIMITS) -> Grammar:
        """A GBNF-style EBNF grammar whose start rule is `root`."""
        import xgrammar

        if not isinstance(text, str) or not text.strip():
            raise InvalidEBNFError("an EBNF grammar must be non-empty text")
        _check_size("the EBNF grammar", len(text.encode("utf-8", "surrogatepass")), limits)
        try:
            xgrammar.Grammar.from_ebnf(text)
        except RuntimeError as exc:
            raise InvalidEBNFError(f"invalid EBNF grammar: {_first_line(exc)}") from None
        return cls("ebnf", text)

    @classmethod
    def choice(cls, options: Iterable[str], *, limits: GrammarLimits = DEFAULT_LIMITS) -> Grammar:
        """Exactly one of the given strings."""
        if isinstance(options, str):
            raise InvalidChoiceError("choice takes a list of strings, not one string")
        unique = tuple(dict.fromkeys(options))
        if not unique:
            raise InvalidChoiceError("choice needs at least one option")
        for index, option in enumerate(unique):
            if not isinstance(option, str) or not option:
                raise InvalidChoiceError(
                    f"choice option {index} is {option!r}; options must be non-empty strings"
                )
        source = json.dumps(unique)
        _check_size("the choice options", len(source), limits)
        return cls("choice", source)

    # ------------------------------------------------------------------ views
    @cached_property
    def schema(self) -> Any:
        """The parsed JSON Schema (json_schema grammars only)."""
        if self.kind != "json_schema":
            raise TypeError(f"a {self.kind} grammar has no schema")
        return json.loads(self.source)

    @cached_property
    def choices(self) -> tuple[str, ...]:
        """The options of a choice grammar."""
        if self.kind != "choice":
            raise TypeError(f"a {self.kind} grammar has no choices")
        return tuple(json.loads(self.source))

    def lower(self) -> LoweredSchema | None:
        """The schema the backends compile: this json_schema grammar's schema lowered (a
        new object each call: the compiler lowers once per compile and hands it on), else
        None."""
        return lower_schema(self.schema) if self.kind == "json_schema" else None

    def as_regex(self) -> str:
        """The regex a regex-only backend compiles for `regex` and `choice` grammars."""
        if self.kind == "regex":
            return self.source
        if self.kind == "choice":
            return "(" + "|".join(_regex_literal(c) for c in self.choices) + ")"
        raise TypeError(f"a {self.kind} grammar has no plain regex form")

    def as_ebnf(self) -> str:
        """The EBNF form of `ebnf` and `choice` grammars."""
        if self.kind == "ebnf":
            return self.source
        if self.kind == "choice":
            return "root ::= " + " | ".join(_ebnf_literal(c) for c in self.choices)
        raise TypeError(f"a {self.kind} grammar has no EBNF form")

    @property
    def key(self) -> tuple[str, str, str, bool, int]:
        """Cache key: equal keys compile to equal grammars."""
        return (self.kind, self.source, self.whitespace, self.strict, self.max_whitespace)

    def describe(self, limit: int = 60) -> str:
        text = self.source if len(self.source) <= limit else self.source[: limit - 3] + "..."
        return f"{self.kind}({text})" if text else self.kind


def _check_whitespace(whitespace: str, max_whitespace: int) -> None:
    if whitespace not in ("compact", "flexible"):
        raise ValueError(f"whitespace must be 'compact' or 'flexible', not {whitespace!r}")
    if max_whitespace < 1:
        raise ValueError(f"max_whitespace must be at least 1, not {max_whitespace}")


def _first_line(exc: BaseException) -> str:
    lines = [line for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__
