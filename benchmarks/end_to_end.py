"""Tokens/s on the real model: constrained vs unconstrained, with and without prompt-lookup
drafts, interleaved in one run so the ratios compare like with like.

The constrained runs use a grammar that allows any text, so both runs produce the same
greedy tokens and the same draft acceptance: the tokens/s differ only by the cost of
masking (fill, wait, apply) on every step.

    python benchmarks/end_to_end.py [--tokens 48] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics

from grammarmask import Grammar, MatcherPool, Vocabulary
from grammarmask.cli import bundled_schema_path
from grammarmask.demo import DemoCase, bundled_cases, chat_prompt
from grammarmask.integrations.engine import GenerationRequest, ReferenceEngine
from grammarmask.integrations.transformers import HFCausalLM, load_smollm2
from grammarmask.sampling import SamplingParams


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    model, tokenizer = load_smollm2()
    vocab = Vocabulary.from_transformers(tokenizer, logits_width=model.config.vocab_size)
    cases: list[DemoCase] = [
        c
        for c in bundled_cases(bundled_schema_path("person.json").parent)
        if c.name in ("person", "meeting", "product_review")
    ]
    grammar = Grammar.regex(r"[\s\S]*")  # allows whatever the model says; costs a real mask
    rates: dict[str, list[float]] = {}
    with MatcherPool(vocab, workers=1) as pool:
        for _ in range(args.repeats):
            for drafts in (0, 3):
                engine = ReferenceEngine(HFCausalLM(model), vocab, pool, num_drafts=drafts)
                for constrained in (False, True):
                    name = f"{'constrained' if constrained else 'unconstrained'}, {drafts} drafts"
                    for index, case in enumerate(cases):
                        request = GenerationRequest(
                            f"{name}-{index}",
                            chat_prompt(tokenizer, case),
                            grammar if constrained else None,
                            SamplingParams(temperature=0),
                            args.tokens,
                        )
                        (result,) = engine.run([request])
                        rates.setdefault(name, []).append(result.tokens_per_second)
    print(
        f"SmolLM2-135M-Instruct, {args.tokens} tokens per answer, {len(cases)} prompts x "
        f"{args.repeats} repeats, median tokens/s"
    )
    for drafts in (0, 3):
        free = statistics.median(rates[f"unconstrained, {drafts} drafts"])
        masked = statistics.median(rates[f"constrained, {drafts} drafts"])
        print(
            f"{drafts} drafts: unconstrained {free:6.2f}  constrained {masked:6.2f}  "
            f"ratio {masked / free:.3f}"
        )


if __name__ == "__main__":
    main()
