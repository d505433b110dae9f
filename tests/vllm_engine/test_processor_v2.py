"""The plugin under Model Runner V2, driven as the runner drives it (`runner_v2.V2Runner`:
vLLM's RequestState, LogitsProcRequestState and LogitsContext over the CPU buffers of
vLLM's CPU V2 runner): the loaders, a replayed speculative trace with slot reuse, a
resumed request and rows without a grammar, failures that end one request, and 10,000
requests through recycled slots."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch
from vllm import SamplingParams
from vllm.config import VllmConfig
from vllm.engine.arg_utils import EngineArgs
from vllm.exceptions import VLLMValidationError
from vllm.v1.sample.logits_processor import _load_custom_logitsprocs
from vllm.v1.worker.gpu.sample.logits_processor.loader import (
    _load_v2_logitsprocs,
    build_custom_logits_processors_params_validator,
)

import grammarmask as gm
from grammarmask.integrations.vllm import (
    EntryPointGrammarLogitsProcessor,
    GrammarLogitsProcessor,
    xargs,
)
from grammarmask.integrations.vllm._v2 import V2Processor
from vllm_engine.engines import PLUGIN, engine_args
from vllm_engine.runner_v2 import V2Runner

NUM_DRAFTS = 3
PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 8}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}
GRAMMARS = (
    gm.Grammar.json_schema(PERSON),
    gm.Grammar.regex(r"[a-z]{2,6}-[0-9]{1,3}"),
    gm.Grammar.choice(["alpha", "beta", "gamma delta"]),
)


@pytest.fixture(scope="module")
def spec_config(model_dir: Path) -> VllmConfig:
    """The engine's config with ngram speculative decoding, 3 drafts a step."""
    speculative = {
        "method": "ngram",
        "num_speculative_tokens": NUM_DRAFTS,
        "prompt_lookup_max": 3,
        "prompt_lookup_min": 1,
    }
    args = engine_args(model_dir, logits_processors=[PLUGIN], speculative_config=speculative)
    return EngineArgs(**args).create_engine_config()


@pytest.fixture
def make_runner(spec_config: VllmConfig) -> Iterator[Callable[..., V2Runner]]:
    """Runners over the spec-decoding config (`drafts=False`: without speculative
    decoding), `additional_config` as asked; xgrammar, which the reference reads."""
    saved = (
        spec_config.additional_config,
        spec_config.model_config.logits_processors,
        spec_config.speculative_config,
    )

    def build(
        classes: Sequence[type] = (GrammarLogitsProcessor,),
        named: bool = True,
        drafts: bool = True,
        max_num_reqs: int = 6,
        **settings: Any,
    ) -> V2Runner:
        spec_config.additional_config = {"grammarmask": {"backend": "xgrammar", **settings}}
        spec_config.model_config.logits_processors = [PLUGIN] if named else None
        spec_config.speculative_config = saved[2] if drafts else None
        vocab_size = spec_config.model_config.get_vocab_size()
        return V2Runner(spec_config, classes, vocab_size, max_num_reqs=max_num_reqs)

    yield build
    (
        spec_config.additional_config,
        spec_config.model_config.logits_processors,
        spec_config.speculative_config,
    ) = saved


@pytest.fixture(scope="module")
def vocab(spec_config: VllmConfig) -> gm.Vocabulary:
    from transformers import AutoTokenizer

    return gm.Vocabulary.from_transformers(
        AutoTokenizer.from_pretrained(spec_config.model_config.tokenizer)
    )


def asking(grammar: gm.Grammar | None, max_tokens: int = 40) -> SamplingParams:
    extra = xargs(grammar) if grammar is not None else None
    return SamplingParams(max_tokens=max_tokens, extra_args=extra)


def allowed_rows(logits: torch.Tensor) -> list[set[int]]:
    return [set(torch.isfinite(row).nonzero().flatten().tolist()) for row in logits]


class Reference:
    """A matcher of its own per grammar request: what the masks must allow."""

    def __init__(self, vocab: gm.Vocabulary) -> None:
        self._compiler = gm.GrammarCompiler(vocab)
        self._vocab = vocab

    def matcher(self, grammar: gm.Grammar, tokens: Sequence[int]) -> Any:
        matcher = self._compiler.compile(grammar, "xgrammar").matcher()
        for token in tokens:
            if not matcher.accept(token):
                return None
        return matcher

    def allowed(self, matcher: Any) -> torch.Tensor:
        row = torch.zeros(1, gm.words_per_row(self._vocab.size), dtype=torch.int32)
        matcher.fill(row, 0)
        bits = (row[0].view(-1, 1) >> torch.arange(32, dtype=torch.int32)) & 1
        return bits.flatten()[: self._vocab.size].bool()


@dataclass
class Trace:
    """What a replayed speculative trace saw."""

    outputs: dict[str, list[int]] = field(default_factory=dict)
    finished: set[str] = field(default_factory=set)
    grammar_of: dict[str, gm.Grammar | None] = field(default_factory=dict)
    accepted_drafts: int = 0
    forbidden_drafts: int = 0
    slots_reused: int = 0
    resumed: int = 0
    untouched_rows_changed: int = 0


def replay(runner: V2Runner, vocab: gm.Vocabulary, requests: int = 14, seed: int = 0) -> Trace:
    """A speculative-decoding trace: requests with and without grammars, 3 drafts a step
    (most of them what the masked greedy choice will be, some any token: often one the
    grammar forbids), greedy verification as vLLM's rejection sampler does it on the
    masked logits (drafts accepted while they equal the choice, then the bonus token),
    finished requests freeing their slots for new ones, and one request preempted and
    resumed with its partial output. Logits are noise: only the masks keep text valid."""
    rng = random.Random(seed)
    torch.manual_seed(seed)
    reference = Reference(vocab)
    stops = set(vocab.stop_token_ids)
    trace = Trace()
    waiting = [f"req-{i}" for i in range(requests)]
    running: list[str] = []
    ever_used: set[int] = set()
    prompts: dict[str, list[int]] = {}
    preempt_at = 6

    def admit(req_id: str, output: Sequence[int] = ()) -> None:
        grammar = trace.grammar_of[req_id]
        slot = runner.add(req_id, prompts[req_id], asking(grammar), output)
        if slot in ever_used:
            trace.slots_reused += 1
        ever_used.add(slot)
        running.append(req_id)

    for index, req_id in enumerate(waiting):
        trace.grammar_of[req_id] = None if index % 3 == 2 else GRAMMARS[(index // 3) % 3]
        prompts[req_id] = [rng.randrange(100, 1000) for _ in range(rng.randint(3, 9))]
        trace.outputs[req_id] = []

    step = 0
    while waiting or running:
        while waiting and len(running) < runner.max_num_reqs:
            admit(waiting.pop(0))
        if step == preempt_at and running:
            victim = next(r for r in running if trace.grammar_of[r] is not None)
            running.remove(victim)
            runner.finish(victim)
            admit(victim, trace.outputs[victim])
            trace.resumed += 1
        runner.before_forward()

        batch: list[tuple[str, list[int]]] = []
        planned: dict[str, list[torch.Tensor]] = {}
        for req_id in running:
            grammar = trace.grammar_of[req_id]
            matcher = (
                reference.matcher(grammar, trace.outputs[req_id]) if grammar is not None else None
            )
            rows, drafts, on_path = [], [], True
            for _ in range(NUM_DRAFTS + 1):
                noise = torch.randn(vocab.size) * 4
                rows.append(noise)
                if len(drafts) == NUM_DRAFTS:
                    break
                choice = noise.clone()
                if matcher is not None and on_path:
                    choice[~reference.allowed(matcher)] = float("-inf")
                token = int(choice.argmax())
                if not on_path or rng.random() < 0.25:
                    token, on_path = rng.randrange(vocab.size), False
                elif matcher is not None and token not in stops:
                    on_path = matcher.accept(token)
                drafts.append(token)
            batch.append((req_id, drafts))
            planned[req_id] = rows
        ctx = runner.context(batch)
        logits = torch.stack([row for req_id, _ in batch for row in planned[req_id]])
        masked = runner.sample_logits(logits.clone(), ctx)

        row = 0
        for req_id, drafts in batch:
            count = len(drafts) + 1
            mine, raw = masked[row : row + count], logits[row : row + count]
            if trace.grammar_of[req_id] is None and not torch.equal(mine, raw):
                trace.untouched_rows_changed += 1
            row += count
            choices = [int(r.argmax()) for r in mine]
            accepted: list[int] = []
            for j, draft in enumerate(drafts):
                if draft != choices[j]:
                    break
                accepted.append(draft)
            trace.accepted_drafts += len(accepted)
            if len(accepted) < len(drafts):
                grammar = trace.grammar_of[req_id]
                if grammar is not None:
                    prefix = [*trace.outputs[req_id], *accepted]
                    matcher = reference.matcher(grammar, prefix)
                    rejected = drafts[len(accepted)]
                    if matcher is not None and not reference.allowed(matcher)[rejected]:
                        trace.forbidden_drafts += 1
            accepted.append(choices[len(accepted)])
            for position, token in enumerate(accepted):
                if token in stops:
                    accepted = accepted[: position + 1]
                    break
            runner.append(req_id, accepted)
            trace.outputs[req_id].extend(accepted)
            done = accepted[-1] in stops or len(trace.outputs[req_id]) >= 40
            if done:
                trace.finished.add(req_id)
                running.remove(req_id)
                runner.finish(req_id)
        step += 1
    return trace


def invalid_outputs(trace: Trace, vocab: gm.Vocabulary) -> list[str]:
    """The grammar requests whose output a fresh matcher refuses (or that stopped where
    the grammar cannot end)."""
    reference = Reference(vocab)
    stops = set(vocab.stop_token_ids)
    wrong = []
    for req_id, grammar in trace.grammar_of.items():
        if grammar is None:
            continue
        tokens = trace.outputs[req_id]
        text = [t for t in tokens if t not in stops]
        matcher = reference.matcher(grammar, text)
        if matcher is None or (tokens and tokens[-1] in stops and not matcher.can_stop()):
            wrong.append(req_id)
    return wrong


# ---------------------------------------------------------------------- loading


def test_both_runners_load_the_entry_point_and_the_named_class() -> None:
    validate = build_custom_logits_processors_params_validator(())
    validate(asking(gm.Grammar.json()))
    bad = SamplingParams(extra_args={"grammarmask": '{"json_schema": {"type": "objekt"}}'})
    with pytest.raises(VLLMValidationError, match=r"grammarmask: .*not a valid JSON Schema"):
        validate(bad)
    for load in (_load_v2_logitsprocs, _load_custom_logitsprocs):
        loaded = load([PLUGIN])
        assert EntryPointGrammarLogitsProcessor in loaded and GrammarLogitsProcessor in loaded


# ---------------------------------------------------------------------- the trace


def test_a_replayed_speculative_trace_keeps_every_output_valid(
    make_runner: Callable[..., V2Runner], vocab: gm.Vocabulary
) -> None:
    trace = replay(make_runner(), vocab)
    assert invalid_outputs(trace, vocab) == []
    assert trace.untouched_rows_changed == 0, "a row without a grammar changed"
    assert len(trace.finished) == len(trace.grammar_of)
    # the trace covers what it claims to
    assert trace.accepted_drafts >= 20 and trace.forbidden_drafts >= 5
    assert trace.slots_reused >= 5 and trace.resumed == 1


@pytest.mark.parametrize("mutant", ["drafts ignored", "slot reuse ignored"])
def test_the_trace_catches_a_processor_that_ignores_drafts_or_slot_reuse(
    make_runner: Callable[..., V2Runner],
    vocab: gm.Vocabulary,
    monkeypatch: pytest.MonkeyPatch,
    mutant: str,
) -> None:
    if mutant == "drafts ignored":
        original_rows = V2Processor._rows

        def rows_without_drafts(self: V2Processor, logits: Any, ctx: Any, slots: Any) -> Any:
            step = original_rows(self, logits, ctx, slots)
            for slot in step.rows:
                step.rows[slot][1:] = []
                step.drafts[slot].clear()
            return step

        monkeypatch.setattr(V2Processor, "_rows", rows_without_drafts)
    else:
        original_add = V2Processor.add_request

        def add_keeping_the_occupant(self: V2Processor, slot: int, params: Any) -> bool:
            if slot in self._slots:
                return True
            return original_add(self, slot, params)

        monkeypatch.setattr(V2Processor, "add_request", add_keeping_the_occupant)
    trace = replay(make_runner(), vocab)
    assert invalid_outputs(trace, vocab), f"{mutant}: the trace did not notice"


def test_without_speculative_decoding_the_fill_runs_beside_the_forward(
    make_runner: Callable[..., V2Runner], vocab: gm.Vocabulary
) -> None:
    runner = make_runner(drafts=False)
    processor = runner.processors[0]
    grammar = GRAMMARS[1]
    runner.add("a", [5, 6, 7], asking(grammar))
    runner.add("b", [8, 9], asking(None))
    runner.before_forward()
    side = processor._side
    assert side._future is not None and side._filled  # started before the forward
    reference = Reference(vocab)
    ctx = runner.context([("b", []), ("a", [])])  # batch order differs from slot order
    logits = torch.randn(2, vocab.size)
    masked = runner.sample_logits(logits.clone(), ctx)
    assert torch.equal(masked[0], logits[0])
    want = reference.allowed(reference.matcher(grammar, []))
    assert torch.equal(torch.isfinite(masked[1]), want)


# ---------------------------------------------------------------------- failures


def test_a_history_vllm_rewrote_ends_that_request_alone(
    make_runner: Callable[..., V2Runner], vocab: gm.Vocabulary, plugin_log: list[str]
) -> None:
    runner = make_runner()
    grammar = GRAMMARS[1]
    runner.add("short", [5, 6], asking(grammar))
    runner.add("fine", [7, 8], asking(grammar))
    runner.before_forward()
    reference = Reference(vocab)
    tokens = vocab_tokens(vocab, "ab")
    for req_id in ("short", "fine"):
        runner.append(req_id, tokens)
    runner.before_forward()
    slot = runner.slot("short")
    runner.states.total_len.gpu[slot] -= 1  # history shorter than what the pool committed
    runner.before_forward()
    ctx = runner.context([("short", []), ("fine", [])])
    masked = runner.sample_logits(torch.zeros(2, vocab.size), ctx)
    rows = allowed_rows(masked)
    assert rows[0] == set(vocab.stop_token_ids)
    want = reference.allowed(reference.matcher(grammar, tokens))
    assert torch.equal(torch.isfinite(masked[1]), want)
    failed = [m for m in plugin_log if " failed: " in m]
    assert len(failed) == 1 and "request short failed" in failed[0] and "fewer than" in failed[0]


def test_a_malformed_entry_that_bypassed_validation_stops_only_its_rows(
    make_runner: Callable[..., V2Runner], vocab: gm.Vocabulary, plugin_log: list[str]
) -> None:
    runner = make_runner()
    bad = SamplingParams(max_tokens=8, extra_args={"grammarmask": "not json"})
    runner.add("bad", [5], bad)
    runner.add("plain", [6], asking(None))
    runner.before_forward()
    ctx = runner.context([("bad", [11, 12]), ("plain", [13])])
    logits = torch.randn(5, vocab.size)
    masked = runner.sample_logits(logits.clone(), ctx)
    assert all(row == set(vocab.stop_token_ids) for row in allowed_rows(masked[:3]))
    assert torch.equal(masked[3:], logits[3:])
    assert len(plugin_log) == 1 and "request bad failed: grammarmask:" in plugin_log[0]


def test_requests_without_a_grammar_cost_nothing(
    make_runner: Callable[..., V2Runner], vocab: gm.Vocabulary
) -> None:
    runner = make_runner()
    runner.add("plain", [5, 6], asking(None))
    assert not runner.needs_processing.any()  # the sampler never calls apply for it
    runner.before_forward()
    processor = runner.processors[0]
    logits = torch.randn(4, vocab.size)
    ctx = runner.context([("plain", [1, 2, 3])])
    assert processor.apply(logits, ctx) is logits


def test_the_entry_point_instance_stands_aside_for_the_named_one_and_switches_off(
    make_runner: Callable[..., V2Runner], vocab: gm.Vocabulary
) -> None:
    both = make_runner(classes=(EntryPointGrammarLogitsProcessor, GrammarLogitsProcessor))
    aside, serving = both.processors
    assert aside._side.plugin.mode == "aside" and serving._side.plugin.mode == "serve"
    both.add("a", [5], asking(GRAMMARS[2]))
    assert both.needs_processing[both.slot("a")]
    off = make_runner(classes=(EntryPointGrammarLogitsProcessor,), named=False, autoload=False)
    off.add("a", [5], asking(GRAMMARS[2]))
    off.before_forward()
    masked = off.sample_logits(torch.zeros(1, vocab.size), off.context([("a", [])]))
    assert allowed_rows(masked)[0] == set(vocab.stop_token_ids)


# ---------------------------------------------------------------------- many requests


def test_ten_thousand_requests_through_recycled_slots_keep_the_pool_flat(
    make_runner: Callable[..., V2Runner], vocab: gm.Vocabulary
) -> None:
    runner = make_runner(drafts=False, max_num_reqs=16)
    processor = runner.processors[0]
    token = vocab_tokens(vocab, "{")[0]
    process = psutil.Process()
    served, rss = 0, []
    while served < 10_000:
        names = [f"r{served + i}" for i in range(16)]
        for i, name in enumerate(names):
            runner.add(name, [5, 6], asking(GRAMMARS[(served + i) % 3] if i % 4 else None))
        runner.before_forward()
        ctx = runner.context([(name, []) for name in names])
        runner.sample_logits(torch.zeros(16, vocab.size), ctx)
        for name in names:
            runner.append(name, [token])
            runner.finish(name)
        served += 16
        if served in (1_008, 10_000):
            rss.append(process.memory_info().rss)
    assert len(processor.tracked()) <= 16
    pool = processor._side.plugin.pool
    assert pool.state("vllm-0").reason.startswith("unknown request id")
    growth_mb = (rss[1] - rss[0]) / 2**20
    assert growth_mb < 32, f"memory grew {growth_mb:.1f} MB from 1,008 to 10,000 requests"


def vocab_tokens(vocab: gm.Vocabulary, text: str) -> list[int]:
    """Token ids whose bytes spell `text` one character at a time."""
    by_bytes = {token: index for index, token in enumerate(vocab.token_bytes)}
    return [by_bytes[char.encode()] for char in text]
