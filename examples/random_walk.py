"""Sample random tokens under grammar masks until the grammar lets the request stop.

Shows the matcher interface end to end with the public API: whatever the (random) logits,
the text that comes out parses and validates against the schema.

    python examples/random_walk.py [--backend outlines] [--seed 3]
"""

from __future__ import annotations

import argparse
import json

import jsonschema
import torch

import grammarmask as gm
from grammarmask.tools.known_vocabs import load_vocabulary


def allowed(mask_row: torch.Tensor, size: int) -> torch.Tensor:
    """Unpack one int32 mask row into a bool vector over the vocabulary."""
    bits = (mask_row.to(torch.int64).unsqueeze(1) >> torch.arange(32)) & 1
    return bits.flatten()[:size].bool()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--backend", default="xgrammar")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-tokens", type=int, default=400)
    args = parser.parse_args()

    schema = {
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 12},
            "unit": {"enum": ["celsius", "fahrenheit"]},
            "days": {"type": "array", "items": {"type": "boolean"}, "maxItems": 3},
        },
        "required": ["city", "unit", "days"],
        "additionalProperties": False,
    }
    vocab = load_vocabulary("deepseek")
    compiled = gm.GrammarCompiler(vocab).compile(gm.Grammar.json_schema(schema), args.backend)
    print(f"{args.backend}: fully enforced = {compiled.fully_enforced}")
    matcher = compiled.matcher()
    mask = torch.zeros(1, gm.words_per_row(vocab.size), dtype=torch.int32)
    generator = torch.Generator().manual_seed(args.seed)
    tokens: list[int] = []
    for _ in range(args.max_tokens):
        matcher.fill(mask, 0)
        logits = torch.randn(vocab.size, generator=generator)
        logits[~allowed(mask[0], vocab.size)] = float("-inf")
        token = int(torch.multinomial(torch.softmax(logits, dim=0), 1, generator=generator))
        assert matcher.accept(token)
        if matcher.is_terminated():
            break
        tokens.append(token)
    text = vocab.decode(tokens).decode("utf-8")
    print(f"{len(tokens)} tokens: {text}")
    if matcher.is_terminated():
        jsonschema.validate(json.loads(text), schema)
        print("valid JSON that validates against the schema")
    else:
        print(f"stopped at the {args.max_tokens}-token budget before the grammar completed")


if __name__ == "__main__":
    main()
