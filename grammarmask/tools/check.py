"""`grammarmask check`: compile one JSON Schema on each installed backend and on `auto`,
and say what each enforces of it (its lowering's rewrites first)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from ..backends import AUTO, AUTO_ORDER, installed_backends
from ..compiler import GrammarCompiler
from ..errors import GrammarError, GrammarMaskError, NotFullyEnforcedError
from ..grammars import Grammar
from ..resources import bundled_schema_path
from ..schema import lower_schema
from ..vocabulary import Vocabulary
from .known_vocabs import KNOWN_VOCABULARIES, load_vocabulary

DEFAULT_SCHEMA = "person.json"


def add_check_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
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
        "--backend",
        action="append",
        help="backend to try, or 'auto' (repeatable; default: all installed, then auto)",
    )
    check.add_argument(
        "--allow-unenforced",
        action="store_true",
        help="let auto serve a schema no backend enforces fully (the fewest constraints left out)",
    )
    check.add_argument("--whitespace", choices=("compact", "flexible"), default="compact")
    check.add_argument(
        "--strict", action="store_true", help="objects without additionalProperties are closed"
    )
    check.add_argument("--timeout", type=float, default=120.0, help="compile timeout in seconds")
    check.add_argument(
        "--show-lowered",
        action="store_true",
        help="print the lowered schema the backends compile (after its list of rewrites)",
    )
    check.set_defaults(run=run_check)


def _load_vocab(args: argparse.Namespace) -> Vocabulary:
    if args.tokenizer_json:
        return Vocabulary.from_tokenizer_json(args.tokenizer_json, logits_width=args.logits_width)
    return load_vocabulary(args.vocab)


def text_table(rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def run_check(args: argparse.Namespace) -> int:
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
    lowering = lower_schema(grammar.schema)
    print(f"lowering   {len(lowering.rewrites)} rewrite(s)" + (":" if lowering.rewrites else ""))
    for rewrite in lowering.rewrites:
        print(f"  {rewrite}")
    if lowering.rewrites and args.show_lowered:
        print(json.dumps(lowering.schema, indent=2))
    loaded = time.perf_counter() - started
    print(f"vocabulary {args.tokenizer_json or args.vocab}: {vocab} (loaded in {loaded:.1f} s)")
    backends = args.backend or [*installed_backends(), AUTO]
    compiler = GrammarCompiler(vocab, timeout_s=args.timeout)
    rows = [["backend", "result", "compile", "enforcement"]]
    details: list[str] = []
    compiled_any = False
    for name in backends:
        print(f"compiling on {name} ...", file=sys.stderr, flush=True)
        try:
            compiled = compiler.compile(grammar, name, allow_unenforced=args.allow_unenforced)
        except NotFullyEnforcedError as exc:
            rows.append([name, "refused", "-", "no backend enforces all of it"])
            details.extend(
                f"{name}: refused: {b}: {why}" for b, w in exc.reasons.items() for why in w
            )
            continue
        except GrammarMaskError as exc:
            rows.append([name, type(exc).__name__, "-", "-"])
            details.append(f"{name}: {exc}")
            continue
        compiled_any = True
        if name == AUTO:
            how = (
                f"the first of {', '.join(AUTO_ORDER)} that enforces all of it"
                if compiled.fully_enforced
                else "the backend that leaves out the fewest constraints (--allow-unenforced)"
            )
            details.append(f"auto: served by {compiled.backend}, {how}")
        if compiled.fully_enforced:
            enforcement = "full"
        else:
            enforcement = f"partial: {len(compiled.unenforced)} constraint(s) not enforced"
            details.extend(f"{name}: not enforced: {item}" for item in compiled.unenforced)
        result = "compiled" if name != AUTO else f"-> {compiled.backend}"
        rows.append([name, result, f"{compiled.compile_seconds * 1000:.0f} ms", enforcement])
    compiler.close()
    print()
    print(text_table(rows))
    if details:
        print()
        print("\n".join(details))
    return 0 if compiled_any else 3
