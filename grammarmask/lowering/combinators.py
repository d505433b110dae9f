"""Combinators the backends refuse, in forms they enforce: a provably disjoint `oneOf` as
`anyOf`, dependencies as `anyOf` branches, and the `not`s that have a positive form.

Each rewrite accepts exactly the instances the original accepts; where grammarmask cannot
prove that, the keyword stays and the backends' enforcement tables report it.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Sequence
from typing import Any

from ..grammars import resolve_pointer
from .drafts import OLD_DRAFTS

_ATOMS = frozenset({"null", "boolean", "object", "array", "string", "integer", "fraction"})
"""The JSON values, by kind: numbers split into integers and the others, so that `integer`
and `number` compare as a subset."""
_TYPE_ATOMS = {
    "null": {"null"},
    "boolean": {"boolean"},
    "object": {"object"},
    "array": {"array"},
    "string": {"string"},
    "integer": {"integer"},
    "number": {"integer", "fraction"},
}
_REF_DEPTH = 8
_INDEPENDENT = frozenset(
    {"type", "required", "properties", "enum", "const", "not", "anyOf", "allOf"}
)
"""Keywords whose meaning does not depend on their neighbours: a schema of several of them
is the allOf of each alone."""


def _atom(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer()):
        return "integer"
    if isinstance(value, float):
        return "fraction"
    if isinstance(value, dict):
        return "object"
    return "array" if isinstance(value, list) else "string"


def _value_key(value: Any) -> str:
    """Equal keys for values JSON Schema calls equal (1 and 1.0 are)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return f"n:{float(value)!r}"
    return "j:" + json.dumps(value, sort_keys=True)


class _Reading:
    """How to read the user's schema where a `$ref` leads into it: in its own draft."""

    def __init__(self, root: Any, draft: str | None) -> None:
        self.root = root
        self.old = draft in OLD_DRAFTS
        """Keywords beside a `$ref` are ignored."""
        self.const = draft != "draft4"
        """`const` exists."""


def _resolve(node: Any, reading: _Reading) -> Any:
    """`node` with local `$ref`s followed (a node with other keywords beside its `$ref` is
    kept as it is from 2019-09 on: it is not only its target)."""
    for _ in range(_REF_DEPTH):
        if not (isinstance(node, dict) and "$ref" in node):
            return node
        if len(node) > 1 and not reading.old:
            return node
        ref = node["$ref"]
        if not (isinstance(ref, str) and (ref == "#" or ref.startswith("#/"))):
            return node
        target = resolve_pointer(reading.root, ref[1:])
        if target is None:
            return node
        node = target
    return node


def _atoms(node: Any, reading: _Reading) -> frozenset[str]:
    """The kinds of value `node` may accept (all of them when unknown)."""
    node = _resolve(node, reading)
    if node is False:
        return frozenset()
    if not isinstance(node, dict):
        return _ATOMS
    found = set(_ATOMS)
    kinds = node.get("type")
    if isinstance(kinds, str):
        kinds = [kinds]
    if isinstance(kinds, list) and all(k in _TYPE_ATOMS for k in kinds):
        found &= set().union(*(_TYPE_ATOMS[k] for k in kinds))
    if "const" in node and reading.const:
        found &= {_atom(node["const"])}
    if isinstance(node.get("enum"), list):
        found &= {_atom(v) for v in node["enum"]}
    return frozenset(found)


def _values(node: Any, reading: _Reading) -> frozenset[str] | None:
    """The values `node` accepts, when it lists them (`const` or `enum`)."""
    node = _resolve(node, reading)
    if not isinstance(node, dict):
        return None
    if "const" in node and reading.const:
        return frozenset({_value_key(node["const"])})
    if isinstance(node.get("enum"), list):
        return frozenset(map(_value_key, node["enum"]))
    return None


def _discriminators(node: Any, reading: _Reading) -> dict[str, frozenset[str]]:
    """Required properties of an object-only schema whose values it lists."""
    node = _resolve(node, reading)
    if not isinstance(node, dict) or _atoms(node, reading) != {"object"}:
        return {}
    required = node.get("required")
    properties = node.get("properties")
    if not (isinstance(required, list) and isinstance(properties, dict)):
        return {}
    found = {}
    for name in required:
        if isinstance(name, str) and name in properties:
            values = _values(properties[name], reading)
            if values is not None:
                found[name] = values
    return found


def disjoint(first: Any, second: Any, reading: _Reading) -> bool:
    """No instance can validate against both (proved from their kinds of value, their
    listed values, or a required property whose listed values differ)."""
    if not _atoms(first, reading) & _atoms(second, reading):
        return True
    values = _values(first, reading), _values(second, reading)
    if values[0] is not None and values[1] is not None and not values[0] & values[1]:
        return True
    left, right = _discriminators(first, reading), _discriminators(second, reading)
    return any(name in right and not left[name] & right[name] for name in left)


def pairwise_disjoint(branches: Sequence[Any], root: Any, draft: str | None) -> bool:
    """No two of `branches` (lowered subschemas of `root`, written in `draft`) overlap."""
    reading = _Reading(root, draft)
    return all(
        disjoint(branches[i], branches[j], reading)
        for i in range(len(branches))
        for j in range(i + 1, len(branches))
    )


def dependency_branches(name: str, then: Any, *, present: bool = False) -> dict[str, Any]:
    """`anyOf` branches meaning "if `name` is present, `then` holds" for an object (either
    the property is absent, or it is present and `then` holds; a value that is no object
    passes both, as the dependency keywords let it): `then` is a list of required names
    or a schema. `present`: the object always has `name` (its schema requires it), so the
    first branch is left out (llguidance refuses a branch no value can satisfy)."""
    holds: dict[str, Any] = {"required": [name]}
    if isinstance(then, list):
        holds = {"required": list(dict.fromkeys([name, *then]))}
    elif then is not True:
        holds = {"required": [name], "allOf": [then]}
    return holds if present else {"anyOf": [{"properties": {name: False}}, holds]}


def _none_of(values: Sequence[Any]) -> dict[str, Any] | bool | None:
    """Every JSON value except `values` (scalars only; None for an array or an object, an
    integer past 2**53 or a string ending in a newline):
    the other types whole, numbers between the excluded ones, strings by a pattern."""
    if any(isinstance(v, (dict, list)) for v in values):
        return None
    if any(isinstance(v, int) and abs(v) > 2**53 for v in values):
        return None  # beyond a float's exact integers
    if any(isinstance(v, str) and v.endswith("\n") for v in values):
        return None  # Python's `$` (jsonschema's) would let the listed string through
    numbers = sorted({float(v) for v in values if _atom(v) in ("integer", "fraction")})
    strings = [v for v in values if isinstance(v, str)]
    booleans = {v for v in values if isinstance(v, bool)}
    branches: list[Any] = [{"type": ["array", "object"]}]
    if None not in values:
        branches.append({"type": "null"})
    branches += [{"const": b} for b in (False, True) if b not in booleans]
    if not numbers:
        branches.append({"type": "number"})
    else:  # the open intervals around the excluded numbers
        bounds: list[float | None] = [None, *numbers, None]
        for low, high in itertools.pairwise(bounds):
            interval: dict[str, Any] = {"type": "number"}
            if low is not None:
                interval["exclusiveMinimum"] = int(low) if low.is_integer() else low
            if high is not None:
                interval["exclusiveMaximum"] = int(high) if high.is_integer() else high
            branches.append(interval)
    if not strings:
        branches.append({"type": "string"})
    else:
        try:
            branches.append({"type": "string", "pattern": f"^{_complement(strings)}$"})
        except ValueError:
            return None
    return {"anyOf": branches}


_ANY = "[\\s\\S]"
"""Any character, newlines included (llguidance reads it so; xgrammar 0.2.9 refuses a newline
there, a completeness gap on a schema it does not serve fully anyway: allOf)."""


def _complement(strings: Sequence[str]) -> str:
    """A regex (no anchors) for every string except `strings`, from their trie: a string
    is outside the set if it ends where no listed string ends, or leaves the trie."""
    trie: dict[str, Any] = {}
    for text in strings:
        node = trie
        for char in text:
            node = node.setdefault(char, {})
        node[""] = {}  # a listed string ends here

    def outside(node: dict[str, Any]) -> str:
        children = sorted(k for k in node if k)
        options = [] if "" in node else [""]
        if children:
            listed = "".join(_literal(c) for c in children)
            options.append(f"[^{listed}]{_ANY}*")
            options += [f"{_literal(c)}{outside(node[c])}" for c in children]
        else:
            options.append(f"{_ANY}+")
        return "(" + "|".join(options) + ")"

    return outside(trie)


def _literal(char: str) -> str:
    """One character in any backend's regex dialect (ASCII letters and digits as they are,
    the rest of the BMP as `\\uXXXX`)."""
    if char.isascii() and char.isalnum():
        return char
    if ord(char) >= 0x10000:
        raise ValueError("a character outside the BMP")
    return f"\\u{ord(char):04x}"


def _lacking_one_of(names: Sequence[str]) -> dict[str, Any]:
    """An object's constraint "at least one of `names` is absent" (values that are no object
    satisfy it)."""
    absent = [{"properties": {name: False}} for name in dict.fromkeys(names)]
    return {"anyOf": absent} if len(absent) > 1 else absent[0]


def exactly_one_required(branches: Sequence[Any]) -> list[Any] | None:
    """`anyOf` branches for a `oneOf` whose branches only require properties ("exactly one
    of these sets of properties is present"): each branch, with every other branch's set
    incomplete. Both forms refuse every value that is no object (there every `required`
    holds, so a `oneOf` of two or more has more than one valid branch)."""
    sets = []
    for branch in branches:
        if not (isinstance(branch, dict) and set(branch) == {"required"}):
            return None
        names = branch["required"]
        if not (isinstance(names, list) and names and all(isinstance(n, str) for n in names)):
            return None
        sets.append(list(dict.fromkeys(names)))
    if len(sets) < 2:
        return None
    rewritten = []
    for index, names in enumerate(sets):
        if any(set(other) <= set(names) for j, other in enumerate(sets) if j != index):
            continue  # whenever it holds another holds too: never the only one
        others = [_lacking_one_of(other) for j, other in enumerate(sets) if j != index]
        rewritten.append({"type": "object", "required": names, "allOf": others})
    return rewritten


def positive_not(
    negated: Any,
    root: Any = None,
    draft: str | None = None,
    depth: int = 0,
    *,
    lowered: bool = True,
) -> dict[str, Any] | bool | None:
    """A schema without `not` that accepts exactly what `not: negated` accepts, for the
    shapes that have one; None for the others. A branch that is a local `$ref` is read at
    its target (in the user's schema `root`, written in `draft`); `lowered` says whether
    `negated` is already lowered, so that its parts may be kept as they are."""
    if depth > _REF_DEPTH:
        return None
    if root is not None and isinstance(negated, dict) and "$ref" in negated:
        target = _resolve(negated, _Reading(root, draft))
        if target is negated:
            return None
        negated, lowered = target, False
    if negated is True or negated == {}:
        return False
    if negated is False:
        return True
    if not isinstance(negated, dict):
        return None
    if set(negated) == {"not"}:
        return negated["not"] if lowered else None
    if set(negated) in ({"anyOf"}, {"allOf"}) and isinstance(next(iter(negated.values())), list):
        ((keyword, branches),) = negated.items()
        positives = [
            positive_not(branch, root, draft, depth + 1, lowered=lowered) for branch in branches
        ]
        if not branches or any(p is None for p in positives):
            return None
        return {"allOf" if keyword == "anyOf" else "anyOf": positives}  # De Morgan
    if set(negated) == {"required"} and isinstance(negated["required"], list):
        names = [n for n in negated["required"] if isinstance(n, str)]
        if len(names) != len(negated["required"]) or not names:
            return None
        # an object lacking at least one of them (anything else satisfies `required`)
        return {"type": "object", **_lacking_one_of(names)}
    if len(negated) > 1 and set(negated) <= _INDEPENDENT:  # not (A and B) = not A or not B
        parts = [
            positive_not({key: value}, root, draft, depth + 1, lowered=lowered)
            for key, value in negated.items()
        ]
        return None if any(p is None for p in parts) else {"anyOf": parts}
    if set(negated) == {"properties"} and isinstance(negated["properties"], dict):
        branches = []
        for name, schema in negated["properties"].items():
            inverse = positive_not(schema, root, draft, depth + 1, lowered=lowered)
            if inverse is None:
                return None
            if inverse is not False:  # present and breaking its schema
                branches.append({"required": [name], "properties": {name: inverse}})
        return {"type": "object", "anyOf": branches} if branches else False
    if set(negated) in ({"enum"}, {"const"}):
        values = negated["enum"] if "enum" in negated else [negated["const"]]
        return _none_of(values) if isinstance(values, list) and values else None
    if set(negated) == {"type"}:
        kinds = negated["type"]
        kinds = [kinds] if isinstance(kinds, str) else kinds
        if not (isinstance(kinds, list) and all(k in _TYPE_ATOMS for k in kinds)):
            return None
        excluded = set().union(*(_TYPE_ATOMS[k] for k in kinds)) if kinds else set()
        if "integer" in excluded and "fraction" not in excluded:
            return None  # "a number that is not an integer" has no type of its own
        left = [k for k in _TYPE_ATOMS if _TYPE_ATOMS[k].isdisjoint(excluded)]
        return {"type": left} if left else False
    return None
