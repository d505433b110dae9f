"""Command line: `grammarmask demo` (the real model, with and without masks), `generate`,
`check` (what each backend enforces of a schema) and `bench` (performance ratios)."""

from __future__ import annotations

import argparse
import importlib.resources
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from .backends import installed_backends
from .compiler import GrammarCompiler
from .errors import GrammarError, GrammarMaskError
from .grammars import Grammar
from .known_vocabs import KNOWN_VOCABULARIES, load_vocabulary
from .vocabulary import Vocabulary

DEFAULT_SCHEMA = "person.json"


def bundled_schema_path(name: str) -> Path:
    """Path of a schema shipped with grammarmask."""
    return Path(str(importlib.resources.files("grammarmask.schemas").joinpath(name)))


def _load_vocab(args: argparse.Namespace) -> Vocabulary:
    if args.tokenizer_json:
        return Vocabulary.from_tokenizer_json(args.tokenizer_json, logits_width=args.logits_width)
    return load_vocabulary(args.vocab)


def _table(rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def cmd_check(args: argparse.Namespace) -> int:
    path = Path(args.schema) if args.schema else bundled_schema_path(DEFAULT_SCHEMA)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        print(f"error: cannot read schema {path}: {exc.strerror}", file=sys.stderr)
        return 2
    try:
        grammar = Grammar.json_schema(text, whitespace=args.whitespace, strict=args.strict)
    except GrammarError as exc:
        print(f"error: {path}: {exc}", file=sys.stderr)
        return 1
    try:
        started = time.perf_counter()
        vocab = _load_vocab(args)
    except GrammarMaskError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"schema     {path}")
    loaded = time.perf_counter() - started
    print(f"vocabulary {args.tokenizer_json or args.vocab}: {vocab} (loaded in {loaded:.1f} s)")
    backends = args.backend or list(installed_backends())
    compiler = GrammarCompiler(vocab, timeout_s=args.timeout)
    rows = [["backend", "result", "compile", "enforcement"]]
    details: list[str] = []
    compiled_any = False
    for name in backends:
        print(f"compiling on {name} ...", file=sys.stderr, flush=True)
        try:
            compiled = compiler.compile(grammar, name)
        except GrammarMaskError as exc:
            rows.append([name, type(exc).__name__, "-", "-"])
            details.append(f"{name}: {exc}")
            continue
        compiled_any = True
        if compiled.fully_enforced:
            enforcement = "full"
        else:
            enforcement = f"partial: {len(compiled.unenforced)} constraint(s) not enforced"
            details.extend(f"{name}: not enforced: {item}" for item in compiled.unenforced)
        rows.append([name, "compiled", f"{compiled.compile_seconds * 1000:.0f} ms", enforcement])
    compiler.close()
    print()
    print(_table(rows))
    if details:
        print()
        print("\n".join(details))
    return 0 if compiled_any else 3


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="grammarmask", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    check = commands.add_parser(
        "check",
        help="compile a JSON Schema on each installed backend and say what each enforces",
    )
    check.add_argument(
        "schema", nargs="?", help=f"JSON Schema file (default: bundled {DEFAULT_SCHEMA})"
    )
    check.add_argument(
        "--vocab",
        choices=sorted(KNOWN_VOCABULARIES),
        default="deepseek",
        help="real vocabulary to compile for (default: deepseek)",
    )
    check.add_argument("--tokenizer-json", help="use this HF tokenizer.json instead of --vocab")
    check.add_argument("--logits-width", type=int, help="logits width for --tokenizer-json")
    check.add_argument(
        "--backend", action="append", help="backend to try (repeatable; default: all installed)"
    )
    check.add_argument("--whitespace", choices=("compact", "flexible"), default="compact")
    check.add_argument(
        "--strict", action="store_true", help="objects without additionalProperties are closed"
    )
    check.add_argument("--timeout", type=float, default=120.0, help="compile timeout in seconds")
    check.set_defaults(run=cmd_check)

    demo = commands.add_parser(
        "demo",
        help="SmolLM2-135M-Instruct answers for each bundled schema, with and without masks",
    )
    demo.add_argument("--schema", action="append", help="only these bundled schema names")
    demo.add_argument("--drafts", type=int, default=3, help="prompt-lookup drafts per step")
    demo.add_argument("--max-tokens", type=int, default=400)
    demo.add_argument(
        "--repetition-penalty",
        type=float,
        default=1.0,
        help="above 1 fights greedy loops, but also penalizes repeated JSON punctuation",
    )
    demo.set_defaults(run=cmd_demo)

    generate = commands.add_parser("generate", help="one constrained answer from the real model")
    generate.add_argument("--schema", required=True, help="JSON Schema file")
    generate.add_argument("--prompt", required=True)
    generate.add_argument("--stream", action="store_true", help="print text as it is generated")
    generate.add_argument("--max-tokens", type=int, default=256)
    generate.set_defaults(run=cmd_generate)

    from .bench.runner import add_parser as add_bench_parser

    add_bench_parser(commands)
    return parser


def cmd_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    failures = run_demo(
        bundled_schema_path(DEFAULT_SCHEMA).parent,
        names=args.schema or (),
        num_drafts=args.drafts,
        max_new_tokens=args.max_tokens,
        repetition_penalty=args.repetition_penalty,
    )
    return 1 if failures else 0


def cmd_generate(args: argparse.Namespace) -> int:
    from .demo import run_generate

    path = Path(args.schema)
    try:
        Grammar.json_schema(path.read_text(encoding="utf-8"))
    except OSError as exc:
        print(f"error: cannot read schema {path}: {exc.strerror}", file=sys.stderr)
        return 2
    except GrammarError as exc:
        print(f"error: {path}: {exc}", file=sys.stderr)
        return 1
    return run_generate(path, args.prompt, stream=args.stream, max_new_tokens=args.max_tokens)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.run(args))


if __name__ == "__main__":
    sys.exit(main())
