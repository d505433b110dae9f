"""The judge: what a backend enforces of a JSON Schema, decided before the schema is served.

Backends compile many keywords they then ignore. Each backend declares, in its own module,
the keywords and formats it really enforces (a `KeywordSupport`); every other constraint
found in a schema is reported as `Unenforced`, with its JSON pointer. The report is an
allowlist check: a keyword of the vocabulary that a backend does not list is reported,
never trusted. Keywords outside the vocabulary (`x-...`, `_format`, typos) and formats
outside FORMATS constrain nothing (validators ignore them) and are skipped.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from .formats import FORMATS
from .keywords import VOCABULARY
from .verdicts import verdicts
from .walk import iter_reachable_subschemas


@dataclass(frozen=True)
class Unenforced:
    """One constraint of a schema that the serving backend lets through unchecked."""

    pointer: str
    keyword: str
    reason: str = "not enforced by this backend"

    def __str__(self) -> str:
        return f"{self.keyword} at {self.pointer or '/'}: {self.reason}"


SchemaRule = Callable[[dict[str, Any], str], Iterable[Unenforced]]
"""A context check: given one schema object and its pointer, what it leaves unenforced."""


@dataclass(frozen=True)
class KeywordSupport:
    """A backend's JSON Schema coverage, as tests/test_enforcement.py measures it on the
    engine versions in `measured_on`."""

    enforced: frozenset[str]
    measured_on: tuple[str, ...]
    """The engine versions the table was measured on; another version is served with it
    and a warning (docs/backends.md)."""
    formats: frozenset[str] = frozenset()
    rules: tuple[SchemaRule, ...] = field(default=())
    format_notes: tuple[tuple[str, str], ...] = ()
    """Why a format outside `formats` is not enforced, where it is only approximated."""


def find_unenforced(schema: Any, support: KeywordSupport) -> tuple[Unenforced, ...]:
    """Constraints of `schema` that a backend with `support` would not enforce."""
    found: list[Unenforced] = []
    for node, pointer in iter_reachable_subschemas(schema):
        for keyword, value in node.items():
            if keyword not in VOCABULARY:
                continue
            if keyword == "format":
                if value in FORMATS and value not in support.formats:
                    note = dict(support.format_notes).get(value, "is not checked")
                    found.append(Unenforced(pointer, "format", f"format {value!r} {note}"))
            elif keyword not in support.enforced:
                found.append(Unenforced(pointer, keyword))
        for rule in support.rules:
            found.extend(rule(node, pointer))
    return tuple(dict.fromkeys(found))


COMMON_KEYWORDS = frozenset(
    {
        "type", "enum", "const", "minLength", "maxLength", "pattern", "items", "prefixItems",
        "minItems", "maxItems", "properties", "required", "additionalProperties", "anyOf",
        "$ref",
    }
)  # fmt: skip
"""What every backend grammarmask knows enforces, in every position."""
COMMON_FORMATS = frozenset({"email", "uuid", "uri"})
"""The formats every backend grammarmask knows enforces."""


# ------------------------------------------------------------- rules more than one backend needs
def required_outside_properties(node: dict[str, Any], pointer: str) -> Iterable[Unenforced]:
    """Backends build objects from `properties`; a required name not listed there is dropped."""
    listed = node.get("properties", {})
    for name in node.get("required", []) if isinstance(node.get("required"), list) else []:
        if not isinstance(listed, dict) or name not in listed:
            yield Unenforced(
                pointer, "required", f"required property {name!r} is not in properties"
            )


def beside_ref(node: dict[str, Any], pointer: str) -> Iterable[Unenforced]:
    """For backends that serve a schema object with `$ref` as its target alone: `type`,
    bounds, lengths beside it go unchecked. Lowering has already dropped what drafts before
    2019-09 ignore there, so what is left constrains."""
    if isinstance(node.get("$ref"), str):
        for keyword in node:
            if keyword in VOCABULARY and keyword != "$ref":
                yield Unenforced(pointer, keyword, "ignored beside $ref")


def beside_any_of(node: dict[str, Any], pointer: str) -> Iterable[Unenforced]:
    """For backends that serve a schema object with `anyOf`, `oneOf` or `allOf` as its
    branches alone: the keywords beside them go unchecked at any position."""
    combinators = [k for k in ("anyOf", "oneOf", "allOf") if isinstance(node.get(k), list)]
    if combinators:
        for keyword in node:
            if keyword in VOCABULARY and keyword not in combinators:
                yield Unenforced(pointer, keyword, f"ignored beside {'/'.join(combinators)}")


def beside_enum(node: dict[str, Any], pointer: str) -> Iterable[Unenforced]:
    """For backends that serve `enum` or `const` as its list of values alone: a keyword
    beside it that some listed value breaks goes unchecked (`"b"` passes `{"enum": ["a",
    "b"], "pattern": "^a$"}`); one that every listed value satisfies changes nothing."""
    if "enum" not in node and "const" not in node:
        return
    values = list(node["enum"]) if isinstance(node.get("enum"), list) else []
    if "const" in node:
        values.append(node["const"])
    for keyword, value in node.items():
        if keyword == "enum" and "const" not in node:
            continue  # every listed value is in the list
        if keyword in VOCABULARY and not _all_satisfy(values, keyword, value):
            yield Unenforced(pointer, keyword, "ignored beside enum/const")


def _all_satisfy(instances: list[Any], keyword: str, value: Any) -> bool:
    """Whether every instance satisfies the one keyword `keyword: value`; False where that
    cannot be judged alone (a `$ref`, a malformed value)."""
    found = verdicts({keyword: value}, instances)
    return found is not None and all(found)
