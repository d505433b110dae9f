"""Fuzzing every bundled schema on xgrammar and llguidance, and the fuzzer catching real
looseness. Short under the default profile; HYPOTHESIS_PROFILE=long runs 500 examples per
property (or `grammarmask fuzz --examples 500`)."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
import torch
from conftest import SCHEMAS, bundled_schema
from hypothesis import settings

import grammarmask as gm
from grammarmask.tools.cli import main
from grammarmask.tools.fuzz import SchemaFuzzer, known_gap

EXAMPLES = 5 if settings.default.max_examples <= 25 else settings.default.max_examples
BACKENDS = ("xgrammar", "llguidance")


def _email_on_xgrammar(schema: Any, backend: str) -> bool:
    """xgrammar's email format refuses valid addresses such as 0@A.A.COM (found by this
    fuzzer): a completeness gap, never a soundness one."""
    return backend == "xgrammar" and '"format":"email"' in json.dumps(schema, separators=(",", ":"))


@pytest.fixture(scope="module")
def fuzz_compiler(deepseek: gm.Vocabulary) -> gm.GrammarCompiler:
    return gm.GrammarCompiler(deepseek, timeout_s=600)


@pytest.mark.parametrize("name", sorted(p.stem for p in SCHEMAS.glob("*.json")))
def test_bundled_schema_survives_every_property(
    name: str, deepseek: gm.Vocabulary, fuzz_compiler: gm.GrammarCompiler
) -> None:
    schema = bundled_schema(name)
    grammar = gm.Grammar.json_schema(schema)
    compiled = {b: fuzz_compiler.compile(grammar, b) for b in BACKENDS}
    fuzzer = SchemaFuzzer(name, schema, compiled, deepseek, examples=EXAMPLES)
    for backend in BACKENDS:
        fuzzer.soundness(backend)
        fuzzer.state(backend)
        if not _email_on_xgrammar(schema, backend):  # shrinking that known gap takes minutes
            fuzzer.completeness(backend)
    fuzzer.differential(BACKENDS)
    report = fuzzer.report
    assert not report.findings, "\n".join(map(str, report.findings))
    for backend in BACKENDS:
        counts = report.counts[backend]
        assert counts["walks"] >= EXAMPLES and counts["state_sequences"] >= EXAMPLES
        if '"format": "email"' not in json.dumps(schema):  # random walks wander in local parts
            assert counts["walks_terminated"] >= 1, f"{backend}: no walk reached a stop token"


def test_soundness_catches_an_undeclared_looseness_with_a_reproducing_command(
    deepseek: gm.Vocabulary, fuzz_compiler: gm.GrammarCompiler
) -> None:
    schema = {"type": "integer", "minimum": 1, "multipleOf": 7}
    real = fuzz_compiler.compile(gm.Grammar.json_schema(schema), "xgrammar")
    assert [u.keyword for u in real.unenforced] == ["multipleOf"]
    declared = SchemaFuzzer("seven.json", schema, {"xgrammar": real}, deepseek, examples=EXAMPLES)
    report = declared.run(["soundness"])
    assert not report.findings and report.counts["xgrammar"]["walks_declared"] >= 1
    # The same real grammar, claiming to enforce everything: the walks must catch it.
    hidden = dataclasses.replace(real, unenforced=())
    runs = [
        SchemaFuzzer(
            "seven.json", schema, {"xgrammar": hidden}, deepseek, examples=EXAMPLES, seed=3
        ).run(["soundness"])
        for _ in range(2)
    ]
    [finding] = runs[0].findings
    assert [f.message for f in runs[1].findings] == [finding.message]  # the seed replays it
    assert finding.prop == "soundness" and "invalid for the schema" in finding.message
    assert finding.command == (
        f"grammarmask fuzz seven.json --backend xgrammar --seed 3 --examples {EXAMPLES} "
        "--max-tokens 256"
    )


def test_differential_reports_backends_that_disagree(
    deepseek: gm.Vocabulary, fuzz_compiler: gm.GrammarCompiler
) -> None:
    four = {"type": "string", "minLength": 4, "maxLength": 4}
    compiled = {
        "xgrammar": fuzz_compiler.compile(gm.Grammar.json_schema(four), "xgrammar"),
        "llguidance": fuzz_compiler.compile(
            gm.Grammar.json_schema({"type": "string", "maxLength": 3}), "llguidance"
        ),
    }
    fuzzer = SchemaFuzzer("four", four, compiled, deepseek, examples=max(EXAMPLES, 10))
    fuzzer.differential(BACKENDS)
    [finding] = fuzzer.report.findings
    assert finding.backend == "xgrammar+llguidance" and "disagree" in finding.message
    assert "--backend xgrammar --backend llguidance" in finding.command


def test_known_gaps_name_their_cause() -> None:
    assert known_gap('"a\\nb"') is not None and "escape" in str(known_gap('"a\\nb"'))
    assert known_gap('"\x85"') is not None
    assert known_gap('{"x":1e+16}') is not None
    assert known_gap('{"e1":"e","n":10}') is None
    assert "e-mail" in str(known_gap('{"to":"0@a.a.com"}'))
    assert known_gap('{"to":"0@a.ab.com"}') is None


def test_fuzz_cli_prints_a_table_and_refuses_unknown_backends(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ["fuzz", "function_call", "--backend", "xgrammar", "--examples", "3"]
    assert main([*args, "--property", "soundness", "--property", "state"]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("function_call"))
    assert row.split()[:4] == ["function_call", "xgrammar", "full", "3"]
    assert main(["fuzz", "function_call", "--backend", "nonesuch"]) == 2
    assert main(["fuzz", "no_such_schema"]) == 2


def test_xgrammar_refuses_encoded_surrogates(
    deepseek: gm.Vocabulary, fuzz_compiler: gm.GrammarCompiler
) -> None:
    from grammarmask.tools.conformance import byte_token_ids, feed

    byte_ids = byte_token_ids(deepseek)
    matcher = fuzz_compiler.compile(
        gm.Grammar.json_schema({"type": "string"}), "xgrammar"
    ).matcher()
    """xgrammar 0.2.9 accepts the UTF-8 form of a surrogate (ED A1 A1) in JSON strings
    (found by `grammarmask fuzz product_review --backend xgrammar --examples 50`); the
    backend's filter refuses it, also when ED and A1 come in different tokens, in accept,
    fill and fill_drafts alike."""
    assert feed(matcher, [byte_ids[b] for b in b'"\xed\xa1\xa1"']) == (False, 2)
    matcher.reset()
    assert matcher.accept(byte_ids[ord('"')]) and matcher.accept(byte_ids[0xED])
    words = gm.words_per_row(deepseek.size)
    row = torch.zeros(1, words, dtype=torch.int32)
    matcher.fill(row, 0)
    assert not _allows(row[0], byte_ids[0xA1]) and _allows(row[0], byte_ids[0x9F])
    matcher.rollback(1)
    drafts = torch.zeros(2, words, dtype=torch.int32)
    assert matcher.fill_drafts(drafts, [0, 1], [byte_ids[0xED]]) == 1
    assert _allows(drafts[0], byte_ids[0xED]) and not _allows(drafts[1], byte_ids[0xA1])
    assert torch.equal(drafts[1], row[0])


def _allows(row: torch.Tensor, token_id: int) -> bool:
    return bool((int(row[token_id >> 5]) >> (token_id & 31)) & 1)
