"""`grammarmask bench`: run scenarios by name, print the ratio table, write JSON and plots."""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from ...resources import corpus_dir
from .apply import run_apply
from .compile import run_compile
from .context import Bench, BenchConfig, Outcome
from .cuda import run_cuda
from .e2e import run_e2e
from .fill import run_fill, run_isolation
from .overlap import run_overlap
from .report import Row, table, write_json
from .vllm import run_vllm

SCENARIOS: dict[str, Callable[[Bench], Outcome]] = {
    "fill": run_fill,
    "isolation": run_isolation,
    "apply": run_apply,
    "overlap": run_overlap,
    "compile": run_compile,
    "e2e": run_e2e,
    "cuda": run_cuda,
    "vllm": run_vllm,
}
"""Every scenario, in the order a plain `grammarmask bench` runs them (but `vllm`)."""

SEPARATE = ("vllm",)
"""Scenarios that run only when named: `vllm` needs vLLM's own environment."""


def machine() -> str:
    """The machine, in words, for the JSON and the README."""
    cpus = os.cpu_count() or 0
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU"
    return f"{platform.machine()} {cpus}-core CPU, {gpu}, torch {torch.__version__}"


def run_bench(
    names: Sequence[str],
    config: BenchConfig,
    *,
    progress: bool = True,
) -> tuple[list[Row], dict[str, Outcome]]:
    """Run the named scenarios in order; returns all rows and each scenario's outcome."""
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        raise ValueError(
            f"unknown scenario(s) {', '.join(unknown)}; choose from {', '.join(SCENARIOS)}"
        )
    bench = Bench(config, progress=progress)
    outcomes: dict[str, Outcome] = {}
    try:
        for name in names:
            outcomes[name] = SCENARIOS[name](bench)
    finally:
        bench.close()
    return [row for o in outcomes.values() for row in o.rows], outcomes


def add_parser(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """The `bench` subcommand."""
    bench = commands.add_parser(
        "bench",
        help="performance scenarios, each figure a ratio against a baseline of the same run",
    )
    bench.add_argument(
        "scenario", nargs="*", help=f"scenarios to run (default: all): {', '.join(SCENARIOS)}"
    )
    size = bench.add_mutually_exclusive_group()
    size.add_argument("--full", action="store_true", help="the whole grid (default: quick)")
    size.add_argument("--tiny", action="store_true", help="smoke-test sizes (seconds)")
    bench.add_argument("--repeats", type=int, help="timed repeats per point (default 20, full 40)")
    bench.add_argument(
        "--corpus",
        type=Path,
        help="MaskBench folder, or 'bundled' for the bundled schemas "
        "(default: $GRAMMARMASK_CORPUS, else ../shared/corpus/maskbench, else bundled)",
    )
    bench.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default="cpu",
        help="cuda: run the cuda scenario (fill with the side-stream copy, apply on the GPU)",
    )
    bench.add_argument("--seed", type=int, default=0)
    bench.add_argument(
        "--cold-caches",
        action="store_true",
        help="fill: evict the CPU caches before every timed call, as a forward would",
    )
    bench.add_argument("--json", type=Path, metavar="OUT", help="write the results as JSON")
    bench.add_argument(
        "--plot", type=Path, metavar="DIR", help="write PNG charts (needs matplotlib)"
    )
    bench.add_argument("--strict", action="store_true", help="exit 1 when a target is not met")
    bench.set_defaults(run=cmd_bench)


def cmd_bench(args: argparse.Namespace) -> int:
    """Exit codes: 0 ran (with --strict: and every target met), 1 a target missed under
    --strict, 2 bad arguments or a missing input."""
    if args.device == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda: no CUDA device here", file=sys.stderr)
        return 2
    default = [name for name in SCENARIOS if name not in SEPARATE]
    names = args.scenario or (["cuda"] if args.device == "cuda" else default)
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        print(
            f"error: unknown scenario(s) {', '.join(unknown)}; choose from {', '.join(SCENARIOS)}",
            file=sys.stderr,
        )
        return 2
    corpus = args.corpus if args.corpus is not None else corpus_dir()
    if corpus is not None and str(corpus) == "bundled":
        corpus = None
    if corpus is not None and not corpus.is_dir():
        print(f"error: corpus folder {corpus} does not exist", file=sys.stderr)
        return 2
    if args.plot is not None:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            print(
                "error: --plot needs matplotlib: pip install 'grammarmask[plot]'", file=sys.stderr
            )
            return 2
    size = "full" if args.full else "tiny" if args.tiny else "quick"
    repeats = args.repeats if args.repeats is not None else (40 if args.full else 20)
    if repeats < 1:
        print(f"error: --repeats must be at least 1, not {repeats}", file=sys.stderr)
        return 2
    config = BenchConfig(size, repeats, corpus, args.seed, args.cold_caches)
    print(f"corpus: {corpus or 'bundled schemas'}; {machine()}", file=sys.stderr)
    started = time.perf_counter()
    rows, outcomes = run_bench(names, config)
    print(table(rows))
    meta = {
        "machine": machine(),
        "command": " ".join(["grammarmask", *sys.argv[2:]]) if sys.argv[1:2] == ["bench"] else "",
        "size": size,
        "repeats": repeats,
        "corpus": str(corpus) if corpus else None,
        "cold_caches": args.cold_caches,
        "seconds": round(time.perf_counter() - started, 1),
    }
    if args.json is not None:
        write_json(args.json, rows, meta)
        print(f"wrote {args.json}", file=sys.stderr)
    if args.plot is not None:
        from .plots import write_plots

        for path in write_plots(rows, outcomes, args.plot):
            print(f"wrote {path}", file=sys.stderr)
    missed = [r for r in rows if r.met is False]
    return 1 if args.strict and missed else 0
