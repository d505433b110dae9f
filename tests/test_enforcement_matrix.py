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
        for position in em.POSITIONS:
            em.wrapped(case, position)  # raises where a wrapping changes a verdict


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
