"""The reference engine loop and the streaming detokenizer, with a seeded random-logits model."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from typing import Any

import jsonschema
import pytest
import torch
from conftest import bundled_schema
from faults import faulty_compiler
from hypothesis import given
from hypothesis import strategies as st

import grammarmask as gm
from grammarmask.integrations.engine import GenerationRequest, ReferenceEngine, propose_ngram
from grammarmask.integrations.engine.detokenize import IncrementalDetokenizer
from grammarmask.integrations.engine.sampling import SamplingParams


class RandomModel:
    """Logits are a seeded function of the context: a deterministic stand-in for a model.
    The cache is the list of tokens processed so far."""

    def __init__(self, vocab_size: int, favour: Sequence[int] = ()) -> None:
        self.vocab_size = vocab_size
        self.favour = list(favour)
        self.calls = 0

    def _row(self, context: list[int]) -> torch.Tensor:
        digest = hashlib.sha256(json.dumps(context[-8:]).encode()).digest()
        generator = torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") >> 1)
        row = torch.randn(self.vocab_size, generator=generator)
        if self.favour:
            row[self.favour] += 4.0
        return row

    def __call__(self, input_ids: Sequence[int], cache: Any) -> tuple[torch.Tensor, Any]:
        self.calls += 1
        context = list(cache or [])
        rows = []
        for token in input_ids:
            context.append(token)
            rows.append(self._row(context))
        return torch.stack(rows), context

    def trim(self, cache: Any, num_tokens: int) -> Any:
        return cache[:num_tokens]


@pytest.fixture(scope="module")
def pool(deepseek: gm.Vocabulary) -> Any:
    with gm.MatcherPool(deepseek, workers=2) as pool:
        yield pool


def test_constrained_requests_validate_with_any_logits(
    deepseek: gm.Vocabulary, pool: gm.MatcherPool, deepseek_encode: Callable[[str], list[int]]
) -> None:
    engine = ReferenceEngine(RandomModel(deepseek.size), deepseek, pool, num_drafts=3)
    names = ["product_review", "product_review"]  # every string and array in it is bounded
    requests = [
        GenerationRequest(
            f"{name}-{i}",
            deepseek_encode(f"Answer as JSON: {name}"),
            gm.Grammar.json_schema(bundled_schema(name)),
            SamplingParams(temperature=0.8, seed=i),
            max_new_tokens=700,
        )
        for i, name in enumerate(names)
    ]
    for result, name in zip(engine.run(requests), names, strict=True):
        assert result.finish_reason in ("grammar", "stop"), result
        jsonschema.validate(json.loads(result.text), bundled_schema(name))
        assert result.steps >= 1 and result.fill_seconds > 0
        # the engine thread's own time on masks: part of the run, never more
        assert 0 < result.masking_seconds < result.seconds
        assert result.masking_seconds >= result.mask_wait_seconds


def test_finish_reasons(deepseek: gm.Vocabulary, pool: gm.MatcherPool) -> None:
    stop = deepseek.stop_token_ids[0]
    engine = ReferenceEngine(RandomModel(deepseek.size, favour=[stop]), deepseek, pool)
    bad = gm.Grammar.json_schema({"type": "object", "properties": {"a": False}, "required": ["a"]})
    prompt = [100, 200, 300]
    results = engine.run(
        [
            GenerationRequest("free-stop", prompt, None, SamplingParams(temperature=0)),
            GenerationRequest(
                "budget", prompt, gm.Grammar.regex("[a-z]{200}"), SamplingParams(temperature=0), 5
            ),
            GenerationRequest(
                "done", prompt, gm.Grammar.choice(["yes"]), SamplingParams(temperature=0)
            ),
            GenerationRequest("broken", prompt, bad, SamplingParams(temperature=0)),
        ]
    )
    reasons = {r.request_id: (r.finish_reason, r.error) for r in results}
    assert reasons["free-stop"] == ("stop", None)
    assert reasons["budget"] == ("length", None)
    assert [len(r.token_ids) for r in results if r.request_id == "budget"] == [5]
    assert reasons["done"][0] in ("grammar", "stop") and results[2].text == "yes"
    assert reasons["broken"][0] == "error" and "xgrammar cannot compile" in str(
        reasons["broken"][1]
    )
    assert [r.steps for r in results if r.request_id == "broken"] == [0]  # never batched


def test_a_slow_compilation_stalls_no_other_request(deepseek: gm.Vocabulary) -> None:
    """A request whose grammar takes 2 s to compile joins the batch once compiled: the
    others stream and finish meanwhile, and it still completes."""
    events: list[str] = []
    with gm.MatcherPool(deepseek, workers=2, compiler=faulty_compiler(deepseek)) as pool:
        engine = ReferenceEngine(RandomModel(deepseek.size), deepseek, pool, num_drafts=0)
        quick = SamplingParams(temperature=0)
        results = engine.run(
            [
                GenerationRequest(
                    "slow", [100], gm.Grammar.choice(["no"]), quick, backend="faulty-slow compile"
                ),
                GenerationRequest("quick", [100], gm.Grammar.regex("[a-z]{12}"), quick, 12),
                GenerationRequest("free", [100], None, quick, 12),
            ],
            on_text=lambda request_id, delta: events.append(request_id),
        )
    by_id = {r.request_id: r for r in results}
    assert by_id["slow"].text == "no" and by_id["slow"].finish_reason in ("grammar", "stop")
    assert len(by_id["quick"].text) == 12 and by_id["free"].steps == 12
    first_slow = events.index("slow")
    assert "quick" in events[:first_slow] and "quick" not in events[first_slow:]


def test_drafts_are_verified_and_caches_trimmed(
    deepseek: gm.Vocabulary, pool: gm.MatcherPool
) -> None:
    """Greedy with drafts gives exactly the greedy output without drafts."""
    prompt = [5, 6, 7, 5, 6, 7, 5, 6]
    grammar = gm.Grammar.regex("[a-z ]{1,60}")
    outputs = []
    for drafts in (0, 4):
        engine = ReferenceEngine(RandomModel(deepseek.size), deepseek, pool, num_drafts=drafts)
        (result,) = engine.run(
            [GenerationRequest(f"d{drafts}", prompt, grammar, SamplingParams(temperature=0), 40)]
        )
        outputs.append(result.token_ids)
    assert outputs[0] == outputs[1]


def test_propose_ngram() -> None:
    assert propose_ngram([1, 2, 3, 4, 1, 2], 3) == [3, 4, 1]
    assert propose_ngram([1, 2, 3], 3) == []
    assert propose_ngram([1, 2, 3, 1, 2], 0) == []


@given(st.text(min_size=1, max_size=40))
def test_detokenizer_never_emits_half_a_character(
    deepseek: gm.Vocabulary, deepseek_encode: Callable[[str], list[int]], text: str
) -> None:
    ids = deepseek_encode(text)
    detokenizer = IncrementalDetokenizer(deepseek)
    pieces = [detokenizer.feed([token]) for token in ids]
    assert "".join(pieces) + detokenizer.finish() == deepseek.decode(ids).decode("utf-8", "replace")
    for piece in pieces:
        assert "\ufffd" not in piece or "\ufffd" in text


def test_detokenizer_replaces_invalid_bytes_at_once(deepseek: gm.Vocabulary) -> None:
    invalid = next(i for i, t in enumerate(deepseek.token_bytes) if t == b"\xff")
    lead = next(i for i, t in enumerate(deepseek.token_bytes) if t == b"\xe4")
    detokenizer = IncrementalDetokenizer(deepseek)
    assert detokenizer.feed([invalid]) == "\ufffd"
    assert detokenizer.feed([lead]) == ""  # held back: the start of a 3-byte character
    assert detokenizer.finish() == "\ufffd"
