"""The plugin's processor driven as vLLM's model runner drives it, with vLLM's own
BatchUpdate and config classes: what the CPU engine here never does (async scheduling's
placeholder tokens) and what takes too many requests for an engine run (10,000 requests)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch
from vllm import SamplingParams
from vllm.config import VllmConfig
from vllm.engine.arg_utils import EngineArgs
from vllm.v1.sample.logits_processor import BatchUpdate, MoveDirectionality

import grammarmask as gm
from grammarmask.integrations.vllm import (
    EntryPointGrammarLogitsProcessor,
    GrammarLogitsProcessor,
    xargs,
)
from vllm_engine.engines import PLUGIN, engine_args

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def vllm_config(model_dir: Path) -> VllmConfig:
    args = engine_args(model_dir, logits_processors=[PLUGIN])
    return EngineArgs(**args).create_engine_config()


@pytest.fixture
def configured(vllm_config: VllmConfig) -> Iterator[Any]:
    """Builds processors for the config with `additional_config` set as asked (backend
    xgrammar unless asked otherwise: `expected` reads its masks off xgrammar)."""
    made: list[GrammarLogitsProcessor] = []
    saved = vllm_config.additional_config, vllm_config.model_config.logits_processors

    def build(
        cls: type[GrammarLogitsProcessor] = GrammarLogitsProcessor,
        named: Sequence[Any] | None = (PLUGIN,),
        **settings: Any,
    ) -> GrammarLogitsProcessor:
        vllm_config.additional_config = {"grammarmask": {"backend": "xgrammar", **settings}}
        vllm_config.model_config.logits_processors = list(named) if named else None
        processor = cls(vllm_config, torch.device("cpu"), False)
        made.append(processor)
        return processor

    yield build
    vllm_config.additional_config, vllm_config.model_config.logits_processors = saved


@pytest.fixture(scope="module")
def tokenizer(model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


def update(
    size: int,
    added: Sequence[tuple[int, SamplingParams, list[int]]] = (),
    removed: Sequence[int] = (),
    moved: Sequence[tuple[int, int, MoveDirectionality]] = (),
) -> BatchUpdate:
    return BatchUpdate(
        batch_size=size,
        removed=list(removed),
        added=[(index, params, [], output) for index, params, output in added],
        moved=list(moved),
    )


def asking(grammar: gm.Grammar | None) -> SamplingParams:
    return SamplingParams(extra_args=xargs(grammar) if grammar is not None else None)


def allowed(processor: GrammarLogitsProcessor, rows: int) -> list[set[int]]:
    """Run `apply` on zero logits: the tokens each row keeps."""
    logits = processor.apply(torch.zeros(rows, processor.vocab.size))
    return [set(torch.isfinite(row).nonzero().flatten().tolist()) for row in logits]


def expected(vocab: gm.Vocabulary, grammar: gm.Grammar, tokens: Sequence[int]) -> set[int]:
    """What a matcher of its own allows after `tokens`."""
    matcher = gm.GrammarCompiler(vocab).compile(grammar, "xgrammar").matcher()
    for token in tokens:
        assert matcher.accept(token)
    row = torch.zeros(1, gm.words_per_row(vocab.size), dtype=torch.int32)
    matcher.fill(row, 0)
    bits = (row[0].view(-1, 1) >> torch.arange(32)) & 1
    return set(bits.flatten()[: vocab.size].nonzero().flatten().tolist())


def pool_of(processor: GrammarLogitsProcessor) -> gm.MatcherPool:
    pool = processor._side.plugin.pool
    assert pool is not None
    return pool


def test_validate_params_refuses_a_malformed_entry_with_its_reason() -> None:
    GrammarLogitsProcessor.validate_params(asking(gm.Grammar.json()))
    GrammarLogitsProcessor.validate_params(SamplingParams())
    bad = SamplingParams(extra_args={"grammarmask": '{"json_schema": {"type": "objekt"}}'})
    with pytest.raises(ValueError, match=r"grammarmask: .*not a valid JSON Schema"):
        GrammarLogitsProcessor.validate_params(bad)


def test_async_scheduling_placeholders_are_committed_before_the_mask(
    configured: Any, tokenizer: Any
) -> None:
    processor = configured()
    grammar = gm.Grammar.json_schema(PERSON)
    text = tokenizer.encode('{"name":"Ada","age', add_special_tokens=False)
    first, second = [], []
    processor.update_state(update(3, [(0, asking(grammar), first), (2, asking(grammar), second)]))
    rows = allowed(processor, 3)
    assert rows[0] == rows[2] == expected(processor.vocab, grammar, [])
    assert rows[1] == set(range(processor.vocab.size))  # no grammar: untouched

    for step, token in enumerate(text):
        first.append(-1)  # the async scheduler's placeholder at update_state time
        second.append(token)  # a request whose token is already known
        processor.update_state(None)
        first[-1] = token  # filled in by vLLM just before the sampler
        rows = allowed(processor, 3)
        want = expected(processor.vocab, grammar, text[: step + 1])
        assert rows[0] == want and rows[2] == want


def test_a_placeholder_never_filled_in_ends_its_request_alone(
    configured: Any, tokenizer: Any, plugin_log: list[str]
) -> None:
    processor = configured()
    grammar = gm.Grammar.choice(["yes", "no"])
    lost, kept = [], []
    processor.update_state(update(2, [(0, asking(grammar), lost), (1, asking(grammar), kept)]))
    allowed(processor, 2)
    lost.append(-1)
    processor.update_state(None)
    rows = allowed(processor, 2)
    assert rows[0] == set(processor.vocab.stop_token_ids)
    assert rows[1] == expected(processor.vocab, grammar, [])
    assert len(plugin_log) == 1 and "did not pass the sampled tokens" in plugin_log[0]


def test_a_forbidden_token_fails_one_request_and_no_other_row_changes(
    configured: Any, tokenizer: Any, plugin_log: list[str]
) -> None:
    grammar = gm.Grammar.json_schema(PERSON)
    good = tokenizer.encode('{"name":"Bo","age":4', add_special_tokens=False)
    bad = [*good[:2], tokenizer.encode("]", add_special_tokens=False)[0], *good[3:]]

    processor = configured()

    def run(second: list[int]) -> list[list[set[int]]]:
        processor = configured()
        outputs: list[list[int]] = [[], [], []]
        processor.update_state(
            update(3, [(i, asking(grammar if i != 1 else None), outputs[i]) for i in range(3)])
        )
        steps = [allowed(processor, 3)]
        for index in range(len(good)):
            outputs[0].append(good[index])
            outputs[1].append(good[index])
            outputs[2].append(second[index])
            processor.update_state(None)
            steps.append(allowed(processor, 3))
        return steps

    clean, faulty = run(good), run(bad)
    stops = set(processor.vocab.stop_token_ids)
    for step, (a, b) in enumerate(zip(clean, faulty, strict=True)):
        assert a[0] == b[0] and a[1] == b[1], f"step {step}: another row changed"
        if step > 2:
            assert b[2] == stops, f"step {step}: the failed request may still produce text"
    assert len(plugin_log) == 1 and "is not allowed by the grammar" in plugin_log[0]


def test_moves_and_swaps_carry_each_grammar_with_its_request(configured: Any) -> None:
    processor = configured()
    yes, number = gm.Grammar.choice(["yes"]), gm.Grammar.regex("[0-9]+")
    processor.update_state(update(3, [(0, asking(yes), []), (2, asking(number), [])]))
    want_yes, want_number = (expected(processor.vocab, g, []) for g in (yes, number))
    assert allowed(processor, 3)[0::2] == [want_yes, want_number]
    processor.update_state(update(3, moved=[(0, 2, MoveDirectionality.SWAP)]))
    assert allowed(processor, 3)[0::2] == [want_number, want_yes]
    processor.update_state(
        update(2, removed=[0], moved=[(2, 0, MoveDirectionality.UNIDIRECTIONAL)])
    )
    rows = allowed(processor, 2)
    assert rows[0] == want_yes and rows[1] == set(range(processor.vocab.size))


def test_ten_thousand_requests_leave_the_pool_and_memory_flat(
    configured: Any, tokenizer: Any
) -> None:
    processor = configured()
    grammars = [gm.Grammar.json_schema(PERSON), gm.Grammar.regex(r"\{[a-z]*\}"), gm.Grammar.json()]
    token = tokenizer.encode("{", add_special_tokens=False)[0]
    process = psutil.Process()
    batch, served, rss = 16, 0, []
    while served < 10_000:
        outputs: list[list[int]] = [[] for _ in range(batch)]
        added = [(i, asking(grammars[(served + i) % 3]), outputs[i]) for i in range(batch)]
        processor.update_state(update(batch, added, removed=range(batch) if served else ()))
        allowed(processor, batch)
        for output in outputs:
            output.append(token)
        processor.update_state(None)
        processor.apply(torch.zeros(batch, processor.vocab.size))
        served += batch
        if served in (1_008, 10_000):
            rss.append(process.memory_info().rss)  # now, not the peak: a leak shows
    processor.update_state(update(0, removed=range(batch)))
    assert processor.tracked() == []
    pool = pool_of(processor)
    assert all(pool.state(f"vllm-{i}").reason.startswith("unknown request id") for i in (0, 9_999))
    growth_mb = (rss[1] - rss[0]) / 2**20
    assert growth_mb < 32, f"memory grew {growth_mb:.1f} MB from 1,008 to 10,000 requests"


def test_the_entry_point_instance_stands_aside_for_the_named_one(configured: Any) -> None:
    aside = configured(EntryPointGrammarLogitsProcessor)
    logits = torch.zeros(1, 8)
    aside.update_state(update(1, [(0, asking(gm.Grammar.json()), [])]))
    assert aside.apply(logits) is logits and torch.equal(logits, torch.zeros(1, 8))
    serving = configured(EntryPointGrammarLogitsProcessor, named=None)
    serving.update_state(update(1, [(0, asking(gm.Grammar.json()), [])]))
    assert allowed(serving, 1)[0] == expected(serving.vocab, gm.Grammar.json(), [])


def test_switched_off_it_ends_grammar_requests_instead_of_ignoring_them(
    configured: Any, plugin_log: list[str]
) -> None:
    off = configured(EntryPointGrammarLogitsProcessor, named=None, autoload=False)
    off.update_state(update(2, [(0, asking(gm.Grammar.json()), []), (1, asking(None), [])]))
    rows = allowed(off, 2)
    assert rows[0] == set(off.vocab.stop_token_ids)
    assert rows[1] == set(range(off.vocab.size))
    refused = [m for m in plugin_log if " failed: " in m]
    assert len(refused) == 1 and "switched off on this engine" in refused[0], plugin_log
    off.update_state(None)
    allowed(off, 2)
    assert len([m for m in plugin_log if " failed: " in m]) == 1  # logged once
