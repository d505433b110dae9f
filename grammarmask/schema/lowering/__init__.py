"""Schema lowering: a JSON Schema rewritten into one that accepts exactly the same
instances and that the backends enforce fully, before any backend sees it.

Every rewrite is exact or it is not applied; what stays approximate is left to the
backends' support tables, which declare it. `Grammar` keeps the user's schema;
`Grammar.lower()` is what the compiler hands the backends and `grammarmask check` shows.
Rewrites: the draft-4/6/7 keywords in 2020-12 form, integer-valued decimals in count
keywords as integers, a `multipleOf` of several fraction digits as one step per digit
count, formats the schema's draft does not define dropped, `date`, `time`,
`date-time` and `uri-reference` as exact patterns, patterns that start with lookaheads
without them, dependencies and `dependentRequired` /
`dependentSchemas` as `anyOf`, `if`/`then`/`else` as `anyOf` (or as `then` where `else` is
the same), a `oneOf` as `anyOf` (of its branches where no two overlap,
else of each branch without the others), the `not`s that have a positive form, a schema
that lists its values (`enum`, `const`, also in an `allOf` branch) as the listed values it
accepts, and references to plain-name anchors as JSON pointers. `$ref` targets under keys
no keyword names (`#/definitions/group/full`) are lowered where they sit. A
draft-4 schema's lowered form reads "integer" as draft 4 does (`strict_integers`).
"""

from __future__ import annotations

import functools
import json
import math
import re
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from ...errors import UnreadablePatternError
from .. import formats
from ..keywords import COUNT_KEYWORDS, VOCABULARY
from ..pointers import json_pointer, pointer_refs_resolve
from ..walk import iter_subschemas, map_subschemas, unreached_targets
from . import anchors, combinators, dialects, disjoint, listed, recursion, regular, strings
from .reading import Reading


@dataclass(frozen=True)
class Rewrite:
    """One change lowering made, at a JSON pointer of the user's schema."""

    pointer: str
    rule: str
    detail: str

    def __str__(self) -> str:
        return f"{self.rule} at {self.pointer or '/'}: {self.detail}"


@dataclass(frozen=True)
class LoweredSchema:
    """The schema the backends compile, and what lowering changed to get it."""

    schema: Any
    rewrites: tuple[Rewrite, ...] = ()
    strict_integers: bool = False
    """"integer" means a number written without a fraction (1.0 is none), as in the user's
    draft-4 schema: a validator of `schema` must read it so (the backends do)."""

    @functools.cached_property
    def source(self) -> str:
        """The lowered schema as JSON text."""
        return json.dumps(self.schema)


@dataclass
class _Context:
    root: Any
    draft: str | None
    """The user's draft, when its keywords may be rewritten (None: they stay)."""
    in_place: bool = False
    """Only rewrites that move no subschema (a `$ref` may point into any)."""
    format_draft: str | None = None
    """The draft whose formats apply in place (the user's)."""
    rewrites: list[Rewrite] = field(default_factory=list)

    @functools.cached_property
    def unreached(self) -> frozenset[str]:
        """The `$ref` targets under keys no keyword names: lowered as the walk reaches them."""
        return unreached_targets(self.root)

    @functools.cached_property
    def unevaluated(self) -> bool:
        """Whether the schema uses `unevaluated...`, which reads what its neighbours evaluate."""
        return '"unevaluated' in json.dumps(self.root)

    def note(self, pointer: str, rule: str, detail: str) -> None:
        self.rewrites.append(Rewrite(pointer, rule, detail))


def lower_schema(schema: Any) -> LoweredSchema:
    """`schema` lowered (a new object: `schema` is not changed). Where a rewrite would move
    or drop a subschema that a `$ref` points to, only the rewrites that move nothing run
    (integer counts, formats)."""
    draft = dialects.draft_of(schema)
    in_place = _Context(schema, None, in_place=True, format_draft=draft)
    context = _Context(schema, draft)
    if draft in dialects.OLD_DRAFTS and not dialects.convertible(schema):
        context = in_place  # left in its own draft
    lowered = _lower(schema, "", context, root=True)
    if not context.in_place and not pointer_refs_resolve(lowered):
        context = in_place
        lowered = _lower(schema, "", context, root=True)
    lowered = _anchor_references(lowered, context)
    if not context.in_place:
        lowered = _recursive_references(lowered, context)
    if not context.in_place and not context.unevaluated:
        lowered = _number_spellings(lowered, "", context)
    strict = dialects.strict_integers(draft)
    if strict and not context.in_place and '"integer"' in json.dumps(schema):
        context.note("", "draft", '"integer" keeps its draft-4 meaning (1.0 is none)')
    return LoweredSchema(lowered, tuple(context.rewrites), strict)


def _lower(node: Any, pointer: str, context: _Context, *, root: bool = False) -> Any:
    if not isinstance(node, dict):
        return node
    draft = context.draft
    if context.in_place:
        out = _children(dict(node), pointer, context)
        _integer_counts(out, pointer, context)
        _formats(out, pointer, context, context.format_draft)
        _readable_pattern(out, pointer, context)
        return out
    out = dict(node)
    if draft is not None:
        _unknown_keywords(out, pointer, context, draft)
    if draft in dialects.OLD_DRAFTS:
        out, changed = dialects.to_2020_12(out, draft, root=root)
        for detail in changed:
            context.note(pointer, "draft", detail)
    out = _children(out, pointer, context)  # first: the rules below read lowered children
    _integer_counts(out, pointer, context)
    _decimal_step(out, pointer, context)
    _formats(out, pointer, context, draft)
    _readable_pattern(out, pointer, context)
    if draft is not None:  # known semantics: the combinators can be read
        only_listed = _listed(out, pointer, context)
        if only_listed is not out:
            return only_listed
        _dependencies(out, pointer, context)
        _listed_beside_pattern(out, pointer, context)
        if not _property_names(out, pointer, context) and not _aligned_pattern_properties(
            node, out, pointer, context
        ):
            _pattern_properties(out, pointer, context)
        _not(out, pointer, context, node)
        _if_then_else(out, pointer, context)
        _one_of(out, pointer, context)
        _min_properties(out, pointer, context)
        one_pattern = strings.as_one_pattern(out, Reading(context.root, draft))
        if one_pattern is not None:
            written, for_backend = one_pattern
            detail = "a string of patterns, lengths and nots -> one pattern"
            if for_backend:
                detail += ", written for a backend's `$` (jsonschema's takes a final newline)"
            context.note(pointer, "pattern", detail)
            return written
    return out


def _listed(node: Any, pointer: str, context: _Context) -> Any:
    """`node` as the values it lists that it accepts, where it lists values; else `node`
    (and below the root of a schema with `unevaluated...`, whose verdicts depend on the
    properties and items a neighbour evaluates)."""
    if not isinstance(node, dict) or (pointer and context.unevaluated):
        return node
    document = None if pointer else context.root
    only_listed = listed.as_listed_values(node, context.draft, document)
    if only_listed is None:
        return node
    context.note(pointer, "enum", "a schema that lists its values -> the ones it accepts")
    return only_listed


def _number_spellings(node: Any, pointer: str, context: _Context) -> Any:
    """Last, so that the proofs above read the values as listed: every listed integral
    number written as a decimal as a schema that takes its spellings."""
    if not isinstance(node, dict):
        return node
    node = map_subschemas(
        dict(node),
        lambda child, step: _number_spellings(child, pointer + json_pointer(step), context),
        at=pointer,
        targets=context.unreached,
    )
    spelled = listed.with_number_spellings(node, Reading(context.root, context.draft).const)
    if spelled is None:
        return node
    context.note(pointer, "enum", "a listed integral decimal (2.0) -> its spellings (2, 2.0)")
    return spelled


def _anchor_references(lowered: Any, context: _Context) -> Any:
    pointers = anchors.anchor_pointers(lowered)
    if not pointers:
        return lowered
    rewritten: list[tuple[str, str]] = []
    lowered = anchors.as_pointers(lowered, pointers, rewritten)
    for pointer, detail in rewritten:
        context.note(pointer, "$ref", f"anchor {detail}")
    return lowered


def _recursive_references(lowered: Any, context: _Context) -> Any:
    lowered, written = recursion.write_out_recursive_references(lowered)
    for pointer in written:
        context.note(
            pointer,
            "$ref",
            "a recursive reference beside other keywords -> a definition of its own",
        )
    return lowered


def _children(node: dict[str, Any], pointer: str, context: _Context) -> dict[str, Any]:
    return map_subschemas(
        node,
        lambda child, step: _lower(child, pointer + json_pointer(step), context),
        at=pointer,
        targets=context.unreached,
    )


def _add_all_of(node: dict[str, Any], schema: Any) -> None:
    node["allOf"] = [*node.get("allOf", []), schema]


def _unknown_keywords(node: dict[str, Any], pointer: str, context: _Context, draft: str) -> None:
    """Keywords of other drafts than the schema's: its validator ignores them."""
    unknown = [k for k in node if k in VOCABULARY and k not in dialects.known_keywords(draft)]
    for keyword in unknown:
        del node[keyword]
    if unknown:
        context.note(pointer, "draft", f"dropped {', '.join(unknown)} ({draft} does not know them)")


_STEP_PLACES = 6
"""The most fraction digits of a `multipleOf` written as one step per count of them."""


def _integer_counts(node: dict[str, Any], pointer: str, context: _Context) -> None:
    for keyword in COUNT_KEYWORDS:
        value = node.get(keyword)
        if isinstance(value, float) and value.is_integer() and value >= 0:
            node[keyword] = int(value)
            context.note(pointer, "count", f"{keyword}: {value!r} -> {int(value)}")


def _decimal_step(node: dict[str, Any], pointer: str, context: _Context) -> None:
    """A `multipleOf` with two or more fraction digits (up to `_STEP_PLACES`) as an `anyOf`
    of one step per count of fraction digits from one up to the step's own: a number
    written with `d` of them is a multiple of the step exactly when it is a multiple of the
    coarsest step with `d` digits, so the `anyOf` holds the same numbers. llguidance writes
    a step's multiples with no fraction or with exactly the step's count of fraction digits
    (0.25 takes `0.50`, not `0.5`); each step brings its own count."""
    step, kinds = node.get("multipleOf"), node.get("type", "number")
    if not isinstance(step, float) or not step > 0 or set(node) == {"multipleOf"}:
        return  # a `multipleOf` alone: this rewrite's own branch, so that lowering ends
    if "number" not in ([kinds] if isinstance(kinds, str) else kinds):
        return  # integers only: no fraction digits to write
    _, digits, exponent = Decimal(repr(step)).normalize().as_tuple()
    if not isinstance(exponent, int) or not -_STEP_PLACES <= exponent < -1:
        return  # one fraction digit or none: llguidance takes both already
    places = -exponent
    coefficient = int("".join(map(str, digits)))
    steps = []
    for written in range(1, places):  # the coarsest step with `written` fraction digits
        coarsest = coefficient // math.gcd(coefficient, 10 ** (places - written))
        steps.append(float(Decimal(coarsest).scaleb(-written)))
    del node["multipleOf"]
    _add_all_of(node, {"anyOf": [{"multipleOf": s} for s in (*steps, step)]})
    context.note(pointer, "multipleOf", f"{step!r} -> one step per count of fraction digits")


def _formats(node: dict[str, Any], pointer: str, context: _Context, draft: str | None) -> None:
    name = node.get("format")
    if draft is None or not isinstance(name, str):
        return
    if name not in formats.DEFINED_FORMATS[draft]:
        del node["format"]
        context.note(pointer, "format", f"dropped format {name!r}: the draft does not define it")
        return
    pattern = formats.PATTERNS.get(name)
    if pattern is None:
        return
    del node["format"]
    if "pattern" in node:  # both hold: the user's pattern beside the format's
        _add_all_of(node, {"pattern": pattern})
    else:
        node["pattern"] = pattern
    length = formats.EXACT_LENGTH.get(name)
    if length is not None:
        node["maxLength"] = min(length, node.get("maxLength", length))
    context.note(pointer, "format", f"format {name!r} -> its exact pattern")


def _readable_pattern(node: dict[str, Any], pointer: str, context: _Context) -> None:
    """A `pattern` that starts with lookaheads, or holds anchors inside or `\\A`, `\\Z`, `\\b`
    (which backends read unlike Python, or not at all), as the pattern of the same strings
    without them."""
    pattern = node.get("pattern")
    if not isinstance(pattern, str):
        return
    for rewrite, what in _UNREADABLE_PARTS:
        written = rewrite(pattern)
        if written is None:
            continue
        if written is True:
            del node["pattern"]
        else:
            node["pattern"] = regular.NO_STRING if written is False else written
        context.note(pointer, "pattern", f"{what} -> a pattern of the same strings")
        return


_UNREADABLE_PARTS = (
    (regular.without_lookaheads, "leading lookaheads"),
    (regular.without_inner_anchors, "anchors inside or escaped"),
)


def _dependencies(node: dict[str, Any], pointer: str, context: _Context) -> None:
    for keyword in ("dependentRequired", "dependentSchemas"):
        entries = node.get(keyword)
        if not isinstance(entries, dict):
            continue
        del node[keyword]
        required = node.get("required")
        always = set(required) if isinstance(required, list) else set()
        for name, then in entries.items():
            rewritten = combinators.dependency_branches(name, then, present=name in always)
            _add_all_of(node, rewritten)
            holds = rewritten if name in always else rewritten["anyOf"][1]
            _one_of(holds, pointer + json_pointer([keyword, name]), context)
        context.note(pointer, "dependencies", f"{keyword} -> anyOf per property")


def _property_names(node: dict[str, Any], pointer: str, context: _Context) -> bool:
    """`propertyNames` spelled by the names the object may have: its listed properties
    outside the allowed names are dropped, its patterns are cut to the allowed names
    (and split where they overlap), the allowed names nothing else covers take
    `additionalProperties`, and every other name is refused by `additionalProperties:
    false`. True where rewritten (the patterns are then written for a backend's `$`)."""
    names = node.get("propertyNames")
    listed = node.get("properties", {})
    patterns = node.get("patternProperties", {})
    additional = node.get("additionalProperties", True)
    if names is None or "unevaluatedProperties" in node:
        return False
    if not (isinstance(listed, dict) and isinstance(patterns, dict)):
        return False
    allowed = strings.names_language(names, Reading(context.root, context.draft))
    if allowed is None:
        return False
    try:
        split = regular.split_names(allowed, list(listed), list(patterns))
    except UnreadablePatternError:
        return False
    schemas = list(patterns.values())
    exact: dict[str, Any] = {}
    for written, members in split.regions:
        inside = [schemas[i] for i in members]
        exact["" if written is True else str(written)] = (
            inside[0] if len(inside) == 1 else {"allOf": inside}
        )
    if split.rest is not False and additional is not False:
        key = "" if split.rest is True else str(split.rest)
        if key in exact:
            return False
        exact[key] = additional
    if listed:  # a name outside the allowed ones falls to `additionalProperties: false`
        node["properties"] = {
            name: schema
            for (name, schema), ok in zip(listed.items(), split.allowed, strict=True)
            if ok
        }
    if exact:
        node["patternProperties"] = exact
    else:
        node.pop("patternProperties", None)
    node["additionalProperties"] = False
    del node["propertyNames"]
    context.note(
        pointer,
        "propertyNames",
        "the allowed names -> properties and patterns written for a backend's `$` "
        "(jsonschema's takes a final newline), no others",
    )
    return True


def _aligned_pattern_properties(
    original: dict[str, Any], node: dict[str, Any], pointer: str, context: _Context
) -> bool:
    """`patternProperties` of a node and of its `allOf` branches written over one set of
    disjoint patterns, each holder keeping exactly its own names (llguidance merges the
    branches' patterns and refuses two that overlap). True where rewritten. Each pattern
    is given the region keys it spans, so every holder still matches exactly the names
    jsonschema matches (each key written for a backend, as `regular.regions` writes it)."""
    holders: list[tuple[dict[str, Any], list[str], list[Any]]] = []
    own = node.get("patternProperties")
    if isinstance(own, dict) and own:
        holders.append((node, list(own), list(own.values())))
    lowered_branches, written_branches = node.get("allOf"), original.get("allOf")
    if not isinstance(lowered_branches, list) or not isinstance(written_branches, list):
        return False
    try:
        for lowered, written in zip(lowered_branches, written_branches, strict=False):
            entries = written.get("patternProperties") if isinstance(written, dict) else None
            kept = lowered.get("patternProperties") if isinstance(lowered, dict) else None
            if not isinstance(entries, dict) or not isinstance(kept, dict) or not entries:
                continue
            if len(kept) != len(entries) or (
                len(entries) > 1 and regular.regions(list(entries)) is not None
            ):
                return False  # the branch split its own patterns: its keys are not its names
            holders.append((lowered, list(entries), list(kept.values())))
        names = list(
            dict.fromkeys(name for _, written_names, _ in holders for name in written_names)
        )
        split = regular.regions(names) if len(holders) > 1 else None
    except UnreadablePatternError:
        return False
    if split is None:
        return False
    for holder, written_names, schemas in holders:
        by_name = dict(zip(written_names, schemas, strict=True))
        exact: dict[str, Any] = {}
        for region, members in split:
            inside = [by_name[names[i]] for i in members if names[i] in by_name]
            if inside:
                key = "" if region is True else str(region)
                exact[key] = inside[0] if len(inside) == 1 else {"allOf": inside}
        if holder is node:
            node["patternProperties"] = exact
        else:
            index = next(i for i, b in enumerate(lowered_branches) if b is holder)
            lowered_branches[index] = {**holder, "patternProperties": exact}
    context.note(pointer, "patternProperties", "patterns of allOf branches -> one disjoint set")
    return True


_PLACES = ('"$id"', '"id"', '"$anchor"', '"$dynamicAnchor"', '"$recursiveAnchor"')
"""Keys that give a subschema a name or base of its own, which dropping it would lose."""


def _listed_beside_pattern(node: dict[str, Any], pointer: str, context: _Context) -> None:
    """A listed property whose schema is that of a `patternProperties` entry matching its
    name, annotations aside, as `{}`: the value meets both, and both are the same (llguidance
    refuses the intersection of a recursive schema with itself)."""
    listed_schemas, entries = node.get("properties"), node.get("patternProperties")
    if not isinstance(listed_schemas, dict) or not isinstance(entries, dict):
        return
    try:
        patterns = [(re.compile(key), schema) for key, schema in entries.items()]
    except (re.error, TypeError):
        return
    rewritten = dict(listed_schemas)
    for name, schema in listed_schemas.items():
        if not isinstance(schema, dict) or not schema or not disjoint.PLAIN_NAME.fullmatch(name):
            continue
        if any(place in json.dumps(schema) for place in _PLACES):
            continue
        own = _constraints(schema)
        if any(p.search(name) and _constraints(other) == own for p, other in patterns):
            rewritten[name] = {}
            context.note(
                pointer + json_pointer(("properties", name)),
                "patternProperties",
                "a listed property with the schema of a pattern it matches -> {}",
            )
    node["properties"] = rewritten


def _constraints(schema: Any) -> Any:
    """A subschema's own keywords of the vocabulary (its annotations left out)."""
    if not isinstance(schema, dict):
        return schema
    return {key: value for key, value in schema.items() if key in VOCABULARY}


def _pattern_properties(node: dict[str, Any], pointer: str, context: _Context) -> None:
    """`patternProperties` as a backend reads them exactly: overlapping patterns as disjoint
    ones (a name matching several meets all their schemas; llguidance refuses overlaps),
    and a pattern ending in `$` with the final newline Python's `$` lets before it (a
    backend's `$` does not: such a name would fall to `additionalProperties`)."""
    entries = node.get("patternProperties")
    if not isinstance(entries, dict) or not entries:
        return
    names = list(entries)
    try:
        split = regular.regions(names) if len(names) > 1 else None
    except UnreadablePatternError:
        return
    if split is not None:
        exact: dict[str, Any] = {}
        for written, members in split:
            schemas = [entries[names[i]] for i in members]
            key = "" if written is True else str(written)
            exact[key] = schemas[0] if len(schemas) == 1 else {"allOf": schemas}
        detail = "overlapping patterns -> disjoint ones, each as a backend reads it"
    else:
        exact = {}
        for name, schema in entries.items():
            try:
                renamed = regular.name_pattern(name)
            except UnreadablePatternError:
                renamed = None
            exact[name if renamed is None or renamed in entries else renamed] = schema
        if list(exact) == names:
            return
        detail = "a name pattern as a backend reads it (Python's final newline, lookaheads)"
    node["patternProperties"] = exact
    context.note(pointer, "patternProperties", detail)


def _not(node: dict[str, Any], pointer: str, context: _Context, user: dict[str, Any]) -> None:
    """`not` as its positive form, read on the lowered `not`, else on the user's (`user`
    is the schema object as written: lowering rewrites some shapes, `propertyNames` among
    them, into ones whose `not` is harder to read)."""
    if "not" not in node:
        return
    positive = combinators.positive_not(node["not"], context.root, context.draft)
    if positive is None and _in_own_draft(user.get("not"), context.draft):
        positive = combinators.positive_not(user["not"], context.root, context.draft, lowered=False)
    if positive is None:
        return
    del node["not"]
    _add_all_of(node, positive)
    context.note(pointer, "not", "not -> its positive form")


def _in_own_draft(schema: Any, draft: str | None) -> bool:
    """Whether `schema` (the user's) is a 2019-09-or-later schema object every keyword of
    which its draft knows: a proof may read it as written."""
    if not isinstance(schema, dict) or draft is None or draft in dialects.OLD_DRAFTS:
        return False
    known = dialects.known_keywords(draft)
    return all(set(node) & VOCABULARY <= known for node, _ in iter_subschemas(schema))


def _if_then_else(node: dict[str, Any], pointer: str, context: _Context) -> None:
    """`if`/`then`/`else` as `anyOf: [{allOf: [if, then]}, {allOf: [not if, else]}]`, where
    `not if` has a positive form; as `then` alone where `else` is the same schema (the
    condition then decides nothing)."""
    if "if" not in node:
        return
    then, otherwise = node.get("then", True), node.get("else", True)
    same = then == otherwise or (combinators.everything(then) and combinators.everything(otherwise))
    if same and not context.unevaluated:  # `if` annotates what `unevaluated...` reads
        for keyword in ("if", "then", "else"):
            node.pop(keyword, None)
        if not combinators.everything(then):
            _add_all_of(node, then)
        context.note(pointer, "if", "if/then/else with the same schema either way -> that schema")
        return
    condition = node["if"]
    inverse = combinators.positive_not(condition, context.root, context.draft)
    if inverse is None:
        return
    then, otherwise = node.pop("then", True), node.pop("else", True)
    del node["if"]
    _add_all_of(node, {"anyOf": [{"allOf": [condition, then]}, {"allOf": [inverse, otherwise]}]})
    context.note(pointer, "if", "if/then/else -> anyOf of both cases")


def _min_properties(node: dict[str, Any], pointer: str, context: _Context) -> None:
    """`minProperties` beside listed properties not all required (which llguidance refuses):
    dropped where the required ones are enough, and a `minProperties` of 1 with none
    required as an `anyOf`: one listed property present, or none of them and some other."""
    least, properties = node.get("minProperties"), node.get("properties")
    if not (isinstance(least, int) and isinstance(properties, dict)):
        return
    listed = [name for name, subschema in properties.items() if subschema is not False]
    if not listed:  # none can be present: the other keys count, as llguidance compiles
        return
    if "maxProperties" in node or context.unevaluated:
        return
    required = {n for n in node.get("required", []) if isinstance(n, str)}
    if len(required) >= least:
        del node["minProperties"]
        context.note(pointer, "minProperties", f"{least} is met by the required properties")
    elif least == 1 and not required:
        del node["minProperties"]
        branches: list[Any] = [{"required": [name]} for name in listed]
        branches.append({"properties": dict.fromkeys(properties, False), "minProperties": 1})
        _add_all_of(node, {"anyOf": branches})
        context.note(pointer, "minProperties", "1 -> anyOf: a listed property, or another")


def _one_of(node: dict[str, Any], pointer: str, context: _Context) -> None:
    branches = node.get("oneOf")
    if not isinstance(branches, list) or not branches:
        return
    overlapping = disjoint.overlapping(branches, context.root, context.draft, node)
    if not overlapping:
        detail = "oneOf with disjoint branches -> anyOf"
    elif disjoint.object_branches_disjoint(branches, context.root, context.draft, node):
        _add_all_of(node, {"type": "object"})
        detail = "oneOf of object branches disjoint on objects -> anyOf, objects only"
    else:
        rewritten = combinators.exactly_one_required(branches)
        detail = "oneOf of required sets -> anyOf, each excluding the others"
        if rewritten is None:
            rewritten = combinators.exactly_one(branches, context.root, context.draft, overlapping)
            detail = "oneOf -> anyOf of each branch without the others"
        if rewritten is None:
            return
        branches = [_listed(b, f"{pointer}/oneOf/{i}", context) for i, b in enumerate(rewritten)]
    del node["oneOf"]
    if "anyOf" in node:
        _add_all_of(node, {"anyOf": branches})
    else:
        node["anyOf"] = branches
    context.note(pointer, "oneOf", detail)
