"""Scenario `compile`: time to the first mask per backend, cache hits, and the stall test.

Time to first mask = compile + a fresh matcher + its first fill, on a fresh compiler, over
corpus schemas; its baseline is the same grammar warm (a cache hit plus the same fill), so
the ratio says how many warm starts one cold start costs. The stall test times the steps of
B active requests while a new, slow grammar compiles in the background (a fresh one
whenever the last finished) against the same steps with no compilation running.
"""

from __future__ import annotations

import dataclasses
import random
import time
from collections.abc import Callable

import torch

from ...backends import installed_backends, words_per_row
from ...compiler import GrammarCompiler
from ...errors import GrammarMaskError
from ...grammars import Grammar
from .context import Bench, Outcome
from .fill import build_pool
from .report import Row, Target, compare, interleave, percentile
from .workload import candidates

STALL_TARGET = Target("<=", 1.1)
WARM = "cache hit + first fill"


def _first_mask(compiler: GrammarCompiler, grammar: Grammar, backend: str) -> float:
    started = time.perf_counter()
    matcher = compiler.compile(grammar, backend).matcher()
    matcher.fill(torch.zeros(1, words_per_row(compiler.vocab.size), dtype=torch.int32), 0)
    return time.perf_counter() - started


def _first_masks(bench: Bench, backend: str, count: int) -> list[Row]:
    vocab = bench.vocab("deepseek")
    cold: list[float] = []
    warm: list[float] = []
    compiler = GrammarCompiler(vocab, timeout_s=bench.config.pick(30, 30, 120))
    schemas = candidates(bench.config.corpus, random.Random(bench.config.seed))
    for _, schema, _ in schemas:
        if len(cold) == count:
            break
        try:
            grammar = Grammar.json_schema(schema)
            cold.append(_first_mask(compiler, grammar, backend))
        except GrammarMaskError:
            continue
        warm.append(_first_mask(compiler, grammar, backend))
        bench.tick()
    compiler.close()
    if not cold:
        return [
            Row(
                "compile",
                "deepseek",
                f"time to first mask ({backend})",
                WARM,
                unavailable="no schema compiled",
            )
        ]
    rows = compare(
        "compile",
        f"deepseek, {len(cold)} schemas",
        {WARM: warm, f"time to first mask ({backend})": cold},
        WARM,
    )
    rows[1].extra["p90_ms"] = percentile(cold, 0.9) * 1e3
    return [dataclasses.replace(rows[0], variant=f"{WARM} ({backend})"), rows[1]]


def _slow_grammar(salt: int) -> Grammar:
    """A fresh grammar (never cached) that takes xgrammar a while on a 129k vocabulary."""
    properties = {
        f"field_{salt}_{i}": {
            "type": "string",
            "pattern": f"^[a-z]{{1,{8 + i}}}[0-9]{{{1 + i % 5}}}$",
        }
        for i in range(4)
    }
    return Grammar.json_schema(
        {"type": "object", "properties": properties, "required": list(properties)}
    )


def _stall(bench: Bench) -> list[Row]:
    config = bench.config
    requests, drafts = config.pick((4, 2), (64, 5), (64, 5))
    plans = bench.replays("deepseek", requests, drafts)
    pool, batch = build_pool(bench, "deepseek", plans, 2)
    compiler = bench.compiler("deepseek")
    salts = iter(range(10**9))
    in_flight = compiler.submit(_slow_grammar(next(salts)))

    def start_compiling() -> None:
        nonlocal in_flight
        if in_flight.done():
            in_flight = compiler.submit(_slow_grammar(next(salts)))

    def step() -> None:
        pool.fill(batch)

    quiet, busy = "step alone", "step while a grammar compiles"
    runs: dict[str, Callable[[], None]] = {quiet: step, busy: step}
    setup = {quiet: lambda: in_flight.result(), busy: start_compiling}
    timings = interleave(runs, config.repeats, bench.rng, bench.tick, setup)
    in_flight.result()
    pool.close()
    rows = compare("compile", f"stall, deepseek B={requests} D={drafts}", timings, quiet)
    return [rows[0], dataclasses.replace(rows[1], target=STALL_TARGET)]


def run_compile(bench: Bench) -> Outcome:
    config = bench.config
    counts = {"xgrammar": config.pick(2, 12, 40), "outlines": config.pick(0, 0, 5)}
    backends = [b for b in installed_backends() if counts.get(b, 0)]
    bench.plan(sum(counts[b] for b in backends) + config.repeats, "compile")
    rows = [row for b in backends for row in _first_masks(bench, b, counts[b])]
    return Outcome(rows + _stall(bench))
