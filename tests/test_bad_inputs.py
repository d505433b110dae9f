"""The bad-input catalogue: every input grammarmask refuses, and what the caller gets.

One row per kind. Engine mistakes (batch layout, logits, configuration, API misuse) raise
at once; a request's own problems (its grammar, its tokens, its id) fail that request
alone: its state becomes `failed` with the reason, and a bystander request in the same
pool keeps bit-identical masks. The table in docs/bad-inputs.md is rendered from this
table (`python tests/test_bad_inputs.py` prints it) and a test keeps the two identical.
"""

from __future__ import annotations

import builtins
import dataclasses
import functools
import importlib
import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import faults
import pytest
import torch

import grammarmask as gm
from grammarmask.integrations.engine import ReferenceEngine
from grammarmask.pool.plan import BatchEntry

FAILED = "request failed"
"""Outcome of a request-level problem: a RequestState with status 'failed'."""
BIG = 1 << 20
"""GrammarLimits().max_source_bytes."""
DEEP_ITEMS = 101
"""Nested `items` schemas one level past GrammarLimits().max_depth."""


V = gm.Vocabulary
G = gm.Grammar
OBJ = {"type": "object", "properties": {"a": {"type": "string"}}}
STOP = 1
"""DeepSeek's EOS id."""
UNCOMPILABLE = {"properties": {"a": False}, "required": ["a"]}
"""Valid JSON Schema that xgrammar 0.2.9 refuses (a required property that must not exist)."""


class Ctx:
    """What the rows act on: the real DeepSeek vocabulary, one pool with a bystander
    request, the masks of one filled step, a folder for tokenizer files."""

    def __init__(self, vocab: gm.Vocabulary, folder: Path) -> None:
        self.vocab = vocab
        self.folder = folder
        self.compiler = gm.GrammarCompiler(vocab)
        self.pool = gm.MatcherPool(vocab, workers=2, compiler=self.compiler)
        self._ids = itertools.count()
        self.pool.add("bystander", gm.Grammar.json_schema({**OBJ, "required": ["a"]}))
        self._bystander_drafts = [self.token(b'{"'), self.token(b"a")]
        self._bystander_rows = self._fill_bystander([])[0]
        self.pool.add("logits", gm.Grammar.regex("[a-z]+"))
        self.masks = self.pool.fill([("logits", [self.token(b"a")]), (None, [])])

    def new_id(self) -> str:
        return f"r{next(self._ids)}"

    def token(self, text: bytes) -> int:
        return self.vocab.token_bytes.index(text)

    def tokenizer_file(self, text: str) -> Path:
        path = self.folder / f"{self.new_id()}.json"
        path.write_text(text, encoding="utf-8")
        return path

    def _fill_bystander(self, batch: list[BatchEntry]) -> tuple[torch.Tensor, str]:
        masks = self.pool.fill([*batch, ("bystander", self._bystander_drafts)])
        rows = list(masks.rows[-1])
        return masks.bitmask[rows].clone(), self.pool.state("bystander").status

    def step(self, request_id: str, drafts: list[int]) -> gm.RequestState:
        """One step with the request beside the bystander; the bystander must not notice."""
        assert self._fill_bystander([(request_id, drafts)])[0].equal(self._bystander_rows)
        return self.pool.state(request_id)

    def bystander_unchanged(self) -> bool:
        rows, status = self._fill_bystander([])
        return status == "active" and rows.equal(self._bystander_rows)

    def added(self, grammar: gm.Grammar, **options: Any) -> str:
        request_id = self.new_id()
        self.pool.add(request_id, grammar, **options)
        return request_id

    def failed_compile(self, grammar: gm.Grammar, **options: Any) -> gm.RequestState:
        return self.step(self.added(grammar, **options), [])

    def commit(self, grammar: gm.Grammar, *steps: list[int]) -> gm.RequestState:
        """Commit `steps` in turn to a new request; the state after the last."""
        request_id = self.added(grammar)
        state = self.pool.state(request_id)
        for tokens in steps:
            state = self.pool.commit(request_id, tokens)
        return state

    def close(self) -> None:
        self.pool.close()
        self.compiler.close()


@dataclass(frozen=True)
class Refusal:
    area: str
    what: str
    outcome: str
    """Exception class name (in grammarmask or builtins), or FAILED."""
    message: str
    """A fragment of the exception message or the request's reason."""
    trigger: Callable[[Ctx], object]


def _nested_items(depth: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "integer"}
    for _ in range(depth - 1):
        schema = {"type": "array", "items": schema}
    return schema


def _load_tokenizer(ctx: Ctx, vocab: dict[str, int], decoder: str = "ByteLevel") -> gm.Vocabulary:
    data = {"model": {"type": "BPE", "vocab": vocab}, "decoder": {"type": decoder}}
    return V.from_tokenizer_json(ctx.tokenizer_file(json.dumps(data)))


def _tiktoken(ctx: Ctx, lines: bytes, specials: dict[str, int]) -> gm.Vocabulary:
    path = ctx.folder / f"{ctx.new_id()}.tiktoken"
    path.write_bytes(lines)
    return gm.Vocabulary.from_tiktoken(path, specials)


def _apply(ctx: Ctx, logits: Any, masks: Any = None) -> None:
    gm.apply_bitmask(logits, ctx.masks if masks is None else masks)


def _logits(ctx: Ctx, **options: Any) -> torch.Tensor:
    return torch.zeros(ctx.masks.num_rows, ctx.vocab.size, **options)


def _remove_then_fill(ctx: Ctx) -> gm.RequestState:
    request_id = ctx.added(gm.Grammar.regex("x+"))
    ctx.pool.remove(request_id)
    return ctx.step(request_id, [])


def _fill(ctx: Ctx, batch: list[Any], **layout: Any) -> None:
    ctx.pool.fill(batch, **layout)


CATALOGUE: tuple[Refusal, ...] = (
    # ------------------------------------------------------------------ vocabularies
    Refusal("vocabulary", "a token table with no tokens", "VocabularyError", "has no tokens",
            lambda c: V([], stop_token_ids=[0])),
    Refusal("vocabulary", "logits width below the number of token ids", "VocabularyError",
            "logits width 1 is smaller than the tokenizer's 2 token ids",
            lambda c: V([b"a", b"b"], stop_token_ids=[0], logits_width=1)),
    Refusal("vocabulary", "no stop token", "VocabularyError", "no stop token",
            lambda c: V([b"a"], stop_token_ids=[])),
    Refusal("vocabulary", "stop token id outside the table", "VocabularyError",
            "stop token id 5 is outside the token table", lambda c: V([b"a"], stop_token_ids=[5])),
    Refusal("vocabulary", "negative special token id", "VocabularyError",
            "special token id -1 is outside the token table",
            lambda c: V([b"a"], stop_token_ids=[0], special_token_ids=[-1])),
    Refusal("vocabulary", "token text that is not bytes", "VocabularyError",
            "token 1 is str 'b'; token bytes must be bytes",
            lambda c: V([b"a", "b"], stop_token_ids=[0])),  # type: ignore[list-item]
    Refusal("vocabulary", "tokenizer file that cannot be read", "VocabularyError",
            "cannot read tokenizer file", lambda c: V.from_tokenizer_json(c.folder / "none.json")),
    Refusal("vocabulary", "tokenizer.json that is not JSON", "VocabularyError", "is not JSON",
            lambda c: V.from_tokenizer_json(c.tokenizer_file("{"))),
    Refusal("vocabulary", "JSON without a tokenizer model", "VocabularyError",
            "has no 'model' section", lambda c: V.from_tokenizer_json(c.tokenizer_file("{}"))),
    Refusal("vocabulary", "tokenizer decoder whose bytes are unknown", "VocabularyError",
            "unsupported tokenizer decoder ['WordPiece']",
            lambda c: _load_tokenizer(c, {"a": 0}, "WordPiece")),
    Refusal("vocabulary", "two tokens with one id", "VocabularyError",
            "token id 0 is given to both 'a' and 'b'",
            lambda c: _load_tokenizer(c, {"a": 0, "b": 0})),
    Refusal("vocabulary", "negative token id in tokenizer.json", "VocabularyError",
            "token id -1 is not a non-negative integer",
            lambda c: _load_tokenizer(c, {"a": -1})),
    Refusal("vocabulary", "malformed tiktoken line", "VocabularyError",
            "expected '<base64 token> <rank>'",
            lambda c: _tiktoken(c, b"YQ== 0\nnot-base64\n", {})),
    Refusal("vocabulary", "tiktoken special reusing an ordinary id", "VocabularyError",
            "special token '<|end|>' reuses id 0",
            lambda c: _tiktoken(c, b"YQ== 0\n", {"<|end|>": 0})),
    # ------------------------------------------------------------------ grammars
    Refusal("grammar", "schema text that is not JSON", "InvalidJSONError",
            "schema text is not JSON: Expecting value at line 1 column 10",
            lambda c: G.json_schema('{"type": }')),
    Refusal("grammar", "schema that is neither object nor boolean", "InvalidSchemaError",
            "must be an object or a boolean, not list", lambda c: G.json_schema([1])),  # type: ignore[arg-type]
    Refusal("grammar", "schema the metaschema rejects (names the JSON pointer)",
            "InvalidSchemaError", "not a valid JSON Schema: -1 is less than the minimum of 0 "
            "(at /properties/a/minLength)",
            lambda c: G.json_schema({"properties": {"a": {"minLength": -1}}})),
    Refusal("grammar", "schema holding non-JSON data (NaN, a set)", "InvalidSchemaError",
            "the schema is not plain JSON data", lambda c: G.json_schema({"const": float("nan")})),
    Refusal("grammar", "$ref to a missing part of the schema", "InvalidSchemaError",
            "$ref '#/$defs/b' does not resolve to any part of the schema (at /items/$ref)",
            lambda c: G.json_schema({"$defs": {"a": {}}, "items": {"$ref": "#/$defs/b"}})),
    Refusal("grammar", "$ref to a missing anchor", "InvalidSchemaError",
            "$ref '#b' does not resolve", lambda c: G.json_schema({"$ref": "#b"})),
    Refusal("grammar", "$ref to another document", "InvalidSchemaError",
            "$ref 'other.json#/a' points outside the schema",
            lambda c: G.json_schema({"$ref": "other.json#/a"})),
    Refusal("grammar", "schema nested deeper than the limit", "GrammarTooLargeError",
            "the schema nests deeper than 100 levels at /items/items",
            lambda c: G.json_schema(_nested_items(DEEP_ITEMS))),
    Refusal("grammar", "schema text nested too deep to parse", "GrammarTooLargeError",
            "the schema text nests too deep to parse", lambda c: G.json_schema("[" * 100_000)),
    Refusal("grammar", "schema object that contains itself", "GrammarTooLargeError",
            "nests deeper than 100 levels", lambda c: G.json_schema(_self_containing())),
    Refusal("grammar", "schema text over the size limit", "GrammarTooLargeError",
            "the schema text: 1,048,577 bytes, over the limit of 1,048,576",
            lambda c: G.json_schema(" " * (BIG - 1) + "{}")),
    Refusal("grammar", "schema over the size limit", "GrammarTooLargeError",
            "the schema: ", lambda c: G.json_schema({"enum": ["x" * 1000] * 1100})),
    Refusal("grammar", "regex that does not parse", "InvalidRegexError",
            "invalid regex '[a-'", lambda c: G.regex("[a-")),
    Refusal("grammar", "regex that is not text", "InvalidRegexError",
            "a regex must be a string, not int", lambda c: G.regex(42)),  # type: ignore[arg-type]
    Refusal("grammar", "regex over the size limit", "GrammarTooLargeError",
            "the regex: 1,048,577 bytes", lambda c: G.regex("a" * (BIG + 1))),
    Refusal("grammar", "EBNF that does not parse", "InvalidEBNFError", "invalid EBNF grammar",
            lambda c: G.ebnf('root ::= "a" |')),
    Refusal("grammar", "empty EBNF", "InvalidEBNFError", "must be non-empty text",
            lambda c: G.ebnf("  ")),
    Refusal("grammar", "EBNF over the size limit", "GrammarTooLargeError",
            "the EBNF grammar: 1,048,587 bytes", lambda c: G.ebnf('root ::= "' + "a" * BIG + '"')),
    Refusal("grammar", "empty choice list", "InvalidChoiceError", "at least one option",
            lambda c: G.choice([])),
    Refusal("grammar", "choice option that is empty or not text", "InvalidChoiceError",
            "choice option 1 is ''; options must be non-empty strings",
            lambda c: G.choice(["yes", ""])),
    Refusal("grammar", "one string given as the choice list", "InvalidChoiceError",
            "not one string", lambda c: G.choice("yes")),
    Refusal("grammar", "choices over the size limit", "GrammarTooLargeError",
            "the choice options: ", lambda c: G.choice([f"{i:07d}" for i in range(120_000)])),
    Refusal("grammar", "unknown whitespace option", "ValueError",
            "whitespace must be 'compact' or 'flexible', not 'pretty'",
            lambda c: G.json(whitespace="pretty")),  # type: ignore[arg-type]
    Refusal("grammar", "a limit below 1", "ValueError", "max_depth must be at least 1, not 0",
            lambda c: gm.GrammarLimits(max_depth=0)),
    # ------------------------------------------------------------------ compile / add
    Refusal("compile", "something other than a Grammar", "TypeError",
            "expected a grammarmask Grammar, not dict",
            lambda c: c.pool.add(c.new_id(), {"type": "string"})),  # type: ignore[arg-type]
    Refusal("compile", "unknown backend", "GrammarMaskError", "unknown backend 'llama'",
            lambda c: c.pool.add(c.new_id(), G.regex("x"), backend="llama")),
    Refusal("compile", "schema the backend cannot compile", FAILED,
            "grammar error: xgrammar cannot compile",
            lambda c: c.failed_compile(G.json_schema(UNCOMPILABLE))),
    Refusal("compile", "grammar kind the backend does not serve", FAILED,
            "outlines serves regular languages only",
            lambda c: c.failed_compile(G.ebnf('root ::= "a"'), backend="outlines")),
    Refusal("compile", "compilation past the pool's timeout", FAILED,
            "grammar compilation did not finish within 0.001 s", lambda c: _timed_out(c)),
    Refusal("compile", "compilation past the memory bound", FAILED,
            "went past the compile memory bound (200 MiB, compile_memory_bytes); ended",
            lambda c: _over_memory(c)),
    # ------------------------------------------------------------------ requests
    Refusal("request", "request id added twice", "GrammarMaskError",
            "request 'bystander' is already in the pool",
            lambda c: c.pool.add("bystander", G.regex("x"))),
    Refusal("request", "fill of an id never added", FAILED,
            "unknown request id 'never-added'",
            lambda c: c.step("never-added", [])),
    Refusal("request", "fill of a removed request", FAILED, "unknown request id",
            _remove_then_fill),
    Refusal("request", "draft token id past the vocabulary", FAILED,
            "draft token id 129280 is outside the vocabulary [0, 129280)",
            lambda c: c.step(c.added(G.regex("[a-z]+")), [129_280])),
    Refusal("request", "negative draft token id", FAILED,
            "draft token id -1 is outside the vocabulary",
            lambda c: c.step(c.added(G.regex("[a-z]+")), [-1])),
    # ------------------------------------------------------------------ batches
    Refusal("batch", "one request twice in a batch", "BatchError",
            "request 'bystander' appears twice in one batch",
            lambda c: _fill(c, [("bystander", []), ("bystander", [])])),
    Refusal("batch", "more drafts than max_drafts", "BatchError",
            "batch entry 0 has 17 drafts; the pool is configured for at most max_drafts=16",
            lambda c: _fill(c, [("bystander", [0] * 17)])),
    Refusal("batch", "draft that is not an integer", "BatchError",
            "batch entry 0 has draft 2.5 (float); drafts must be integer token ids",
            lambda c: _fill(c, [("bystander", [2.5])])),
    Refusal("batch", "drafts that are not a sequence", "BatchError",
            "batch entry 0 has drafts 7, not a sequence of integer token ids",
            lambda c: _fill(c, [("bystander", 7)])),
    Refusal("batch", "entry that is not a (request id, drafts) pair", "BatchError",
            "batch entry 0 must be a (request id, drafts) pair", lambda c: _fill(c, ["bystander"])),
    Refusal("batch", "request id that is not hashable", "BatchError",
            "batch entry 0 has request id ['a'], which cannot be an id",
            lambda c: _fill(c, [(["a"], [])])),
    Refusal("batch", "num_rows below the rows the batch needs", "BatchError",
            "num_rows=1 is smaller than the 3 rows the batch needs",
            lambda c: _fill(c, [("bystander", [1, 2])], num_rows=1)),
    Refusal("batch", "row index lists not one per entry", "BatchError",
            "2 row index lists for 1 batch entries",
            lambda c: _fill(c, [("bystander", [])], row_indices=[[0], [1]])),
    Refusal("batch", "row index list not drafts + 1 long", "BatchError",
            "has 1 drafts and so needs 2 rows, got 1",
            lambda c: _fill(c, [("bystander", [5])], row_indices=[[0]])),
    Refusal("batch", "two entries on one logits row", "BatchError",
            "two batch entries claim the same logits row",
            lambda c: _fill(c, [("bystander", []), (None, [])], row_indices=[[0], [0]])),
    Refusal("batch", "row index outside the logits", "BatchError",
            "row indices must lie in [0, 4)",
            lambda c: _fill(c, [("bystander", [])], row_indices=[[7]], num_rows=4)),
    Refusal("batch", "more rows than the pool's max_rows", "BatchError",
            "the step has 2000 rows; the pool was built for max_rows=1024",
            lambda c: _fill(c, [("bystander", [])], num_rows=2000)),
    # ------------------------------------------------------------------ commits
    Refusal("commit", "token the grammar forbids", FAILED,
            "is not allowed by the grammar after 0 tokens",
            lambda c: c.commit(G.regex("[0-9]+"), [c.token(b"a")])),
    Refusal("commit", "negative token id", FAILED,
            "committed token id -1 is outside the vocabulary",
            lambda c: c.commit(G.regex("[a-z]+"), [-1])),
    Refusal("commit", "token id past the vocabulary", FAILED,
            "committed token id 200000 is outside the vocabulary [0, 129280)",
            lambda c: c.commit(G.regex("[a-z]+"), [200_000])),
    Refusal("commit", "token that is not an integer", FAILED,
            "committed token 2.5 (float) is not an integer token id",
            lambda c: c.commit(G.regex("[a-z]+"), [2.5])),
    Refusal("commit", "tokens that are not a sequence", FAILED,
            "committed tokens must be a sequence of integer token ids, not 7",
            lambda c: c.commit(G.regex("[a-z]+"), 7)),  # type: ignore[arg-type]
    Refusal("commit", "token after the request finished", FAILED,
            "committed after the request finished",
            lambda c: c.commit(G.regex("a"), [c.token(b"a"), STOP], [c.token(b"a")])),
    Refusal("commit", "commit to an unknown or removed request", FAILED,
            "unknown request id 'gone'", lambda c: c.pool.commit("gone", [1])),
    # ------------------------------------------------------------------ logits
    Refusal("logits", "logits that are not a tensor", "ApplyError",
            "logits must be a torch.Tensor, not list", lambda c: _apply(c, [[0.0]])),
    Refusal("logits", "logits that are not 2-D", "ApplyError",
            "logits must be 2-D [rows, vocab], got shape (129280,)",
            lambda c: _apply(c, torch.zeros(c.vocab.size))),
    Refusal("logits", "logits of an unsupported dtype", "ApplyError",
            "logits dtype torch.float64 is not supported",
            lambda c: _apply(c, _logits(c, dtype=torch.float64))),
    Refusal("logits", "integer logits", "ApplyError", "logits dtype torch.int32 is not supported",
            lambda c: _apply(c, _logits(c, dtype=torch.int32))),
    Refusal("logits", "fewer logits rows than the step's masks", "ApplyError",
            "logits have 2 rows, the step's masks 3",
            lambda c: _apply(c, torch.zeros(2, c.vocab.size))),
    Refusal("logits", "logits width other than the vocabulary's", "ApplyError",
            "logits width 129279 differs from the vocabulary width 129280",
            lambda c: _apply(c, torch.zeros(3, c.vocab.size - 1))),
    Refusal("logits", "logits on another device than the masks", "ApplyError",
            "logits are on meta, the masks on cpu", lambda c: _apply(c, _logits(c, device="meta"))),
    Refusal("logits", "non-contiguous logits", "ApplyError", "logits must be contiguous",
            lambda c: _apply(c, torch.zeros(c.vocab.size, 3).t())),
    # ------------------------------------------------------------------ masks
    Refusal("masks", "masks that are not a fill's StepMasks", "ApplyError",
            "masks must be the StepMasks of a fill, not Tensor",
            lambda c: _apply(c, _logits(c), c.masks.bitmask)),
    Refusal("masks", "bitmask of the wrong width or dtype", "ApplyError",
            "masks for a vocabulary of 129280 need int32 [rows, 4040]",
            lambda c: _apply(
                c, _logits(c), dataclasses.replace(c.masks, bitmask=c.masks.bitmask[:, 1:])
            )),
    # ------------------------------------------------------------------ configuration
    Refusal("config", "negative max_drafts", "ValueError", "max_drafts must be at least 0",
            lambda c: gm.MatcherPool(c.vocab, max_drafts=-1)),
    Refusal("config", "engine drafts beyond the pool's max_drafts", "ValueError",
            "num_drafts must lie in [0, 16] (the pool's max_drafts), not 17",
            lambda c: ReferenceEngine(None, c.vocab, c.pool, num_drafts=17)),  # type: ignore[arg-type]
    Refusal("config", "compile cache bounded to nothing", "ValueError",
            "cache_bytes must be at least 1, not 0",
            lambda c: gm.GrammarCompiler(c.vocab, cache_bytes=0)),
    # ------------------------------------------------------------------ worker processes
    Refusal("workers", "a script that builds a process pool when imported (no main guard)",
            "WorkerStartError", 'build it under `if __name__ == "__main__":`',
            lambda c: _unguarded_script(c)),
    Refusal("workers", "a worker process that cannot import what it runs", "WorkerStartError",
            "ended before it was ready: worker process died (exit code 1)",
            lambda c: _unimportable_factory(c)),
    Refusal("workers", "a backend_factory that raises in the worker process",
            "WorkerStartError", f"could not start: RuntimeError: {faults.START_FAULT}",
            lambda c: _process_pool(c, backend_factory=faults.raising_factory)),
    Refusal("workers", "a worker process killed while it starts", "WorkerStartError",
            "ended before it was ready: worker process died (SIGKILL)",
            lambda c: _killed_while_starting(c)),
    Refusal("workers", "a worker process that hangs while it starts", "WorkerStartError",
            "was not ready within 3 s (start_timeout_s)",
            lambda c: _process_pool(c, backend_factory=_hang_factory(c), start_timeout_s=3)),
    Refusal("workers", "a worker restarted after a crash that cannot start", FAILED,
            f"worker process could not restart: worker process could not start: RuntimeError: "
            f"{faults.START_FAULT}", lambda c: _restart_cannot_start(c)),
)  # fmt: skip


def _process_pool(ctx: Ctx, **options: Any) -> None:
    """Build a one-worker process pool (the rows above raise while building it) and close it."""
    gm.MatcherPool(ctx.vocab, workers=1, isolation="process", **options).close()


def _hang_factory(ctx: Ctx) -> Callable[[gm.Vocabulary], dict[str, gm.Backend]]:
    pid_file = ctx.folder / f"{ctx.new_id()}.pid"
    return functools.partial(faults.pid_then_hang_factory, str(pid_file))


def _killed_while_starting(ctx: Ctx) -> None:
    """Kill the worker with SIGKILL as soon as it writes its pid, while the pool waits."""
    factory = _hang_factory(ctx)
    pid_file = Path(factory.args[0])  # type: ignore[attr-defined]

    def kill_when_started() -> None:
        for _ in range(1200):
            if pid_file.exists() and pid_file.read_text(encoding="utf-8"):
                os.kill(int(pid_file.read_text(encoding="utf-8")), signal.SIGKILL)
                return
            time.sleep(0.05)

    threading.Thread(target=kill_when_started, daemon=True).start()
    _process_pool(ctx, backend_factory=factory)


def _unimportable_factory(ctx: Ctx) -> None:
    name = f"unimportable_{ctx.new_id()}"
    (ctx.folder / f"{name}.py").write_text(faults.UNIMPORTABLE_MODULE, encoding="utf-8")
    sys.path.insert(0, str(ctx.folder))
    try:
        module = importlib.import_module(name)
        _process_pool(ctx, backend_factory=module.factory)
    finally:
        sys.path.remove(str(ctx.folder))


def _unguarded_script(ctx: Ctx) -> None:
    """Run the script in its own interpreter; re-raise the error it ended with."""
    script = ctx.folder / f"{ctx.new_id()}.py"
    script.write_text(faults.UNGUARDED_SCRIPT, encoding="utf-8")
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=240
    )
    assert done.returncode != 0 and "started" not in done.stdout, done.stdout
    error = done.stderr.strip().splitlines()[-1]
    assert error.startswith("grammarmask.errors.WorkerStartError: "), done.stderr[-2000:]
    raise gm.WorkerStartError(error)


def _restart_cannot_start(ctx: Ctx) -> gm.RequestState:
    """A one-worker pool whose worker is killed once its replacement can no longer start:
    the request added next fails saying why, and so does every later one."""
    marker = ctx.folder / f"{ctx.new_id()}.marker"
    factory = functools.partial(faults.fails_once_marked_factory, str(marker))
    with gm.MatcherPool(ctx.vocab, workers=1, isolation="process", backend_factory=factory) as pool:
        pool.add("first", G.regex("[a-z]+"))
        marker.touch()
        os.kill(pool.matchers.pids()[0], signal.SIGKILL)
        assert "(SIGKILL)" in pool.fill([("first", [])]).failures["first"]
        pool.add("second", G.regex("[a-z]+"))
        state = pool.state("second")
        later = pool.add("third", G.regex("[a-z]+"))
        assert later.status == "failed" and (later.reason or "").startswith(
            "no worker process is running: worker process could not restart"
        )
        return state


def _self_containing() -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "object"}
    schema["properties"] = {"self": schema}
    return schema


def _timed_out(ctx: Ctx) -> gm.RequestState:
    """A grammar nobody compiled yet, in a pool that waits 1 ms for compilations."""
    with gm.MatcherPool(ctx.vocab, compiler=ctx.compiler, compile_timeout_s=0.001) as pool:
        request_id = ctx.new_id()
        pool.add(request_id, G.json_schema({**OBJ, "title": request_id}))
        pool.fill([(request_id, [])])
        return pool.state(request_id)


def _over_memory(ctx: Ctx) -> gm.RequestState:
    """An outlines index build of gigabytes, in a pool that bounds a compile to 200 MiB."""
    with gm.MatcherPool(
        ctx.vocab, "outlines", compile_timeout_s=300, compile_memory_bytes=200 << 20
    ) as pool:
        pool.add("hungry", G.regex('"[^"\\\\]{0,1000}"'))
        deadline = time.monotonic() + 120
        while pool.state("hungry").readiness == "compiling" and time.monotonic() < deadline:
            time.sleep(0.05)
        return pool.state("hungry")


def _resolve(name: str) -> type[BaseException]:
    found = getattr(gm, name, None) or getattr(builtins, name, None)
    assert isinstance(found, type) and issubclass(found, BaseException), name
    return found


@pytest.fixture(scope="module")
def ctx(deepseek: gm.Vocabulary, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ctx]:
    context = Ctx(deepseek, tmp_path_factory.mktemp("bad-inputs"))
    yield context
    context.close()


START_UP_TIMEOUT_S = 120
"""Each worker start-up row ends within this (a pool that hung at start would not)."""


@pytest.mark.parametrize(
    "row",
    [
        pytest.param(row, marks=pytest.mark.timeout(START_UP_TIMEOUT_S))
        if row.area == "workers"
        else row
        for row in CATALOGUE
    ],
    ids=lambda r: f"{r.area}: {r.what}",
)
def test_refused(row: Refusal, ctx: Ctx) -> None:
    if row.outcome == FAILED:
        state = row.trigger(ctx)
        assert isinstance(state, gm.RequestState)
        assert state.status == "failed"
        assert state.reason is not None and row.message in state.reason
        assert ctx.bystander_unchanged()
        return
    with pytest.raises(_resolve(row.outcome)) as info:
        row.trigger(ctx)
    assert row.message in str(info.value)
    assert ctx.bystander_unchanged()


def test_catalogue_covers_every_area_and_twenty_kinds() -> None:
    assert len(CATALOGUE) >= 20
    areas = {r.area for r in CATALOGUE}
    assert {"vocabulary", "grammar", "batch", "commit", "logits", "masks"} <= areas
    assert len({(r.area, r.what) for r in CATALOGUE}) == len(CATALOGUE)


def test_limits_admit_what_they_do_not_refuse(ctx: Ctx) -> None:
    """The refusals above are the limits' edges: one level or byte less compiles."""
    deepest = G.json_schema(_nested_items(DEEP_ITEMS - 1))
    assert ctx.compiler.compile(deepest).fully_enforced
    G.json_schema(" " * (BIG - 2) + "{}")
    assert G.regex("a" * 11, limits=gm.GrammarLimits(max_source_bytes=11)).source == "a" * 11
    with pytest.raises(gm.GrammarTooLargeError, match="the regex: 12 bytes"):
        G.regex("a" * 12, limits=gm.GrammarLimits(max_source_bytes=11))
    with pytest.raises(gm.GrammarTooLargeError, match="deeper than 3 levels at /items/items"):
        G.json_schema(_nested_items(4), limits=gm.GrammarLimits(max_depth=3))


def test_local_refs_and_anchors_resolve() -> None:
    G.json_schema({"$defs": {"a b": {"type": "string"}}, "items": {"$ref": "#/$defs/a%20b"}})
    G.json_schema({"$defs": {"a": {"$anchor": "name", "type": "string"}}, "$ref": "#name"})
    draft7 = "http://json-schema.org/draft-07/schema#"
    G.json_schema({"$schema": draft7, "definitions": {"a": {"$id": "#n"}}, "items": {"$ref": "#n"}})
    draft4 = "http://json-schema.org/draft-04/schema#"
    G.json_schema({"$schema": draft4, "definitions": {"a": {"id": "#n"}}, "items": {"$ref": "#n"}})
    G.json_schema({"type": "array", "items": {"$ref": "#"}})


@pytest.mark.corpus
def test_the_new_checks_refuse_no_maskbench_schema(corpus_dir: Path) -> None:
    """Limits, $ref targets and plain-data checks are for abuse: real schemas all pass them
    (two MaskBench schemas fail the metaschema itself, as before these checks)."""
    refused = {}
    for path in sorted(corpus_dir.glob("*.json")):
        try:
            G.json_schema(json.loads(path.read_text(encoding="utf-8"))["schema"])
        except gm.GrammarError as exc:
            if "not a valid JSON Schema" not in str(exc):
                refused[path.name] = str(exc)
    assert not refused, refused


def test_a_draft_list_at_max_drafts_is_served(ctx: Ctx) -> None:
    pool_drafts = [ctx.token(b"a")] * 16
    masks = ctx.pool.fill([("logits", pool_drafts)])
    assert masks.valid_rows == (17,)


def render_table() -> str:
    """The docs/bad-inputs.md table, one line per catalogue row."""
    lines = ["| area | bad input | caller gets | message (excerpt) |", "|---|---|---|---|"]
    for row in CATALOGUE:
        outcome = "state `failed`" if row.outcome == FAILED else f"raises `{row.outcome}`"
        message = row.message.replace("|", "\\|")
        lines.append(f"| {row.area} | {row.what} | {outcome} | {message} |")
    return "\n".join(lines)


DOC = Path(__file__).resolve().parent.parent / "docs" / "bad-inputs.md"
BEGIN, END = "<!-- bad-input table: python tests/test_bad_inputs.py -->", "<!-- end of table -->"


def test_doc_table_is_the_catalogue() -> None:
    text = DOC.read_text(encoding="utf-8")
    assert BEGIN in text and END in text, "docs/bad-inputs.md lacks the bad-input table markers"
    table = text.split(BEGIN, 1)[1].split(END, 1)[0].strip()
    assert table == render_table(), (
        "docs/bad-inputs.md table is stale: python tests/test_bad_inputs.py"
    )


if __name__ == "__main__":
    print(render_table())
