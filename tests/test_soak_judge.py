"""The server soak's judge (`grammarmask soak`), on answers written here: it must call a
broken answer broken, or the soak's "0 broken" would say nothing."""

from __future__ import annotations

import grammarmask as gm
from grammarmask.resources import bundled_sample_dir
from grammarmask.tools.soak import (
    Answer,
    SoakCase,
    SoakReport,
    adversarial_cases,
    judge_answers,
    retitled_copies,
    schema_cases,
)

NUMBER = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
UNIQUE = {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}


def case(name: str, grammar: gm.Grammar) -> SoakCase:
    return SoakCase(name, {}, grammar)


def test_answers_are_judged_whole_or_as_prefixes(smollm2: gm.Vocabulary) -> None:
    number = case("number", gm.Grammar.json_schema(NUMBER))
    unique = case("unique", gm.Grammar.json_schema(UNIQUE))  # auto declares uniqueItems
    digits = case("digits", gm.Grammar.regex("[0-9]{3}"))
    answers = [
        Answer(number, text='{"n":3}', finish="stop"),
        Answer(number, text='{"n":"x"}', finish="stop"),
        Answer(unique, text="[1,1]", finish="stop"),
        Answer(number, text='{"n":', finish="length"),
        Answer(number, text='{"m":', finish="length"),
        Answer(digits, text="123", finish="stop"),
        Answer(digits, text="12", finish="stop"),
        Answer(digits, text="12", finish="stop", request_id="chatcmpl-7"),  # ended early
        Answer(number, status="400"),
    ]
    report = SoakReport(len(answers), 0, 1, 0, 0.0)
    judge_answers(answers, smollm2, {"chatcmpl-7-0a1b"}, report)
    assert [a.verdict for a in answers] == [
        "valid",
        "broken",
        "declared",
        "valid prefix",
        "broken prefix",
        "valid",
        "broken",
        "valid prefix",
        "",
    ]
    assert len(report.broken) == 3


def test_the_cases_cover_the_corpus_and_the_adversarial_grammars() -> None:
    files = sorted(bundled_sample_dir().glob("*.json"))
    copies = retitled_copies(schema_cases(files), 3)
    assert len(copies) == 3 * len(files)
    keys = {c.grammar.key for c in copies if c.grammar is not None}
    assert len(keys) == len(copies)  # each copy is a compile of its own
    adversarial = {c.name: c for c in adversarial_cases()}
    for refused in ("schema:150-deep", "ebnf:malformed", "entry:unknown-key"):
        assert adversarial[f"adversarial:{refused}"].grammar is None
    assert adversarial["adversarial:choice:20000"].grammar is not None
