"""The enforcement tables are measured: a keyword a backend claims is really enforced.

Each case is a schema with one valid and one invalid instance. Where a backend declares the
schema fully enforced, the invalid instance must be rejected token by token with the real
SmolLM2 tokenizer; where it does not, the declaration names the keyword.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import logging
from typing import Any

import pytest
from conftest import accepts_all

import grammarmask as gm
from grammarmask.schema import lower_schema
from grammarmask.tools.conformance import byte_token_ids, feed, validates

X, OL, LL = "xgrammar", "outlines", "llguidance"
S = dict

CASES: list[tuple[str, dict[str, Any], Any, Any, set[str]]] = [
    ("type", S(type="integer"), 5, "a", {X, OL, LL}),
    ("minimum", S(type="integer", minimum=3), 5, 2, {X, LL}),
    ("maximum", S(type="integer", maximum=3), 2, 5, {X, LL}),
    ("exclusiveMinimum", S(type="integer", exclusiveMinimum=3), 4, 3, {X, LL}),
    ("exclusiveMaximum", S(type="number", exclusiveMaximum=3), 2.5, 3, {X, LL}),
    ("multipleOf", S(type="integer", multipleOf=3), 6, 5, {LL}),
    ("minLength", S(type="string", minLength=3), "abc", "ab", {X, OL, LL}),
    ("maxLength", S(type="string", maxLength=3), "abc", "abcd", {X, OL, LL}),
    ("pattern", S(type="string", pattern="^a+$"), "aa", "ab", {X, OL, LL}),
    (
        "maxLength-with-pattern",
        S(type="string", pattern="^a+$", maxLength=3),
        "aaa",
        "aaaaaa",
        {LL},
    ),
    (
        "maxLength-with-format",
        S(type="string", format="email", maxLength=9),
        "a@b.co",
        "abcdef@example.com",
        {OL, LL},
    ),
    ("enum", S(enum=["x", 1]), "x", "y", {X, OL, LL}),
    ("const", S(const="x"), "x", "y", {X, OL, LL}),
    ("minItems", S(type="array", items=S(type="integer"), minItems=2), [1, 2], [1], {X, OL, LL}),
    (
        "maxItems",
        S(type="array", items=S(type="integer"), maxItems=2),
        [1, 2],
        [1, 2, 3],
        {X, OL, LL},
    ),
    (
        "prefixItems",
        S(type="array", prefixItems=[S(type="integer"), S(type="string")]),
        [1, "a"],
        ["a", 1],
        {X, OL, LL},
    ),
    (
        "uniqueItems",
        S(type="array", items=S(type="integer"), uniqueItems=True),
        [1, 2],
        [1, 1],
        set(),
    ),
    (
        "contains",
        S(type="array", items=S(type="integer"), contains=S(const=2)),
        [1, 2],
        [1, 1],
        set(),
    ),
    (
        "required",
        S(type="object", properties=S(a=S(type="integer")), required=["a"]),
        {"a": 1},
        {},
        {X, OL, LL},
    ),
    (
        "required-not-in-properties",
        S(type="object", properties=S(a=S(type="integer")), required=["a", "b"]),
        {"a": 1, "b": 2},
        {"a": 1},
        {LL},
    ),
    (
        "additionalProperties",
        S(type="object", properties=S(a=S(type="integer")), additionalProperties=False),
        {"a": 1},
        {"a": 1, "b": 2},
        {X, OL, LL},
    ),
    (
        "minProperties",
        S(type="object", additionalProperties=S(type="integer"), minProperties=1),
        {"a": 1},
        {},
        {X, LL},
    ),
    (
        "maxProperties",
        S(type="object", additionalProperties=S(type="integer"), maxProperties=1),
        {"a": 1},
        {"a": 1, "b": 2},
        {X, LL},
    ),
    (
        "patternProperties",
        S(type="object", patternProperties={"^x": S(type="integer")}),
        {"x1": 1},
        {"x1": "s"},
        {LL},
    ),
    ("anyOf", S(anyOf=[S(type="integer"), S(type="string")]), 1, None, {X, OL, LL}),
    ("oneOf", S(oneOf=[S(type="integer"), S(type="number")]), 1.5, 1, {LL}),
    # lowered to anyOf (grammarmask proves the branches disjoint)
    ("oneOf-disjoint", S(oneOf=[S(type="integer"), S(type="string")]), 1, None, {X, OL, LL}),
    ("allOf", S(allOf=[S(type="integer"), S(minimum=3)]), 4, 1, {LL}),
    ("not", S(type="integer", **{"not": S(const=3)}), 4, 3, {LL}),  # lowered: anyOf of ranges
    # lowered: anyOf of both cases (`not if` is the other side of the minimum)
    ("if-then", S(type="integer", **{"if": S(minimum=5), "then": S(multipleOf=2)}), 6, 7, {LL}),
    (
        "dependentRequired",
        S(
            type="object",
            properties=S(a=S(type="integer"), b=S(type="integer")),
            dependentRequired=S(a=["b"]),
        ),
        {"a": 1, "b": 1},
        {"a": 1},
        {LL},  # lowered to allOf/anyOf branches
    ),
    (
        "$ref",
        S(
            type="object",
            properties=S(a={"$ref": "#/$defs/x"}),
            required=["a"],
            **{"$defs": S(x=S(type="integer"))},
        ),
        {"a": 1},
        {"a": "s"},
        {X, OL, LL},
    ),
    ("format-email", S(type="string", format="email"), "a@b.co", "nope", {X, OL, LL}),
    (
        "format-date-time",
        S(type="string", format="date-time"),
        "2024-01-01T00:00:00Z",
        "2024-02-31T00:00:00Z",
        {X, OL, LL},  # lowered to its exact pattern
    ),
    ("pattern-optional-group", S(type="string", pattern="^a(bc+)?Z$"), "abcZ", "acZ", {OL, LL}),
    # pattern and maxLength: outlines keeps only the length
    ("format-date", S(type="string", format="date"), "2024-02-29", "2023-02-29", {X, LL}),
    ("pattern-beside-maxLength", S(type="string", pattern="^a+$", maxLength=3), "aa", "bb", {LL}),
    ("format-time", S(type="string", format="time"), "10:00:00Z", "10:00:00", {X, OL, LL}),
    (
        "format-uuid",
        S(type="string", format="uuid"),
        "123e4567-e89b-12d3-a456-426614174000",
        "x",
        {X, OL, LL},
    ),
    ("format-ipv4", S(type="string", format="ipv4"), "1.2.3.4", "1.2.3", {X, LL}),
    ("format-ipv6", S(type="string", format="ipv6"), "::1", "1:2", {LL}),
    ("format-hostname", S(type="string", format="hostname"), "example.com", "-x-.com", {X, LL}),
    ("format-duration", S(type="string", format="duration"), "P1D", "1D", {LL}),
    (
        "unevaluatedProperties",
        S(type="object", properties=S(a=S(type="integer")), unevaluatedProperties=False),
        {"a": 1},
        {"a": 1, "b": 2},
        set(),
    ),
    # keywords of one type where the schema names no type (xgrammar skips them; outlines
    # refuses such a schema)
    ("pattern-without-type", S(pattern="^a+$"), "aa", "ab", {LL}),
    ("minimum-without-type", S(minimum=3), 5, 2, {LL}),
    ("maxLength-without-type", S(maxLength=2), "ab", "abc", {LL}),
    ("minItems-without-type", S(minItems=2), [1, 2], [1], {LL}),
    ("maxProperties-without-type", S(maxProperties=1), {"a": 1}, {"a": 1, "b": 2}, {LL}),
    # keywords beside enum: lowering keeps the listed values that satisfy them, so every
    # backend enforces them; beside a $ref it cannot, and xgrammar and outlines, which serve
    # the listed values alone, declare the keyword
    (
        "pattern-beside-enum",
        S(type="string", enum=["a", "b"], pattern="^a$"),
        "a",
        "b",
        {X, OL, LL},
    ),
    ("maxLength-beside-enum", S(enum=["a", "bbb"], maxLength=2), "a", "bbb", {X, OL, LL}),
    ("type-beside-enum", S(type="string", enum=["a", None]), "a", None, {X, OL, LL}),
    (  # below the root a list beside a reference is left to the backend ...
        "pattern-beside-enum-and-ref",
        S(
            type="object",
            properties={"k": S(enum=["a", "b"], pattern="^a$", allOf=[{"$ref": "#/$defs/s"}])},
            required=["k"],
            **{"$defs": {"s": {"type": "string"}}},
        ),
        {"k": "a"},
        {"k": "b"},
        {LL},
    ),
    (  # a reference's target is judged where no keyword names the key above it
        "type-beside-anyOf-behind-a-ref-to-an-unnamed-key",
        S(
            **{"$ref": "#/$defs/group/full"},
            **{
                "$defs": {
                    "group": {"full": S(type="string", anyOf=[S(maxLength=1), S(minLength=3)])}
                }
            },
        ),
        "a",
        5,
        {LL},
    ),
    (  # ... at the root lowering keeps the values the user's document accepts
        "pattern-beside-enum-and-ref-at-the-root",
        S(
            type="string",
            enum=["a", "b"],
            pattern="^a$",
            allOf=[{"$ref": "#/$defs/s"}],
            **{"$defs": {"s": {"type": "string"}}},
        ),
        "a",
        "b",
        {X, OL, LL},
    ),
    # ... and where every listed value satisfies them, nothing is left out
    (
        "enum-with-a-pattern-all-satisfy",
        S(type="string", enum=["ab", "ac"], pattern="^a"),
        "ab",
        "b",
        {X, OL, LL},
    ),
    # minProperties on outlines holds only on an object with nothing else to check
    (
        "minProperties-beside-properties",
        S(type="object", properties=S(a=S(type="integer")), minProperties=2),
        {"a": 1, "b": 2},
        {"a": 1},
        {X},  # llguidance refuses min/maxProperties beside listed properties
    ),
    # integer-valued decimals in count keywords mean integers (lowered)
    ("maxItems-decimal", S(type="array", maxItems=2.0), [1, 2], [1, 2, 3], {X, OL, LL}),
    ("minLength-decimal", S(type="string", minLength=2.0), "ab", "a", {X, OL, LL}),
    (
        "maxProperties-decimal",
        S(type="object", maxProperties=1.0),
        {"a": 1},
        {"a": 1, "b": 2},
        {X, LL},
    ),
    # keywords beside anyOf, at the top and inside additionalProperties
    (
        "required-beside-anyOf",
        S(
            type="object",
            properties=S(a=S(type="integer")),
            required=["a"],
            anyOf=[S(type="object"), S(minProperties=0)],
        ),
        {"a": 1},
        {},
        {LL},
    ),
    (
        "properties-beside-allOf",
        S(
            type="object",
            properties=S(t=S(type="number", maximum=1)),
            allOf=[S(type="object"), S(minProperties=0)],
        ),
        {"t": 0.5},
        {"t": 1.5},
        {LL},
    ),
    (
        "additionalProperties-beside-anyOf",
        S(
            type="object",
            additionalProperties=S(type="object", minProperties=1),
            anyOf=[S(type="object"), S(minProperties=0)],
        ),
        {"k": {"a": 1}},
        {"k": {}},
        {LL},
    ),
    (
        "pattern-beside-format",
        S(type="string", format="uri", pattern="^wss?://.*$"),
        "wss://a.example",
        "ftp://a.example",
        {LL},
    ),
    (
        "format-beside-pattern",
        S(type="string", format="email", pattern="^[a-z@.]+$"),
        "a@b.co",
        "abc",
        {LL},
    ),
    (
        "properties-beside-patternProperties",
        S(type="object", properties=S(a=S(type="string")), patternProperties={"^x-": {}}),
        {"a": "s", "x-b": 1},
        {"a": 0},
        {LL},
    ),
    (
        "$ref-to-an-anchor",
        {
            "$defs": {"p": {"$anchor": "p", "type": "integer"}},
            "type": "object",
            "properties": S(x={"$ref": "#p"}),
        },
        {"x": 1},
        {"x": "a"},
        {X, OL, LL},
    ),
    (
        "$ref-to-a-draft-4-id",
        {
            "$schema": "http://json-schema.org/draft-04/schema#",
            "definitions": {"p": {"id": "#p", "type": "integer"}},
            "type": "object",
            "properties": S(x={"$ref": "#p"}),
        },
        {"x": 1},
        {"x": "a"},
        {X, OL, LL},
    ),
    (
        "$ref-to-an-anchor-beside-an-embedded-resource",
        {
            "$defs": {
                "e": {"$id": "https://example.com/e.json", "type": "string"},
                "p": {"$anchor": "p", "type": "integer"},
            },
            "type": "object",
            "properties": S(x={"$ref": "#p"}),
        },
        {"x": 1},
        {"x": "a"},
        {LL},
    ),
    (
        "minProperties-through-a-recursive-ref",
        {
            "$defs": {
                "n": S(
                    anyOf=[
                        S(type="integer"),
                        S(
                            type="object",
                            additionalProperties={"$ref": "#/$defs/n"},
                            minProperties=1,
                        ),
                    ]
                )
            },
            "$ref": "#/$defs/n",
        },
        {"a": {"b": 1}},
        {"a": {}},
        {X, OL, LL},
    ),
]


ALSO_DECLARED = {
    "pattern-beside-maxLength": ("maxLength",),
    "maxLength-with-pattern": ("pattern",),
    "properties-beside-patternProperties": ("patternProperties",),
    "pattern-beside-format": ("format",),
    "format-beside-pattern": ("pattern",),
}
"""Cases a backend fails through another keyword than the one they are named after."""

UNTYPED = ("pattern", "minimum", "maxLength", "minItems", "maxProperties")
REFUSED_AT_COMPILE = {
    ("oneOf", LL),
    ("minProperties-through-a-recursive-ref", OL),
    ("minProperties-beside-properties", LL),
    ("$ref-to-an-anchor-beside-an-embedded-resource", OL),
    *((f"{name}-without-type", OL) for name in UNTYPED),
}
"""Claimed keywords a backend refuses in some shapes: llguidance compiles oneOf only where
it proves the branches exclusive, and min/maxProperties beside listed properties; outlines
serves no recursive schema, no schema without a type that it cannot guess and no reference
to an anchor left as one. A refusal is
sound: `auto` moves on to the next backend."""


@pytest.fixture(scope="module")
def smollm2_compiler(smollm2: gm.Vocabulary) -> gm.GrammarCompiler:
    return gm.GrammarCompiler(smollm2, timeout_s=300)


@pytest.mark.parametrize("backend", [X, OL, LL])
@pytest.mark.parametrize(
    ("name", "schema", "valid", "invalid", "enforced_by"), CASES, ids=[c[0] for c in CASES]
)
def test_declared_enforcement_is_real(
    backend: str,
    name: str,
    schema: dict[str, Any],
    valid: Any,
    invalid: Any,
    enforced_by: set[str],
    smollm2_compiler: gm.GrammarCompiler,
    smollm2_tokenizer: Any,
) -> None:
    grammar = gm.Grammar.json_schema(schema)
    if (name, backend) in REFUSED_AT_COMPILE:
        with pytest.raises(gm.UnsupportedGrammarError):
            smollm2_compiler.compile(grammar, backend)
        return
    engine = smollm2_compiler.backend(backend)
    declared = engine.unenforced(grammar, grammar.lower())
    if backend not in enforced_by:
        assert declared, f"{backend} must declare that it does not enforce {name}"
        keyword = name.split("-")[0]
        lowered = bool(lower_schema(schema).rewrites)  # the keyword may have been rewritten
        keywords = {keyword, *ALSO_DECLARED.get(name, ())}
        assert lowered or any(u.keyword in keywords for u in declared), declared
        return
    assert not declared, declared
    matcher = smollm2_compiler.compile(grammar, backend).matcher()

    def encode(value: Any) -> list[int]:
        return list(
            smollm2_tokenizer.encode(
                json.dumps(value, separators=(",", ":")), add_special_tokens=False
            )
        )

    assert accepts_all(matcher, encode(valid)), f"{backend} rejects the valid instance of {name}"
    assert not accepts_all(matcher, encode(invalid)), (
        f"{backend} accepts the invalid instance of {name}"
    )


def test_unenforced_items_carry_pointers(deepseek: gm.Vocabulary) -> None:
    schema = {
        "type": "object",
        "properties": {
            "tags": {
                "type": "array",
                "uniqueItems": True,
                "items": {"type": "integer", "multipleOf": 2},
            }
        },
    }
    grammar = gm.Grammar.json_schema(schema)
    found = gm.create_backend("xgrammar", deepseek).unenforced(grammar, grammar.lower())
    assert {(u.pointer, u.keyword) for u in found} == {
        ("/properties/tags", "uniqueItems"),
        ("/properties/tags/items", "multipleOf"),
    }
    assert "uniqueItems at /properties/tags" in str(found[0]) + str(found[1])


def test_flexible_whitespace_declares_the_tab_hole(deepseek: gm.Vocabulary) -> None:
    schema = {"type": "object", "properties": {"s": {"type": "string", "maxLength": 4}}}
    backend = gm.create_backend("xgrammar", deepseek)
    compact = gm.Grammar.json_schema(schema)
    assert backend.unenforced(compact, compact.lower()) == ()
    grammar = gm.Grammar.json_schema(schema, whitespace="flexible")
    flexible = backend.unenforced(grammar, grammar.lower())
    assert [(u.pointer, u.keyword) for u in flexible] == [("/properties/s", "maxLength")]
    assert "TAB" in flexible[0].reason
    behind = {"$ref": "#/$defs/group/s", "$defs": {"group": {"s": schema["properties"]["s"]}}}
    grammar = gm.Grammar.json_schema(behind, whitespace="flexible")
    found = backend.unenforced(grammar, grammar.lower())
    assert [(u.pointer, u.keyword) for u in found] == [("/$defs/group/s", "maxLength")]


@pytest.mark.parametrize("backend", [X, OL, LL])
def test_keywords_outside_the_vocabulary_are_not_constraints(
    backend: str, deepseek: gm.Vocabulary
) -> None:
    """Validators ignore unknown keywords, so declaring them would refuse schemas for nothing;
    so does a 2020-12 validator a draft-07 keyword (`dependencies`): lowering drops it."""
    schema = {
        "type": "object",
        "x-kubernetes-patch-strategy": "merge",
        "properties": {"a": {"type": "string", "_format": "date"}},
        "dependencies": {"a": ["b"]},
    }
    grammar = gm.Grammar.json_schema(schema)
    found = gm.create_backend(backend, deepseek).unenforced(grammar, grammar.lower())
    assert found == ()


def test_formats_json_schema_does_not_define_are_not_constraints(
    deepseek_compiler: gm.GrammarCompiler,
) -> None:
    """No validator checks format "credit-card" (nor OpenAPI's "int32"): no backend declares
    it, and lowering drops it before llguidance (which refuses string formats it does not
    know) sees it, so auto serves such a schema with llguidance."""
    grammar = gm.Grammar.json_schema({"type": "string", "format": "credit-card"})
    for backend in (X, OL, LL):
        assert deepseek_compiler.backend(backend).unenforced(grammar, grammar.lower()) == ()
    chosen = deepseek_compiler.compile(grammar, "auto")
    assert chosen.backend == LL and chosen.fully_enforced


@pytest.mark.parametrize("backend", [X, LL])
def test_pattern_classes_read_as_ecma_262(
    backend: str, smollm2_compiler: gm.GrammarCompiler, smollm2_tokenizer: Any
) -> None:
    """\\d and \\w are ASCII in ECMA-262 (Python's `re` also takes other scripts' digits and
    letters) and `.` refuses a newline: the backends refuse what ECMA-262 refuses. (\\s and
    a no-break space, which ECMA-262 matches, is a completeness difference between versions:
    xgrammar 0.2.8 refuses it, 0.2.9 and llguidance take it.)"""
    cases = [
        ("^\\d$", "3", True), ("^\\d$", "\u0663", False), ("^\\w$", "a", True),
        ("^\\w$", "\u00e9", False), ("^\\s$", " ", True), ("^.$", "\n", False),
    ]  # fmt: skip
    for pattern, text, ecma in cases:
        grammar = gm.Grammar.json_schema({"type": "string", "pattern": pattern})
        matcher = smollm2_compiler.compile(grammar, backend).matcher()
        written = json.dumps(text, ensure_ascii=False)  # a newline stays an escape
        ids = list(smollm2_tokenizer.encode(written, add_special_tokens=False))
        assert accepts_all(matcher, ids) == ecma, (backend, pattern, text)


def test_llguidance_reads_information_separators_as_ecma_262(
    smollm2_compiler: gm.GrammarCompiler, smollm2_tokenizer: Any
) -> None:
    """U+001C-U+001F are not white space in ECMA-262, and llguidance lets `"\\u001f"` pass
    `^\\S$`; Python's `re`, which jsonschema runs, calls them white space and refuses it. The
    one place found where a backend is looser than jsonschema: it follows the standard."""
    grammar = gm.Grammar.json_schema({"type": "string", "pattern": "^\\S$"})
    matcher = smollm2_compiler.compile(grammar, LL).matcher()
    ids = list(smollm2_tokenizer.encode('"\\u001f"', add_special_tokens=False))
    assert accepts_all(matcher, ids)
    assert not validates({"type": "string", "pattern": "^\\S$"}, "\x1f")


BESIDE_REF = [
    ({"type": "integer", "$ref": "#/$defs/n", "$defs": {"n": {"type": "number"}}}, "1.5"),
    ({"maximum": 5, "$ref": "#/$defs/n", "$defs": {"n": {"type": "integer"}}}, "9"),
    (
        {
            "type": "object",
            "properties": {"p": {"minLength": 3, "$ref": "#/$defs/s"}},
            "required": ["p"],
            "$defs": {"s": {"type": "string"}},
        },
        '{"p":"a"}',
    ),
]


@pytest.mark.parametrize("backend", [X, OL, LL])
@pytest.mark.parametrize(("schema", "invalid"), BESIDE_REF)
def test_keywords_beside_a_ref_are_enforced_or_declared(
    smollm2_compiler: gm.GrammarCompiler, backend: str, schema: dict[str, Any], invalid: str
) -> None:
    """From 2019-09 on, keywords beside `$ref` apply too (a MaskBench schema found it)."""
    assert not validates(schema, json.loads(invalid))
    compiled = smollm2_compiler.compile(gm.Grammar.json_schema(schema), backend)
    table = byte_token_ids(smollm2_compiler.vocab)
    accepted = feed(compiled.matcher(), [table[b] for b in invalid.encode()])[0]
    assert not accepted or compiled.unenforced, (backend, invalid)


@pytest.mark.parametrize("backend", gm.backend_names())
def test_each_support_table_was_measured_on_the_installed_engine(
    backend: str, deepseek_compiler: gm.GrammarCompiler
) -> None:
    """The tables above are the ones these tests hold to the tokens: an engine upgraded past
    the versions they were measured on fails here until they are measured again."""
    engine = deepseek_compiler.backend(backend)
    assert engine.support is not None and engine.distribution
    assert importlib.metadata.version(engine.distribution) in engine.support.measured_on


def test_an_unmeasured_engine_version_is_said_once(
    deepseek: gm.Vocabulary, caplog: pytest.LogCaptureFixture
) -> None:
    from grammarmask.backends.xgrammar_backend import XGRAMMAR_SUPPORT, XGrammarBackend

    class Unmeasured(XGrammarBackend):
        support = dataclasses.replace(XGRAMMAR_SUPPORT, measured_on=("0.0.1",))

    with caplog.at_level(logging.WARNING, logger="grammarmask"):
        Unmeasured(deepseek)
        Unmeasured(deepseek)
    said = [r.getMessage() for r in caplog.records if "measured on" in r.getMessage()]
    assert len(said) == 1, said
    assert "measured on xgrammar 0.0.1" in said[0]
    assert importlib.metadata.version("xgrammar") in said[0]
