"""A schema that lists its values (`const` or `enum`, at its own level or in one of its
`allOf` branches) accepts at most those values: it is exactly the `enum` of the listed
values that pass the whole schema. Whatever else it says (a `not`, a `pattern` beside the
list, a `oneOf`) then has nothing left for a backend to enforce. An array schema with
`uniqueItems` whose items are a few listed values lists its arrays the same way."""

from __future__ import annotations

import itertools
import json
import math
from typing import Any

from ..keywords import VOCABULARY
from ..verdicts import document_verdicts, verdicts
from .dialects import strict_integers
from .reading import Reading, listed_values, value_key

_REFERENCES = ('"$ref"', '"$dynamicRef"', '"$recursiveRef"')
_DROPPED = VOCABULARY | {"$defs", "definitions"}
"""What the rewritten schema leaves out: every constraint (the list now says them all) and
the definitions, which nothing inside it refers to."""
_PLAIN = frozenset({"enum", "const", "type"})
"""A list beside a type that every listed value has: left as it is, as every backend
enforces it."""


def as_listed_values(
    node: dict[str, Any], draft: str | None, document: Any = None
) -> dict[str, Any] | bool | None:
    """`node` (lowered, 2020-12) as the `enum` of the values it lists that jsonschema
    accepts against all of `node` (False where none does, an unsatisfiable schema), with its
    annotations kept; None where `node` lists no values or is a plain list that every value
    passes. `document`: the user's schema, where `node` is its lowered root; a node that
    holds a reference is read only there, and judged by the user's document in its own
    draft (the lowered node's references may point where lowering moved things)."""
    reading = Reading(node, None)
    listed = listed_values(node, reading)
    if listed is None:
        branches = node.get("allOf")
        if isinstance(branches, list):
            lists = (listed_values(b, reading) for b in branches if isinstance(b, dict))
            listed = next((found for found in lists if found is not None), None)
    if listed is None:
        listed = _unique_arrays(node, reading)
    if listed is None:
        return None
    text = json.dumps(node)
    referring = any(key in text for key in _REFERENCES)
    if referring and document is None:
        return None
    strict = strict_integers(draft)
    if strict and any(map(_has_integral_float, listed)):
        return None  # 1.0 is listed, no integer, yet equal to the integer 1, which may pass
    if referring:
        found = document_verdicts(document, listed)
    else:
        found = verdicts(node, listed, strict_integers=strict)
    if found is None:
        return None
    kept = [value for value, ok in zip(listed, found, strict=True) if ok]
    if len(kept) == len(listed) and set(node) & VOCABULARY <= _PLAIN:
        return None
    if not kept:
        return False
    return {**{k: v for k, v in node.items() if k not in _DROPPED}, "enum": kept}


def _unique_arrays(node: dict[str, Any], reading: Reading) -> list[Any] | None:
    """Every array of distinct items that `node` (an array schema with `uniqueItems`) may
    accept, where its items are of a few listed values (`enum`, `const`, boolean, null) and
    the arrays are at most `MAX_UNIQUE_ARRAYS`; None otherwise."""
    items = node.get("items")
    if not (node.get("type") == "array" and node.get("uniqueItems") is True):
        return None
    if "prefixItems" in node or not isinstance(items, dict):
        return None
    domain = listed_values(items, reading)
    if domain is None:
        domain = _TYPE_DOMAINS.get(json.dumps(items.get("type")))
    if domain is None or len(set(map(value_key, domain))) != len(domain):
        return None  # repeated listed values (1 and 1.0) would make equal arrays unequal
    low = node.get("minItems", 0)
    high = min(node.get("maxItems", len(domain)), len(domain))
    if not (isinstance(low, int) and isinstance(high, int)):
        return None
    sizes = range(max(low, 0), high + 1)
    count = sum(math.perm(len(domain), size) for size in sizes)
    if count > MAX_UNIQUE_ARRAYS:
        return None
    return [list(p) for size in sizes for p in itertools.permutations(domain, size)]


MAX_UNIQUE_ARRAYS = 2000
"""The most arrays a `uniqueItems` schema is spelled out as (6 listed items give 1,957)."""
_TYPE_DOMAINS: dict[str, list[Any]] = {'"boolean"': [False, True], '"null"': [None]}


def _has_integral_float(value: Any) -> bool:
    """Whether `value` holds a number written with a zero fraction (1.0, 1e20)."""
    if isinstance(value, float):
        return value.is_integer()
    if isinstance(value, dict):
        return any(map(_has_integral_float, value.values()))
    return isinstance(value, list) and any(map(_has_integral_float, value))


def with_number_spellings(node: dict[str, Any], const: bool) -> dict[str, Any] | None:
    """`node` with each value it lists (`enum`, `const` where `const` says the draft has
    it) that holds an integral number written as a decimal (`2.0`) as a schema of that
    value, which takes both of its usual spellings (`2`, `2.0`); None where it lists no
    such value. A backend writes a listed number one way, yet every spelling of an equal
    number is the same value to JSON Schema."""
    listed: list[Any] = []
    if const and "const" in node:
        listed = [node["const"]]
    elif isinstance(node.get("enum"), list):
        listed = node["enum"]
    spelled = [v for v in listed if _has_integral_float(v) and _spellable(v)]
    if not spelled:
        return None
    plain = [v for v in listed if not (_has_integral_float(v) and _spellable(v))]
    alternatives = [_value_schema(v) for v in spelled]
    if plain:
        alternatives.insert(0, {"enum": plain})
    out = {k: v for k, v in node.items() if k not in ("enum", "const")}
    if "const" in node and not const:
        out["const"] = node["const"]  # a draft without `const`: only an annotation
    listing = alternatives[0] if len(alternatives) == 1 else {"anyOf": alternatives}
    if set(listing) & set(out):
        out["allOf"] = [*out.get("allOf", []), listing]
    else:
        out.update(listing)
    return out


_LARGEST_SPELLED = 2**50
"""Integral numbers up to this size have exact float neighbours a quarter away."""


def _spellable(value: Any) -> bool:
    """Whether every number in `value` is small enough to be spelled by a range."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return math.isfinite(value) and abs(value) < _LARGEST_SPELLED
    if isinstance(value, dict):
        return all(map(_spellable, value.values()))
    return not isinstance(value, list) or all(map(_spellable, value))


def _value_schema(value: Any) -> Any:
    """A schema that accepts exactly `value` (JSON Schema's equality): an integral number
    as the multiples of 0.5 within a quarter of it (only itself, which llguidance writes
    as `2` and `2.0`), an object or array as its parts, anything else as its `const`."""
    if isinstance(value, float) and value.is_integer():
        whole = int(value)
        return {
            "type": "number",
            "multipleOf": 0.5,
            "minimum": whole - 0.25,
            "maximum": whole + 0.25,
        }
    if isinstance(value, dict):
        return {
            "type": "object",
            "properties": {name: _value_schema(part) for name, part in value.items()},
            "required": list(value),
            "additionalProperties": False,
        }
    if isinstance(value, list):
        return {
            "type": "array",
            "prefixItems": [_value_schema(part) for part in value],
            "items": False,
            "minItems": len(value),
        }
    return {"const": value}
