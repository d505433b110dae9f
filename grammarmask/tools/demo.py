"""The main job: a real model (SmolLM2-135M-Instruct) answering with and without grammar masks."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema

from ..grammars import Grammar
from ..integrations.engine import GenerationRequest, GenerationResult, ReferenceEngine
from ..integrations.engine.sampling import SamplingParams
from ..integrations.transformers import HFCausalLM, load_smollm2
from ..pool import MatcherPool
from ..vocabulary import Vocabulary

PROMPTS = {
    "person": "Give me the contact card of Ada Lovelace (age 36, ada@example.org, speaks "
    "English and French).",
    "invoice": "Write an invoice INV-2024001 issued 2024-05-02 in EUR to ACME Ltd for 3 hours "
    "of consulting at 90.0 each.",
    "function_call": "Call the right tool to get the weather in Paris in celsius.",
    "service_config": "Configure the service 'checkout-api' from image shop/checkout:1.2 on "
    "port 8080 with 3 replicas, log level info, in production.",
    "matrix": "Give a 2x2 identity matrix with row labels 'x' and 'y'.",
    "meeting": "Schedule a 30 minute meeting titled 'Sync' on 2025-03-04 at 10:00 UTC, "
    "organized by ann@example.com with bob@example.com.",
    "product_review": "Review the 'Trail shoes X2': rating 4, light and grippy, a bit narrow, "
    "recommended.",
}


@dataclass(frozen=True)
class DemoCase:
    name: str
    schema: dict[str, Any]
    prompt: str


def bundled_cases(directory: Path) -> list[DemoCase]:
    cases = []
    for path in sorted(directory.glob("*.json")):
        schema = json.loads(path.read_text(encoding="utf-8"))
        prompt = PROMPTS.get(
            path.stem, f"Produce an example of: {schema.get('description', path.stem)}"
        )
        cases.append(DemoCase(path.stem, schema, prompt))
    return cases


def chat_prompt(tokenizer: Any, case: DemoCase) -> list[int]:
    properties = ", ".join(case.schema.get("properties", {})) or "see the schema"
    messages = [
        {"role": "system", "content": "You answer with one JSON object and nothing else."},
        {
            "role": "user",
            "content": f"{case.prompt}\nFields: {properties}.\nJSON Schema: "
            f"{json.dumps(case.schema.get('properties', {}), separators=(',', ':'))}",
        },
    ]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return list(tokenizer.encode(text, add_special_tokens=False))


def validate(text: str, schema: dict[str, Any]) -> str:
    """'valid', or why not."""
    try:
        instance = json.loads(text)
    except json.JSONDecodeError as exc:
        return f"not JSON ({exc.msg})"
    validator = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker())
    error = next(iter(validator.iter_errors(instance)), None)
    return "valid" if error is None else f"invalid: {error.message}"


def _describe(result: GenerationResult) -> str:
    per_step = result.fill_seconds / max(result.steps, 1) * 1e3
    wait = result.mask_wait_seconds / max(result.steps, 1) * 1e3
    return (
        f"{len(result.token_ids)} tokens, {result.tokens_per_second:.1f} tok/s, "
        f"drafts accepted {result.accepted_drafts}/{result.drafted} "
        f"({result.acceptance_rate:.0%}), mask fill {per_step:.2f} ms/step "
        f"(exposed wait {wait:.2f} ms), finish: {result.finish_reason}"
    )


def _load_model() -> tuple[Any, Any, Vocabulary]:
    """SmolLM2 with its tokenizer and the vocabulary at the model's logits width."""
    model, tokenizer = load_smollm2()
    return (
        model,
        tokenizer,
        Vocabulary.from_transformers(tokenizer, logits_width=model.config.vocab_size),
    )


def run_demo(
    schema_dir: Path,
    *,
    names: Sequence[str] = (),
    num_drafts: int = 3,
    max_new_tokens: int = 200,
    contrast_tokens: int = 80,
    repetition_penalty: float = 1.0,
    out: Any = None,
) -> int:
    """Constrained and unconstrained answers for each bundled schema, written to `out`
    (default: sys.stdout as it is when called); returns the number of constrained answers
    that do not validate."""
    out = sys.stdout if out is None else out
    started = time.perf_counter()
    model, tokenizer, vocab = _load_model()
    print(
        f"model SmolLM2-135M-Instruct loaded in {time.perf_counter() - started:.1f} s; {vocab}",
        file=out,
    )
    engine_model = HFCausalLM(model)
    failures = 0
    with MatcherPool(vocab, workers=1) as pool:
        engine = ReferenceEngine(engine_model, vocab, pool, num_drafts=num_drafts)
        for case in bundled_cases(schema_dir):
            if names and case.name not in names:
                continue
            prompt = chat_prompt(tokenizer, case)
            params = SamplingParams(temperature=0, repetition_penalty=repetition_penalty)
            grammar = Grammar.json_schema(case.schema)
            (constrained,) = engine.run(
                [GenerationRequest(f"{case.name}-json", prompt, grammar, params, max_new_tokens)]
            )
            (free,) = engine.run(
                [GenerationRequest(f"{case.name}-free", prompt, None, params, contrast_tokens)]
            )
            verdict = validate(constrained.text, case.schema)
            failures += verdict != "valid"
            print(f"\n=== {case.name}: {case.prompt}", file=out)
            print(f"with grammarmask: {constrained.text}", file=out)
            print(f"  -> {verdict}; {_describe(constrained)}", file=out)
            free_text = free.text.strip().replace("\n", "\\n")
            print(f"without:          {free_text}", file=out)
            print(f"  -> {validate(free.text, case.schema)}; {_describe(free)}", file=out)
    print(f"\n{failures} constrained answer(s) failed validation", file=out)
    return failures


def run_generate(schema_path: Path, prompt_text: str, *, stream: bool, max_new_tokens: int) -> int:
    model, tokenizer, vocab = _load_model()
    schema = json.loads(schema_path.read_text(encoding="utf-8"))
    case = DemoCase(schema_path.stem, schema, prompt_text)
    with MatcherPool(vocab, workers=1) as pool:
        engine = ReferenceEngine(HFCausalLM(model), vocab, pool)
        request = GenerationRequest(
            "generate",
            chat_prompt(tokenizer, case),
            Grammar.json_schema(schema),
            SamplingParams(temperature=0),
            max_new_tokens,
        )

        def show(_: str, delta: str) -> None:
            print(delta, end="", flush=True)

        (result,) = engine.run([request], on_text=show if stream else None)
    if stream:
        print()
    else:
        print(result.text)
    verdict = validate(result.text, schema)
    print(f"-> {verdict}; {_describe(result)}", file=sys.stderr)
    return 0 if verdict == "valid" else 1
