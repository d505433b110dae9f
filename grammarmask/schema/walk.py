"""The walk over a JSON Schema's subschemas, the one place that knows where they sit: the
judge, lowering and the conformance runner read schemas through it."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from .keywords import SUBSCHEMA_LISTS, SUBSCHEMA_MAPS, SUBSCHEMA_SINGLE, VOCABULARY
from .pointers import json_pointer, normal_pointer, resolve_pointer

Step = tuple[str | int, ...]
"""Where a subschema sits below its parent: (keyword,) or (keyword, name or index), or
the keys down to a `$ref` target no keyword names (("group", "full"))."""

_NAMED = VOCABULARY | set(SUBSCHEMA_MAPS)
"""The keys whose values a keyword reads (as subschemas, or as values)."""


def child_schemas(node: dict[str, Any]) -> Iterator[tuple[Step, Any]]:
    """The subschemas directly inside one schema object, each with its step from `node`."""
    for key in SUBSCHEMA_MAPS:
        children = node.get(key)
        if isinstance(children, dict):
            for name, child in children.items():
                yield (key, name), child
    for key in (*SUBSCHEMA_LISTS, "items"):
        children = node.get(key)
        if isinstance(children, list):
            for index, child in enumerate(children):
                yield (key, index), child
    for key in SUBSCHEMA_SINGLE:
        child = node.get(key)
        if isinstance(child, dict):
            yield (key,), child


def iter_subschemas(schema: Any, pointer: str = "") -> Iterator[tuple[dict[str, Any], str]]:
    """Every schema object inside `schema`, with its JSON pointer (boolean schemas skipped)."""
    if not isinstance(schema, dict):
        return
    yield schema, pointer
    for step, child in child_schemas(schema):
        yield from iter_subschemas(child, pointer + json_pointer(step))


def iter_reachable_subschemas(
    schema: Any, starts: Iterable[str] = ("",)
) -> Iterator[tuple[dict[str, Any], str]]:
    """Every schema object of `iter_subschemas` from each of `starts` (JSON pointers; the
    root by default), then every one a local `$ref` ("#/...") leads to that the walk does
    not reach (a target under a key no keyword names, as in `#/definitions/group/full`),
    each once: what a grammar serves is all of these."""
    seen: set[str] = set()
    pending = list(starts)[::-1]
    while pending:
        start = pending.pop()
        if start in seen:  # the common case: a target the walk has been through
            continue
        for node, pointer in iter_subschemas(resolve_pointer(schema, start), start):
            if pointer in seen:
                continue
            seen.add(pointer)
            yield node, pointer
            target = node.get("$ref")
            if isinstance(target, str) and target.startswith("#/"):
                pending.append(target[1:])


def unreached_targets(schema: Any) -> frozenset[str]:
    """The JSON pointers (in `json_pointer`'s spelling) of the local `$ref` targets that
    `iter_subschemas` does not reach: where `iter_reachable_subschemas` goes beyond it."""
    walked = {pointer for _, pointer in iter_subschemas(schema)}
    found: set[str] = set()
    for node, _ in iter_reachable_subschemas(schema):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/"):
            target = normal_pointer(ref[1:])
            if target not in walked and isinstance(resolve_pointer(schema, target), dict):
                found.add(target)
    return frozenset(found)


def map_subschemas(
    node: dict[str, Any],
    transform: Callable[[Any, Step], Any],
    *,
    at: str = "",
    targets: frozenset[str] = frozenset(),
) -> dict[str, Any]:
    """`node` (changed in place) with every direct subschema replaced by `transform(child,
    step)`, the maps and lists that hold them new: the user's own stay as they were. With
    `targets` (`unreached_targets` of the document, `node` at pointer `at`), each of them
    under a key of `node` no keyword names is a subschema too, its step the keys down to it."""
    for key in SUBSCHEMA_MAPS:
        children = node.get(key)
        if isinstance(children, dict):
            node[key] = {name: transform(child, (key, name)) for name, child in children.items()}
    for key in (*SUBSCHEMA_LISTS, "items"):
        children = node.get(key)
        if isinstance(children, list):
            node[key] = [transform(child, (key, index)) for index, child in enumerate(children)]
    for key in SUBSCHEMA_SINGLE:
        if isinstance(node.get(key), dict):
            node[key] = transform(node[key], (key,))
    if targets:
        for key in [key for key in node if key not in _NAMED]:
            node[key] = _map_targets(node[key], (key,), at, targets, transform)
    return node


def _map_targets(
    value: Any, path: Step, at: str, targets: frozenset[str], transform: Callable[[Any, Step], Any]
) -> Any:
    """`value` (at `at` + `path`, under keys no keyword names) with each target inside it
    transformed, the containers down to one new."""
    here = at + json_pointer(path)
    if here in targets:
        return transform(value, path)
    if not any(target.startswith(here + "/") for target in targets):
        return value
    if isinstance(value, dict):
        return {k: _map_targets(v, (*path, k), at, targets, transform) for k, v in value.items()}
    if isinstance(value, list):
        return [_map_targets(v, (*path, i), at, targets, transform) for i, v in enumerate(value)]
    return value
