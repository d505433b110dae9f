"""Mutants of valid instances: the soundness oracle of `grammarmask conformance --mutate`.

Each mutant changes one value of a valid instance (or one member or item around it) in a
way that typically breaks one constraint: a string shortened, lengthened, emptied or given
a character a pattern may forbid (a backslash, a quote, a non-ASCII letter, a space); a
number moved past a bound or off a multiple; a boolean flipped; a value of another type;
an item dropped or repeated; a member dropped or an unknown one added. jsonschema says
which mutants the schema refuses and names the keyword each breaks (its best match), with
the schema's and the instance's JSON pointers: a mask that accepts such a mutant, where
the backend declared nothing that explains it, is a hole at that keyword and pointer.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import jsonschema
from jsonschema.validators import validator_for
from referencing.exceptions import Unresolvable

from ..errors import SchemaJudgeError

_STRING_EDITS: tuple[tuple[str, Any], ...] = (
    ("empty", lambda s: ""),
    ("shorter", lambda s: s[:-1]),
    ("longer", lambda s: s + s[-1:] * 8 if s else "xxxxxxxxx"),
    ("backslash", lambda s: s + "\\"),
    ("quote", lambda s: s + '"'),
    ("non-ASCII", lambda s: s + "é"),
    ("space", lambda s: s + " "),
    ("changed", lambda s: ("y" if s[:1] != "y" else "z") + s[1:]),
)
_NUMBER_EDITS: tuple[tuple[str, Any], ...] = (
    ("plus one", lambda n: n + 1),
    ("minus one", lambda n: n - 1),
    ("fraction", lambda n: n + 0.5),
    ("large", lambda n: n * 1000 + 1000),
    ("negative", lambda n: -abs(n) - 1000),
)
_OTHER_TYPE: dict[type, Any] = {str: 0, int: "0", float: "0", bool: None, type(None): 0}


@dataclass(frozen=True)
class Mutant:
    """One mutation of an instance, and what jsonschema says it breaks."""

    instance: Any
    edit: str
    at: str
    """JSON pointer of the changed value in the instance."""
    keyword: str
    """The keyword jsonschema's best-matching error names."""
    schema_pointer: str


def mutants(schema: Any, instance: Any, limit: int = 200) -> Iterator[Mutant]:
    """The first `limit` mutants of `instance` that `schema` refuses, each with the keyword
    it breaks; raises SchemaJudgeError where jsonschema cannot judge the schema."""
    cls = validator_for(schema, default=jsonschema.Draft202012Validator)
    validator = cls(schema, format_checker=cls.FORMAT_CHECKER)
    found = 0
    seen: set[str] = set()
    for edit, at, mutated in _edits(instance, ""):
        key = repr(mutated)
        if key in seen:
            continue
        seen.add(key)
        try:
            errors = [e for e in validator.iter_errors(mutated) if not _rounding_only(e)]
            error = jsonschema.exceptions.best_match(errors)
        except (Unresolvable, re.error, jsonschema.exceptions.UnknownType) as exc:
            raise SchemaJudgeError(f"jsonschema cannot judge this schema: {exc}") from exc
        if error is None:
            continue
        pointer = "".join(f"/{part}" for part in error.absolute_schema_path)
        yield Mutant(mutated, edit, at, str(error.validator), pointer)
        found += 1
        if found >= limit:
            return


def _rounding_only(error: jsonschema.exceptions.ValidationError) -> bool:
    """A multipleOf error that only binary floating point makes: jsonschema divides floats
    (`-1200.1 / 0.01` is not a whole number), where JSON Schema means the decimal numbers
    written, and `-1200.1` is a multiple of `0.01`."""
    if error.validator != "multipleOf":
        return False
    number, step = error.instance, error.validator_value
    if not all(isinstance(n, int | float) and not isinstance(n, bool) for n in (number, step)):
        return False
    try:
        return Decimal(repr(number)) % Decimal(repr(step)) == 0
    except (ArithmeticError, ValueError):
        return False


def _edits(value: Any, at: str) -> Iterator[tuple[str, str, Any]]:
    """(edit, pointer, the whole value with that edit) for `value` and everything in it,
    outermost first."""
    for edit, replacement in _local_edits(value):
        yield edit, at, replacement
    if isinstance(value, dict):
        for key, member in value.items():
            for edit, where, inner in _edits(member, f"{at}/{_escaped(key)}"):
                yield edit, where, {**value, key: inner}
    elif isinstance(value, list):
        for index, item in enumerate(value):
            for edit, where, inner in _edits(item, f"{at}/{index}"):
                yield edit, where, [*value[:index], inner, *value[index + 1 :]]


def _local_edits(value: Any) -> Iterator[tuple[str, Any]]:
    """Replacements for `value` itself."""
    if isinstance(value, bool):
        yield "flipped", not value
    elif isinstance(value, str):
        for edit, change in _STRING_EDITS:
            yield edit, change(value)
    elif isinstance(value, int | float):
        for edit, change in _NUMBER_EDITS:
            yield edit, change(value)
    elif isinstance(value, list):
        if value:
            yield "last item dropped", value[:-1]
            yield "first item repeated", [*value, copy.deepcopy(value[0])]
        yield "item of another type", [*value, {"x": [1]} if value[-1:] != [{}] else 0]
        yield "emptied", []
    elif isinstance(value, dict):
        for key in value:
            yield f"member {key!r} dropped", {k: v for k, v in value.items() if k != key}
        yield "unknown member", {**value, "zz_unknown": 1}
        yield "emptied", {}
    other = _OTHER_TYPE.get(type(value), "x")
    yield "another type", other


def _escaped(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")
