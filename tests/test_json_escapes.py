"""Patterns against JSON escapes: a backend matches `pattern` on the decoded string, but
the model writes the encoded one (`\\\\`, `\\"`, `\\/`, `\\n`, `\\uXXXX`, surrogate pairs), so
every escape form must meet every pattern construct. A cell where the backend accepts
an invalid text must be declared; undeclared, it is a hole (the rules
`negated_class_excluding_*` in the xgrammar and llguidance backends declare the ones measured)."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest

import grammarmask as gm
from grammarmask.tools.conformance import byte_token_ids, feed, validates

PATTERNS = (
    r"^[^\\]+$", r'^[^"]+$', r'^[^"\\]+$', r"^(?:[^\\]|\\\\)+$", r"^[^/]+$", r"^[a-z]+$",
    r"^\S+$", r"^\w+$", r"^.+$", r"^[^é]+$", r"^[^😀]+$", r"^[ -~]+$", r"^[^\n]+$",
    r"^[^\s\\]+$", r"^\D+$", r"^[^\x00-\x1f]+$", r"^[a-zé]+$", r"^[^a-z]+$",
    r"^[\x00-\x1fa-z]+$", r"^[\x00-!#-~]+$", r"^[\x01-!#-~]+$", r"^[a-z\\]+$",
    "^[!#-~\U00010000-\U0010ffff]+$", "^[a-z\U00010000-\U0010ffff]+$",
)  # fmt: skip
"""Negated classes, shorthands, `.`, positive classes with the backslash, from U+0000
(llguidance) and with characters above U+FFFF (xgrammar; written as the characters)."""
TEXTS = (
    r'"a\\b"', r'"a\"b"', r'"a\/b"', r'"a\nb"', r'"a\tb"', r'"a\u00e9b"', r'"a\u005cb"',
    r'"a\u0022b"', r'"\ud83d\ude00"', '"😀"', r'"a\u0020b"', r'"a\u0061"', '"aé"', r'"\u00e9"',
    r'"a\u2028b"', r'"a\u0031"', '"ab"',
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
