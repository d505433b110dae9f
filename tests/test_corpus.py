"""Sweeps over ../shared/corpus/maskbench (set GRAMMARMASK_CORPUS to move it).

Not part of the default run: `pytest -m corpus`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import allowed_ids
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from test_backends import BACKENDS, _dialect_difference
from test_pool import check_draft_rows, draw_step

import grammarmask as gm

pytestmark = pytest.mark.corpus

AGREEMENT_SCHEMAS = [
    "Github_easy---o10008.json",
    "Kubernetes---kb_1056_Normalized.json",
    "Glaiveai2K---analyze_social_media_sentiment_6ef0069e.json",
    "BFCL_simple_1.json",
    "JME_11.json",
    "BFCL_parallel_0.json",
]


def _entry(corpus_dir: Path, name: str) -> dict[str, Any]:
    return json.loads((corpus_dir / name).read_text(encoding="utf-8"))


@pytest.mark.parametrize("vocab_name", ["deepseek", "qwen", "smollm2"])
def test_corpus_schema_compiles_on_both_backends_with_real_vocabularies(
    vocab_name: str, request: pytest.FixtureRequest, corpus_dir: Path
) -> None:
    vocab: gm.Vocabulary = request.getfixturevalue(vocab_name)
    schema = _entry(corpus_dir, "Glaiveai2K---analyze_stock_market_8b93e3e7.json")["schema"]
    compiler = gm.GrammarCompiler(vocab, timeout_s=600)
    for backend in BACKENDS:
        compiled = compiler.compile(gm.Grammar.json_schema(schema), backend)
        assert compiled.fully_enforced
        assert compiled.matcher().accept(
            next(i for i, t in enumerate(vocab.token_bytes) if t == b"{")
        )
    compiler.close()


@pytest.mark.parametrize("name", AGREEMENT_SCHEMAS)
def test_backends_agree_on_corpus_instances(
    name: str,
    corpus_dir: Path,
    deepseek_compiler: gm.GrammarCompiler,
    deepseek: gm.Vocabulary,
    deepseek_encode: Callable[[str], list[int]],
) -> None:
    entry = _entry(corpus_dir, name)
    # outlines-core closes every object; strict mode makes xgrammar do the same.
    grammar = gm.Grammar.json_schema(entry["schema"], strict=True)
    compiled = {b: deepseek_compiler.compile(grammar, b) for b in BACKENDS}
    assert all(c.fully_enforced for c in compiled.values())
    completed = 0
    for test in entry["tests"]:
        if not test["valid"]:
            continue
        ids = deepseek_encode(json.dumps(test["data"], separators=(",", ":"), ensure_ascii=False))
        matchers = {b: c.matcher() for b, c in compiled.items()}
        for position in range(len(ids) + 1):
            xg, ol = (allowed_ids(matchers[b], deepseek.size) for b in BACKENDS)
            unexplained = [i for i in xg ^ ol if not _dialect_difference(deepseek.token_bytes[i])]
            assert not unexplained, (position, [deepseek.token_bytes[i] for i in unexplained[:5]])
            if position == len(ids):
                completed += all(m.can_stop() for m in matchers.values())
                break
            accepted = [matchers[b].accept(ids[position]) for b in BACKENDS]
            assert accepted[0] == accepted[1], (position, accepted)
            if not accepted[0]:
                break  # both refuse (e.g. key order differs from the schema's): stop here
    assert completed >= 1, "no valid instance was walked to its end"


@pytest.fixture(scope="module")
def corpus_files(corpus_dir: Path) -> list[Path]:
    return sorted(p for p in corpus_dir.glob("*.json") if p.stat().st_size < 20_000)


@pytest.fixture(scope="module")
def corpus_compiler(deepseek: gm.Vocabulary) -> gm.GrammarCompiler:
    return gm.GrammarCompiler(deepseek)


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow],
)
@given(data=st.data())
def test_draft_rows_on_random_corpus_schemas(
    data: st.DataObject,
    corpus_files: list[Path],
    corpus_compiler: gm.GrammarCompiler,
    deepseek: gm.Vocabulary,
    deepseek_encode: Callable[[str], list[int]],
) -> None:
    """Invariants 1 and 2 of docs/design.md on random MaskBench schemas, replaying their valid
    instances."""
    compiler = corpus_compiler
    entry = json.loads(data.draw(st.sampled_from(corpus_files)).read_text(encoding="utf-8"))
    valid = [t["data"] for t in entry.get("tests", []) if t["valid"]]
    assume(valid)
    try:
        grammar = gm.Grammar.json_schema(entry["schema"])
        compiled = compiler.compile(grammar, "xgrammar", timeout_s=30)
    except gm.GrammarError:
        assume(False)
        return
    ids = deepseek_encode(json.dumps(valid[0], separators=(",", ":"), ensure_ascii=False))
    matcher = compiled.matcher()
    accepted = 0
    while accepted < len(ids) and matcher.accept(ids[accepted]):
        accepted += 1
    assume(accepted > 1)
    committed, drafts = draw_step(data, ids, accepted, deepseek.size)
    check_draft_rows(deepseek, compiler, grammar, ids[:committed], drafts)
