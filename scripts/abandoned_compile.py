"""What an abandoned compile costs the machine: a process-isolated pool (one worker, the
plugin's 10 s compile timeout) given grammars whose outlines index builds take minutes and
gigabytes; prints the worker's memory (its index build processes included) every half
second, and the time to compile other grammars after it.

    .venv/bin/python scripts/abandoned_compile.py [--vocab deepseek] [--seconds 20]
"""

from __future__ import annotations

import argparse
import time

import psutil

import grammarmask as gm
from grammarmask.pool.process_matchers import ProcessMatchers
from grammarmask.tools.known_vocabs import load_vocabulary

CASES = {
    # llguidance refuses uniqueItems; under flexible whitespace xgrammar leaves out one
    # keyword more than outlines, so auto tries outlines first (a 1,000-character string)
    "auto, allow_unenforced": (
        gm.Grammar.json_schema(
            {"type": "array", "uniqueItems": True, "items": {"type": "string", "maxLength": 1000}},
            whitespace="flexible",
        ),
        "auto",
    ),
    "outlines by name": (gm.Grammar.regex('"[^"\\\\]{0,1000}"'), "outlines"),
}
NEXT = [
    gm.Grammar.json_schema(
        {"type": "object", "properties": {f"f{i}": {"type": "integer"}}, "required": [f"f{i}"]}
    )
    for i in range(3)
]


def tree_mib(pid: int) -> float:
    process = psutil.Process(pid)
    total = process.memory_info().rss
    for child in process.children(recursive=True):
        try:
            total += child.memory_info().rss
        except psutil.NoSuchProcess:
            continue
    return total / 2**20


def run_case(vocab: gm.Vocabulary, label: str, seconds: float) -> None:
    grammar, backend = CASES[label]
    with gm.MatcherPool(
        vocab,
        "outlines",
        workers=1,
        isolation="process",
        compile_timeout_s=10.0,
        allow_unenforced=True,
    ) as pool:
        host = pool.matchers
        assert isinstance(host, ProcessMatchers)
        (worker,) = host.pids()
        pool.add("warm", gm.Grammar.regex("[0-9]{2}"), backend="outlines")
        pool.fill_async([("warm", ())]).wait()
        print(f"\n## {label}: worker baseline {tree_mib(worker):,.0f} MiB")
        started = time.monotonic()
        pool.add("hard", grammar, backend=backend)
        peak, ended_at, state = 0.0, None, pool.state("hard")
        while time.monotonic() - started < seconds:
            time.sleep(0.5)
            memory = tree_mib(worker)
            peak = max(peak, memory)
            state = pool.state("hard")
            if state.status != "active" or state.ready:
                ended_at = ended_at or time.monotonic() - started
            print(f"{time.monotonic() - started:5.1f} s  {memory:7,.0f} MiB  {state.status}")
        print(f"request: {state.status} ({state.backend}) {state.reason or ''}".rstrip())
        print(f"peak {peak:,.0f} MiB; settled at {ended_at or float('nan'):.1f} s")
        for index, other in enumerate(NEXT):
            begun = time.perf_counter()
            pool.add(f"next{index}", other, backend="outlines")
            pool.fill_async([(f"next{index}", ())]).wait()
            print(f"next grammar {index}: first mask in {time.perf_counter() - begun:.2f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", default="deepseek")
    parser.add_argument("--seconds", type=float, default=20.0)
    args = parser.parse_args()
    vocab = load_vocabulary(args.vocab)
    for label in CASES:
        run_case(vocab, label, args.seconds)


if __name__ == "__main__":
    main()
