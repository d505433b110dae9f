"""backend="auto": per grammar, the first backend in AUTO_ORDER that enforces all of it."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import accepts_all, allowed_ids, ids_in_row

import grammarmask as gm
from grammarmask.schema import LoweredSchema
from grammarmask.tools.cli import main

PLAIN = {
    "type": "object",
    "properties": {"n": {"type": "integer", "minimum": 3}},
    "required": ["n"],
    "additionalProperties": False,
}
UNIQUE = {"type": "array", "items": {"type": "integer", "minimum": 0}, "uniqueItems": True}
MIN_PROPERTIES = {
    "type": "object",
    "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}, "c": {"type": "integer"}},
    "minProperties": 2,
}
OVERLAPPING_ONE_OF = {"oneOf": [{"type": "integer"}, {"type": "number"}]}


@pytest.fixture(scope="module")
def compiler(deepseek: gm.Vocabulary) -> gm.GrammarCompiler:
    return gm.GrammarCompiler(deepseek, timeout_s=300)


def test_the_order_is_documented_and_llguidance_comes_first(compiler: gm.GrammarCompiler) -> None:
    assert gm.AUTO_ORDER == ("llguidance", "xgrammar", "outlines")
    assert compiler.auto_candidates() == gm.AUTO_ORDER  # all three are installed here


def test_auto_picks_llguidance_and_shares_its_cache_entry(compiler: gm.GrammarCompiler) -> None:
    grammar = gm.Grammar.json_schema(PLAIN)
    chosen = compiler.compile(grammar, "auto")
    assert chosen.backend == "llguidance" and chosen.fully_enforced
    assert compiler.compile(grammar, "llguidance") is chosen
    assert compiler.compile(grammar, "auto") is chosen


def test_auto_moves_on_when_a_backend_refuses_at_compile_time(
    compiler: gm.GrammarCompiler, deepseek_encode: Callable[[str], list[int]]
) -> None:
    """llguidance compiles minProperties on an open object only when every listed property
    is required (lowering rewrites only a minProperties of 1); xgrammar enforces it."""
    grammar = gm.Grammar.json_schema(MIN_PROPERTIES)
    assert compiler.backend("llguidance").unenforced(grammar, grammar.lower()) == ()
    with pytest.raises(gm.UnsupportedGrammarError, match="min/maxProperties only supported"):
        compiler.compile(grammar, "llguidance")
    chosen = compiler.compile(grammar, "auto")
    assert chosen.backend == "xgrammar" and chosen.fully_enforced
    assert accepts_all(chosen.matcher(), deepseek_encode('{"b":2,"c":3}'))
    assert not accepts_all(chosen.matcher(), deepseek_encode('{"b":2}'))


def test_ebnf_goes_to_xgrammar_first(compiler: gm.GrammarCompiler) -> None:
    """Grammar.ebnf is xgrammar's dialect; llguidance's converter mangles some of it."""
    assert compiler.auto_candidates("ebnf") == ("xgrammar", "llguidance", "outlines")
    grammar = gm.Grammar.ebnf("root ::= [\\u0041-\\u005A]+")
    with pytest.raises(gm.CompileError, match="llguidance cannot compile"):
        compiler.compile(grammar, "llguidance")
    assert compiler.compile(grammar, "auto").backend == "xgrammar"


def test_auto_skips_backends_that_refuse_or_leave_constraints_out(
    compiler: gm.GrammarCompiler,
) -> None:
    """Overlapping oneOf: llguidance refuses it, the others would treat it as anyOf."""
    grammar = gm.Grammar.json_schema(OVERLAPPING_ONE_OF)
    with pytest.raises(gm.NotFullyEnforcedError) as refused:
        compiler.compile(grammar, "auto")
    assert isinstance(refused.value, gm.GrammarError)
    assert list(refused.value.reasons) == ["llguidance", "xgrammar", "outlines"]
    assert "oneOf constraints are not supported" in refused.value.reasons["llguidance"][0]
    assert refused.value.reasons["xgrammar"] == ("oneOf at /: not enforced by this backend",)
    assert "allow_unenforced=True" in str(refused.value)


def test_refusal_lists_every_backends_pointers(compiler: gm.GrammarCompiler) -> None:
    with pytest.raises(gm.NotFullyEnforcedError) as refused:
        compiler.compile(gm.Grammar.json_schema(UNIQUE), "auto")
    message = str(refused.value)
    assert "llguidance: uniqueItems at /" in message
    assert "outlines: uniqueItems at /: not enforced by this backend, minimum at /items" in message


def test_loose_opt_in_serves_with_the_fewest_unenforced(
    compiler: gm.GrammarCompiler,
    deepseek: gm.Vocabulary,
    deepseek_encode: Callable[[str], list[int]],
) -> None:
    """uniqueItems: llguidance refuses; xgrammar leaves out 1 constraint, outlines 2."""
    chosen = compiler.compile(gm.Grammar.json_schema(UNIQUE), "auto", allow_unenforced=True)
    assert chosen.backend == "xgrammar"
    assert [(u.pointer, u.keyword) for u in chosen.unenforced] == [("", "uniqueItems")]
    matcher = chosen.matcher()
    assert accepts_all(matcher, deepseek_encode("[1,1]"))  # declared: duplicates pass
    assert not accepts_all(matcher, deepseek_encode("[-1]"))  # minimum is still enforced
    assert allowed_ids(matcher, deepseek.size)


def test_loose_opt_in_still_prefers_a_full_backend(compiler: gm.GrammarCompiler) -> None:
    chosen = compiler.compile(gm.Grammar.json_schema(PLAIN), "auto", allow_unenforced=True)
    assert chosen.backend == "llguidance" and chosen.fully_enforced


def _first_row_ids(masks: gm.StepMasks, entry: int, vocab: gm.Vocabulary) -> set[int]:
    return ids_in_row(masks.bitmask[masks.rows[entry][0]], vocab.size)


def test_pool_auto_reports_the_backend_and_fails_a_refused_request_alone(
    deepseek: gm.Vocabulary, deepseek_encode: Callable[[str], list[int]]
) -> None:
    compiler = gm.GrammarCompiler(deepseek, timeout_s=300)
    plain = gm.Grammar.json_schema(PLAIN)
    ebnf = gm.Grammar.ebnf("root ::= [\\u0041-\\u005A]+")
    with gm.MatcherPool(deepseek, backend="auto", workers=2, compiler=compiler) as pool:
        assert pool.add("plain", plain).backend == "auto"  # until compiled
        pool.add("ebnf", ebnf)
        pool.add("refused", gm.Grammar.json_schema(UNIQUE))
        pool.add("loose", gm.Grammar.json_schema(UNIQUE), allow_unenforced=True)
        pool.add("named", plain, backend="xgrammar")
        masks = pool.fill([("plain", []), ("refused", []), ("ebnf", []), ("loose", [])])
        assert list(masks.failures) == ["refused"]
        assert "no installed backend enforces all of" in masks.failures["refused"]
        assert "xgrammar: uniqueItems at /" in masks.failures["refused"]
        states = {rid: pool.state(rid) for rid in ("plain", "ebnf", "refused", "loose")}
        assert states["plain"].backend == "llguidance" and states["plain"].status == "active"
        assert states["ebnf"].backend == "xgrammar" and states["ebnf"].status == "active"
        assert states["refused"].status == "failed"
        assert states["loose"].backend == "xgrammar"
        assert [u.keyword for u in states["loose"].unenforced] == ["uniqueItems"]
        stop_only = {deepseek.stop_token_ids[0]}
        assert _first_row_ids(masks, 1, deepseek) == stop_only
        reference = compiler.compile(plain, "llguidance").matcher()
        assert _first_row_ids(masks, 0, deepseek) == allowed_ids(reference, deepseek.size)
        for token in deepseek_encode(json.dumps({"n": 5}, separators=(",", ":"))):
            assert pool.commit("plain", [token]).status != "failed"
        assert pool.commit("plain", list(deepseek.stop_token_ids)).status == "finished"
        pool.fill([("named", [])])
        assert pool.state("named").backend == "xgrammar"


def test_pool_rejects_an_unknown_backend_but_takes_auto(deepseek: gm.Vocabulary) -> None:
    with pytest.raises(gm.GrammarMaskError, match="unknown backend 'fast'"):
        gm.MatcherPool(deepseek, backend="fast")
    gm.MatcherPool(deepseek, backend="auto").close()


def test_check_shows_the_llguidance_row_and_the_auto_choice(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "plain.json"
    path.write_text(json.dumps(PLAIN))
    assert main(["check", str(path), "--backend", "llguidance", "--backend", "auto"]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line for line in out.splitlines() if line.startswith(("ll", "auto"))}
    assert "compiled" in rows["llguidance"] and rows["llguidance"].endswith("full")
    assert "-> llguidance" in rows["auto"] and rows["auto"].endswith("full")
    assert "auto: served by llguidance, the first of llguidance, xgrammar, outlines" in out


def test_check_auto_refusal_and_opt_in(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "unique.json"
    path.write_text(json.dumps(UNIQUE))
    assert main(["check", str(path), "--backend", "auto"]) == 3
    out = capsys.readouterr().out
    assert "auto     refused" in out
    assert "auto: refused: xgrammar: uniqueItems at /: not enforced by this backend" in out
    assert "auto: refused: outlines: minimum at /items" in out
    assert main(["check", str(path), "--backend", "auto", "--allow-unenforced"]) == 0
    out = capsys.readouterr().out
    assert "-> xgrammar" in out and "partial: 1 constraint(s) not enforced" in out
    assert "auto: not enforced: uniqueItems at /" in out


RECURSIVE_LIST = {
    "$defs": {
        "node": {
            "type": "object",
            "properties": {
                "next": {"$ref": "#/$defs/node", "required": ["value"]},
                "value": {"type": "integer"},
            },
        }
    },
    "$ref": "#/$defs/node",
}
"""A list whose every later node must hold a value: a recursive `$ref` beside `required`."""


RECURSIVE_TREE = {
    "$defs": {
        "node": {
            "type": "object",
            "properties": {
                "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}, "title": "Kids"}
            },
            "patternProperties": {"^[a-z]+$": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
            "additionalProperties": False,
        }
    },
    "$ref": "#/$defs/node",
}
"""A tree whose listed property `kids` has the schema of the pattern its name matches."""


RECURSIVE_CONDITION = {
    "$defs": {
        "item": {
            "type": "object",
            "required": ["type"],
            "properties": {"type": {"anyOf": [{"type": "string"}, {"$ref": "#/$defs/item"}]}},
            "if": {"properties": {"type": {"const": "array"}}},
            "then": {},
        }
    },
    "$ref": "#/$defs/item",
}
"""A type that is a name or a type, under a condition that decides nothing (`then: {}`)."""


RECURSIVE_VERDICTS = {
    "list": (
        RECURSIVE_LIST,
        {
            '{"next":{"next":{"value":2},"value":1}}': True,  # llguidance keeps the listed order
            '{"value":0}': True,
            '{"next":{"next":{},"value":1}}': False,
            '{"next":{}}': False,
        },
    ),
    "tree": (
        RECURSIVE_TREE,
        {
            '{"kids":[{"kids":[]},{"other":[{}]}]}': True,
            '{"kids":[{"kids":[1]}]}': False,
            '{"kids":[{"Kids":[]}]}': False,
            '{"kids":{}}': False,
        },
    ),
}


def _auto_serves_on_llguidance(
    compiler: gm.GrammarCompiler,
    encode: Callable[[str], list[int]],
    schema: dict[str, object],
    verdicts: dict[str, bool],
) -> None:
    """`auto` serves `schema` fully on llguidance, and its mask takes each text exactly
    where `verdicts` says it is valid."""
    chosen = compiler.compile(gm.Grammar.json_schema(schema), "auto")
    assert chosen.backend == "llguidance" and chosen.fully_enforced
    for text, valid in verdicts.items():
        assert accepts_all(chosen.matcher(), encode(text)) is valid, text


def test_llguidance_serves_a_recursive_type_under_a_condition_that_decides_nothing(
    compiler: gm.GrammarCompiler, deepseek_encode: Callable[[str], list[int]]
) -> None:
    """Written as an `anyOf` of both cases, the condition would meet the recursive
    reference, which llguidance refuses; lowering drops it, as it decides nothing."""
    verdicts = {
        '{"type":"array"}': True,
        '{"type":{"type":{"type":"x"}}}': True,
        '{"type":{"type":{}}}': False,
        '{"type":1}': False,
        "{}": False,
    }
    _auto_serves_on_llguidance(compiler, deepseek_encode, RECURSIVE_CONDITION, verdicts)


PATH_OF_SEGMENTS = {"type": "string", "pattern": "^(/?([.]{2}|[a-z0-9-]*)($|/))*$"}
"""Segments each closed by a slash or the end: a `$` inside a repeated group."""


def test_a_pattern_with_an_end_anchor_inside_is_served_as_python_reads_it(
    compiler: gm.GrammarCompiler, deepseek_encode: Callable[[str], list[int]]
) -> None:
    """llguidance reads a `$` inside a pattern as a lookaround it refuses; lowering writes
    the pattern's strings without it, and the mask takes exactly what `re.search` does."""
    grammar = gm.Grammar.json_schema(PATH_OF_SEGMENTS)
    with pytest.raises(gm.UnsupportedGrammarError, match="lookarounds"):
        compiler.backend("llguidance").compile(grammar, LoweredSchema(PATH_OF_SEGMENTS))
    values = ("", "a/b-1/", "/../x", "a", "a//b", "A", "a/.", "a/b/c-d/../", "a b")
    verdicts = {
        json.dumps(v): re.search(PATH_OF_SEGMENTS["pattern"], v) is not None for v in values
    }
    _auto_serves_on_llguidance(compiler, deepseek_encode, PATH_OF_SEGMENTS, verdicts)


NAMES_BUT_TWO = {
    "type": "object",
    "patternProperties": {"^(?!ab|c$).+$": {"type": "integer"}},
    "additionalProperties": {"type": "string"},
}
"""Integer values under every name but `ab...` and `c` (with Python's final newline)."""


def test_a_name_pattern_with_a_leading_lookahead_is_served_as_python_reads_it(
    compiler: gm.GrammarCompiler, deepseek_encode: Callable[[str], list[int]]
) -> None:
    """llguidance refuses a lookahead in a property name pattern; lowering writes the names
    without it, `c\\n` included (Python's `$` matches before it, so the lookahead refuses it)."""
    grammar = gm.Grammar.json_schema(NAMES_BUT_TWO)
    with pytest.raises(gm.UnsupportedGrammarError, match="regex parse error"):
        compiler.backend("llguidance").compile(grammar, LoweredSchema(NAMES_BUT_TWO))
    verdicts = {
        '{"x":1}': True,
        '{"x":"s"}': False,
        '{"abc":"s"}': True,
        '{"abc":1}': False,
        '{"c":"s"}': True,
        '{"c\\n":"s"}': True,
        '{"cd":1}': True,
        '{"cd":"s"}': False,
    }
    _auto_serves_on_llguidance(compiler, deepseek_encode, NAMES_BUT_TWO, verdicts)


@pytest.mark.parametrize("shape", RECURSIVE_VERDICTS)
def test_llguidance_serves_a_recursive_reference_that_meets_other_keywords(
    compiler: gm.GrammarCompiler, deepseek_encode: Callable[[str], list[int]], shape: str
) -> None:
    """llguidance refuses to intersect a reference whose target it is still reading: a
    `required` beside it (the list), or a listed property's schema with the same schema
    of the pattern its name matches (the tree). Lowering writes the first out as its own
    definition and leaves the second's listed schema `{}`; the constraints still hold at
    every depth."""
    schema, verdicts = RECURSIVE_VERDICTS[shape]
    grammar = gm.Grammar.json_schema(schema)
    with pytest.raises(gm.UnsupportedGrammarError, match="circular references"):
        compiler.backend("llguidance").compile(grammar, LoweredSchema(schema))
    _auto_serves_on_llguidance(compiler, deepseek_encode, schema, verdicts)
