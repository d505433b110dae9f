"""The enforcement tables hold per position: every keyword at every position, on each
backend as installed, is enforced, declared or refused; never silently ignored."""

from __future__ import annotations

from typing import Any

import pytest

import grammarmask as gm
from grammarmask.tools import enforcement_matrix as em


@pytest.fixture(scope="module")
def compiler(smollm2: gm.Vocabulary) -> Any:
    compiler = gm.GrammarCompiler(smollm2, timeout_s=300)
    yield compiler
    compiler.close()


def test_every_position_keeps_each_cases_verdicts() -> None:
    for case in em.KEYWORDS:
        for position in (*em.POSITIONS, *em.PAIRS):
            em.wrapped(case, position)  # raises where a wrapping changes a verdict


def test_pairs_nest_every_position_in_every_other_and_keep_references_whole() -> None:
    outer = next(p for p in em.POSITIONS if p.name == "through $ref")
    inner = next(p for p in em.POSITIONS if p.name == "recursive $ref")
    nested = em.composed(outer, inner).schema({"const": 1})
    assert set(nested["$defs"]) == {"d", "n_in"}  # both definitions at the root
    assert nested["$defs"]["d"] == {"$ref": "#/$defs/n_in"}
    assert len(em.PAIRS) == (len(em.POSITIONS) - 1) ** 2


def _unsound(cells: list[em.Cell]) -> list[em.Cell]:
    return [cell for cell in cells if cell.verdict == em.UNSOUND]


@pytest.mark.parametrize("backend", ["llguidance", "xgrammar"])
def test_no_cell_is_unsound(compiler: gm.GrammarCompiler, backend: str) -> None:
    cells = em.matrix(compiler, [backend])
    assert len(cells) == len(em.KEYWORDS) * len(em.POSITIONS)
    assert _unsound(cells) == []
    enforced = [c for c in cells if c.verdict == em.ENFORCED]
    assert enforced, f"{backend} enforces nothing: the matrix measures nothing"
    # "enforced" by refusing everything would be no enforcement: the valid instance passes
    assert [c for c in enforced if not c.valid_accepted] == []


@pytest.mark.parametrize("backend", ["llguidance", "xgrammar"])
def test_no_cell_two_levels_deep_is_unsound(compiler: gm.GrammarCompiler, backend: str) -> None:
    """Every pair of positions, one keyword each (taken in turn; the slow run below has
    them all): a keyword nested two levels deep is enforced, declared or refused."""
    cells = [em.measure(compiler, backend, case, pair) for case, pair in em.rotated(em.PAIRS)]
    assert _unsound(cells) == []
    enforced = [c for c in cells if c.verdict == em.ENFORCED]
    assert enforced and [c for c in enforced if not c.valid_accepted] == []


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["llguidance", "xgrammar"])
def test_no_cell_of_any_keyword_two_levels_deep_is_unsound(
    compiler: gm.GrammarCompiler, backend: str
) -> None:
    assert _unsound(em.matrix(compiler, [backend], positions=em.PAIRS)) == []


@pytest.mark.slow
def test_no_outlines_cell_is_unsound(compiler: gm.GrammarCompiler) -> None:
    """outlines builds an index per schema (seconds each): the whole column is a slow run."""
    assert _unsound(em.matrix(compiler, ["outlines"])) == []


def test_outlines_beside_anyof(compiler: gm.GrammarCompiler) -> None:
    """Where outlines was found ignoring keywords (its top level: test_enforcement.py)."""
    positions = [p for p in em.POSITIONS if p.name == "beside anyOf"]
    assert _unsound(em.matrix(compiler, ["outlines"], positions=positions)) == []


def test_a_hidden_declaration_is_found_unsound(
    smollm2: gm.Vocabulary, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The matrix can fail: with xgrammar's declarations silenced, the keywords it ignores
    beside anyOf show up as unsound cells."""
    compiler = gm.GrammarCompiler(smollm2)
    try:
        backend = compiler.backend("xgrammar")
        monkeypatch.setattr(type(backend), "unenforced", lambda self, grammar, lowered: ())
        beside = next(p for p in em.POSITIONS if p.name == "beside anyOf")
        case = next(c for c in em.KEYWORDS if c.keyword == "maxLength")
        assert em.measure(compiler, "xgrammar", case, beside).verdict == em.UNSOUND
    finally:
        compiler.close()


def test_a_hidden_declaration_two_levels_deep_is_found_unsound(
    smollm2: gm.Vocabulary, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pairs can fail: with xgrammar's declarations silenced, a const inside an allOf
    inside a oneOf branch (beside which xgrammar ignores it) shows up as unsound."""
    compiler = gm.GrammarCompiler(smollm2)
    try:
        backend = compiler.backend("xgrammar")
        monkeypatch.setattr(type(backend), "unenforced", lambda self, grammar, lowered: ())
        pair = next(p for p in em.PAIRS if p.name == "oneOf branch > allOf beside a $ref")
        case = next(c for c in em.KEYWORDS if c.keyword == "const")
        assert em.measure(compiler, "xgrammar", case, pair).verdict == em.UNSOUND
    finally:
        compiler.close()
