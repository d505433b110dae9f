"""GrammarLogitsProcessor: rollback on shrinking input_ids, refusal of beams, and
generate() on the real SmolLM2 model with prompt lookup and with an assistant model."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest
import torch
from conftest import bundled_schema

import grammarmask as gm
from grammarmask.device.kernels import unpack_rows
from grammarmask.integrations.transformers import GrammarLogitsProcessor, load_smollm2


def _fresh_allowed(
    compiler: gm.GrammarCompiler, grammar: gm.Grammar, tokens: list[int], size: int
) -> torch.Tensor:
    matcher = compiler.compile(grammar, "xgrammar").matcher()
    assert all(matcher.accept(t) for t in tokens)
    row = torch.zeros(1, gm.words_per_row(size), dtype=torch.int32)
    matcher.fill(row, 0)
    return unpack_rows(row, size)[0]


def test_processor_follows_drafts_and_rejections(
    smollm2_tokenizer: Any, smollm2: gm.Vocabulary
) -> None:
    grammar = gm.Grammar.regex("(cat|car|cart|dog)s?")
    compiler = gm.GrammarCompiler(smollm2)
    processor = GrammarLogitsProcessor(
        smollm2_tokenizer, [grammar], vocab=smollm2, compiler=compiler
    )
    single = {t: i for i, t in enumerate(smollm2.token_bytes) if len(t) == 1}
    c, a, r, t, d = (single[x] for x in (b"c", b"a", b"r", b"t", b"d"))
    prompt = [1, 2, 3]
    calls = [
        [],
        [c],
        [c, a],
        [c, a, r],
        [c, a, r, t],
        [c, a],
        [c, a, t],
        [],
        [d],
    ]  # drafts, then rejections
    for generated in calls:
        scores = torch.zeros(1, smollm2.size)
        out = processor(torch.tensor([prompt + generated]), scores)
        expected = _fresh_allowed(compiler, grammar, generated, smollm2.size)
        assert torch.equal(torch.isfinite(out[0]), expected), generated
    assert processor.failures() == [None]


def test_processor_rows_leaving_the_grammar_allow_only_stop(
    smollm2_tokenizer: Any, smollm2: gm.Vocabulary
) -> None:
    processor = GrammarLogitsProcessor(
        smollm2_tokenizer, [gm.Grammar.choice(["yes"]), gm.Grammar.json()], vocab=smollm2
    )
    x = smollm2.token_bytes.index(b"x")
    processor(torch.tensor([[7], [7]]), torch.zeros(2, smollm2.size))  # the prompt
    out = processor(torch.tensor([[7, x], [7, x]]), torch.zeros(2, smollm2.size))
    assert torch.isfinite(out[0]).nonzero().flatten().tolist() == [2]
    assert torch.isfinite(out[1]).nonzero().flatten().tolist() == [2]
    assert processor.failures()[0] == f"token {x} is not allowed by the grammar"


def test_beam_search_is_refused(smollm2_tokenizer: Any, smollm2: gm.Vocabulary) -> None:
    processor = GrammarLogitsProcessor(smollm2_tokenizer, [gm.Grammar.json()], vocab=smollm2)
    with pytest.raises(
        ValueError, match="beam search and num_return_sequences > 1 are not supported"
    ):
        processor(torch.zeros(3, 4, dtype=torch.long), torch.zeros(3, smollm2.size))


@pytest.fixture(scope="module")
def model_and_tokenizer() -> tuple[Any, Any]:
    return load_smollm2()


@pytest.mark.parametrize("assist", ["prompt_lookup", "assistant_model"])
def test_generate_on_the_real_model_with_drafts(
    model_and_tokenizer: tuple[Any, Any], assist: str
) -> None:
    model, tokenizer = model_and_tokenizer
    schema = bundled_schema("function_call")
    messages = [{"role": "user", "content": "Get the weather in Paris in celsius. Answer in JSON."}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    inputs = tokenizer(text, return_tensors="pt")
    processor = GrammarLogitsProcessor(tokenizer, [gm.Grammar.json_schema(schema)])
    extra: dict[str, Any] = (
        {"prompt_lookup_num_tokens": 5} if assist == "prompt_lookup" else {"assistant_model": model}
    )
    output = model.generate(
        **inputs, logits_processor=[processor], max_new_tokens=60, do_sample=False, **extra
    )
    answer = tokenizer.decode(output[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
    jsonschema.validate(json.loads(answer), schema)
    assert processor.failures() == [None]


def test_processor_masks_a_copy_and_refuses_unsupported_dtypes(
    smollm2_tokenizer: Any, smollm2: gm.Vocabulary
) -> None:
    """The scores passed in stay as they were (generate may still hold them); the returned
    ones keep every allowed score's value."""
    processor = GrammarLogitsProcessor(smollm2_tokenizer, [gm.Grammar.json()], vocab=smollm2)
    scores = torch.randn(1, smollm2.size, generator=torch.Generator().manual_seed(0))
    before = scores.clone()
    out = processor(torch.tensor([[7]]), scores)
    assert torch.equal(scores, before)
    kept = torch.isfinite(out[0])
    assert 0 < int(kept.sum()) < smollm2.size
    assert torch.equal(out[0][kept], before[0][kept])
    with pytest.raises(ValueError, match=r"scores dtype torch.float64 is not supported"):
        processor(torch.tensor([[7]]), torch.zeros(1, smollm2.size, dtype=torch.float64))
