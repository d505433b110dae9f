"""Which JSON Schema draft a schema is written in, and its draft-4/6/7 keywords in their
2020-12 form.

jsonschema validates a schema under the draft its `$schema` names (2020-12 when it names
none); the backends read 2020-12. A draft-7-or-older schema is rewritten keyword by keyword
into the 2020-12 schema that accepts exactly the same instances, and declares 2020-12.
"""

from __future__ import annotations

import functools
from typing import Any

DRAFT_2020_12 = "https://json-schema.org/draft/2020-12/schema"


@functools.cache
def _drafts() -> dict[type[Any], str]:
    """jsonschema's validator classes by draft name (imported on first use: jsonschema
    with its format checkers takes seconds to import, and a vLLM process that never sees
    a schema should not pay for it)."""
    import jsonschema

    return {
        jsonschema.Draft4Validator: "draft4",
        jsonschema.Draft6Validator: "draft6",
        jsonschema.Draft7Validator: "draft7",
        jsonschema.Draft201909Validator: "draft2019-09",
        jsonschema.Draft202012Validator: "draft2020-12",
    }


OLD_DRAFTS = frozenset({"draft4", "draft6", "draft7"})

_KEPT_BESIDE_REF = frozenset({"definitions", "$defs"})
"""Up to draft 7 every keyword beside `$ref` is ignored; these stay as targets of refs."""


_COMPANIONS = {
    "if": ("then", "else"),
    "maximum": ("exclusiveMaximum",),  # draft 4: a flag read by maximum
    "minimum": ("exclusiveMinimum",),
}
"""Keywords that no validator function of their own reads, but the one they belong to."""


@functools.cache
def known_keywords(draft: str) -> frozenset[str]:
    """The keywords a validator of `draft` applies; it ignores every other."""
    cls = next(cls for cls, name in _drafts().items() if name == draft)
    known = set(cls.VALIDATORS)
    for keyword, companions in _COMPANIONS.items():
        if keyword in known:
            known.update(companions)
    if getattr(cls.VALIDATORS.get("contains"), "__name__", "") == "contains":
        known.update(("minContains", "maxContains"))  # read by contains from 2019-09 on
    return frozenset(known)


def draft_of(schema: Any) -> str | None:
    """The draft jsonschema validates `schema` under (None: draft 3, left as it is)."""
    if not isinstance(schema, dict):
        return "draft2020-12"
    import jsonschema

    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    return _drafts().get(cls)


def convertible(schema: Any) -> bool:
    """Whether the 2020-12 form can accept exactly the same: every `$ref` survives (none
    points into `items`, `additionalItems` or `dependencies`, whose subschemas move, and,
    where there are `$ref`s, no subschema sets a base URI of its own; without a `$ref` a
    base URI changes nothing). A draft-4 "integer" keeps its meaning only where integers
    are read strictly (see `strict_integers`)."""
    refs: list[str] = []
    identified = False
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(node)
            continue
        if not isinstance(node, dict):
            continue
        ref = node.get("$ref")
        if isinstance(ref, str):
            refs.append(ref)
        ident = node.get("id", node.get("$id"))
        if node is not schema and isinstance(ident, str) and not ident.startswith("#"):
            identified = True
        stack.extend(node.values())
    moved = ("items", "additionalItems", "dependencies")
    if any(part in moved for ref in refs for part in ref.split("/")):
        return False
    return not (refs and identified)


def strict_integers(draft: str | None) -> bool:
    """Whether "integer" means a number written without a fraction, as in draft 4, where 1.0
    is no integer (2020-12 cannot tell 1.0 from 1; every backend writes integers without a
    fraction, so the lowered schema reads as draft 4 there)."""
    return draft == "draft4"


def with_strict_integers(cls: type[Any]) -> type[Any]:
    """The jsonschema validator class `cls` with draft 4's "integer": a JSON number without
    a fraction part (Python's int), 1.0 excluded."""
    from jsonschema import validators  # on first use, as above

    def is_integer(_checker: Any, instance: Any) -> bool:
        return isinstance(instance, int) and not isinstance(instance, bool)

    checker = cls.TYPE_CHECKER.redefine("integer", is_integer)
    return validators.extend(cls, type_checker=checker)  # type: ignore[no-any-return]


def to_2020_12(node: dict[str, Any], draft: str, *, root: bool) -> tuple[dict[str, Any], list[str]]:
    """One schema object of a draft-4/6/7 schema in 2020-12 form (not its subschemas), and
    what changed."""
    changed: list[str] = []
    out = dict(node)
    if "$ref" in out:
        ignored = [k for k in out if k not in ("$ref", *_KEPT_BESIDE_REF)]
        if root:
            ignored = [k for k in ignored if k != "$schema"]
        for key in ignored:
            del out[key]
        if ignored:
            changed.append(f"dropped {', '.join(ignored)} beside $ref (ignored before 2019-09)")
    items = out.get("items")
    if isinstance(items, list):
        out["prefixItems"] = out.pop("items")
        if "additionalItems" in out:
            out["items"] = out.pop("additionalItems")
        changed.append("tuple items -> prefixItems (+ additionalItems -> items)")
    elif "additionalItems" in out:
        del out["additionalItems"]
        changed.append("dropped additionalItems (no tuple items)")
    if draft == "draft4":
        for exclusive, bound in (("exclusiveMaximum", "maximum"), ("exclusiveMinimum", "minimum")):
            flag = out.get(exclusive)
            if isinstance(flag, bool):
                del out[exclusive]
                if flag and bound in out:
                    out[exclusive] = out.pop(bound)
                changed.append(f"draft-4 boolean {exclusive} -> a number")
        ident = out.get("id")
        if isinstance(ident, str):
            del out["id"]
            if ident.startswith("#") and len(ident) > 1:
                out["$anchor"] = ident[1:]
            elif root:
                out["$id"] = ident
            changed.append("draft-4 id -> $id / $anchor")
    elif isinstance(out.get("$id"), str) and out["$id"].startswith("#") and len(out["$id"]) > 1:
        out["$anchor"] = out.pop("$id")[1:]
        changed.append("fragment $id -> $anchor")
    dependencies = out.pop("dependencies", None)
    if isinstance(dependencies, dict):
        for name, value in dependencies.items():
            target = "dependentRequired" if isinstance(value, list) else "dependentSchemas"
            out.setdefault(target, {})[name] = value
        changed.append("dependencies -> dependentRequired / dependentSchemas")
    elif dependencies is not None:
        out["dependencies"] = dependencies
    if root:
        out["$schema"] = DRAFT_2020_12
    return out, changed
