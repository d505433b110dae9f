"""Command line: `grammarmask demo` (the real model, with and without masks), `generate`,
`check` (what each backend enforces of a schema) and `bench` (performance ratios)."""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..backends import installed_backends
from ..compiler import GrammarCompiler
from ..errors import GrammarError
from ..grammars import Grammar
from ..resources import bundled_schema_path, schemas_dir
from ..vocabulary import Vocabulary
from .check import add_check_parser, text_table
from .known_vocabs import KNOWN_VOCABULARIES, load_vocabulary


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="grammarmask", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    add_check_parser(commands)

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
    model = commands.add_parser(
        "model",
        help="print the folder of the SmolLM2 checkpoint (converted once), e.g. for vllm serve",
    )
    model.set_defaults(run=cmd_model)
    _add_conformance_parser(commands)
    _add_fuzz_parser(commands)
    _add_soak_parser(commands)

    from .bench.runner import add_parser as add_bench_parser

    add_bench_parser(commands)
    return parser


def cmd_model(args: argparse.Namespace) -> int:
    from ..integrations.transformers import smollm2_checkpoint

    print(smollm2_checkpoint())
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    failures = run_demo(
        schemas_dir(),
        names=args.schema or (),
        num_drafts=args.drafts,
        max_new_tokens=args.max_tokens,
        repetition_penalty=args.repetition_penalty,
    )
    return 1 if failures else 0


def cmd_generate(args: argparse.Namespace) -> int:
    from .demo import run_generate

    path = Path(args.schema)
    _, code = _read_schema(path, str(path))
    if code:
        return code
    return run_generate(path, args.prompt, stream=args.stream, max_new_tokens=args.max_tokens)


def _read_schema(path: Path, label: str) -> tuple[Any, int]:
    """(parsed schema, 0), or (None, exit code) after saying why: 2 unreadable, 1 invalid."""
    try:
        return Grammar.json_schema(path.read_text(encoding="utf-8")).schema, 0
    except OSError as exc:
        print(f"error: cannot read schema {label}: {exc.strerror}", file=sys.stderr)
        return None, 2
    except GrammarError as exc:
        print(f"error: {label}: {exc}", file=sys.stderr)
        return None, 1


def _unknown_backends(names: Sequence[str]) -> int:
    """2 after naming the backends that are neither installed nor 'auto', else 0."""
    known = {*installed_backends(), "auto"}
    unknown = [b for b in names if b not in known]
    if unknown:
        print(
            f"error: unknown or uninstalled backend(s) {', '.join(unknown)}; "
            f"choose from {', '.join(sorted(known))}",
            file=sys.stderr,
        )
        return 2
    return 0


def _add_soak_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    soak = commands.add_parser(
        "soak",
        help="vLLM's OpenAI server with the plugin (process isolation) under every schema of a "
        "corpus and adversarial grammars from concurrent clients (needs vLLM)",
    )
    soak.add_argument(
        "directory",
        nargs="?",
        help="MaskBench-format directory (default: $GRAMMARMASK_CORPUS, "
        "../shared/corpus/maskbench, else a bundled sample)",
    )
    soak.add_argument("--limit", type=int, help="only the first N schemas")
    soak.add_argument("--sample", type=int, help="a seeded random sample of N schemas")
    soak.add_argument("--seed", type=int, default=0, help="seed for --sample")
    soak.add_argument(
        "--copies", type=int, default=1, help="each schema N times under new titles (N compiles)"
    )
    soak.add_argument("--clients", type=int, default=16, help="concurrent clients")
    soak.add_argument("--max-tokens", type=int, default=24, help="tokens per answer")
    soak.add_argument("--model", help="model folder (default: the SmolLM2 checkpoint)")
    soak.add_argument("--log", help="where the server's log goes (default: a temporary file)")
    soak.add_argument("--json", dest="json_out", help="write the report as JSON here")
    soak.set_defaults(run=cmd_soak)


def cmd_soak(args: argparse.Namespace) -> int:
    """Exit 0 when the engine lived, no answer broke its grammar and nothing failed but
    with a 400 or a reason from the plugin; 1 otherwise, 2 for unusable arguments."""
    import tempfile

    from tqdm import tqdm

    from . import conformance as cf
    from .soak import SETTINGS, adversarial_cases, retitled_copies, run_soak, schema_cases
    from .vllm_server import serve

    directory = Path(args.directory) if args.directory else cf.default_corpus_dir()
    try:
        files = cf.select_files(directory, limit=args.limit, sample=args.sample, seed=args.seed)
    except FileNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        import vllm  # noqa: F401
    except ImportError:
        print("error: the soak needs vLLM: bash scripts/vllm-env.sh, then run it with "
              ".venv-vllm/bin/grammarmask soak", file=sys.stderr)  # fmt: skip
        return 2
    from transformers import AutoTokenizer

    from ..integrations.transformers import smollm2_checkpoint

    model_dir = Path(args.model) if args.model else smollm2_checkpoint()
    vocab = Vocabulary.from_transformers(AutoTokenizer.from_pretrained(model_dir))
    schemas = retitled_copies(schema_cases(files), max(1, args.copies))
    cases = schemas + adversarial_cases()
    adversarial = len(cases) - len(schemas)
    print(
        f"{len(schemas)} schema requests from {directory} and {adversarial} adversarial "
        f"grammars, {args.clients} clients, {args.max_tokens} tokens each"
    )
    log = Path(args.log) if args.log else Path(tempfile.mkdtemp()) / "vllm.log"
    print(f"starting vLLM (log: {log}) ...")
    extra = ["--max-num-seqs", str(args.clients)]
    with (
        serve(model_dir, log, SETTINGS, extra_args=extra) as server,
        tqdm(total=len(cases), unit="request") as bar,
    ):
        report, _ = run_soak(
            server,
            cases,
            vocab=vocab,
            clients=args.clients,
            max_tokens=args.max_tokens,
            progress=bar.update,
        )
    print(report.table())
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(report.to_json(), indent=2), encoding="utf-8")
    trouble = report.deaths or report.errors or report.broken
    return 1 if trouble else 0


def _add_conformance_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    conformance = commands.add_parser(
        "conformance",
        help="check compiled grammars against a MaskBench-format corpus's valid/invalid tests",
    )
    conformance.add_argument(
        "directory",
        nargs="?",
        help="MaskBench-format directory (default: $GRAMMARMASK_CORPUS, "
        "../shared/corpus/maskbench, else a bundled sample)",
    )
    conformance.add_argument(
        "--backend",
        action="append",
        help="backend name or 'auto' (repeatable; default: xgrammar)",
    )
    conformance.add_argument("--vocab", choices=sorted(KNOWN_VOCABULARIES), default="deepseek")
    conformance.add_argument("--whitespace", choices=("compact", "flexible"), default="compact")
    conformance.add_argument("--strict", action="store_true", help="close objects by default")
    conformance.add_argument(
        "--allow-unenforced",
        action="store_true",
        help="with auto: serve what no backend enforces fully (every looseness is declared)",
    )
    conformance.add_argument("--timeout", type=float, default=30.0, help="compile limit (s)")
    conformance.add_argument(
        "--check-timeout", type=float, default=120.0, help="limit for checking the tests (s)"
    )
    conformance.add_argument(
        "--mutate",
        type=int,
        default=0,
        metavar="N",
        help="also feed up to N mutants of each schema's valid instances, each one the schema "
        "refuses (a mask that accepts one, undeclared, is a hole at the keyword it breaks)",
    )
    conformance.add_argument("--jobs", type=int, default=1, help="worker processes")
    conformance.add_argument("--limit", type=int, help="only the first N schemas")
    conformance.add_argument("--sample", type=int, help="a seeded random sample of N schemas")
    conformance.add_argument("--seed", type=int, default=0, help="seed for --sample")
    conformance.add_argument("--json", dest="json_out", help="write one JSON line per schema")
    conformance.add_argument(
        "--resume", action="store_true", help="skip the schemas already in --json OUT"
    )
    conformance.set_defaults(run=cmd_conformance)


def cmd_conformance(args: argparse.Namespace) -> int:
    """Exit 0 when no schema crashed and no invalid instance or mutant was accepted
    undeclared, 1 otherwise, 2 for unusable arguments."""
    import json

    from tqdm import tqdm

    from . import conformance as cf
    from . import conformance_report as cr

    backends = args.backend or ["xgrammar"]
    if _unknown_backends(backends):
        return 2
    if args.resume and not args.json_out:
        print("error: --resume needs --json OUT", file=sys.stderr)
        return 2
    directory = Path(args.directory) if args.directory else cf.default_corpus_dir()
    try:
        files = cf.select_files(directory, limit=args.limit, sample=args.sample, seed=args.seed)
    except (FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    out_path = Path(args.json_out) if args.json_out else None
    previous: list[cf.Record] = []
    if args.resume and out_path is not None and out_path.exists():
        names = {f.name for f in files}
        previous = [r for r in cr.read_records(out_path) if r["schema"] in names]
    options = cf.ConformanceOptions(
        vocab=args.vocab,
        whitespace=args.whitespace,
        strict=args.strict,
        allow_unenforced=args.allow_unenforced,
        compile_timeout_s=args.timeout,
        check_timeout_s=args.check_timeout,
        mutate=args.mutate,
    )
    print(
        f"corpus {directory}: {len(files)} schema(s) x {', '.join(backends)}; "
        f"vocabulary {args.vocab}, {args.jobs} job(s)",
        file=sys.stderr,
    )
    out = out_path.open("a" if args.resume else "w", encoding="utf-8") if out_path else None
    done = {(r["schema"], r["backend"]) for r in previous}
    bar = tqdm(total=len(files) * len(backends), initial=len(done), unit="schema", file=sys.stderr)

    def record_landed(record: cf.Record) -> None:
        bar.update(1)
        if record["status"] in ("crash", "timeout"):
            bar.write(
                f"{record['backend']}: {record['schema']}: {record['status']}: {record['detail']}",
                file=sys.stderr,
            )
        if out is not None:
            out.write(json.dumps(record, ensure_ascii=False) + "\n")
            out.flush()

    try:
        records = cf.run_conformance(
            files, backends, options, jobs=args.jobs, on_record=record_landed, skip=done
        )
    finally:
        bar.close()
        if out is not None:
            out.close()
    totals = cr.summarize([*previous, *records])
    print(cr.summary_table(totals))
    print(cr.lowering_line([*previous, *records]))
    bad = sum(
        t["crash"] + t["invalid_accepted_defect"] + t["mutant_accepted_defect"]
        for t in totals.values()
    )
    return 1 if bad else 0


def _add_fuzz_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    fuzz = commands.add_parser(
        "fuzz",
        help="hypothesis fuzzing of compiled schemas: soundness, completeness, differential, state",
    )
    fuzz.add_argument(
        "schema", nargs="*", help="schema files or bundled names (default: every bundled schema)"
    )
    fuzz.add_argument(
        "--backend",
        action="append",
        help="backend or 'auto' (repeatable; default: xgrammar and llguidance if installed)",
    )
    fuzz.add_argument("--examples", type=int, default=100, help="examples per property")
    fuzz.add_argument("--seed", type=int, default=0)
    fuzz.add_argument("--max-tokens", type=int, default=256, help="length cap of a walk")
    fuzz.add_argument("--vocab", choices=sorted(KNOWN_VOCABULARIES), default="deepseek")
    fuzz.add_argument("--whitespace", choices=("compact", "flexible"), default="compact")
    fuzz.add_argument(
        "--property",
        action="append",
        choices=("soundness", "completeness", "differential", "state"),
        help="only these properties (repeatable; default: all)",
    )
    fuzz.set_defaults(run=cmd_fuzz)


def _fuzz_targets(names: Sequence[str]) -> list[tuple[str, Path]]:
    """(name as typed, file) for each schema argument; bare names are bundled schemas."""
    if not names:
        folder = schemas_dir()
        return [(p.stem, p) for p in sorted(folder.glob("*.json"))]
    targets = []
    for name in names:
        path = Path(name)
        if not path.exists():
            path = bundled_schema_path(name if name.endswith(".json") else f"{name}.json")
        targets.append((name, path))
    return targets


def cmd_fuzz(args: argparse.Namespace) -> int:
    """Exit 0 without counterexamples, 1 with, 2 for unusable arguments."""
    from tqdm import tqdm

    from .fuzz import PROPERTIES, SchemaFuzzer

    installed = installed_backends()
    backends = args.backend or [b for b in ("xgrammar", "llguidance") if b in installed]
    if _unknown_backends(backends):
        return 2
    grammars = []
    for name, path in _fuzz_targets(args.schema):
        schema, code = _read_schema(path, name)
        if code:
            return code
        grammars.append((name, schema, Grammar.json_schema(schema, whitespace=args.whitespace)))
    vocab = load_vocabulary(args.vocab)
    compiler = GrammarCompiler(vocab, timeout_s=600)
    rows = [["schema", "backend", "enforced", "walks", "ended", "declared", "instances",
             "accepted", "known gap", "key order", "diff", "state", "findings"]]  # fmt: skip
    findings = []
    for name, schema, grammar in tqdm(grammars, unit="schema", file=sys.stderr):
        compiled = {}
        for backend in backends:
            try:
                compiled[backend] = compiler.compile(grammar, backend)
            except GrammarError as exc:
                rows.append([name, backend, type(exc).__name__, *["-"] * 10])
        fuzzer = SchemaFuzzer(
            name, schema, compiled, vocab, seed=args.seed, examples=args.examples,
            max_tokens=args.max_tokens,
            command=f"grammarmask fuzz --vocab {args.vocab} --whitespace {args.whitespace}",
        )  # fmt: skip
        report = fuzzer.run(args.property or PROPERTIES)
        findings.extend(report.findings)
        for backend, item in compiled.items():
            counts = report.counts.get(backend, Counter())
            mine = sum(backend in f.backend.split("+") for f in report.findings)
            rows.append([
                name, backend, "full" if item.fully_enforced else f"{len(item.unenforced)} gaps",
                *(str(counts.get(k, 0)) for k in ("walks", "walks_terminated", "walks_declared",
                  "instances", "instances_accepted", "instances_known_gap", "instances_key_order",
                  "differential_compared", "state_sequences")),
                str(mine),
            ])  # fmt: skip
    compiler.close()
    print(text_table(rows))
    for finding in findings:
        print()
        print(finding)
    return 1 if findings else 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.run(args))


if __name__ == "__main__":
    sys.exit(main())
