"""Recursive references written out where they meet other keywords.

A `$ref` whose target leads back to itself, sitting beside other keywords (or in an `allOf`
beside other branches, or as a branch of an `anyOf`/`oneOf` beside other keywords), asks
its reader to intersect the target with the rest while the target is still being read:
llguidance refuses that ("circular references with sibling keys"). Each such schema
object becomes a plain `$ref` to a definition of its own, holding the object with the
reference replaced by a copy of the target (every `$ref` inside the copy is a JSON pointer
from the document's root, so it lands where it did). The copy holds the same
intersection again, which becomes a plain `$ref` to that same definition: the cycle
closes through it, and means what it meant.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

from ..keywords import VOCABULARY
from ..pointers import json_pointer, resolve_pointer
from ..walk import iter_subschemas, map_subschemas, unreached_targets

_CONTAINERS = ("$defs", "definitions")
"""Keys that only hold subschemas for references: left out of a copy (its references reach
the originals)."""
_BASE_CHANGING = ("$id", "id", "$anchor", "$dynamicAnchor", "$recursiveAnchor")
"""Keywords that would mean something else, or clash, in a copy."""
_COPIED_CHARACTERS = 2_000_000
"""The most JSON text the copies may add: past it the schema is left as it was."""
_DEFINITIONS = 256
"""The most intersections written out: past it the schema is left as it was."""
_PREFIX = "grammarmask-intersection-"


def write_out_recursive_references(schema: Any) -> tuple[Any, list[str]]:
    """`schema` (a lowered document, not changed) with each schema object where a recursive
    reference meets other keywords as a `$ref` to its own definition, and the pointers of
    those references; `schema` itself when there is none, or past `_DEFINITIONS` or
    `_COPIED_CHARACTERS`."""
    if not isinstance(schema, dict) or '"$ref"' not in json.dumps(schema):
        return schema, []
    recursive = _recursive_targets(schema)
    if not recursive:
        return schema, []
    writer = _Writer(schema, recursive, unreached_targets(schema))
    rewritten = writer.children(copy.deepcopy(schema), "", original=True)
    if not writer.written or writer.too_large:
        return schema, []
    rewritten["$defs"] = {**rewritten.get("$defs", {}), **writer.definitions}
    return rewritten, writer.written


def _local_references(node: Any) -> set[str]:
    """The local `$ref`s ("#", "#/...") anywhere in `node`, outside `$defs`/`definitions`."""
    found: set[str] = set()
    stack = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, dict):
            ref = item.get("$ref")
            if isinstance(ref, str) and (ref == "#" or ref.startswith("#/")):
                found.add(ref)
            stack.extend(v for k, v in item.items() if k not in _CONTAINERS)
    return found


def _recursive_targets(schema: Any) -> frozenset[str]:
    """The local references whose target leads, through references, back to itself."""
    edges: dict[str, set[str]] = {}
    pending = list(_local_references(schema) | {"#"})
    while pending:
        ref = pending.pop()
        if ref in edges:
            continue
        edges[ref] = _local_references(resolve_pointer(schema, ref[1:]))
        pending.extend(edges[ref] - edges.keys())
    recursive = set()
    for start in edges:
        seen: set[str] = set()
        stack = list(edges[start])
        while stack:
            ref = stack.pop()
            if ref == start:
                recursive.add(start)
                break
            if ref not in seen:
                seen.add(ref)
                stack.extend(edges.get(ref, ()))
    return frozenset(recursive)


def _constraining(node: dict[str, Any], besides: str) -> bool:
    """Whether `node` has a keyword other than `besides` that constrains an instance."""
    return any(key in VOCABULARY and key != besides for key in node)


def _plain_reference(node: Any) -> str | None:
    """The target of a schema that is a `$ref` and nothing that constrains beside it."""
    plain = isinstance(node, dict) and isinstance(node.get("$ref"), str)
    return str(node["$ref"]) if plain and not _constraining(node, "$ref") else None


class _Writer:
    def __init__(
        self, root: dict[str, Any], recursive: frozenset[str], unreached: frozenset[str]
    ) -> None:
        self.root = root
        self.recursive = recursive
        self.unreached = unreached
        self.names: dict[str, str] = {}
        """The definition written for each intersection met (by its JSON text)."""
        self.definitions: dict[str, Any] = {}
        self.written: list[str] = []
        self.copied = 0
        self.too_large = False
        """Past a limit: the rewritten document is not used."""

    def rewrite(self, node: Any, pointer: str, *, original: bool = True) -> Any:
        """`node` (a copy of the part at `pointer`, changed in place) with its intersected
        recursive references written out; `original`: `node` is the user's, not a copy."""
        if not isinstance(node, dict):
            return node
        return self._intersection(
            self.children(node, pointer, original=original), pointer, original
        )

    def children(self, node: dict[str, Any], pointer: str, *, original: bool) -> dict[str, Any]:
        """`node` with its subschemas rewritten (the root itself stays where it is: its
        definitions belong to it)."""
        return map_subschemas(
            node,
            lambda child, step: self.rewrite(
                child, pointer + json_pointer(step), original=original
            ),
            at=pointer,
            targets=self.unreached if original else frozenset(),
        )

    def _intersection(self, node: dict[str, Any], pointer: str, original: bool) -> Any:
        """`node`, or a reference to the definition that writes out its intersected
        recursive reference (one per distinct intersection, so that copies of copies end)."""
        found = None if self.too_large else _intersected(node, self._recursive)
        if found is None:
            return node
        ref, place = found
        target = self._target(ref)
        if target is None or _moves_badly(target):
            return node
        key = json.dumps([ref, node], sort_keys=True)
        name = self.names.get(key)
        if name is None:
            name = self._new_name()
            self.names[key] = name
            if original:
                self.written.append(pointer + json_pointer(place))
            self.copied += len(json.dumps(target))
            if self.copied > _COPIED_CHARACTERS or len(self.names) > _DEFINITIONS:
                self.too_large = True
                return node
            written = copy.deepcopy(target)
            if isinstance(written, dict):
                for container in _CONTAINERS:
                    written.pop(container, None)
            written = self.rewrite(written, ref[1:], original=False)
            self.definitions[name] = self._intersection(
                _placed(node, place, written), pointer, False
            )
        return {"$ref": f"#/$defs/{name}"}

    def _recursive(self, ref: str) -> bool:
        """Whether `ref` may lead back to itself (a written definition may)."""
        return ref in self.recursive or ref.startswith(f"#/$defs/{_PREFIX}")

    def _target(self, ref: str) -> Any:
        """What `ref` points to; None for a definition still being written."""
        if ref.startswith(f"#/$defs/{_PREFIX}"):
            return self.definitions.get(ref.removeprefix("#/$defs/"))
        return resolve_pointer(self.root, ref[1:])

    def _new_name(self) -> str:
        taken = self.root.get("$defs", {})
        index = len(self.names)
        while f"{_PREFIX}{index}" in taken:
            index += 1
        return f"{_PREFIX}{index}"


def _intersected(
    node: dict[str, Any], recursive: Callable[[str], bool]
) -> tuple[str, tuple[str | int, ...]] | None:
    """The first recursive reference `node` intersects with something else, and its place."""
    ref = node.get("$ref")
    if isinstance(ref, str) and recursive(ref) and _constraining(node, "$ref"):
        return ref, ("$ref",)
    for keyword in ("allOf", "anyOf", "oneOf"):
        branches = node.get(keyword)
        if not isinstance(branches, list):
            continue
        beside = keyword == "allOf" and len(branches) > 1
        if not (beside or _constraining(node, keyword)):
            continue
        for index, branch in enumerate(branches):
            target = _plain_reference(branch)
            if target is not None and recursive(target):
                return target, (keyword, index)
    return None


def _placed(node: dict[str, Any], place: tuple[str | int, ...], written: Any) -> dict[str, Any]:
    """`node` with the reference at `place` replaced by `written`."""
    out = dict(node)
    if place == ("$ref",):
        del out["$ref"]
        out["allOf"] = [*out.get("allOf", []), written]
    else:
        keyword, index = place
        out[str(keyword)] = [written if i == index else b for i, b in enumerate(out[str(keyword)])]
    return out


def _moves_badly(target: Any) -> bool:
    """Whether a copy of `target` would mean something else, or clash, elsewhere."""
    return any(
        isinstance(node.get(key), str)
        for node, _ in iter_subschemas(target)
        for key in _BASE_CHANGING
    )
