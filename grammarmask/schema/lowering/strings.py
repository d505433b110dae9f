"""A string schema built from patterns, lengths, `not`, `allOf` and `anyOf` as one pattern:
the backends refuse most `not`s and combine patterns approximately or not at all, while a
single pattern they enforce exactly.

The combination is read on strings only (the schema's `type: string` refuses the rest), as
jsonschema reads it, and regular.py writes the language back for a backend, whose `$` is
only the end: the backends then accept exactly the strings jsonschema accepts against the
user's schema. jsonschema itself reads the written `$` also before a final newline, so the
lowered schema, read by jsonschema, takes each such string with one more final newline
(as with name patterns, lowering.md).
"""

from __future__ import annotations

from typing import Any

from ...errors import UnreadablePatternError
from ..keywords import VOCABULARY
from . import regular
from .reading import REF_DEPTH, Reading, resolve

_STRING_KEYWORDS = frozenset(
    {"type", "pattern", "minLength", "maxLength", "allOf", "anyOf", "not", "$ref"}
)
"""Keywords read here; a schema with any other keyword (a `format`, `enum`, ...) is left."""
_NESTING = 4 * REF_DEPTH
"""Subschemas and references followed at most, so that a circular one ends."""


def as_one_pattern(
    node: dict[str, Any], reading: Reading
) -> tuple[dict[str, Any] | bool, bool] | None:
    """`node` (a `type: string` schema of the keywords above) with its string keywords as
    one `pattern` (False where no string passes), its other keys (annotations, `$defs`)
    kept, and whether the pattern is written for a backend's `$`; None where it is of
    another shape, has only one pattern and no `not` (the backends read that as it is), or
    its language is past regular.py's limits."""
    if node.get("type") not in ("string", ["string"]):
        return None
    vocabulary = {k for k in node if k in VOCABULARY}
    if not vocabulary <= _STRING_KEYWORDS | {"$defs", "definitions"}:
        return None
    reading_part = {k: v for k, v in node.items() if k in _STRING_KEYWORDS}
    strings = _strings(reading_part, reading, 0)
    if strings is None or not _worth_it(strings):
        return None
    written = _written(strings)
    if written is None:
        return None
    pattern, whole = written
    if pattern is False:
        return False, whole
    kept = {k: v for k, v in node.items() if k not in _STRING_KEYWORDS}
    return {**kept, "type": "string"} | ({} if pattern is True else {"pattern": pattern}), whole


def _written(strings: regular.Strings) -> tuple[str | bool, bool] | None:
    """The pattern as jsonschema reads it where one exists, else as a backend reads it
    (True beside it); None where neither can be written."""
    for whole in (False, True):
        try:
            return regular.language_pattern(strings, whole=whole), whole
        except UnreadablePatternError as error:
            if "final newline" not in str(error):
                return None
    return None


def names_language(node: Any, reading: Reading) -> regular.Strings | None:
    """The property names a `propertyNames` schema allows, as a combination of patterns,
    lengths and listed names (every name is a string); None where it uses anything else."""
    return _strings(node, reading, 0)


def _strings(node: Any, reading: Reading, depth: int) -> regular.Strings | None:
    """`node` on strings, as a combination; None where it uses anything else."""
    if depth > _NESTING:
        return None
    if isinstance(node, dict) and "$ref" in node and (len(node) == 1 or reading.old):
        target = resolve(node, reading)
        if target is node:
            return None
        return _strings(target, reading, depth + 1)
    if node is True:
        return regular.AllOf(())
    if node is False:
        return regular.AnyOf(())
    if not isinstance(node, dict):
        return None
    parts: list[regular.Strings] = []
    least, most = node.get("minLength", 0), node.get("maxLength")
    for key, value in node.items():
        if key not in VOCABULARY or key in ("minLength", "maxLength", "$defs", "definitions"):
            continue
        part = _keyword(key, value, reading, depth)
        if part is None:
            return None
        parts.append(part)
    if "minLength" in node or "maxLength" in node:
        if not _count(least) or (most is not None and not _count(most)):
            return None
        parts.append(regular.Lengths(int(least), None if most is None else int(most)))
    return parts[0] if len(parts) == 1 else regular.AllOf(tuple(parts))


def _keyword(key: str, value: Any, reading: Reading, depth: int) -> regular.Strings | None:
    if key == "pattern":
        return regular.Matching(value) if isinstance(value, str) else None
    if key == "type":
        kinds = [value] if isinstance(value, str) else value
        if not isinstance(kinds, list):
            return None
        return regular.AllOf(()) if "string" in kinds else regular.AnyOf(())
    if key == "$ref":
        return _strings({"$ref": value}, reading, depth + 1)
    if key in ("enum", "const") and (reading.const or key == "enum"):
        listed = value if key == "enum" else [value]
        if not isinstance(listed, list):
            return None
        return regular.Listed(tuple(dict.fromkeys(v for v in listed if isinstance(v, str))))
    if key == "not":
        inner = _strings(value, reading, depth + 1)
        return None if inner is None else regular.Outside(inner)
    if key in ("allOf", "anyOf") and isinstance(value, list) and value:
        inner_parts = [_strings(branch, reading, depth + 1) for branch in value]
        if any(p is None for p in inner_parts):
            return None
        kept = tuple(p for p in inner_parts if p is not None)
        return regular.AllOf(kept) if key == "allOf" else regular.AnyOf(kept)
    return None


def _count(value: Any) -> bool:
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and value >= 0
        and value == int(value)
    )


def _worth_it(strings: regular.Strings) -> bool:
    """A `not` somewhere, or two patterns or more."""
    patterns, negated = _census(strings)
    return negated or patterns > 1


def _census(strings: regular.Strings) -> tuple[int, bool]:
    if isinstance(strings, regular.Matching):
        return 1, False
    if isinstance(strings, regular.Lengths | regular.Listed):
        return 0, False
    if isinstance(strings, regular.Outside):
        return _census(strings.part)[0], True
    counts = [_census(part) for part in strings.parts]
    return sum(c for c, _ in counts), any(n for _, n in counts)
