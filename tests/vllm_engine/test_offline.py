"""grammarmask inside vLLM's offline engine (`LLM.generate`) on SmolLM2: a mixed batch,
batch churn, and requests that fail alone."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from vllm import SamplingParams

import grammarmask as gm
from grammarmask.integrations.vllm import xargs
from grammarmask.integrations.vllm._batch import BatchRows
from grammarmask.tools.demo import DemoCase, chat_prompt, validate
from vllm_engine.prefixes import PrefixChecker

MAX_TOKENS = 256


@dataclass
class Case:
    """One request of a batch: its prompt, params, what its finished text must satisfy
    (None: no grammar), and the grammar an unfinished answer must be a prefix of."""

    name: str
    prompt: dict[str, Any]
    params: SamplingParams
    check: Callable[[str], str] | None = None
    grammar: gm.Grammar | None = None


def fullmatch(pattern: str) -> Callable[[str], str]:
    return lambda text: "valid" if re.fullmatch(pattern, text) else f"no match for {pattern}"


def is_json(text: str) -> str:
    try:
        json.loads(text)
    except json.JSONDecodeError as exc:
        return f"not JSON ({exc.msg})"
    return "valid"


def greedy(max_tokens: int = MAX_TOKENS, **extra: Any) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, **extra)


def constrained(name: str, prompt: str, grammar: gm.Grammar, check: Callable[[str], str]) -> Case:
    return Case(name, {"prompt": prompt}, greedy(extra_args=xargs(grammar)), check, grammar)


def mixed_batch(tokenizer: Any, cases: list[DemoCase]) -> list[Case]:
    """Every grammar kind and every bundled schema, between requests without a grammar."""
    batch = []
    for index, case in enumerate(cases):
        ids = {"prompt_token_ids": chat_prompt(tokenizer, case)}
        schema = case.schema
        grammar = gm.Grammar.json_schema(schema)
        batch.append(
            Case(
                f"schema:{case.name}",
                ids,
                greedy(extra_args=xargs(grammar, allow_unenforced=True)),
                lambda text, schema=schema: validate(text, schema),
                grammar,
            )
        )
        batch.append(Case(f"plain:{case.name}", ids, greedy(24 + 16 * index)))
    batch += [
        constrained("json", "A JSON list of three fruits:", gm.Grammar.json(), is_json),
        constrained(
            "regex",
            "The first moon landing happened on",
            gm.Grammar.regex(r"[0-9]{4}-[0-9]{2}-[0-9]{2}"),
            fullmatch(r"[0-9]{4}-[0-9]{2}-[0-9]{2}"),
        ),
        constrained(
            "choice",
            "Is water wet? Answer yes, no or maybe:",
            gm.Grammar.choice(["yes", "no", "maybe"]),
            fullmatch("yes|no|maybe"),
        ),
        constrained(
            "ebnf",
            "Add some numbers:",
            gm.Grammar.ebnf('root ::= num (" + " num)*\nnum ::= [1-9] [0-9]*'),
            fullmatch(r"[1-9][0-9]*( \+ [1-9][0-9]*)*"),
        ),
        Case("plain:story", {"prompt": "Once upon a time"}, greedy(100)),
    ]
    return batch


UNIQUE_IDS = {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}
"""A schema no backend enforces fully (uniqueItems): auto refuses it without the opt-in."""


def failing_requests(tokenizer: Any, cases: list[DemoCase]) -> list[Case]:
    """Requests that fail after admission: one that no backend enforces fully (auto, no
    opt-in), and one whose grammar and `allowed_token_ids` leave no token in common after
    three letters (the sampler then takes a token the grammar forbids)."""
    letters = [
        token_id
        for token, token_id in tokenizer.get_vocab().items()
        if re.fullmatch("[a-z]+", tokenizer.convert_tokens_to_string([token]))
    ]
    return [
        Case(
            "fails:unenforced",
            {"prompt": "A list of distinct ids as JSON:"},
            greedy(extra_args=xargs(gm.Grammar.json_schema(UNIQUE_IDS))),
        ),
        Case(
            "fails:forbidden-token",
            {"prompt": "Spell a word, then a number:"},
            greedy(
                40,
                allowed_token_ids=[*letters, tokenizer.eos_token_id],
                extra_args=xargs(gm.Grammar.regex("[a-z]{3}[0-9]{3}")),
            ),
        ),
    ]


def same_shape(case: Case, tokens: int) -> Case:
    """The request without its grammar, producing exactly as many tokens as it did with it:
    the engine then takes steps of the same shapes (vLLM's CPU kernels are not
    batch-invariant, so other requests' outputs are compared in identical batches)."""
    params = greedy(max(tokens, 1), min_tokens=max(tokens, 1))
    return Case(case.name, case.prompt, params)


class PluginLog(logging.Handler):
    """The plugin's log records (vLLM's loggers do not propagate to the root)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture
def plugin_log() -> Iterator[PluginLog]:
    handler = PluginLog()
    logger = logging.getLogger("vllm.grammarmask")
    logger.addHandler(handler)
    yield handler
    logger.removeHandler(handler)


def run(llm: Any, batch: list[Case]) -> list[Any]:
    outputs = llm.generate([c.prompt for c in batch], [c.params for c in batch], use_tqdm=False)
    return [output.outputs[0] for output in outputs]


def test_mixed_batch_validates_and_leaves_other_requests_untouched(
    plugin_llm: Any,
    make_llm: Callable[..., Any],
    cases: list[DemoCase],
    plugin_log: PluginLog,
    smollm2: gm.Vocabulary,
) -> None:
    tokenizer = plugin_llm.get_tokenizer()
    batch = mixed_batch(tokenizer, cases) + failing_requests(tokenizer, cases)
    outputs = run(plugin_llm, batch)

    finished = unfinished = 0
    prefixes = PrefixChecker(smollm2)
    for case, output in zip(batch, outputs, strict=True):
        if case.check is None:
            continue
        if output.finish_reason == "stop":
            finished += 1
            assert case.check(output.text) == "valid", (case.name, output.text)
        else:  # out of tokens: what it wrote must still lead to a valid answer
            assert case.grammar is not None and output.finish_reason == "length", case.name
            unfinished += 1
            verdict = prefixes.tokens(case.grammar, output.token_ids)
            assert verdict == "valid", (case.name, verdict, output.text)
    prefixes.close()
    assert finished + unfinished == sum(c.check is not None for c in batch)
    assert unfinished <= 2, "most constrained requests should finish"

    by_name = dict(zip((c.name for c in batch), outputs, strict=True))
    refused = by_name["fails:unenforced"]
    assert (refused.text, refused.finish_reason) == ("", "stop")
    forbidden = by_name["fails:forbidden-token"]
    assert re.fullmatch("[a-z]{3}", forbidden.text) and forbidden.finish_reason == "stop"
    assert len(forbidden.token_ids) < 10
    failures = [m for m in plugin_log.messages if " failed: " in m]
    assert len(failures) == 2, failures  # once per failed request
    assert any("no installed backend enforces all" in m for m in failures)
    assert any("is not allowed by the grammar" in m for m in failures)
    loose = [m for m in plugin_log.messages if "which does not enforce" in m]
    compiler = gm.GrammarCompiler(smollm2)  # the bundled schemas auto serves loosely
    try:
        expected = sum(
            not compiler.compile(
                gm.Grammar.json_schema(case.schema), "auto", allow_unenforced=True
            ).fully_enforced
            for case in cases
        )
    finally:
        compiler.close()
    assert len(loose) == expected, loose  # declared once each

    plain_llm = make_llm(additional_config={"grammarmask": {"autoload": False}})
    baseline = [
        case
        if case.check is None and not case.name.startswith("fails:")
        else same_shape(case, len(output.token_ids))
        for case, output in zip(batch, outputs, strict=True)
    ]
    without = run(plain_llm, baseline)
    for case, with_plugin, alone in zip(batch, outputs, without, strict=True):
        if case.check is None and not case.name.startswith("fails:"):
            assert with_plugin.token_ids == alone.token_ids, case.name


def test_batch_churn_keeps_every_grammar_with_its_request(
    plugin_llm: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    moves: list[tuple[int, int, bool]] = []
    replaced = 0  # steps that added requests into the rows of finished ones
    update = BatchRows.update

    def recording(self: BatchRows[Any], removed: Any, added: Any, moved: Any) -> Any:
        nonlocal replaced
        added, moved = list(added), list(moved)
        moves.extend(moved)
        gone = update(self, removed, added, moved)
        replaced += bool(added and gone)
        return gone

    monkeypatch.setattr(BatchRows, "update", recording)
    batch = []
    for i in range(40):
        letters = (i * 17) % 45 + 1  # lengths from 1 to 45 letters, interleaved
        if i % 4 == 3:
            batch.append(Case(f"plain:{i}", {"prompt": f"Item {i}:"}, greedy(letters)))
            continue
        pattern = f"item{i:02d}=[a-z]{{{letters}}}"
        batch.append(
            Case(
                f"regex:{i}",
                {"prompt": f"Write item {i} as a tag:"},
                greedy(80, extra_args=xargs(gm.Grammar.regex(pattern))),
                fullmatch(pattern),
            )
        )
    outputs = run(plugin_llm, batch)
    for case, output in zip(batch, outputs, strict=True):
        if case.check is not None:
            assert output.finish_reason == "stop", (case.name, output.text)
            assert case.check(output.text) == "valid", (case.name, output.text)
    assert sum(1 for *_, swap in moves if not swap) >= 5, moves  # the batch was compacted
    assert replaced >= 5  # and new requests took the rows of finished ones
