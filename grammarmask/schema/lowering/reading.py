"""Reading a (lowered) schema for the proofs lowering rests on: `$ref`s followed in the
user's draft, and the kinds of JSON value a subschema may accept."""

from __future__ import annotations

import json
import re
from typing import Any

from ..keywords import VOCABULARY
from ..pointers import resolve_pointer
from .dialects import OLD_DRAFTS

ATOMS = frozenset({"null", "boolean", "object", "array", "string", "integer", "fraction"})
"""The JSON values, by kind: numbers split into integers and the others, so that `integer`
and `number` compare as a subset."""
TYPE_ATOMS = {
    "null": {"null"},
    "boolean": {"boolean"},
    "object": {"object"},
    "array": {"array"},
    "string": {"string"},
    "integer": {"integer"},
    "number": {"integer", "fraction"},
}
REF_DEPTH = 8
"""How deep the proofs follow `$ref`s and nested subschemas before they give up."""


def atom(value: Any) -> str:
    """The kind of a JSON value (1.0 is an "integer" value: draft 4's type "integer" refuses
    it, which only makes that type's kinds a wider guess)."""
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


def value_key(value: Any) -> str:
    """Equal keys for values JSON Schema calls equal (1 and 1.0 are)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return f"n:{float(value)!r}"
    return "j:" + json.dumps(value, sort_keys=True)


class Reading:
    """How to read the user's schema where a `$ref` leads into it: in its own draft."""

    def __init__(self, root: Any, draft: str | None) -> None:
        self.root = root
        self.old = draft in OLD_DRAFTS
        """Keywords beside a `$ref` are ignored."""
        self.const = draft != "draft4"
        """`const` exists."""


def resolve(node: Any, reading: Reading) -> Any:
    """`node` with local `$ref`s followed (a node with other keywords beside its `$ref` is
    kept as it is from 2019-09 on: it is not only its target)."""
    for _ in range(REF_DEPTH):
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


def atoms(node: Any, reading: Reading, depth: int = 0) -> frozenset[str]:
    """The kinds of value `node` may accept (all of them when unknown): from its `type`,
    `const`, `enum`, a `$ref` beside them, and the branches of its `anyOf`, `oneOf` and
    `allOf`."""
    node = resolve(node, reading)
    if node is False:
        return frozenset()
    if not isinstance(node, dict) or depth > REF_DEPTH:
        return ATOMS
    found = set(ATOMS)
    if "$ref" in node:  # kept beside other keywords: its target applies as well
        found &= atoms({"$ref": node["$ref"]}, reading, depth + 1)
    kinds = node.get("type")
    if isinstance(kinds, str):
        kinds = [kinds]
    if isinstance(kinds, list) and all(k in TYPE_ATOMS for k in kinds):
        found &= set().union(*(TYPE_ATOMS[k] for k in kinds))
    if "const" in node and reading.const:
        found &= {atom(node["const"])}
    if isinstance(node.get("enum"), list):
        found &= {atom(v) for v in node["enum"]}
    for keyword in ("anyOf", "oneOf"):
        branches = node.get(keyword)
        if isinstance(branches, list) and branches:
            found &= set().union(*(atoms(b, reading, depth + 1) for b in branches))
    branches = node.get("allOf")
    if isinstance(branches, list):
        for branch in branches:
            found &= atoms(branch, reading, depth + 1)
    return frozenset(found)


def listed_values(node: Any, reading: Reading) -> list[Any] | None:
    """The values `node` lists (`const`, else `enum`), as written; None where it lists none."""
    node = resolve(node, reading)
    if not isinstance(node, dict):
        return None
    if "const" in node and reading.const:
        return [node["const"]]
    if isinstance(node.get("enum"), list):
        return list(node["enum"])
    return None


def values(node: Any, reading: Reading) -> frozenset[str] | None:
    """The values `node` accepts, when it lists them (`const`, `enum`, or a string type with
    a literal pattern), by `value_key`."""
    node = resolve(node, reading)
    listed = listed_values(node, reading)
    if listed is not None:
        return frozenset(map(value_key, listed))
    if not isinstance(node, dict):
        return None
    literal = _LITERAL_PATTERN.fullmatch(str(node.get("pattern")))
    if node.get("type") == "string" and literal:  # Python's `$` passes a final newline
        return frozenset({value_key(literal[1]), value_key(literal[1] + "\n")})
    return None


_LITERAL_PATTERN = re.compile(r"\^([A-Za-z0-9_ -]*)\$")
"""A pattern that names one string (`^success$`)."""


_NEIGHBOURS = (
    frozenset({"if", "then", "else"}),
    frozenset({"contains", "minContains", "maxContains"}),
    frozenset({"properties", "patternProperties", "additionalProperties"}),
    frozenset({"prefixItems", "items", "additionalItems"}),
)
"""Keywords that read each other: split between two schema objects they mean something else
than side by side in one (`then` alone is ignored, `additionalProperties` covers only its
own object's `properties`)."""


def joined(node: dict[str, Any], branch: Any) -> dict[str, Any] | None:
    """One schema object for `node` and `branch` both (their allOf), where their keywords do
    not clash (`required` lists join); None where they do, where keywords that read each
    other are split between them, or where either evaluates its neighbours
    (`unevaluated...`)."""
    if branch is True:
        return node
    if not isinstance(branch, dict):
        return None
    for side in (node, branch):
        if any(key.startswith("unevaluated") for key in side):
            return None
    for group in _NEIGHBOURS:
        mine, theirs = group & set(node), group & set(branch)
        if mine and theirs and any(node.get(k) != branch.get(k) for k in mine | theirs):
            return None
    merged = dict(node)
    for key, value in branch.items():
        if key not in merged or merged[key] == value:
            merged[key] = value
        elif key == "required" and isinstance(value, list) and isinstance(merged[key], list):
            merged[key] = list(dict.fromkeys([*merged[key], *value]))
        elif key in VOCABULARY:
            return None
    return merged
