"""JSON pointers (RFC 6901) and the schema's own references: where each `$ref` lands."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any
from urllib.parse import unquote

from ..errors import GrammarTooLargeError, InvalidSchemaError


def json_pointer(path: Iterable[Any]) -> str:
    """RFC 6901 pointer for a path of keys and indices."""
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in path)


def normal_pointer(pointer: str) -> str:
    """`pointer` as `json_pointer` spells it (percent-encoding decoded, as in a `$ref`)."""
    return json_pointer(
        unquote(raw).replace("~1", "/").replace("~0", "~") for raw in pointer.split("/")[1:]
    )


def resolve_pointer(document: Any, pointer: str) -> Any:
    """The node at an RFC 6901 `pointer` ("" is the root), or None if there is none."""
    node = document
    for raw in pointer.split("/")[1:]:
        part = unquote(raw).replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node


def references(schema: Any, max_depth: int | None) -> tuple[list[tuple[str, str]], set[str]]:
    """The string `$ref`s of `schema` with their pointers, and its anchors, in one iterative
    pass (no recursion; cycles end at the depth limit) that refuses nesting deeper than
    `max_depth` (GrammarTooLargeError; None: a schema already checked, no limit)."""
    refs: list[tuple[str, str]] = []
    anchors: set[str] = set()
    stack: list[tuple[Any, tuple[Any, ...]]] = [(schema, ())]
    while stack:
        node, path = stack.pop()
        if not isinstance(node, (dict, list)):
            continue
        if max_depth is not None and len(path) >= max_depth:
            where = json_pointer(path)
            where = where if len(where) <= 80 else where[:60] + "..." + where[-17:]
            raise GrammarTooLargeError(
                f"the schema nests deeper than {max_depth} levels at {where}; "
                "the limit is GrammarLimits.max_depth"
            )
        if isinstance(node, list):
            stack.extend((v, (*path, i)) for i, v in enumerate(node))
            continue
        ref = node.get("$ref")
        if isinstance(ref, str):
            refs.append((ref, json_pointer((*path, "$ref"))))
        if isinstance(node.get("$anchor"), str):
            anchors.add(node["$anchor"])
        for ident in (node.get("$id"), node.get("id")):  # "#name" ids: drafts 4 to 7
            if isinstance(ident, str) and ident.startswith("#"):
                anchors.add(ident[1:])
        stack.extend((v, (*path, k)) for k, v in node.items())
    return refs, anchors


def check_references(schema: Any, refs: list[tuple[str, str]], anchors: set[str]) -> None:
    """Every `$ref` must land inside the schema (InvalidSchemaError naming it otherwise):
    backends fetch nothing and fail obscurely."""
    for ref, pointer in refs:
        if not ref.startswith("#"):
            raise InvalidSchemaError(
                f"$ref {ref!r} points outside the schema; only references inside it "
                "('#', '#/json/pointer' or '#anchor') can be resolved",
                pointer,
            )
        fragment = ref[1:]
        found = (
            resolve_pointer(schema, fragment) is not None
            if fragment == "" or fragment.startswith("/")
            else fragment in anchors
        )
        if not found:
            raise InvalidSchemaError(
                f"$ref {ref!r} does not resolve to any part of the schema", pointer
            )


def pointer_refs_resolve(schema: Any) -> bool:
    """Every local `$ref` of `schema` (one already checked, such as a lowered schema)
    written as a pointer lands on a schema in it."""
    refs, _ = references(schema, None)
    return all(
        isinstance(resolve_pointer(schema, ref[1:]), (dict, bool))
        for ref, _ in refs
        if ref.startswith("#/")
    )
