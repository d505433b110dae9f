"""Patterns against JSON escapes: a backend matches `pattern` on the decoded string, but
the model writes the encoded one (`\\\\`, `\\"`, `\\/`, `\\n`, `\\uXXXX`, surrogate pairs), so
every escape form must meet every pattern construct. A cell where the backend accepts
an invalid text must be declared; undeclared, it is a hole (the rules
`negated_class_excluding_*` in the xgrammar and llguidance backends declare the ones measured)."""

from __future__ import annotations

import itertools
import json
import re
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import grammarmask as gm
from grammarmask.schema.patterns import (
    holds_nul_without_quote_or_backslash,
    without_nul_in_negated_classes,
)
from grammarmask.tools.conformance import byte_token_ids, feed, validates

PATTERNS = (
    r"^[^\\]+$", r'^[^"]+$', r'^[^"\\]+$', r"^(?:[^\\]|\\\\)+$", r"^[^/]+$", r"^[a-z]+$",
    r"^\S+$", r"^\w+$", r"^.+$", r"^[^é]+$", r"^[^😀]+$", r"^[ -~]+$", r"^[^\n]+$",
    r"^[^\s\\]+$", r"^\D+$", r"^[^\x00-\x1f]+$", r"^[a-zé]+$", r"^[^a-z]+$",
    r"^[\x00-\x1fa-z]+$", r"^[\x00-!#-~]+$", r"^[\x01-!#-~]+$", r"^[a-z\\]+$",
    "^[!#-~\U00010000-\U0010ffff]+$", "^[a-z\U00010000-\U0010ffff]+$",
    r"^[\x00\x01-\x1fa-z]+$", r"^(?:[a-z\x01-\x1f]|\x00)+$", r"^[^\\\n]+$", r"^[^\\\x00]+$",
    r'^[^"\\\x00]+$', r"^[^\x00-\x1f\\]+$", r"^[^-\\]+$",
)  # fmt: skip
"""Negated classes, shorthands, `.`, positive classes with the backslash, from U+0000
(llguidance) and with characters above U+FFFF (xgrammar; written as the characters)."""
TEXTS = (
    r'"a\\b"', r'"a\"b"', r'"a\/b"', r'"a\nb"', r'"a\tb"', r'"a\u00e9b"', r'"a\u005cb"',
    r'"a\u0022b"', r'"\ud83d\ude00"', '"😀"', r'"a\u0020b"', r'"a\u0061"', '"aé"', r'"\u00e9"',
    r'"a\u2028b"', r'"a\u0031"', '"ab"', r'"a\u0000b"',
)  # fmt: skip
"""Each string written as the model would write it: JSON text, escapes and all."""

POSITIONS = {
    "top level": (lambda s: s, lambda t: t),
    "a property": (
        lambda s: {"type": "object", "properties": {"p": s}, "required": ["p"]},
        lambda t: '{"p":' + t + "}",
    ),
}


def _holes(
    compiler: gm.GrammarCompiler, backend: str, schema: dict[str, Any], texts: tuple[str, ...]
) -> list[str]:
    """The texts the backend accepts although jsonschema refuses them, with nothing declared."""
    table = byte_token_ids(compiler.vocab)
    try:
        compiled = compiler.compile(gm.Grammar.json_schema(schema), backend)
    except gm.GrammarError:
        return []  # a refusal is sound
    if compiled.unenforced:
        return []
    matcher = compiled.matcher()
    return [
        text
        for text in texts
        if feed(matcher, [table[b] for b in text.encode()])[0]
        and not validates(schema, json.loads(text))
    ]


@pytest.mark.parametrize("position", POSITIONS)
@pytest.mark.parametrize(
    "backend",
    ["xgrammar", "llguidance", pytest.param("outlines", marks=pytest.mark.slow)],
)
def test_no_escape_goes_through_a_pattern_undeclared(
    deepseek_compiler: gm.GrammarCompiler, backend: str, position: str
) -> None:
    wrap, place = POSITIONS[position]
    holes = {
        pattern: found
        for pattern in PATTERNS
        if (
            found := _holes(
                deepseek_compiler,
                backend,
                wrap({"type": "string", "pattern": pattern}),
                tuple(map(place, TEXTS)),
            )
        )
    }
    assert holes == {}


@pytest.mark.parametrize("backend", ["xgrammar", "llguidance"])
def test_no_escape_goes_through_a_key_pattern_undeclared(
    deepseek_compiler: gm.GrammarCompiler, backend: str
) -> None:
    holes = {}
    for pattern in (r"^[^\\]+$", r'^[^"]+$', r"^[^é]+$"):
        schema = {
            "type": "object",
            "patternProperties": {pattern: {"type": "integer"}},
            "additionalProperties": False,
        }
        keys = [text + ":1" for text in TEXTS]
        found = _holes(deepseek_compiler, backend, schema, tuple("{" + k + "}" for k in keys))
        if found:
            holes[pattern] = found
    assert holes == {}


def test_auto_serves_each_pattern_fully_where_a_backend_can(
    deepseek_compiler: gm.GrammarCompiler,
) -> None:
    """The declarations move auto to a backend that enforces the pattern, soundly."""
    for pattern, text in itertools.product((r"^[^\\]+$", r'^[^"]+$', r"^[^é]+$"), TEXTS):
        schema = {"type": "string", "pattern": pattern}
        compiled = deepseek_compiler.compile(gm.Grammar.json_schema(schema), "auto")
        assert compiled.fully_enforced, (pattern, compiled.backend)
        assert _holes(deepseek_compiler, compiled.backend, schema, (text,)) == []


def test_auto_serves_a_negated_class_on_llguidance_at_the_cost_of_nul(
    deepseek_compiler: gm.GrammarCompiler,
) -> None:
    """llguidance gets `[^\\\\]` with U+0000 added to the class, which it reads right: a
    pattern beside a length (which xgrammar does not hold) is served fully enforced, the
    backslash escape is refused, and so is U+0000, the price of the rewrite."""
    schema = {"type": "string", "pattern": r"^[^\\]+$", "minLength": 2}
    compiled = deepseek_compiler.compile(gm.Grammar.json_schema(schema), "auto")
    assert (compiled.backend, compiled.fully_enforced) == ("llguidance", True)
    table = byte_token_ids(deepseek_compiler.vocab)
    verdicts = {
        text: feed(compiled.matcher(), [table[b] for b in text.encode()])[0]
        for text in (r'"a\\b"', r'"a\"b"', '"ab"', '"a"', r'"a\u0000b"')
    }
    assert verdicts == {
        r'"a\\b"': False,
        r'"a\"b"': True,
        '"ab"': True,
        '"a"': False,
        r'"a\u0000b"': False,
    }


BACKSLASHLESS = {"type": "string", "pattern": r"^[^\\]+$"}
NEGATIONS = [
    ({"oneOf": [BACKSLASHLESS, {"type": "string", "maxLength": 1}]}, ["/oneOf/0"]),
    (
        {
            "type": "object",
            "properties": {
                "a": BACKSLASHLESS,
                "b": {"oneOf": [{"$ref": "#/$defs/d"}, {"type": "string", "maxLength": 1}]},
                "c": {"$ref": "#/$defs/d"},
            },
            "$defs": {"d": BACKSLASHLESS},
        },
        ["/$defs/d"],
    ),
    (
        {
            "type": "object",
            "properties": {"a": BACKSLASHLESS, "b": {"not": {"$ref": "#"}}},
        },
        ["/properties/a"],
    ),
]
"""Under an overlapping `oneOf` (or a `not`) a stricter branch can let more through:
`"\\u0000"` would pass the second branch alone. The class is left as written there and in
what a `$ref` from there leads to (all of the schema, for `"#"`), and declared."""


@pytest.mark.parametrize(("schema", "declared"), NEGATIONS)
def test_a_negated_class_keeps_its_reading_under_a_negation(
    deepseek_compiler: gm.GrammarCompiler, schema: dict[str, Any], declared: list[str]
) -> None:
    grammar = gm.Grammar.json_schema(schema)
    found = deepseek_compiler.backend("llguidance").unenforced(grammar, grammar.lower())
    assert sorted(u.pointer for u in found if u.keyword == "pattern") == declared


REWRITTEN = {
    r"^[^\\]+$": r"^[^\x00\\]+$",
    r"^[^-\\]+$": r"^[^\x00\-\\]+$",
    r"^a[^\s\\](?:[^\u0022]|\\[^\\])*$": r"^a[^\x00\s\\](?:[^\x00\u0022]|\\[^\x00\\])*$",
    r"^[^a]+$": r"^[^a]+$",
    r"^[^\x00\\]+$": r"^[^\x00\\]+$",
    r"^[^\S\\]+$": r"^[^\S\\]+$",
    r"^[\\^\\]$": r"^[\\^\\]$",
}  # fmt: skip
"""Negated classes that hold U+0000 but not both `"` and `\\` get it added (a leading hyphen
escaped); a class holding both, or no U+0000, and a positive class, are left as written."""


@pytest.mark.parametrize("pattern", REWRITTEN)
def test_negated_classes_lose_nul_and_nothing_else(pattern: str) -> None:
    assert without_nul_in_negated_classes(pattern) == REWRITTEN[pattern]
    assert not holds_nul_without_quote_or_backslash(REWRITTEN[pattern])


@given(st.text(alphabet=st.sampled_from('ab-\\"\x00\x01 \t\u00e9'), max_size=8))
def test_the_rewrite_changes_only_the_verdicts_on_nul(text: str) -> None:
    for pattern, rewritten in REWRITTEN.items():
        before, after = re.search(pattern, text), re.search(rewritten, text)
        assert bool(after) == (bool(before) and ("\x00" not in text or pattern == rewritten))


@pytest.mark.parametrize(
    ("pattern", "risky"),
    [
        (r"^[\x00-\x1fa-z]+$", True), (r"^[\x00\x01-\x1fa-z]+$", True),
        (r"^(?:[a-z]|\x00)+$", True), (r"^(?:[a-z]|\u0000)+$", True), (r"^a\0$", True),
        ("^a\x00$", True), (r"^[\s\x00]$", True), (r"^\\x00$", False), (r"^\x001$", True),
        (r"^[\x01-\x1fa-z]+$", False), (r"^[\s\S]+$", False), (r"^.+$", False),
        (r"^[^\d]+$", False), (r"^\01$", False), (r"^\000$", True), (r"^\08$", True),
    ],
)  # fmt: skip
def test_where_llguidance_is_judged_to_misread_nul(pattern: str, risky: bool) -> None:
    assert holds_nul_without_quote_or_backslash(pattern) == risky
