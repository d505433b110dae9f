"""Realistic fill traffic: corpus schemas replaying their valid instances on a real vocabulary.

Each request is a MaskBench schema whose first valid instance, encoded by the vocabulary's
real tokenizer, xgrammar accepts token by token. A request sits at a random position of its
instance (structural and inside-string positions mix as in real traffic) and its drafts are
the instance's next tokens, so every draft is accepted: the most rows to fill.

Which schemas a run uses is pinned (`instances.json`, by MaskBench file name, for the
shared corpus; a run of n schemas takes the first n): a search that skips the schemas still
compiling after a few seconds picked other ones on a loaded machine, and runs then replayed
other traffic (fills cost 8 us at the median position and up to 1.3 ms inside some strings,
so the draws move a step's time by more than any change to the pool). A corpus without the
pinned names is searched.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, wait
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...backends import CompiledGrammar
from ...compiler import GrammarCompiler
from ...errors import GrammarMaskError
from ...grammars import Grammar
from ...resources import bench_instances_path, schemas_dir
from ..known_vocabs import Encoder

MAX_SCHEMA_CHARS = 4_000
"""Larger schemas take seconds each to compile on a 129k vocabulary (minutes on a busy
2-core machine), which would dominate a run."""


PINNED_COMPILE_TIMEOUT_S = 300.0
"""A pinned schema compiled in under 5 s when it was pinned; a busy machine may take longer."""


@dataclass(frozen=True)
class Instance:
    """A compiled schema (by name: its MaskBench file, or bundled file and example) and the
    token ids of one of its valid instances."""

    name: str
    compiled: CompiledGrammar
    ids: tuple[int, ...]


@dataclass(frozen=True)
class Replay:
    """One request of a step: the instance prefix it has committed and its drafts."""

    compiled: CompiledGrammar
    prefix: tuple[int, ...]
    drafts: tuple[int, ...]


def pinned_names() -> list[str]:
    """The MaskBench names runs replay, in order: a run of n schemas takes the first n."""
    document = json.loads(bench_instances_path().read_text())
    names: list[str] = document["names"]
    return names


def _compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _maskbench(path: Path) -> tuple[dict[str, Any], str] | None:
    """A MaskBench file's schema and its first valid instance, if small enough to use."""
    entry = json.loads(path.read_text(encoding="utf-8"))
    valid = [t["data"] for t in entry.get("tests", []) if t.get("valid")]
    schema = entry.get("schema")
    if valid and isinstance(schema, dict) and len(json.dumps(schema)) <= MAX_SCHEMA_CHARS:
        return schema, _compact(valid[0])
    return None


def candidates(
    corpus: Path | None, rng: random.Random
) -> Iterator[tuple[str, dict[str, Any], str]]:
    """(name, schema, compact instance text): MaskBench files in random order, or with no
    corpus the bundled schemas and their `examples`."""
    if corpus is None:
        for path in sorted(schemas_dir().glob("*.json")):
            schema = json.loads(path.read_text(encoding="utf-8"))
            for index, example in enumerate(schema.get("examples", [])):
                yield f"{path.stem}#{index}", schema, _compact(example)
        return
    paths = sorted(corpus.glob("*.json"))
    if not paths:
        raise FileNotFoundError(f"no MaskBench schemas in {corpus}")
    rng.shuffle(paths)
    for path in paths:
        found = _maskbench(path)
        if found is not None:
            yield path.stem, *found


def _replayed(name: str, compiled: CompiledGrammar, text: str, encode: Encoder) -> Instance | None:
    """The instance, if xgrammar accepts all of it (and it is long enough to sit inside)."""
    ids = encode(text)
    matcher = compiled.matcher()
    if len(ids) > 8 and all(matcher.accept(t) for t in ids) and matcher.can_stop():
        return Instance(name, compiled, tuple(ids))
    return None


def _named(
    corpus: Path, names: Sequence[str], compiler: GrammarCompiler, encode: Encoder
) -> list[Instance] | None:
    """The pinned instances, or None if this corpus lacks one or it no longer replays."""
    loaded = []
    for name in names:
        path = corpus / f"{name}.json"
        found = _maskbench(path) if path.is_file() else None
        if found is None:
            return None
        loaded.append((name, *found))
    pending = [
        (name, compiler.submit(Grammar.json_schema(schema), "xgrammar"), text)
        for name, schema, text in loaded
    ]
    chosen = []
    for name, future, text in pending:
        try:
            instance = _replayed(name, future.result(PINNED_COMPILE_TIMEOUT_S), text, encode)
        except (GrammarMaskError, FutureTimeout):
            instance = None
        if instance is None:
            _settle([f for _, f, _ in pending])
            return None
        chosen.append(instance)
    return chosen


def pick_instances(
    corpus: Path | None,
    count: int,
    compiler: GrammarCompiler,
    encode: Encoder,
    rng: random.Random,
    *,
    compile_timeout_s: float = 5.0,
    names: Sequence[str] | None = None,
) -> list[Instance]:
    """The pinned `names` if the corpus has them all and they replay; otherwise up to
    `count` schemas whose instance xgrammar replays in full, searched: a window of
    candidates compiles in the background and a schema still compiling
    `compile_timeout_s` after its turn came is skipped."""
    if names is not None and corpus is not None:
        pinned = _named(corpus, names[:count], compiler, encode)
        if pinned is not None:
            return pinned
    chosen: list[Instance] = []
    pending: list[tuple[str, Future[CompiledGrammar], str]] = []
    skipped: list[Future[CompiledGrammar]] = []
    pool = candidates(corpus, rng)
    while len(chosen) < count:
        for name, schema, text in pool:
            try:
                grammar = Grammar.json_schema(schema)
            except GrammarMaskError:
                continue
            pending.append((name, compiler.submit(grammar, "xgrammar"), text))
            if len(pending) >= 2 * (count - len(chosen)):
                break
        if not pending:
            break
        name, future, text = pending.pop(0)
        try:
            compiled = future.result(timeout=compile_timeout_s)
        except FutureTimeout:
            skipped.append(future)
            continue
        except GrammarMaskError:
            continue
        instance = _replayed(name, compiled, text, encode)
        if instance is not None:
            chosen.append(instance)
    _settle([*skipped, *(future for _, future, _ in pending)])
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
