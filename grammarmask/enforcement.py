"""What a backend enforces of a JSON Schema, decided before the schema is served.

Backends compile many keywords they then ignore. Each backend declares the keywords and
formats it really enforces (measured, see tests/test_enforcement.py); every other
constraint found in a schema is reported as `Unenforced`, with its JSON pointer. The
report is an allowlist check: a keyword of the JSON Schema vocabulary (drafts 4 to 2020-12)
that a backend does not list is reported, never trusted. Keywords outside that vocabulary
(`x-...`, `_format`, typos) and formats outside FORMATS constrain nothing — validators
ignore them — and are skipped.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from .formats import FIXED_LENGTH_PATTERNS
from .grammars import json_pointer

VOCABULARY = frozenset(
    {
        "type", "enum", "const", "multipleOf", "maximum", "exclusiveMaximum", "minimum",
        "exclusiveMinimum", "maxLength", "minLength", "pattern", "format", "items",
        "additionalItems", "prefixItems", "contains", "minContains", "maxContains", "maxItems",
        "minItems", "uniqueItems", "maxProperties", "minProperties", "required", "properties",
        "patternProperties", "additionalProperties", "dependencies", "dependentRequired",
        "dependentSchemas", "propertyNames", "allOf", "anyOf", "oneOf", "not", "if", "then",
        "else", "unevaluatedItems", "unevaluatedProperties", "$ref", "$dynamicRef",
        "$recursiveRef",
    }
)  # fmt: skip
"""Keywords that can constrain an instance in some JSON Schema draft; the others ($id, title,
$defs, examples, x-..., ...) are annotations or unknown, and validators ignore them."""

FORMATS = frozenset(
    {
        "date-time", "date", "time", "duration", "email", "idn-email", "hostname",
        "idn-hostname", "ipv4", "ipv6", "uri", "uri-reference", "iri", "iri-reference", "uuid",
        "uri-template", "json-pointer", "relative-json-pointer", "regex",
    }
)  # fmt: skip
"""The formats JSON Schema defines. Validators check no other (OpenAPI's int32, double, ...),
so another `format` constrains nothing and is not reported."""

SUBSCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
SUBSCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems")
SUBSCHEMA_SINGLE = (
    "additionalProperties", "items", "additionalItems", "contains", "not", "if", "then", "else",
    "propertyNames", "unevaluatedItems", "unevaluatedProperties",
)  # fmt: skip


@dataclass(frozen=True)
class Unenforced:
    """One constraint of a schema that the serving backend lets through unchecked."""

    pointer: str
    keyword: str
    reason: str = "not enforced by this backend"

    def __str__(self) -> str:
        return f"{self.keyword} at {self.pointer or '/'}: {self.reason}"


SchemaRule = Callable[[dict[str, Any], str], Iterable[Unenforced]]
"""A context check: given one schema object and its pointer, what it leaves unenforced."""


@dataclass(frozen=True)
class KeywordSupport:
    """A backend's measured JSON Schema coverage."""

    enforced: frozenset[str]
    formats: frozenset[str] = frozenset()
    rules: tuple[SchemaRule, ...] = field(default=())
    format_notes: tuple[tuple[str, str], ...] = ()
    """Why a format outside `formats` is not enforced, where it is only approximated."""


def iter_subschemas(schema: Any, pointer: str = "") -> Iterator[tuple[dict[str, Any], str]]:
    """Every schema object inside `schema`, with its JSON pointer (boolean schemas skipped)."""
    if not isinstance(schema, dict):
        return
    yield schema, pointer
    for key in SUBSCHEMA_MAPS:
        children = schema.get(key)
        if isinstance(children, dict):
            for name, child in children.items():
                yield from iter_subschemas(child, pointer + json_pointer((key, name)))
    for key in (*SUBSCHEMA_LISTS, "items"):
        children = schema.get(key)
        if isinstance(children, list):
            for index, child in enumerate(children):
                yield from iter_subschemas(child, pointer + json_pointer((key, index)))
    for key in SUBSCHEMA_SINGLE:
        child = schema.get(key)
        if isinstance(child, dict):
            yield from iter_subschemas(child, pointer + json_pointer((key,)))


def find_unenforced(schema: Any, support: KeywordSupport) -> tuple[Unenforced, ...]:
    """Constraints of `schema` that a backend with `support` would not enforce."""
    found: list[Unenforced] = []
    for node, pointer in iter_subschemas(schema):
        for keyword, value in node.items():
            if keyword not in VOCABULARY:
                continue
            if keyword == "format":
                if value in FORMATS and value not in support.formats:
                    note = dict(support.format_notes).get(value, "is not checked")
                    found.append(Unenforced(pointer, "format", f"format {value!r} {note}"))
            elif keyword not in support.enforced:
                found.append(Unenforced(pointer, keyword))
        for rule in support.rules:
            found.extend(rule(node, pointer))
    return tuple(dict.fromkeys(found))


def required_outside_properties(node: dict[str, Any], pointer: str) -> Iterable[Unenforced]:
    """Backends build objects from `properties`; a required name not listed there is dropped."""
    listed = node.get("properties", {})
    for name in node.get("required", []) if isinstance(node.get("required"), list) else []:
        if not isinstance(listed, dict) or name not in listed:
            yield Unenforced(
                pointer, "required", f"required property {name!r} is not in properties"
            )


def length_beside_pattern_or_format(node: dict[str, Any], pointer: str) -> Iterable[Unenforced]:
    """xgrammar 0.2.9 drops minLength/maxLength next to pattern or format (a warning only),
    which changes nothing where the pattern fixes the length within them."""
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


def pattern_beside_length(node: dict[str, Any], pointer: str) -> Iterable[Unenforced]:
    """outlines-core 0.2.14 builds a string with minLength/maxLength from the lengths alone,
    dropping its pattern (measured)."""
    if "pattern" in node and ("minLength" in node or "maxLength" in node):
        yield Unenforced(pointer, "pattern", "ignored when combined with minLength/maxLength")


def optional_group_ending_in_repetition(node: dict[str, Any], pointer: str) -> Iterable[Unenforced]:
    """xgrammar 0.2.9 compiles a schema pattern's `(bc+)?` as if `b` were optional too
    (`acZ` passes `^a(bc+)?Z$`; measured): such a pattern is not enforced."""
    pattern = node.get("pattern")
    if isinstance(pattern, str) and _has_optional_group_ending_in_repetition(pattern):
        yield Unenforced(pointer, "pattern", "an optional group ending in a repetition")


def _has_optional_group_ending_in_repetition(pattern: str) -> bool:
    depth = 0
    escaped = in_class = False
    for index, char in enumerate(pattern):
        if escaped:
            escaped = False
        elif char == "\\":
            escaped = True
        elif in_class:
            in_class = char != "]"
        elif char == "[":
            in_class = True
        elif char == "(":
            depth += 1
        elif char == ")" and depth:
            depth -= 1
            last = pattern[index - 1] if index else ""
            follows = pattern[index + 1 : index + 2]
            if follows == "?" and last in "+*?}" and pattern[index - 2 : index - 1] != "\\":
                return True
    return False


def negated_class_excluding_quote_or_backslash(
    node: dict[str, Any], pointer: str
) -> Iterable[Unenforced]:
    r"""llguidance 1.x lets the JSON escape `\"` or `\\` through a negated class that excludes
    that character: `"a\\b"`, a string holding a backslash, passes `^[^\\]+$` (measured)."""
    what = "a quote or a backslash"
    yield from _negated_class_rule(node, pointer, _may_exclude_quote_or_backslash, what)


def negated_class_excluding_non_ascii(node: dict[str, Any], pointer: str) -> Iterable[Unenforced]:
    r"""xgrammar 0.2.x lets a `\uXXXX` escape through a negated class that excludes that
    non-ASCII character: `"\u00e9"` passes `^[^é]+$` (measured)."""
    yield from _negated_class_rule(node, pointer, _may_exclude_non_ascii, "a non-ASCII character")


def _negated_class_rule(
    node: dict[str, Any], pointer: str, excludes: Callable[[str], bool], what: str
) -> Iterable[Unenforced]:
    reason = f"a negated character class that excludes {what} lets it through as a JSON escape"
    pattern = node.get("pattern")
    if isinstance(pattern, str) and any(map(excludes, negated_classes(pattern))):
        yield Unenforced(pointer, "pattern", reason)
    keys = node.get("patternProperties")
    if isinstance(keys, dict) and any(excludes(b) for k in keys for b in negated_classes(k)):
        yield Unenforced(pointer, "patternProperties", reason)


def negated_classes(pattern: str) -> list[str]:
    """The bodies of the pattern's negated character classes (`[^...]`), escapes kept."""
    bodies, index = [], 0
    while index < len(pattern):
        char = pattern[index]
        if char == "\\":
            index += 2
            continue
        if char != "[":
            index += 1
            continue
        end = index + 1
        negated = pattern[end : end + 1] == "^"
        end += negated
        start = end
        while end < len(pattern) and pattern[end] != "]":
            end += 2 if pattern[end] == "\\" else 1
        if negated:
            bodies.append(pattern[start:end])
        index = end + 1
    return bodies


_SHORTHANDS = frozenset("sSdDwW")
_ESCAPED = {"n": 10, "t": 9, "r": 13, "f": 12, "v": 11, "0": 0}


def _class_items(body: str) -> list[tuple[int, int] | str]:
    """A class body as code point ranges and shorthand letters (`\\s`, `\\W`, ...)."""
    atoms: list[int | str] = []  # code points, shorthands, and "-" for a bare hyphen
    index = 0
    while index < len(body):
        char = body[index]
        if char != "\\" or index + 1 == len(body):
            atoms.append("-" if char == "-" else ord(char))
            index += 1
            continue
        escaped = body[index + 1]
        digits = {"x": 2, "u": 4}.get(escaped, 0)
        code = body[index + 2 : index + 2 + digits]
        if digits and len(code) == digits and all(c in "0123456789abcdefABCDEF" for c in code):
            atoms.append(int(code, 16))
            index += 2 + digits
        else:
            atoms.append(escaped if escaped in _SHORTHANDS else _ESCAPED.get(escaped, ord(escaped)))
            index += 2
    items: list[tuple[int, int] | str] = []
    position = 0
    while position < len(atoms):
        atom = ord("-") if atoms[position] == "-" else atoms[position]  # a bare hyphen
        after = atoms[position + 2] if position + 2 < len(atoms) else None
        if isinstance(atom, str):
            items.append(atom)
            position += 1
        elif atoms[position + 1 : position + 2] == ["-"] and isinstance(after, int):
            items.append((atom, after))
            position += 3
        else:
            items.append((atom, atom))
            position += 1
    return items


def _may_exclude_quote_or_backslash(body: str) -> bool:
    for item in _class_items(body):
        if isinstance(item, str):
            if item in "SDW":  # these cover both
                return True
        elif any(item[0] <= code <= item[1] for code in (0x22, 0x5C)):
            return True
    return False


def _may_exclude_non_ascii(body: str) -> bool:
    return any(isinstance(item, str) or item[1] >= 0x80 for item in _class_items(body))


def beside_ref(node: dict[str, Any], pointer: str) -> Iterable[Unenforced]:
    """xgrammar 0.2.9 and outlines-core 0.2.14 serve a schema object with `$ref` as its
    target alone: `type`, bounds, lengths beside it go unchecked (`1.5` passes
    `{"type": "integer", "$ref": ...}` to a number; measured). Lowering has already dropped
    what drafts before 2019-09 ignore there, so what is left constrains."""
    if isinstance(node.get("$ref"), str):
        for keyword in node:
            if keyword in VOCABULARY and keyword != "$ref":
                yield Unenforced(pointer, keyword, "ignored beside $ref")


def beside_any_of(node: dict[str, Any], pointer: str) -> Iterable[Unenforced]:
    """xgrammar 0.2.9 and outlines-core 0.2.14 serve a schema object with `anyOf`, `oneOf`
    or `allOf` as its branches alone: the keywords beside them (type, properties, required,
    additionalProperties, bounds, ...) go unchecked at any position (measured)."""
    combinators = [k for k in ("anyOf", "oneOf", "allOf") if isinstance(node.get(k), list)]
    if combinators:
        for keyword in node:
            if keyword in VOCABULARY and keyword not in combinators:
                yield Unenforced(pointer, keyword, f"ignored beside {'/'.join(combinators)}")


_COMMON = frozenset(
    {
        "type", "enum", "const", "minLength", "maxLength", "pattern", "items", "prefixItems",
        "minItems", "maxItems", "properties", "required", "additionalProperties",
        "minProperties", "anyOf", "$ref",
    }
)  # fmt: skip
_COMMON_FORMATS = frozenset({"email", "uuid", "uri"})

XGRAMMAR_SUPPORT = KeywordSupport(
    enforced=_COMMON
    | {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "maxProperties"},
    formats=_COMMON_FORMATS | {"ipv4", "hostname", "time"},
    rules=(
        required_outside_properties,
        length_beside_pattern_or_format,
        beside_any_of,
        beside_ref,
        optional_group_ending_in_repetition,
        negated_class_excluding_non_ascii,
    ),
    format_notes=(
        ("date", "is approximated: any day 01-31 passes in every month"),
        ("date-time", "is approximated: any day 01-31 passes in every month"),
    ),
)
"""xgrammar 0.2.9. Compiled but not enforced (measured): uniqueItems, contains, not,
if/then/else, oneOf exclusivity, allOf beyond types, dependentRequired, unevaluated*;
multipleOf, patternProperties and propertyNames only in some shapes, so never trusted."""

OUTLINES_SUPPORT = KeywordSupport(
    enforced=_COMMON,
    formats=_COMMON_FORMATS,
    rules=(required_outside_properties, pattern_beside_length, beside_any_of, beside_ref),
    format_notes=(
        ("date", "is approximated: Unicode digits and day 31 in every month pass"),
        ("date-time", "is approximated: negative years, a missing offset and day 31 pass"),
        ("time", "is approximated: a missing offset passes"),
    ),
)
"""outlines-core 0.2.14. Drops numeric bounds, multipleOf, maxProperties, patternProperties,
propertyNames, oneOf exclusivity, not, if/then/else, dependentRequired, unevaluated*;
refuses allOf."""

LLGUIDANCE_SUPPORT = KeywordSupport(
    enforced=_COMMON
    | {
        "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf",
        "maxProperties", "allOf", "oneOf", "patternProperties",
    },
    formats=_COMMON_FORMATS | {"ipv4", "ipv6", "hostname", "time", "duration"},
    rules=(negated_class_excluding_quote_or_backslash,),
    format_notes=(
        ("date", "is approximated: February 29 passes in every year"),
        ("date-time", "is approximated: February 29 passes in every year"),
    ),
)  # fmt: skip
"""llguidance 1.9.1 with lenient=False. It refuses at compile time what it does not
implement (not, if/then/else, contains, uniqueItems, propertyNames, dependentRequired,
dependentSchemas, unevaluated*, unknown formats, oneOf it cannot prove exclusive), so this
list only has to be honest about what it compiles."""
