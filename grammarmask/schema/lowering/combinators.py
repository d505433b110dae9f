"""Combinators the backends refuse, in forms they enforce: dependencies as `anyOf`
branches, the `not`s that have a positive form, and a `oneOf` as the `anyOf` of each
branch without the others (a provably disjoint `oneOf`: disjoint.py).

Each rewrite accepts exactly the instances the original accepts; where grammarmask cannot
prove that, the keyword stays and the backends' enforcement tables report it.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

from ...errors import UnreadablePatternError
from ..keywords import VOCABULARY
from .disjoint import disjoint, included, property_schema, within
from .reading import (
    ATOMS,
    REF_DEPTH,
    TYPE_ATOMS,
    Reading,
    atom,
    atoms,
    joined,
    listed_values,
    resolve,
)
from .regular import combined_pattern

_BOUND_INVERSES = {
    "minimum": ("number", "exclusiveMaximum", 0),
    "exclusiveMinimum": ("number", "maximum", 0),
    "maximum": ("number", "exclusiveMinimum", 0),
    "exclusiveMaximum": ("number", "minimum", 0),
    "minLength": ("string", "maxLength", -1),
    "maxLength": ("string", "minLength", 1),
    "minItems": ("array", "maxItems", -1),
    "maxItems": ("array", "minItems", 1),
    "minProperties": ("object", "maxProperties", -1),
    "maxProperties": ("object", "minProperties", 1),
}
"""A bound's complement among the values it applies to: (their type, the opposite keyword,
the step from the bound to the opposite one: counts are integers)."""
_INDEPENDENT = frozenset(
    {"type", "required", "properties", "enum", "const", "not", "anyOf", "allOf", "pattern"}
    | {"items"}
    | set(_BOUND_INVERSES)
)
"""Keywords whose meaning does not depend on their neighbours: a schema of several of them
is the allOf of each alone (2019-09 on: exclusive bounds are numbers of their own; `items`
beside no `prefixItems` or `additionalItems`, which are not in the set)."""
_BLOCKING = frozenset({"$id", "id", "$anchor", "$dynamicAnchor", "$defs", "definitions"})
"""Keys that constrain nothing themselves but that references may lean on: they are kept
where other non-vocabulary keys (annotations, `x-...`) are dropped, so that a schema
holding one has no positive `not` (`id` only in draft 4: later drafts spell it `$id`,
and read `id` as an annotation)."""


def _outside_bound(keyword: str, bound: Any) -> dict[str, Any] | bool | None:
    """`not: {keyword: bound}`: the values of the bound's type on the other side of it
    (every value of another type satisfies the bound)."""
    kind, opposite, step = _BOUND_INVERSES[keyword]
    if isinstance(bound, bool) or not isinstance(bound, (int, float)):
        return None
    if step == 0:
        return {"type": kind, opposite: bound}
    if not isinstance(bound, int) or bound < 0:
        return None
    if bound + step < 0:
        return False  # a minimum count of 0: every value satisfies it
    return {"type": kind, opposite: bound + step}


def dependency_branches(name: str, then: Any, *, present: bool = False) -> dict[str, Any]:
    """`anyOf` branches meaning "if `name` is present, `then` holds" for an object (either
    the property is absent, or it is present and `then` holds; a value that is no object
    passes both, as the dependency keywords let it): `then` is a list of required names
    or a schema. `present`: the object always has `name` (its schema requires it), so the
    first branch is left out (llguidance refuses a branch no value can satisfy). A schema
    is joined into the branch that requires `name` where their keywords do not clash, so
    that a `oneOf` in it is read knowing `name` is there."""
    holds: dict[str, Any] = {"required": [name]}
    if isinstance(then, list):
        holds = {"required": list(dict.fromkeys([name, *then]))}
    elif then is not True:
        holds = joined(holds, then) or {"required": [name], "allOf": [then]}
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
    numbers = sorted({float(v) for v in values if atom(v) in ("integer", "fraction")})
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


def _not_matching(pattern: str) -> dict[str, Any] | bool | None:
    """`not: {pattern: ...}`: the strings the pattern finds no match in (regular.py; every
    other value satisfies the pattern); None where that pattern cannot be read or written."""
    try:
        outside = combined_pattern([], [pattern])
    except UnreadablePatternError:
        return None
    if isinstance(outside, bool):
        return {"type": "string"} if outside else False
    return {"type": "string", "pattern": outside}


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


def exactly_one(
    branches: Sequence[Any],
    root: Any,
    draft: str | None,
    overlapping: frozenset[tuple[int, int]],
) -> list[Any] | None:
    """`anyOf` branches for a `oneOf` whose branches may overlap: each branch with the
    positive form of the `not` of every other branch it may overlap with (`overlapping`:
    the pairs i < j not proved disjoint). None where one of those `not`s has no positive
    form, or where no branch is left."""
    negations: dict[int, Any] = {}
    rewritten = []
    for index, branch in enumerate(branches):
        excluded = []
        others = [
            (other_index, other)
            for other_index, other in enumerate(branches)
            if (min(index, other_index), max(index, other_index)) in overlapping
        ]
        if any(within(branch, other, root, draft) for _, other in others):
            continue  # whenever it holds another holds too: never the only one
        for other_index, other in others:
            if other_index not in negations:
                negations[other_index] = positive_not(other, root, draft)
            negation = negations[other_index]
            if negation is None:
                negation = positive_not(other, root, draft, given=branch)
            if negation is None and everything(positive_not(branch, root, draft, given=other)):
                negation = True  # no value of `other` is one of `branch`: the two are apart
            if negation is None:
                negation = _outside_closed_object(branch, other, root, draft)
            if negation is None:
                return None
            if negation is not True:
                excluded.append(negation)
        if any(negation is False for negation in excluded):
            continue  # another branch accepts everything: this one is never the only one
        rewritten.append({"allOf": [branch, *excluded]} if excluded else branch)
    return rewritten or None


def _some_name_outside(names: Any, reading: Reading) -> dict[str, Any] | bool | None:
    """`not: {propertyNames: names}`, an object with a key that `names` refuses, where that
    has a positive form: any key at all (`names` is false), or one of the listed keys that
    `names` is the `not` of (present: required)."""
    if names is True or names == {}:
        return False
    if names is False:
        return {"type": "object", "minProperties": 1}
    if not (isinstance(names, dict) and set(names) & VOCABULARY == {"not"}):
        return None
    refused = names["not"]
    if not (isinstance(refused, dict) and set(refused) & VOCABULARY in ({"const"}, {"enum"})):
        return None
    listed = listed_values(refused, reading)
    if not listed or not all(isinstance(name, str) for name in listed):
        return None
    if len(listed) == 1:
        return {"type": "object", "required": listed}
    return {"type": "object", "anyOf": [{"required": [name]} for name in listed]}


def everything(schema: Any) -> bool:
    """Whether `schema` plainly accepts every value (True, `{}`, an `allOf` of such)."""
    if schema is True or schema == {}:
        return True
    if isinstance(schema, dict) and set(schema) == {"allOf"} and isinstance(schema["allOf"], list):
        return all(map(everything, schema["allOf"]))
    return False


def _settled(negated: Any, given: Any, reading: Reading) -> bool | None:
    """`not: negated` on the values `given` accepts, where that needs no reading of
    `negated`: True where they share no value, False where `negated` takes every one of
    them (and where `given` accepts nothing); None otherwise."""
    if given is False:
        return False
    if given is True:
        return None
    if disjoint(given, negated, reading, judged=False):  # `given` may be the user's text
        return True
    return False if included(given, negated, reading) else None


def _outside_items(items: Any, given: Any, reading: Reading) -> dict[str, Any] | bool | None:
    """`not: {items: items}` (an array with an item outside `items`) on the arrays `given`
    accepts, where their items settle it (`_settled`): none of them is an `items` value (any
    item will do: a non-empty array) or each is one (no array is outside); None otherwise
    (it would need `contains`)."""
    if items is True:
        return False
    kept = None if given is None else resolve(given, reading)
    if not isinstance(kept, dict) or "prefixItems" in kept or isinstance(kept.get("items"), list):
        return None
    settled = _settled(items, kept.get("items", True), reading)
    return {"type": "array", "minItems": 1} if settled is True else settled


_CLOSED_OBJECT_KEYWORDS = frozenset({"type", "properties", "required", "additionalProperties"})


def _outside_closed_object(kept: Any, closed: Any, root: Any, draft: str | None) -> Any:
    """A schema S with `kept` and S exactly `kept` and not `closed`, where `closed` is a
    closed object (`properties`, `required`, `additionalProperties: false`, `type` object)
    and `kept` allows only the properties it lists: such an object leaves `closed` by a
    property `closed` does not list, by lacking one it requires, or by a listed property's
    value outside its schema. None where either is of another shape."""
    reading = Reading(root, draft)
    kept, closed = resolve(kept, reading), resolve(closed, reading)
    if not (isinstance(kept, dict) and isinstance(closed, dict)):
        return None
    kept_names = _closed_names(kept)
    closed_names = _closed_names(closed)
    shape = {k for k in closed if k in VOCABULARY}
    if kept_names is None or closed_names is None or not shape <= _CLOSED_OBJECT_KEYWORDS:
        return None
    if closed.get("type", "object") != "object":
        return None
    required = closed.get("required", [])
    if not (isinstance(required, list) and all(isinstance(n, str) for n in required)):
        return None
    ways: list[Any] = [{"required": [n]} for n in kept_names if n not in closed_names]
    ways += [{"properties": {n: False}} for n in dict.fromkeys(required)]
    for name in kept_names:
        if name in closed_names:
            outside = positive_not(
                closed["properties"][name],
                root,
                draft,
                lowered=False,
                given=property_schema(kept, name, reading),
            )
            if outside is None:
                return None
            if outside is not False:
                ways.append({"required": [name], "properties": {name: outside}})
    objects_outside = {"type": "object", "anyOf": ways} if ways else False
    if "type" not in closed:  # every other value satisfies `closed`
        return objects_outside
    not_object = positive_not({"type": "object"})
    return {"anyOf": [not_object, objects_outside]} if ways else not_object


def _closed_names(node: dict[str, Any]) -> list[str] | None:
    """The only property names an object `node` accepts may have (`properties` beside
    `additionalProperties: false`, no `patternProperties`); None where others may appear."""
    names = node.get("properties", {})
    if node.get("additionalProperties") is not False or "patternProperties" in node:
        return None
    return list(names) if isinstance(names, dict) else None


def positive_not(
    negated: Any,
    root: Any = None,
    draft: str | None = None,
    depth: int = 0,
    *,
    lowered: bool = True,
    given: Any = None,
) -> dict[str, Any] | bool | None:
    """A schema without `not` that accepts exactly what `not: negated` accepts, for the
    shapes that have one; None for the others. A branch that is a local `$ref` is read at
    its target (in the user's schema `root`, written in `draft`); `lowered` says whether
    `negated` is already lowered, so that its parts may be kept as they are. `depth`
    counts the `$ref`s followed (a recursive schema has no positive `not` this way).
    With `given`, a schema every value in question satisfies, the result need only agree
    with `not: negated` on those values: parts of `negated` that `given` settles (a
    property `given` holds to other values, a type `given` has) need no positive form."""
    reading = Reading(root, draft)
    if given is not None:
        settled = _settled(negated, given, reading)
        if settled is not None:
            return settled
    if root is not None and isinstance(negated, dict) and "$ref" in negated:
        target = resolve(negated, reading)
        if target is negated or depth >= REF_DEPTH:
            return None
        negated, lowered, depth = target, False, depth + 1
    if negated is True or negated == {}:
        return False
    if negated is False:
        return True
    if not isinstance(negated, dict):
        return None
    blocking = _BLOCKING if draft in (None, "draft4") else _BLOCKING - {"id"}
    negated = {k: v for k, v in negated.items() if k in VOCABULARY or k in blocking}
    if not negated:
        return False
    if set(negated) == {"not"}:
        return negated["not"] if lowered else None
    if len(negated) == 1 and next(iter(negated)) in _BOUND_INVERSES:
        return _outside_bound(*next(iter(negated.items())))
    if set(negated) in ({"anyOf"}, {"allOf"}) and isinstance(next(iter(negated.values())), list):
        ((keyword, branches),) = negated.items()
        positives = [
            positive_not(branch, root, draft, depth, lowered=lowered, given=given)
            for branch in branches
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
            positive_not({key: value}, root, draft, depth, lowered=lowered, given=given)
            for key, value in negated.items()
        ]
        return None if any(p is None for p in parts) else {"anyOf": parts}
    if set(negated) == {"properties"} and isinstance(negated["properties"], dict):
        branches = []
        for name, schema in negated["properties"].items():
            value_given = None
            if given is not None:
                value_given = property_schema(given, name, reading)
            inverse = positive_not(schema, root, draft, depth, lowered=lowered, given=value_given)
            if inverse is None:
                return None
            if inverse is not False:  # present and breaking its schema
                branches.append({"required": [name], "properties": {name: inverse}})
        return {"type": "object", "anyOf": branches} if branches else False
    if set(negated) == {"items"} and isinstance(negated["items"], (dict, bool)):
        return _outside_items(negated["items"], given, reading)
    if negated == {"additionalProperties": False}:  # propertyNames false, lowered
        return {"type": "object", "minProperties": 1}
    if set(negated) == {"propertyNames"}:
        return _some_name_outside(negated["propertyNames"], reading)
    if set(negated) == {"pattern"} and isinstance(negated["pattern"], str):
        return _not_matching(negated["pattern"])
    if set(negated) in ({"enum"}, {"const"}):
        values = negated["enum"] if "enum" in negated else [negated["const"]]
        return _none_of(values) if isinstance(values, list) and values else None
    if set(negated) == {"type"}:
        kinds = negated["type"]
        kinds = [kinds] if isinstance(kinds, str) else kinds
        if not (isinstance(kinds, list) and all(k in TYPE_ATOMS for k in kinds)):
            return None
        excluded = set().union(*(TYPE_ATOMS[k] for k in kinds)) if kinds else set()
        possible = ATOMS if given is None else atoms(given, reading)
        if possible <= excluded:
            return False
        if "integer" in excluded and "fraction" not in excluded and "fraction" in possible:
            return None  # "a number that is not an integer" has no type of its own
        left = [k for k in TYPE_ATOMS if TYPE_ATOMS[k].isdisjoint(excluded)]
        return {"type": left} if left else False
    return None
