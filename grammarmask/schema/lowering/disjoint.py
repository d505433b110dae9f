"""Proofs that two subschemas accept no common instance, so that a `oneOf` of them means
the same as their `anyOf` (which every backend enforces; llguidance refuses a `oneOf` it
cannot prove disjoint itself).

Each proof reads only keywords a branch certainly enforces at its top level (a keyword
deeper in a branch only narrows it), so that "disjoint" is never claimed wrongly; a pair
the proofs cannot settle stays a `oneOf`.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeGuard

from ...errors import UnreadablePatternError
from ..keywords import VOCABULARY
from ..verdicts import verdicts
from .reading import ATOMS, REF_DEPTH, Reading, atoms, joined, listed_values, resolve, values
from .regular import combined_pattern


@dataclass(frozen=True)
class Scope:
    """What the keywords beside a `oneOf` demand of every value its branches see."""

    atoms: frozenset[str] = ATOMS
    required: frozenset[str] = frozenset()


_ANYWHERE = Scope()


def scope_of(node: dict[str, Any], reading: Reading) -> Scope:
    """The scope that the siblings of `node`'s `oneOf` set."""
    siblings = {k: v for k, v in node.items() if k != "oneOf"}
    return Scope(atoms(siblings, reading), frozenset(_required(siblings)))


def overlapping(
    branches: Sequence[Any], root: Any, draft: str | None, siblings: dict[str, Any]
) -> frozenset[tuple[int, int]]:
    """The pairs (i < j) of `branches` (lowered subschemas of `root`, written in `draft`)
    not proved to share no instance that also satisfies `siblings` (the schema object
    holding them): empty when the branches are pairwise disjoint."""
    reading = Reading(root, draft)
    return _overlapping(branches, reading, scope_of(siblings, reading))


def object_branches_disjoint(
    branches: Sequence[Any], root: Any, draft: str | None, siblings: dict[str, Any]
) -> bool:
    """Two or more `branches` that each constrain objects only, no two accepting a common
    object: their `oneOf` refuses every other value (all branches accept it), and on
    objects it means their `anyOf`."""
    reading = Reading(root, draft)
    if len(branches) < 2 or not all(_objects_only(resolve(b, reading)) for b in branches):
        return False
    scope = scope_of(siblings, reading)
    return not _overlapping(branches, reading, Scope(scope.atoms & {"object"}, scope.required))


_OBJECT_KEYWORDS = frozenset(
    {
        "properties", "required", "additionalProperties", "patternProperties",
        "minProperties", "maxProperties", "propertyNames", "dependentRequired",
        "dependentSchemas", "title", "description", "$comment", "default", "examples",
        "deprecated", "readOnly", "writeOnly",
    }
)  # fmt: skip
"""Keywords that constrain objects only (or nothing): a schema of them accepts every value
that is no object."""


def within(first: Any, second: Any, root: Any, draft: str | None) -> bool:
    """Every value `first` accepts, `second` accepts too: proved where `second` constrains
    objects only and `first` accepts no object (a `oneOf` never takes `first` alone)."""
    reading = Reading(root, draft)
    return _objects_only(resolve(second, reading)) and "object" not in atoms(first, reading)


def included(inner: Any, outer: Any, reading: Reading, depth: int = 0) -> bool:
    """Every value `inner` accepts, `outer` accepts too: proved where `outer` accepts
    everything, the two are the same schema, or each keyword of `outer` is implied by
    `inner`'s keywords (`_implied`). Read on the schemas' text alone: either may be the
    user's, in its own draft."""
    inner, outer = resolve(inner, reading), resolve(outer, reading)
    if outer is True or outer == {} or _same(inner, outer):
        return True
    if not (isinstance(inner, dict) and isinstance(outer, dict)) or depth > REF_DEPTH:
        return False
    keywords = {k: v for k, v in outer.items() if k in VOCABULARY}
    return set(keywords) <= _IMPLIED_KEYWORDS and all(
        _implied(inner, keyword, value, reading, depth) for keyword, value in keywords.items()
    )


_IMPLIED_KEYWORDS = frozenset(
    {"type", "required", "properties", "items", "pattern", "minLength", "maxLength",
     "minItems", "maxItems", "minimum", "maximum"}
)  # fmt: skip
"""The keywords `_implied` reads: each means the same whatever its neighbours are (`items`
only where `prefixItems` is absent, which the set leaves out)."""
_LOWER_BOUNDS = frozenset({"minLength", "minItems", "minimum"})


def _implied(inner: dict[str, Any], keyword: str, value: Any, reading: Reading, depth: int) -> bool:
    """Every value `inner` accepts satisfies `{keyword: value}`."""
    if keyword == "type":
        return atoms(inner, reading) <= atoms({"type": value}, reading)
    if keyword == "required":
        return isinstance(value, list) and set(_required(inner)) >= set(value)
    if keyword == "properties":
        return isinstance(value, dict) and all(
            included(property_schema(inner, name, reading), schema, reading, depth + 1)
            for name, schema in value.items()
        )
    if keyword == "items":
        if "prefixItems" in inner or isinstance(inner.get("items"), list):
            return False
        return included(inner.get("items", True), value, reading, depth + 1)
    if keyword == "pattern":
        if not (isinstance(value, str) and isinstance(inner.get("pattern"), str)):
            return False
        try:
            return combined_pattern([inner["pattern"]], [value]) is False
        except UnreadablePatternError:
            return False
    own = inner.get(keyword)
    if not (_is_number(value) and _is_number(own)):
        return False
    return own >= value if keyword in _LOWER_BOUNDS else own <= value


def property_schema(node: Any, name: str, reading: Reading) -> Any:
    """A schema that every value of property `name` in an object `node` accepts satisfies
    (True: none known)."""
    node = resolve(node, reading)
    return _property_schema(node, name) if isinstance(node, dict) else True


def _objects_only(node: Any) -> bool:
    return isinstance(node, dict) and bool(node) and set(node) <= _OBJECT_KEYWORDS


def _overlapping(
    branches: Sequence[Any], reading: Reading, scope: Scope
) -> frozenset[tuple[int, int]]:
    return frozenset(
        (i, j)
        for i in range(len(branches))
        for j in range(i + 1, len(branches))
        if not disjoint(branches[i], branches[j], reading, scope)
    )


def disjoint(
    first: Any,
    second: Any,
    reading: Reading,
    scope: Scope = _ANYWHERE,
    depth: int = 0,
    *,
    judged: bool = True,
) -> bool:
    """No instance in `scope` validates against both: proved from their kinds of value,
    their listed values (apart, or each refused by the other branch: read as 2020-12,
    where `judged` says both are lowered subschemas, else only where their keywords mean
    the same in the user's draft), one being the other's `not`, their length, count or
    number bounds, or, for objects, a property both must have whose schemas are disjoint
    (a required property the other forbids, a discriminator's different values)."""
    if depth == 0 and (
        _listed_fail(first, second, reading, judged=judged)
        or _listed_fail(second, first, reading, judged=judged)
    ):
        return True
    first, second = resolve(first, reading), resolve(second, reading)
    common = atoms(first, reading) & atoms(second, reading) & scope.atoms
    if not common:
        return True
    listed = values(first, reading), values(second, reading)
    if listed[0] is not None and listed[1] is not None and not listed[0] & listed[1]:
        return True
    if not (isinstance(first, dict) and isinstance(second, dict)) or depth > REF_DEPTH:
        return False
    if _same(first.get("not"), second) or _same(second.get("not"), first):
        return True
    bounds = _BOUNDS_BY_KIND.get(common)
    if bounds is not None and _apart(_bounds(first, bounds), _bounds(second, bounds)):
        return True
    if common == {"string"} and _strings_apart(first, second):
        return True
    if common == {"object"} and (
        _objects_disjoint(first, second, reading, scope, depth)
        or _keys_clash(first, second, reading, scope)
    ):
        return True
    if common == {"array"} and _arrays_disjoint(first, second, reading, depth):
        return True
    return depth < _SPLIT_DEPTH and (
        _branches_disjoint(first, second, reading, scope, depth)
        or _branches_disjoint(second, first, reading, scope, depth)
        or _part_disjoint(first, second, reading, scope, depth)
        or _part_disjoint(second, first, reading, scope, depth)
    )


_SPLIT_DEPTH = 2
"""How many levels of `anyOf`/`oneOf` the proofs split into branch pairs (a oneOf of two
schemas that are each a oneOf takes two): the pairs multiply."""


def _branches_disjoint(
    first: dict[str, Any], second: dict[str, Any], reading: Reading, scope: Scope, depth: int
) -> bool:
    """`first` holds an `anyOf` or `oneOf` each of whose branches, together with `first`'s
    other keywords, shares no instance with `second` (an instance of `first` is in one of
    them)."""
    for keyword in ("anyOf", "oneOf"):
        branches = first.get(keyword)
        if not (isinstance(branches, list) and branches):
            continue
        rest = {k: v for k, v in first.items() if k != keyword}
        merged = [joined(rest, resolve(branch, reading)) for branch in branches]
        if all(m is not None and disjoint(m, second, reading, scope, depth + 1) for m in merged):
            return True
    return False


def _part_disjoint(
    first: dict[str, Any], second: dict[str, Any], reading: Reading, scope: Scope, depth: int
) -> bool:
    """`first` holds an `allOf` (or a `$ref` beside other keywords) one of whose parts,
    together with `first`'s other keywords where they join, shares no instance with
    `second` (an instance of `first` is one of each part's)."""
    parts = first.get("allOf")
    parts = list(parts) if isinstance(parts, list) else []
    if "$ref" in first:  # kept beside other keywords (`resolve` followed a lone one)
        parts.append({"$ref": first["$ref"]})
    rest = {k: v for k, v in first.items() if k not in ("allOf", "$ref")}
    for part in parts:
        part = resolve(part, reading)
        merged = joined(rest, part)
        if disjoint(part if merged is None else merged, second, reading, scope, depth + 1):
            return True
    return False


FORMAT_SUPERSETS = {
    "uri": r"^[A-Za-z][A-Za-z0-9+.\-]*:",
    "hostname": r"^[A-Za-z0-9.\-]+$",
    "ipv4": r"^[0-9.]+$",
    "ipv6": r"^[0-9A-Fa-f.]*:[0-9A-Fa-f:.]*$",
    "email": "@",
    "idn-email": "@",
}
"""For a format every draft defines, a pattern that every string jsonschema's checker
accepts in it matches: a URI starts with its scheme and a colon, a hostname is ASCII
letters, digits, hyphens and dots, an IPv4 address digits and dots, an IPv6 address hex
digits, dots and at least one colon (no zone), an email address holds an `@`. Only for
proving strings apart: the format itself stays."""


def _strings_apart(first: dict[str, Any], second: dict[str, Any]) -> bool:
    """No string matches the patterns of both, and the patterns their formats' strings
    match (regular.py reads them)."""
    patterns = [*_string_patterns(first), *_string_patterns(second)]
    if len(patterns) < 2:
        return False
    try:
        return combined_pattern(patterns, []) is False
    except UnreadablePatternError:
        return False


def _string_patterns(node: dict[str, Any]) -> list[str]:
    found = [node["pattern"]] if isinstance(node.get("pattern"), str) else []
    kind = node.get("format")
    superset = FORMAT_SUPERSETS.get(kind) if isinstance(kind, str) else None
    return [*found, superset] if superset else found


def _listed_fail(listing: Any, other: Any, reading: Reading, *, judged: bool) -> bool:
    """`listing` lists its values (`enum`, `const`) and jsonschema refuses each of them
    against `other`, a subschema with no `$ref` in it (a `$ref` may lead into the user's own
    draft, which a 2020-12 validator misreads) that is lowered (`judged`) or whose keywords
    mean the same in the user's draft as in 2020-12."""
    listed = listed_values(listing, reading)
    text = json.dumps(other)
    if listed is None or '"$ref"' in text:
        return False
    if not judged and any(key in text for key in _DRAFT_SENSITIVE):
        return False
    found = verdicts(other, listed)
    return found is not None and not any(found)


_DRAFT_SENSITIVE = (
    '"const"', '"contains"', '"propertyNames"', '"if"', '"then"', '"else"',
    '"exclusiveMaximum"', '"exclusiveMinimum"', '"items": [', '"additionalItems"',
    '"dependencies"', '"format"', '"prefixItems"', '"dependentRequired"',
    '"dependentSchemas"', '"unevaluatedProperties"', '"unevaluatedItems"', '"minContains"',
    '"maxContains"',
)  # fmt: skip
"""Keys that some draft reads otherwise than 2020-12 does (or does not have, so that a
2020-12 validator would check what the user's validator ignores)."""


_NUMBERS = (("minimum", "exclusiveMinimum"), ("maximum", "exclusiveMaximum"))
_BOUNDS_BY_KIND: dict[frozenset[str], tuple[tuple[str, str | None], tuple[str, str | None]]] = {
    frozenset({"string"}): (("minLength", None), ("maxLength", None)),
    frozenset({"array"}): (("minItems", None), ("maxItems", None)),
    frozenset({"object"}): (("minProperties", None), ("maxProperties", None)),
    frozenset({"integer"}): _NUMBERS,
    frozenset({"fraction"}): _NUMBERS,
    frozenset({"integer", "fraction"}): _NUMBERS,
}
"""The keywords that bound a value of one kind from below and from above (inclusive, and
the exclusive one where there is one)."""

_Bound = tuple[float, bool]
"""A bound and whether it is open (the bound itself excluded)."""


def _bounds(
    node: dict[str, Any], keywords: tuple[tuple[str, str | None], tuple[str, str | None]]
) -> tuple[_Bound, _Bound]:
    """The interval `node` confines a value to (unbounded where it says nothing)."""
    (low_key, low_open_key), (high_key, high_open_key) = keywords
    low = _bound(node, low_key, low_open_key, -math.inf, max)
    high = _bound(node, high_key, high_open_key, math.inf, min)
    return low, high


def _bound(
    node: dict[str, Any], key: str, open_key: str | None, unbounded: float, tighter: Any
) -> _Bound:
    found: _Bound = (unbounded, False)
    value, flag = node.get(key), node.get(open_key) if open_key else None
    if _is_number(value):
        found = (float(value), flag is True)  # a draft-4 boolean flag opens `key`
    if _is_number(flag):
        candidate = (float(flag), True)
        if candidate[0] == found[0]:
            found = (found[0], True)
        elif tighter(candidate[0], found[0]) == candidate[0]:
            found = candidate
    return found


def _is_number(value: Any) -> TypeGuard[float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _apart(first: tuple[_Bound, _Bound], second: tuple[_Bound, _Bound]) -> bool:
    """The two intervals share no point."""

    def below(high: _Bound, low: _Bound) -> bool:
        return high[0] < low[0] or (high[0] == low[0] and (high[1] or low[1]))

    return below(first[1], second[0]) or below(second[1], first[0])


def _same(first: Any, second: Any) -> bool:
    """The same JSON (Python's == calls True and 1, or 1 and 1.0, equal)."""
    return first is not None and json.dumps(first, sort_keys=True) == json.dumps(
        second, sort_keys=True
    )


def _required(node: dict[str, Any]) -> list[str]:
    names = node.get("required")
    return [n for n in names if isinstance(n, str)] if isinstance(names, list) else []


def _parts_disjoint(left: Any, right: Any, reading: Reading, depth: int) -> bool:
    """The two schemas that one part of a common instance (a property, an item) must
    satisfy share no instance (a side that is True, nothing known, proves nothing)."""
    return (
        left is not True
        and right is not True
        and disjoint(left, right, reading, _ANYWHERE, depth + 1)
    )


def _objects_disjoint(
    first: dict[str, Any], second: dict[str, Any], reading: Reading, scope: Scope, depth: int
) -> bool:
    """Objects: some property every common instance has (required by either or by the
    scope) must satisfy two disjoint schemas."""
    present = dict.fromkeys([*_required(first), *_required(second), *scope.required])
    for name in present:
        if _parts_disjoint(
            _property_schema(first, name), _property_schema(second, name), reading, depth
        ):
            return True
    return False


def _keys_clash(
    first: dict[str, Any], second: dict[str, Any], reading: Reading, scope: Scope
) -> bool:
    """Objects: the keys one of them (or the scope) requires include a set of keys that one
    of them forbids together (the JSON-RPC shape: `result` required here, `error` there,
    both under a shared `not: {required: [result, error]}`)."""
    present_first, forbidden_first = _key_facts(first, reading)
    present_second, forbidden_second = _key_facts(second, reading)
    present = present_first | present_second | scope.required
    return any(keys <= present for keys in (*forbidden_first, *forbidden_second))


def _key_facts(
    node: Any, reading: Reading, depth: int = 0
) -> tuple[frozenset[str], list[frozenset[str]]]:
    """The keys every object `node` accepts has (its `required`, through `allOf` and
    `$ref`s), and the sets of keys no object it accepts has all of (a `not` of `required`,
    its positive form: an `anyOf` whose branches each forbid one key, a property that is
    `false`)."""
    node = resolve(node, reading)
    if not isinstance(node, dict) or depth > REF_DEPTH:
        return frozenset(), []
    present = set(_required(node))
    forbidden: list[frozenset[str]] = []
    negated = node.get("not")
    if isinstance(negated, dict) and set(negated) & VOCABULARY == {"required"}:
        forbidden.append(frozenset(_required(negated)))
    properties = node.get("properties")
    if isinstance(properties, dict):
        forbidden.extend(frozenset({name}) for name, value in properties.items() if value is False)
    alternatives = node.get("anyOf")
    if isinstance(alternatives, list) and alternatives:
        keys = [_forbidden_key(resolve(branch, reading)) for branch in alternatives]
        if all(key is not None for key in keys):
            forbidden.append(frozenset(key for key in keys if key is not None))
    parts = node.get("allOf")
    parts = list(parts) if isinstance(parts, list) else []
    if "$ref" in node:  # kept beside other keywords: its target applies as well
        parts.append({"$ref": node["$ref"]})
    for part in parts:
        more_present, more_forbidden = _key_facts(part, reading, depth + 1)
        present |= more_present
        forbidden.extend(more_forbidden)
    return frozenset(present), forbidden


def _forbidden_key(node: Any) -> str | None:
    """The one key that `node` (`{"properties": {key: false}}`, perhaps typed "object")
    forbids, where that is all it says."""
    if not isinstance(node, dict) or set(node) & VOCABULARY - {"type"} != {"properties"}:
        return None
    if node.get("type", "object") != "object":
        return None
    properties = node["properties"]
    if not (isinstance(properties, dict) and len(properties) == 1):
        return None
    name, value = next(iter(properties.items()))
    return name if value is False else None


def _arrays_disjoint(
    first: dict[str, Any], second: dict[str, Any], reading: Reading, depth: int
) -> bool:
    """Arrays: some position both must fill (both have at least that many items) takes two
    disjoint schemas."""
    least = max(_count(first.get("minItems")), _count(second.get("minItems")))
    for index in range(least):
        if _parts_disjoint(_item_schema(first, index), _item_schema(second, index), reading, depth):
            return True
        if index >= len(_prefix(first)) and index >= len(_prefix(second)):
            break  # every later position takes the same schemas
    return False


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _prefix(node: dict[str, Any]) -> list[Any]:
    """The schemas of the first items (`prefixItems`, or a draft-7-or-older tuple kept in
    place)."""
    for key in ("prefixItems", "items"):
        if isinstance(node.get(key), list):
            return list(node[key])
    return []


def _item_schema(node: dict[str, Any], index: int) -> Any:
    """A schema that `node` demands of the item at `index` (True: none known)."""
    prefix = _prefix(node)
    if index < len(prefix):
        return prefix[index]
    if isinstance(node.get("items"), list):
        return node.get("additionalItems", True)
    return node.get("items", True)


PLAIN_NAME = re.compile(r"[ -~]*")
"""Property names whose match against a pattern Python's `re`, ECMA-262 and the backends
agree on (printable ASCII, no newline)."""


def _property_schema(node: dict[str, Any], name: str) -> Any:
    """A schema that `node` demands of property `name`'s value (True: none known)."""
    properties = node.get("properties")
    if isinstance(properties, dict) and name in properties:
        return properties[name]
    patterns = node.get("patternProperties")
    if isinstance(patterns, dict) and patterns:
        if not PLAIN_NAME.fullmatch(name):
            return True
        for pattern, schema in patterns.items():
            try:
                if re.search(pattern, name):
                    return schema
            except (re.error, TypeError):
                return True
    return node.get("additionalProperties", True)
