"""The enforcement tables measured per position: each keyword at each place a schema can
hold it (top level, a property, additionalProperties, items, a combinator's branch, beside
a combinator, through a `$ref`, through a recursive `$ref`), on each backend as installed.

A cell compiles the keyword's schema wrapped at that position and feeds one valid and one
invalid instance byte by byte. What the backend declares about it decides what is owed:
nothing declared means the invalid instance must be refused (else the cell is `UNSOUND`,
a hole in the tables); a declaration or a refusal to compile is sound. Run
`python scripts/enforcement_matrix.py` to write docs/enforcement-matrix.md; the test suite
asserts that no cell is unsound.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ..compiler import GrammarCompiler
from ..errors import GrammarError
from ..grammars import Grammar
from .conformance import byte_token_ids, feed, serialize, validates


@dataclass(frozen=True)
class KeywordCase:
    """A schema whose `invalid` instance breaks only `keyword` (and `valid` satisfies it)."""

    keyword: str
    schema: dict[str, Any]
    valid: Any
    invalid: Any


KEYWORDS: tuple[KeywordCase, ...] = (
    KeywordCase("type", {"type": "integer"}, 5, "a"),
    KeywordCase("enum", {"enum": ["x", 1]}, "x", "y"),
    KeywordCase("const", {"const": "x"}, "x", "y"),
    KeywordCase("minimum", {"type": "integer", "minimum": 3}, 5, 2),
    KeywordCase("exclusiveMaximum", {"type": "number", "exclusiveMaximum": 3}, 2.5, 3),
    KeywordCase("multipleOf", {"type": "integer", "multipleOf": 3}, 6, 5),
    KeywordCase("minLength", {"type": "string", "minLength": 3}, "abc", "ab"),
    KeywordCase("maxLength", {"type": "string", "maxLength": 3}, "abc", "abcd"),
    KeywordCase("pattern", {"type": "string", "pattern": "^a+$"}, "aa", "ab"),
    KeywordCase("format", {"type": "string", "format": "date"}, "2024-02-29", "2023-02-29"),
    KeywordCase("minItems", {"type": "array", "items": {"type": "integer"}, "minItems": 2},
                [1, 2], [1]),
    KeywordCase("maxItems", {"type": "array", "items": {"type": "integer"}, "maxItems": 2},
                [1, 2], [1, 2, 3]),
    KeywordCase("items", {"type": "array", "items": {"type": "integer"}}, [1], ["a"]),
    KeywordCase("required", {"type": "object", "properties": {"a": {"type": "integer"}},
                             "required": ["a"]}, {"a": 1}, {}),
    KeywordCase("properties", {"type": "object", "properties": {"a": {"type": "integer"}}},
                {"a": 1}, {"a": "s"}),
    KeywordCase("additionalProperties", {"type": "object", "properties": {"a": {}},
                                         "additionalProperties": False}, {"a": 1}, {"b": 1}),
    KeywordCase("minProperties", {"type": "object", "minProperties": 1}, {"a": 1}, {}),
    KeywordCase("maxProperties", {"type": "object", "maxProperties": 1}, {"a": 1},
                {"a": 1, "b": 2}),
)  # fmt: skip
"""One case per keyword family (`wrapped` checks that each position keeps its verdicts)."""


@dataclass(frozen=True)
class Position:
    """Where a keyword's schema sits, and where its instance sits in the whole instance."""

    name: str
    schema: Callable[[dict[str, Any]], dict[str, Any]]
    instance: Callable[[Any], Any]


def _beside(keyword: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """The schema with a combinator beside its keywords that every value satisfies (inside
    an allOf beside them where the schema has that combinator already)."""
    every = [{"minLength": 0}, {"type": "null"}]
    return lambda s: (
        {**s, keyword: every}
        if keyword not in s
        else {**s, "allOf": [*s.get("allOf", []), {keyword: every}]}
    )


POSITIONS: tuple[Position, ...] = (
    Position("top level", lambda s: s, lambda v: v),
    Position("properties", lambda s: {"type": "object", "properties": {"p": s},
                                      "required": ["p"]}, lambda v: {"p": v}),
    Position("additionalProperties", lambda s: {"type": "object", "additionalProperties": s},
             lambda v: {"k": v}),
    Position("items", lambda s: {"type": "array", "items": s}, lambda v: [v]),
    Position("anyOf branch", lambda s: {"anyOf": [s, {"type": "null"}]}, lambda v: v),
    Position("oneOf branch", lambda s: {"oneOf": [s, {"type": "null"}]}, lambda v: v),
    Position("allOf branch", lambda s: {"allOf": [s]}, lambda v: v),
    Position("beside anyOf", _beside("anyOf"), lambda v: v),
    Position("beside allOf", lambda s: {**s, "allOf": [*s.get("allOf", []), {"minLength": 0}]},
             lambda v: v),
    Position("through $ref", lambda s: {"$defs": {"d": s}, "type": "object",
                                        "properties": {"p": {"$ref": "#/$defs/d"}},
                                        "required": ["p"]}, lambda v: {"p": v}),
    Position("recursive $ref", lambda s: {"$defs": {"n": {"anyOf": [s, {
        "type": "array", "items": {"$ref": "#/$defs/n"}, "minItems": 1}]}},
        "$ref": "#/$defs/n"}, lambda v: [[v]]),
    Position("$ref as allOf branch", lambda s: {"$defs": {"b": s},
                                                "allOf": [{"$ref": "#/$defs/b"}]}, lambda v: v),
    Position("allOf beside a $ref", lambda s: {"$defs": {"any": {}},
                                               "allOf": [s, {"$ref": "#/$defs/any"}]},
             lambda v: v),
    Position("oneOf of one", lambda s: {"oneOf": [s]}, lambda v: v),
)  # fmt: skip
"""Each place a keyword's schema can sit, one level deep; `composed` nests them in pairs."""


def composed(outer: Position, inner: Position) -> Position:
    """`inner` inside `outer`: the keyword two levels deep. The inner position's `$defs`
    move to the root (renamed, with its references), so that JSON pointers still land."""

    def schema(s: dict[str, Any]) -> dict[str, Any]:
        nested = inner.schema(s)
        defs = nested.pop("$defs", {}) if "$defs" in nested else {}
        renamed = {f"{name}_in": _renamed_refs(body, defs) for name, body in defs.items()}
        whole = outer.schema(_renamed_refs(nested, defs))
        if renamed:
            whole = {**whole, "$defs": {**whole.get("$defs", {}), **renamed}}
        return whole

    return Position(
        f"{outer.name} > {inner.name}", schema, lambda v: outer.instance(inner.instance(v))
    )


def _renamed_refs(node: Any, defs: dict[str, Any]) -> Any:
    """`node` with each reference into `defs` pointed at its renamed (`_in`) definition."""
    if isinstance(node, dict):
        out = {k: _renamed_refs(v, defs) for k, v in node.items()}
        ref = out.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/$defs/") and ref[8:] in defs:
            out["$ref"] = f"{ref}_in"
        return out
    if isinstance(node, list):
        return [_renamed_refs(item, defs) for item in node]
    return node


PAIRS: tuple[Position, ...] = tuple(
    composed(outer, inner) for outer in POSITIONS[1:] for inner in POSITIONS[1:]
)
"""Every position inside every other (the top level aside): combinators in combinators,
`$ref` as a branch, combinators under properties, items and additionalProperties, and
recursion around each."""

ENFORCED, DECLARED, REFUSED, UNSOUND = "enforced", "declared", "refused", "UNSOUND"


@dataclass(frozen=True)
class Cell:
    """One keyword at one position on one backend."""

    keyword: str
    position: str
    backend: str
    verdict: str
    """ENFORCED (nothing declared, the invalid instance refused), DECLARED (the backend
    names what it leaves out), REFUSED (it does not compile the schema) or UNSOUND (nothing
    declared, the invalid instance accepted)."""
    valid_accepted: bool | None = None
    detail: str = ""


def wrapped(case: KeywordCase, position: Position) -> tuple[dict[str, Any], Any, Any]:
    """The schema and its valid and invalid instances at `position`, checked with
    jsonschema (a wrapping that changes a verdict is a bug of this table)."""
    schema = position.schema(case.schema)
    valid, invalid = position.instance(case.valid), position.instance(case.invalid)
    if not validates(schema, valid) or validates(schema, invalid):
        raise AssertionError(f"{case.keyword} at {position.name}: the instances do not fit")
    return schema, valid, invalid


def measure(compiler: GrammarCompiler, backend: str, case: KeywordCase, position: Position) -> Cell:
    """The cell of `case` at `position` on `backend`."""
    schema, valid, invalid = wrapped(case, position)
    name = (case.keyword, position.name, backend)
    try:
        compiled = compiler.compile(Grammar.json_schema(schema), backend)
    except GrammarError as exc:
        return Cell(*name, REFUSED, detail=str(exc).splitlines()[0][:160])
    table = byte_token_ids(compiler.vocab)
    matcher = compiled.matcher()

    def accepted(value: Any) -> bool:
        text = serialize(schema, value, "compact")[0]
        return feed(matcher, [table[b] for b in text.encode()])[0]

    valid_accepted = accepted(valid)
    if compiled.unenforced:
        detail = "; ".join(sorted({str(u) for u in compiled.unenforced}))[:160]
        return Cell(*name, DECLARED, valid_accepted, detail)
    verdict = UNSOUND if accepted(invalid) else ENFORCED
    return Cell(*name, verdict, valid_accepted)


def matrix(
    compiler: GrammarCompiler,
    backends: Sequence[str],
    keywords: Iterable[KeywordCase] = KEYWORDS,
    positions: Iterable[Position] = POSITIONS,
) -> list[Cell]:
    """Every cell of `keywords` x `positions` x `backends`."""
    positions = list(positions)
    return [
        measure(compiler, backend, case, position)
        for case in keywords
        for position in positions
        for backend in backends
    ]


_PACKAGES = {"xgrammar": "xgrammar", "llguidance": "llguidance", "outlines": "outlines-core"}
_MARKS = {ENFORCED: "✓", DECLARED: "d", REFUSED: "r", UNSOUND: "**UNSOUND**"}


def backend_version(backend: str) -> str:
    """The installed version of a backend's package."""
    return importlib.metadata.version(_PACKAGES[backend])


def render(cells: Sequence[Cell]) -> str:
    """Markdown: one table per backend (keywords down, positions across), its version in
    the heading; `✓` enforced, `d` declared, `r` refused, `*` the valid instance refused."""
    lines: list[str] = []
    positions = list(dict.fromkeys(c.position for c in cells))
    for backend in dict.fromkeys(c.backend for c in cells):
        lines += [f"### {backend} {backend_version(backend)}", ""]
        lines.append("| keyword | " + " | ".join(positions) + " |")
        lines.append("|---" * (len(positions) + 1) + "|")
        by_keyword: dict[str, dict[str, Cell]] = {}
        for cell in cells:
            if cell.backend == backend:
                by_keyword.setdefault(cell.keyword, {})[cell.position] = cell
        for keyword, row in by_keyword.items():
            marks = [
                _MARKS[row[p].verdict] + ("*" if row[p].valid_accepted is False else "")
                for p in positions
            ]
            lines.append(f"| {keyword} | " + " | ".join(marks) + " |")
        lines.append("")
    return "\n".join(lines)


def rotated(positions: Sequence[Position]) -> list[tuple[KeywordCase, Position]]:
    """One keyword case per position, the cases taken in turn: every position measured,
    every case at many of them, in a fraction of the whole matrix's time."""
    return [(KEYWORDS[i % len(KEYWORDS)], p) for i, p in enumerate(positions)]


def render_pairs(cells: Sequence[Cell]) -> str:
    """Markdown: one table per backend, outer positions down and inner across, each cell
    the verdict over every keyword there (UNSOUND if any keyword is, else `d` if any is
    declared, `r` if any is refused, else `✓`; `*` where a valid instance was refused)."""
    lines: list[str] = []
    for backend in dict.fromkeys(c.backend for c in cells):
        mine = [c for c in cells if c.backend == backend]
        outers = list(dict.fromkeys(_pair_names(c)[0] for c in mine))
        inners = list(dict.fromkeys(_pair_names(c)[1] for c in mine))
        grouped: dict[tuple[str, str], list[Cell]] = {}
        for cell in mine:
            grouped.setdefault(_pair_names(cell), []).append(cell)
        lines += [f"### {backend} {backend_version(backend)}, two levels deep", ""]
        lines.append("| outer \\ inner | " + " | ".join(inners) + " |")
        lines.append("|---" * (len(inners) + 1) + "|")
        for outer in outers:
            marks = [_worst(grouped.get((outer, inner), [])) for inner in inners]
            lines.append(f"| {outer} | " + " | ".join(marks) + " |")
        lines.append("")
    return "\n".join(lines)


def _pair_names(cell: Cell) -> tuple[str, str]:
    """(outer, inner) of a cell measured at a position from `composed`."""
    outer, _, inner = cell.position.partition(" > ")
    return outer, inner


def _worst(cells: Sequence[Cell]) -> str:
    if not cells:
        return ""
    verdicts = {c.verdict for c in cells}
    worst = next(v for v in (UNSOUND, DECLARED, REFUSED, ENFORCED) if v in verdicts)
    return _MARKS[worst] + ("*" if any(c.valid_accepted is False for c in cells) else "")
