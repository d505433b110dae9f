"""References to plain-name anchors (`"$ref": "#name"`) rewritten as JSON pointers to the
schema object the anchor names: the same schema, and one that backends which follow only
`#/pointer` references read (xgrammar lets any value through `#name`)."""

from __future__ import annotations

from typing import Any

from ..pointers import json_pointer
from ..walk import iter_subschemas, map_subschemas


def anchor_pointers(schema: Any) -> dict[str, str]:
    """The JSON pointer of each plain-name anchor (`$anchor`, or a `"#name"` `$id` / `id`
    of drafts 4 to 7) that names exactly one schema object of `schema`; empty when `schema`
    embeds another resource (an inner `$id` that is no fragment), where `"#name"` may mean
    an anchor of that resource instead."""
    found: dict[str, list[str]] = {}
    for node, pointer in iter_subschemas(schema):
        names = [node["$anchor"]] if isinstance(node.get("$anchor"), str) else []
        for ident in (node.get("$id"), node.get("id")):
            if not isinstance(ident, str):
                continue
            if ident.startswith("#"):
                names.append(ident[1:])
            elif pointer:
                return {}
        for name in names:
            found.setdefault(name, []).append(pointer)
    return {name: pointers[0] for name, pointers in found.items() if len(pointers) == 1}


def as_pointers(
    node: Any, pointers: dict[str, str], rewritten: list[tuple[str, str]], pointer: str = ""
) -> Any:
    """`node` (a lowered schema, changed in place) with each `"#name"` reference whose
    anchor `pointers` locates replaced by `"#" + pointer`; the JSON pointer and new target
    of each reference replaced are added to `rewritten`."""
    if not isinstance(node, dict):
        return node
    out = map_subschemas(
        node,
        lambda child, step: as_pointers(child, pointers, rewritten, pointer + json_pointer(step)),
    )
    ref = out.get("$ref")
    name = ref[1:] if isinstance(ref, str) and ref.startswith("#") else ""
    if name and not name.startswith("/") and name in pointers:
        out["$ref"] = "#" + pointers[name]
        rewritten.append((pointer, f"{ref} -> {out['$ref']}"))
    return out
