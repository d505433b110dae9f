"""Grammar specs are checked up front; each bad input has a precise error."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

import grammarmask as gm


def test_schema_text_that_is_not_json() -> None:
    with pytest.raises(gm.InvalidJSONError, match=r"not JSON: .* line 1 column 10"):
        gm.Grammar.json_schema('{"type": }')


@pytest.mark.parametrize(
    ("schema", "pointer", "words"),
    [
        ({"type": "strin"}, "/type", "is not valid under any of the given schemas"),
        ({"properties": {"age": {"type": 5}}}, "/properties/age/type", "5"),
        ({"properties": {"tags": {"minItems": -1}}}, "/properties/tags/minItems", "-1"),
        ({"required": "name"}, "/required", "is not of type 'array'"),
        ({"$defs": {"x": {"enum": 3}}}, "/$defs/x/enum", "is not of type 'array'"),
    ],
)
def test_invalid_schema_names_pointer(schema: dict[str, object], pointer: str, words: str) -> None:
    with pytest.raises(gm.InvalidSchemaError) as info:
        gm.Grammar.json_schema(schema)
    assert info.value.pointer == pointer
    assert pointer in str(info.value)
    assert words in str(info.value)
    assert "not a valid JSON Schema" in str(info.value)


def test_schema_that_is_not_an_object() -> None:
    with pytest.raises(gm.InvalidSchemaError, match="must be an object or a boolean, not list"):
        gm.Grammar.json_schema([1, 2])


def test_unresolvable_ref() -> None:
    schema = {"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}
    with pytest.raises(gm.InvalidSchemaError, match="does not resolve") as info:
        gm.Grammar.json_schema(schema)
    assert info.value.pointer == "/properties/a/$ref"


def test_bad_regex() -> None:
    with pytest.raises(gm.InvalidRegexError, match=r"invalid regex '\[a-': .*position"):
        gm.Grammar.regex("[a-")


def test_regex_must_be_text() -> None:
    with pytest.raises(gm.InvalidRegexError, match="must be a string"):
        gm.Grammar.regex(42)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('root ::= "a" |', "invalid EBNF grammar"),
        ('start ::= "a"', "invalid EBNF grammar"),
        ("", "non-empty"),
    ],
)
def test_bad_ebnf(text: str, message: str) -> None:
    with pytest.raises(gm.InvalidEBNFError, match=message):
        gm.Grammar.ebnf(text)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ([], "at least one option"),
        (["yes", ""], "option 1 is ''"),
        (["yes", 3], "option 1 is 3"),
        ("yes", "not one string"),
    ],
)
def test_bad_choice(options: object, message: str) -> None:
    with pytest.raises(gm.InvalidChoiceError, match=message):
        gm.Grammar.choice(options)  # type: ignore[arg-type]


def test_bad_whitespace_option() -> None:
    with pytest.raises(ValueError, match="whitespace must be 'compact' or 'flexible'"):
        gm.Grammar.json(whitespace="pretty")  # type: ignore[arg-type]


def test_errors_share_one_base() -> None:
    for cls in (
        gm.InvalidJSONError,
        gm.InvalidSchemaError,
        gm.InvalidRegexError,
        gm.InvalidEBNFError,
        gm.InvalidChoiceError,
        gm.CompileError,
        gm.CompileTimeoutError,
        gm.UnsupportedGrammarError,
    ):
        assert issubclass(cls, gm.GrammarError)
        assert issubclass(cls, ValueError)


def test_schema_key_keeps_property_order() -> None:
    """Property order decides the order backends generate: it is part of the identity."""
    first = gm.Grammar.json_schema({"properties": {"a": {}, "b": {}}})
    second = gm.Grammar.json_schema('{"properties": {"b": {}, "a": {}}}')
    assert first.key != second.key
    assert first == gm.Grammar.json_schema(json.dumps({"properties": {"a": {}, "b": {}}}))


@given(st.lists(st.text(min_size=1, max_size=8), min_size=1, max_size=6))
def test_choice_regex_and_ebnf_forms_match_exactly_the_options(options: list[str]) -> None:
    import re

    grammar = gm.Grammar.choice(options)
    assert grammar.choices == tuple(dict.fromkeys(options))
    pattern = re.compile(grammar.as_regex(), re.DOTALL)
    for option in options:
        assert pattern.fullmatch(option)
    assert not pattern.fullmatch("".join(options) + "\x00")
    gm.Grammar.ebnf(grammar.as_ebnf())  # the EBNF form parses
