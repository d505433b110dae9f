"""Scenario `e2e`: tokens/s on the real model (SmolLM2-135M-Instruct), constrained against
unconstrained, without drafts and with prompt-lookup drafts under masks.

The constrained runs use a grammar that allows any text, so both runs decode the same
greedy tokens and accept the same drafts: the tokens/s differ only by the cost of masking
(fill, wait, apply) on every step. Each case runs both ways back to back, and the
constrained row's ratio is the median of those pairs' ratios: the cases differ in speed, and
a shared machine's speed drifts over minutes, by more than masking costs. The ratio of the
p50s over all runs stays in `extra.ratio_of_p50s`, and `extra.masking_share` is the median
share of a constrained run's time that the engine's thread spent on masks (the fill_async
call, the wait, the apply): the cost itself, which the noisy ratios can only bound.
"""

from __future__ import annotations

import dataclasses
import statistics

from ...grammars import Grammar
from ...pool import MatcherPool
from ...vocabulary import Vocabulary
from .context import Bench, Outcome
from .report import Row, Target, compare

TARGET = Target(">=", 0.97)


def run_e2e(bench: Bench) -> Outcome:
    from ...integrations.engine import GenerationRequest, ReferenceEngine
    from ...integrations.engine.sampling import SamplingParams
    from ...integrations.transformers import HFCausalLM, load_smollm2
    from ...resources import bundled_schema_path
    from ..demo import bundled_cases, chat_prompt

    config = bench.config
    tokens = config.pick(8, 48, 96)
    repeats = config.pick(1, 3, 3)
    names = config.pick(("person",), ("person", "meeting", "product_review"), None)
    depths = config.pick((2,), (0, 3), (0, 3, 5))
    bench.plan(repeats * len(depths), "e2e (loading SmolLM2)")
    model, tokenizer = load_smollm2()
    vocab = Vocabulary.from_transformers(tokenizer, logits_width=model.config.vocab_size)
    cases = [
        c
        for c in bundled_cases(bundled_schema_path("person.json").parent)
        if names is None or c.name in names
    ]
    grammar = Grammar.regex(r"[\s\S]*")
    rates: dict[tuple[int, bool], list[float]] = {}
    paired: dict[int, list[float]] = {}
    shares: dict[int, list[float]] = {}
    with MatcherPool(vocab, workers=1) as pool:
        for _ in range(repeats):
            for drafts in depths:
                engine = ReferenceEngine(HFCausalLM(model), vocab, pool, num_drafts=drafts)
                for index, case in enumerate(cases):
                    # both variants of a case back to back, in a random order: the speed of
                    # a shared machine drifts over minutes, so far-apart runs differ by more
                    # than masking costs
                    pair = {}
                    for constrained in bench.rng.sample([False, True], 2):
                        request = GenerationRequest(
                            f"{drafts}-{constrained}-{index}-{bench.rng.random()}",
                            chat_prompt(tokenizer, case),
                            grammar if constrained else None,
                            SamplingParams(temperature=0),
                            tokens,
                        )
                        (result,) = engine.run([request])
                        pair[constrained] = result.tokens_per_second
                        if constrained:
                            shares.setdefault(drafts, []).append(
                                result.masking_seconds / result.seconds
                            )
                        rates.setdefault((drafts, constrained), []).append(result.tokens_per_second)
                    paired.setdefault(drafts, []).append(pair[True] / pair[False])
                bench.tick()
    rows: list[Row] = []
    for drafts in depths:
        free, masked = f"unconstrained, {drafts} drafts", f"constrained, {drafts} drafts"
        measured = compare(
            "e2e",
            f"SmolLM2-135M {tokens} tokens, {drafts} drafts",
            {free: rates[(drafts, False)], masked: rates[(drafts, True)]},
            free,
            scale=1.0,
            unit="tok/s",
        )
        masked_row = dataclasses.replace(
            measured[1],
            ratio_p50=statistics.median(paired[drafts]),
            target=TARGET,
            extra={
                "ratio_of_p50s": measured[1].ratio_p50 or 0.0,
                "masking_share": statistics.median(shares[drafts]),
            },
        )
        rows += [measured[0], masked_row]
    return Outcome(rows)
