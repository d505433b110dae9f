"""Realistic fill traffic: corpus schemas replaying their valid instances on a real vocabulary.

Each request is a MaskBench schema whose first valid instance, encoded by the vocabulary's
real tokenizer, xgrammar accepts token by token. A request sits at a random position of its
instance (structural and inside-string positions mix as in real traffic) and its drafts are
the instance's next tokens, so every draft is accepted: the most rows to fill.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from concurrent.futures import Future, wait
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path
from typing import Any

from ..backends import CompiledGrammar
from ..compiler import GrammarCompiler
from ..errors import GrammarMaskError
from ..grammars import Grammar
from ..known_vocabs import Encoder

MAX_SCHEMA_CHARS = 4_000
"""Larger schemas take seconds each to compile on a 129k vocabulary (minutes on a busy
2-core machine), which would dominate a run."""


@dataclass(frozen=True)
class Instance:
    """A compiled schema and the token ids of one of its valid instances."""

    compiled: CompiledGrammar
    ids: tuple[int, ...]


@dataclass(frozen=True)
class Replay:
    """One request of a step: the instance prefix it has committed and its drafts."""

    compiled: CompiledGrammar
    prefix: tuple[int, ...]
    drafts: tuple[int, ...]


def candidates(corpus: Path | None, rng: random.Random) -> Iterator[tuple[dict[str, Any], str]]:
    """(schema, compact instance text): MaskBench files in random order, or with no corpus
    the bundled schemas and their `examples`."""
    if corpus is None:
        for path in sorted(Path(str(files("grammarmask.schemas"))).glob("*.json")):
            schema = json.loads(path.read_text(encoding="utf-8"))
            for example in schema.get("examples", []):
                yield schema, json.dumps(example, separators=(",", ":"), ensure_ascii=False)
        return
    paths = sorted(corpus.glob("*.json"))
    if not paths:
        raise FileNotFoundError(f"no MaskBench schemas in {corpus}")
    rng.shuffle(paths)
    for path in paths:
        entry = json.loads(path.read_text(encoding="utf-8"))
        valid = [t["data"] for t in entry.get("tests", []) if t.get("valid")]
        schema = entry.get("schema")
        if valid and isinstance(schema, dict) and len(json.dumps(schema)) <= MAX_SCHEMA_CHARS:
            yield schema, json.dumps(valid[0], separators=(",", ":"), ensure_ascii=False)


def pick_instances(
    corpus: Path | None,
    count: int,
    compiler: GrammarCompiler,
    encode: Encoder,
    rng: random.Random,
    *,
    compile_timeout_s: float = 5.0,
) -> list[Instance]:
    """Up to `count` schemas whose instance xgrammar replays in full; a window of candidates
    compiles in the background and a schema still compiling `compile_timeout_s` after
    its turn came is skipped."""
    chosen: list[Instance] = []
    pending: list[tuple[Future[CompiledGrammar], str]] = []
    skipped: list[Future[CompiledGrammar]] = []
    pool = candidates(corpus, rng)
    while len(chosen) < count:
        for schema, text in pool:
            try:
                grammar = Grammar.json_schema(schema)
            except GrammarMaskError:
                continue
            pending.append((compiler.submit(grammar, "xgrammar"), text))
            if len(pending) >= 2 * (count - len(chosen)):
                break
        if not pending:
            break
        future, text = pending.pop(0)
        try:
            compiled = future.result(timeout=compile_timeout_s)
        except FutureTimeout:
            skipped.append(future)
            continue
        except GrammarMaskError:
            continue
        ids = encode(text)
        matcher = compiled.matcher()
        if len(ids) > 8 and all(matcher.accept(t) for t in ids) and matcher.can_stop():
            chosen.append(Instance(compiled, tuple(ids)))
    _settle([*skipped, *(future for future, _ in pending)])
    if not chosen:
        raise ValueError(f"no usable schema in {corpus or 'the bundled schemas'}")
    return chosen


def _settle(leftovers: list[Future[CompiledGrammar]]) -> None:
    """Cancel the compilations not started and wait for the running ones: left running,
    they kept both cores of a 2-core machine busy for ~20 s into the timed scenarios."""
    for future in leftovers:
        future.cancel()
    wait(leftovers)


def replays(
    instances: list[Instance], requests: int, drafts: int, rng: random.Random
) -> list[Replay]:
    """`requests` requests cycling over the instances, each at a random position."""
    out = []
    for index in range(requests):
        instance = instances[index % len(instances)]
        position = rng.randrange(0, len(instance.ids) - 1)
        out.append(
            Replay(
                instance.compiled,
                instance.ids[:position],
                instance.ids[position : position + drafts],
            )
        )
    return out
