"""A minimal engine loop around grammarmask, using only the public API.

The "model" here returns seeded random logits (the real-model engine comes with the
sampling work); everything else is what an engine author writes: drafts from an n-gram
(prompt-lookup) proposer, `fill_async` before the forward, `wait` right before sampling,
greedy draft verification on masked logits, `commit` of the accepted tokens only.

    python examples/engine_loop.py [--workers 2] [--drafts 3]
"""

from __future__ import annotations

import argparse
import json

import torch

import grammarmask as gm
from grammarmask.tools.known_vocabs import load_vocabulary

REQUESTS = {
    "weather": gm.Grammar.json_schema(
        {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 10},
                "unit": {"enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        }
    ),
    "answer": gm.Grammar.choice(["yes", "no", "maybe"]),
    "code": gm.Grammar.regex(r"[A-Z]{3}-[0-9]{4}"),
}


def propose(history: list[int], k: int) -> list[int]:
    """Prompt lookup: continue the last bigram's earlier occurrence, if any."""
    if k == 0 or len(history) < 3:
        return []
    key = history[-2:]
    for start in range(len(history) - 3, -1, -1):
        if history[start : start + 2] == key:
            return history[start + 2 : start + 2 + k]
    return []


def forward(num_rows: int, vocab_size: int, generator: torch.Generator) -> torch.Tensor:
    return torch.randn(num_rows, vocab_size, generator=generator)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--drafts", type=int, default=3)
    parser.add_argument("--max-steps", type=int, default=200)
    args = parser.parse_args()

    vocab = load_vocabulary("deepseek")
    generator = torch.Generator().manual_seed(0)
    outputs: dict[str, list[int]] = {rid: [] for rid in REQUESTS}
    with gm.MatcherPool(vocab, workers=args.workers) as pool:
        for rid, grammar in REQUESTS.items():
            pool.add(rid, grammar)
        running = list(REQUESTS)
        for _ in range(args.max_steps):
            if not running:
                break
            batch = [(rid, propose(outputs[rid], args.drafts)) for rid in running]
            future = pool.fill_async(batch)  # masks are built while the forward runs
            logits = forward(sum(len(d) + 1 for _, d in batch), vocab.size, generator)
            masks = future.wait()
            gm.apply_bitmask(logits, masks)
            for index, (rid, drafts) in enumerate(batch):
                rows = masks.rows[index]
                targets = logits[list(rows)].argmax(dim=-1).tolist()
                accepted = 0
                while accepted < len(drafts) and drafts[accepted] == targets[accepted]:
                    accepted += 1
                tokens = [*drafts[:accepted], targets[accepted]]
                state = pool.commit(rid, tokens)
                outputs[rid].extend(t for t in tokens if t not in vocab.stop_token_ids)
                if state.status != "active":
                    print(f"{rid}: {state.status} ({state.reason})")
                    running.remove(rid)
    for rid, tokens in outputs.items():
        text = vocab.decode(tokens).decode("utf-8", "replace")
        print(f"{rid:8s} {text}")
    json.loads(vocab.decode(outputs["weather"]))


if __name__ == "__main__":
    main()
