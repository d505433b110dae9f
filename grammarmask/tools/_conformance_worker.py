"""Child process of the conformance runner: compiles and checks one schema per request.

Protocol (JSON lines): the parent writes `{"path", "backend", "whitespace", "strict"}`;
the worker answers `{"event": "compiling"}` when the compilation starts (after the
backend's one-time set-up), `{"event": "compiled"}` once it is done (so the parent can
time set-up, compilation and checking apart) and then `{"event": "result", "record": ...}`.
It prints `{"event": "ready"}` once the vocabulary and tokenizer are loaded. File
descriptor 1 is moved to stderr so that native libraries cannot corrupt the protocol.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any

from ..backends import CompiledGrammar
from ..compiler import GrammarCompiler
from ..errors import (
    GrammarError,
    InvalidJSONError,
    InvalidSchemaError,
    NotFullyEnforcedError,
    SchemaJudgeError,
    UnsupportedGrammarError,
)
from ..grammars import Grammar
from ..schema import lower_schema
from .conformance import Record, byte_token_ids, feed, judge_invalid_accepted, serialize, validates
from .known_vocabs import KNOWN_VOCABULARIES, load_encoder, load_vocabulary
from .mutants import mutants

_MUTATED_INSTANCES = 5
"""Valid instances of one schema whose mutants `--mutate` feeds (the corpus has 1-3)."""


def _verdict(schema: Any, instance: Any) -> bool | None:
    """jsonschema's verdict, None where it cannot judge the schema."""
    try:
        return validates(schema, instance)
    except SchemaJudgeError:
        return None


class Checker:
    """Holds what a worker loads once: vocabulary, tokenizer, compiler."""

    def __init__(self, vocab_name: str) -> None:
        self.vocab = load_vocabulary(vocab_name)
        self.encode = load_encoder(vocab_name)
        self.byte_ids = byte_token_ids(self.vocab)
        # One cache slot: outlines indexes are tens of MB each and schemas do not repeat.
        self.compiler = GrammarCompiler(self.vocab, threads=1, cache_size=1, timeout_s=1e9)
        self._warm: set[tuple[str, str, bool]] = set()

    def _warm_up(self, backend: str, grammar: Grammar) -> None:
        """Bind the backend and build its per-vocabulary tables (xgrammar's tokenizer info
        and token filter take seconds) outside the timed compilation."""
        key = (backend, grammar.whitespace, grammar.strict)
        if key in self._warm:
            return
        self._warm.add(key)
        tiny = Grammar.json_schema(
            {"type": "string"}, whitespace=grammar.whitespace, strict=grammar.strict
        )
        for name in self.compiler.auto_candidates() if backend == "auto" else (backend,):
            try:
                self.compiler.compile(tiny, name)
            except GrammarError:
                continue  # the real compilation reports the problem

    def check(self, request: dict[str, Any], emit: Callable[[dict[str, Any]], None]) -> Record:
        path = Path(request["path"])
        backend = request["backend"]
        record: Record = {"schema": path.name, "backend": backend}
        try:
            entry = json.loads(path.read_text(encoding="utf-8"))
            schema = entry["schema"]
            tests = list(entry.get("tests", []))
        except (
            OSError,
            UnicodeDecodeError,
            ValueError,
            KeyError,
            TypeError,
            AttributeError,
        ) as exc:
            return {**record, "status": "unreadable", "detail": f"{type(exc).__name__}: {exc}"}
        try:
            grammar = Grammar.json_schema(
                schema, whitespace=request["whitespace"], strict=request["strict"]
            )
        except (InvalidSchemaError, InvalidJSONError) as exc:
            return {**record, "status": "invalid_schema", "detail": str(exc)}
        self._warm_up(backend, grammar)
        started = time.perf_counter()
        # timed on its own (the compiler keeps the lowered form of the schemas it has seen)
        lowering = lower_schema(grammar.schema)
        lower_s = time.perf_counter() - started
        rewrites = sorted({r.rule for r in lowering.rewrites})
        record.update(rewrites=rewrites, lower_s=round(lower_s, 6))
        emit({"event": "compiling"})
        try:
            compiled = self.compiler.compile(
                grammar, backend, allow_unenforced=request.get("allow_unenforced", False)
            )
        except (UnsupportedGrammarError, NotFullyEnforcedError) as exc:
            return {**record, "status": "unsupported", "detail": str(exc)}
        except GrammarError as exc:
            return {**record, "status": "compile_error", "detail": str(exc)}
        emit({"event": "compiled"})
        matcher = compiled.matcher()
        counts: Counter[str] = Counter()
        findings: list[dict[str, Any]] = []
        for index, test in enumerate(tests):
            text, determined = serialize(
                schema, test["data"], request["whitespace"], lowered=lowering.schema
            )
            encoded = text.encode("utf-8")
            errors: list[str] = []
            if all(b in self.byte_ids for b in encoded):
                as_bytes = feed(matcher, [self.byte_ids[b] for b in encoded], errors)
            else:
                as_bytes = None
            as_ids = feed(matcher, self.encode(text), errors)
            if errors:
                counts["matcher_errors"] += len(errors)
            if as_bytes is not None and as_bytes[0] != as_ids[0]:
                counts["bytes_tokens_disagree"] += 1
                findings.append({"test": index, "outcome": "bytes_tokens_disagree", "text": text})
            valid = bool(test["valid"])
            counts["valid" if valid else "invalid"] += 1
            if valid:
                accepted = as_ids[0] and (as_bytes is None or as_bytes[0])
                if accepted:
                    counts["valid_accepted"] += 1
                    continue
                outcome = "valid_rejected" if determined else "valid_rejected_key_order"
                counts[outcome] += 1
                findings.append(
                    {
                        "test": index,
                        "outcome": outcome,
                        "at_byte": _at_byte(as_bytes),
                        "jsonschema_valid": _verdict(schema, test["data"]),  # doubtful label?
                        "text": text,
                        **({"matcher_error": errors[0]} if errors else {}),
                    }
                )
                continue
            accepted = as_ids[0] or (as_bytes is not None and as_bytes[0])
            if not accepted:
                counts["invalid_rejected"] += 1
                continue
            verdict = judge_invalid_accepted(schema, compiled.unenforced, test["data"])
            counts[f"invalid_accepted_{verdict}"] += 1
            findings.append({"test": index, "outcome": f"invalid_accepted_{verdict}", "text": text})
        mutate = int(request.get("mutate", 0))
        if mutate:
            instances = [t["data"] for t in tests if t["valid"]][:_MUTATED_INSTANCES]
            self._mutants(
                schema, lowering.schema, compiled, instances, request, counts, findings, mutate
            )
        for finding in findings:
            finding["text"] = finding["text"][:300]
        return {
            **record,
            "status": "compiled",
            "served_by": compiled.backend,
            "compile_s": round(compiled.compile_seconds, 4),
            "fully_enforced": compiled.fully_enforced,
            "unenforced": [str(u) for u in compiled.unenforced],
            "counts": dict(counts),
            "findings": findings,
        }

    def _mutants(
        self,
        schema: Any,
        lowered: Any,
        compiled: CompiledGrammar,
        instances: list[Any],
        request: dict[str, Any],
        counts: Counter[str],
        findings: list[dict[str, Any]],
        limit: int,
    ) -> None:
        """Feed mutants of the valid instances (`limit` in all): each the schema refuses
        must be refused by the mask, or be explained by a declaration."""
        matcher = compiled.matcher()
        share = max(1, limit // max(1, len(instances)))
        errors: list[str] = []
        try:
            for instance in instances:
                for mutant in mutants(schema, instance, share):
                    counts["mutants"] += 1
                    text, _ = serialize(
                        schema, mutant.instance, request["whitespace"], lowered=lowered
                    )
                    if not feed(matcher, self.encode(text), errors)[0]:
                        counts["mutants_rejected"] += 1
                        if errors:
                            counts["matcher_errors"] += len(errors)
                            errors.clear()
                        continue
                    verdict = judge_invalid_accepted(schema, compiled.unenforced, mutant.instance)
                    counts[f"mutant_accepted_{verdict}"] += 1
                    if verdict != "explained":
                        findings.append({
                            "outcome": f"mutant_accepted_{verdict}",
                            "keyword": mutant.keyword,
                            "schema_pointer": mutant.schema_pointer,
                            "at": mutant.at,
                            "edit": mutant.edit,
                            "text": text,
                        })  # fmt: skip
        except SchemaJudgeError:
            counts["mutants_unjudged"] += 1


def _at_byte(as_bytes: tuple[bool, int] | None) -> int | None:
    return None if as_bytes is None else as_bytes[1]


def serve(checker: Checker, requests: IO[str], replies: IO[str]) -> None:
    """Answer requests until stdin closes."""

    def emit(message: dict[str, Any]) -> None:
        replies.write(json.dumps(message) + "\n")
        replies.flush()

    emit({"event": "ready"})
    for line in requests:
        if not line.strip():
            continue
        request = json.loads(line)
        try:
            record = checker.check(request, emit)
        except Exception as exc:  # a backend bug: report it, keep serving
            record = {
                "schema": Path(request["path"]).name,
                "backend": request["backend"],
                "status": "crash",
                "detail": f"{type(exc).__name__}: {exc}",
            }
        emit({"event": "result", "record": record})


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m grammarmask.tools._conformance_worker")
    parser.add_argument("--vocab", choices=sorted(KNOWN_VOCABULARIES), default="deepseek")
    args = parser.parse_args(argv)
    replies = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    serve(Checker(args.vocab), sys.stdin, replies)


if __name__ == "__main__":
    main()
