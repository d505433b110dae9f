"""Conformance runner: do compiled grammars accept a corpus's valid instances and reject its
invalid ones?

The corpus is a directory of MaskBench-format files (`{description, meta, schema, tests:
[{description, valid, data}]}`). Each (schema, backend) pair is checked in a child process
(`grammarmask.tools._conformance_worker`) so that a backend that segfaults or hangs costs one
schema, not the run: the parent kills a worker past its time limit (a timeout) and
restarts one that died by a signal (a crash, with the signal's name).

An invalid instance that a matcher accepts is *explained* when the backend declared the
keywords that make it invalid as not enforced (the instance validates once those keywords
are removed from the schema), and a *defect* otherwise.
"""

from __future__ import annotations

import copy
import json
import queue
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, Any

import jsonschema
from jsonschema.validators import validator_for
from referencing.exceptions import Unresolvable

from ..backends import Matcher
from ..errors import SchemaJudgeError
from ..resources import bundled_sample_dir, corpus_dir
from ..schema import (
    LoweredSchema,
    Unenforced,
    iter_reachable_subschemas,
    lower_schema,
    resolve_pointer,
)
from ..schema.lowering import dialects
from ..vocabulary import Vocabulary

STATUSES = (
    "compiled", "unsupported", "compile_error", "invalid_schema", "unreadable", "timeout", "crash",
)  # fmt: skip
"""What became of one (schema, backend) pair, in summary-table order."""

Record = dict[str, Any]
"""One JSON line of the report: a schema on a backend, with its counts and findings."""


# ---------------------------------------------------------------------------- corpus
def default_corpus_dir() -> Path:
    """The corpus (see resources.corpus_dir), else the small sample bundled with grammarmask."""
    return corpus_dir() or bundled_sample_dir()


def select_files(
    directory: Path, *, limit: int | None = None, sample: int | None = None, seed: int = 0
) -> list[Path]:
    """The corpus files to run: all, a seeded random `sample`, then the first `limit`."""
    if not directory.is_dir():
        raise FileNotFoundError(f"corpus directory {directory} does not exist")
    files = sorted(directory.glob("*.json"))
    if not files:
        raise FileNotFoundError(f"corpus directory {directory} holds no .json files")
    if sample is not None and sample < len(files):
        files = sorted(random.Random(seed).sample(files, sample))
    return files[:limit] if limit is not None else files


# ---------------------------------------------------------------------------- serialization
def serialize(
    schema: Any, instance: Any, whitespace: str = "compact", *, lowered: Any = None
) -> tuple[str, bool]:
    """JSON text of `instance` as the grammar writes it: object keys in the order the
    backends lay them out (the `properties` of `schema`'s lowered form, `lowered` where
    the caller has it, merged as `_SchemaContext.layout` reads them), compact (`,` `:`)
    or flexible (`, ` `: `) separators.

    The flag says whether every object's key order could be read off the schema (False
    where several anyOf/oneOf branches fit and lay keys out differently, or a remote $ref).
    """
    if lowered is None:
        lowered = lower_schema(schema).schema
    ordered, determined = _order(instance, lowered, _SchemaContext(lowered))
    separators = (",", ":") if whitespace == "compact" else (", ", ": ")
    return json.dumps(ordered, separators=separators, ensure_ascii=False), determined


class _SchemaContext:
    """The root schema, its draft's validator (to pick anyOf branches) and local $refs."""

    def __init__(self, root: Any) -> None:
        self.root = root
        try:
            self.validator: Any = validator_for(root, default=jsonschema.Draft202012Validator)(root)
        except (TypeError, jsonschema.exceptions.SchemaError):
            self.validator = None
        self.refs_alone = dialects.draft_of(root) in dialects.OLD_DRAFTS

    def fits(self, branch: Any, instance: Any) -> bool:
        if self.validator is None:
            return False
        try:
            return bool(self.validator.evolve(schema=branch).is_valid(instance))
        except Exception:  # a remote $ref or a malformed branch: treat as not fitting
            return False

    def layout(self, node: Any, instance: Any, depth: int = 0) -> tuple[_Layout, bool]:
        """The schema objects that lay out `instance` under `node`, in the order the
        grammar merges them, as llguidance does: its keywords in the order they are
        written, its own properties where `properties` (or `additionalProperties`, which
        reads them) comes, a `$ref`, `allOf` and the `anyOf`/`oneOf` branch that fits
        where they come, each property name where it first appears; the flag is False
        where that is ambiguous (fitting branches that lay keys out differently, a
        remote `$ref`, no fitting branch)."""
        layout = _Layout()
        if not isinstance(node, dict) or depth > _LAYOUT_DEPTH:
            return layout, depth <= _LAYOUT_DEPTH
        if self.refs_alone and "$ref" in node:  # up to draft 7 its neighbours are ignored
            node = {"$ref": node["$ref"]}
        determined = True
        own_added = False
        for keyword, value in node.items():
            if keyword in ("properties", "additionalProperties"):
                if not own_added and (keyword == "properties" or "properties" in node):
                    layout.add(node)
                    own_added = True
                continue
            parts = self._parts(keyword, value, instance)
            if parts is None:
                determined = False
                continue
            laid = [self.layout(part, instance, depth + 1) for part in parts]
            if keyword in ("anyOf", "oneOf"):
                if len({tuple(branch.properties) for branch, _ in laid}) > 1:
                    determined = False
                laid = laid[:1]
            for branch, ok in laid:
                layout.merge(branch)
                determined = determined and ok
        if not own_added:
            layout.add(node)
        return layout, determined

    def _parts(self, keyword: str, value: Any, instance: Any) -> list[Any] | None:
        """The subschemas that `keyword` merges into the layout (for `anyOf`/`oneOf` the
        ones `instance` fits); None where they cannot be known."""
        if keyword == "$ref":
            if not (isinstance(value, str) and value.startswith("#")):
                return None
            target = resolve_pointer(self.root, value[1:])
            return None if target is None else [target]
        if keyword == "allOf" and isinstance(value, list):
            return value
        if keyword in ("anyOf", "oneOf") and isinstance(value, list):
            fitting = [branch for branch in value if self.fits(branch, instance)]
            return fitting or None
        return []


_LAYOUT_DEPTH = 64
"""How many `$ref`s and branches deep a layout is read (a schema may refer to itself)."""


class _Layout:
    """The schema objects that apply to one value, in the order a grammar merges them: its
    property names in the order they are written, and the schemas of each part."""

    def __init__(self) -> None:
        self.nodes: list[Mapping[str, Any]] = []
        self.properties: dict[str, list[Any]] = {}
        self.required: list[str] = []

    def add(self, node: Mapping[str, Any]) -> None:
        self.nodes.append(node)
        properties = node.get("properties")
        if isinstance(properties, dict):
            for name, schema in properties.items():
                self.properties.setdefault(name, []).append(schema)
        required = node.get("required")
        if isinstance(required, list):
            self.required.extend(name for name in required if isinstance(name, str))

    def key_order(self, instance: Mapping[str, Any]) -> list[str]:
        """`instance`'s keys as llguidance lays them out: the properties, then the required
        keys no `properties` names (in `required` order), then the rest."""
        keys = [k for k in self.properties if k in instance]
        keys += [k for k in dict.fromkeys(self.required) if k in instance and k not in keys]
        return keys + [k for k in instance if k not in keys]

    def merge(self, other: _Layout) -> None:
        for node in other.nodes:
            self.add(node)

    def child(self, name: str) -> Any:
        """The schema that property `name`'s value is laid out by."""
        schemas = self.properties.get(name)
        if not schemas:
            schemas = [schema for node in self.nodes for schema in _by_pattern(node, name)]
        if not schemas:
            schemas = [n["additionalProperties"] for n in self.nodes if "additionalProperties" in n]
        return _all_of(schemas)

    def item(self, index: int) -> Any:
        """The schema that the item at `index` is laid out by."""
        return _all_of([_item_schema(node, index) for node in self.nodes])


def _by_pattern(node: Mapping[str, Any], name: str) -> list[Any]:
    """The `patternProperties` schemas of `node` whose pattern `name` matches (by Python's
    `re`: close enough to lay keys out)."""
    patterns = node.get("patternProperties")
    if not isinstance(patterns, dict):
        return []
    found = []
    for pattern, schema in patterns.items():
        try:
            if re.search(pattern, name):
                found.append(schema)
        except (re.error, TypeError):
            continue
    return found


def _all_of(schemas: list[Any]) -> Any:
    schemas = [s for s in schemas if s not in ({}, True)]
    return {"allOf": schemas} if len(schemas) > 1 else (schemas[0] if schemas else {})


def _order(instance: Any, schema: Any, context: _SchemaContext) -> tuple[Any, bool]:
    if not isinstance(instance, (dict, list)):
        return instance, True
    layout, determined = context.layout(schema, instance)
    if isinstance(instance, list):
        items: list[Any] = []
        for index, item in enumerate(instance):
            value, ok = _order(item, layout.item(index), context)
            items.append(value)
            determined = determined and ok
        return items, determined
    keys = layout.key_order(instance)
    if not determined and len(instance) < 2:
        determined = True
    result: dict[str, Any] = {}
    for key in keys:
        result[key], ok = _order(instance[key], layout.child(key), context)
        determined = determined and ok
    return result, determined


def _item_schema(node: Mapping[str, Any], index: int) -> Any:
    prefix = node.get("prefixItems")
    if isinstance(prefix, list) and index < len(prefix):
        return prefix[index]
    items = node.get("items")
    if isinstance(items, list):  # draft 4-7 tuple form
        return items[index] if index < len(items) else node.get("additionalItems", {})
    return items if items is not None else {}


# ---------------------------------------------------------------------------- feeding
def byte_token_ids(vocab: Vocabulary) -> dict[int, int]:
    """Byte value -> id of the token that is exactly that byte (byte-level vocabularies
    have all 256), for feeding text byte by byte."""
    table: dict[int, int] = {}
    for token_id, token in enumerate(vocab.token_bytes):
        if len(token) == 1:
            table.setdefault(token[0], token_id)
    return table


def feed(
    matcher: Matcher, token_ids: Sequence[int], errors: list[str] | None = None
) -> tuple[bool, int]:
    """(every token accepted and the matcher can stop, tokens accepted); then reset.

    With `errors`, a matcher error (RuntimeError: the plugin fails such a request with it)
    refuses the text at the token it came from and its message is appended there; without,
    it propagates."""
    accepted = 0
    try:
        for token_id in token_ids:
            if not matcher.accept(token_id):
                break
            accepted += 1
        return accepted == len(token_ids) and matcher.can_stop(), accepted
    except RuntimeError as exc:
        if errors is None:
            raise
        errors.append(str(exc))
        return False, accepted
    finally:
        matcher.reset()


# ---------------------------------------------------------------------------- judging
def loosen(schema: Any, unenforced: Iterable[Unenforced]) -> LoweredSchema:
    """`schema`, lowered, without the keywords a backend declared as not enforced (their
    pointers are into the lowered schema, which accepts what `schema` accepts); validate
    with its `strict_integers`."""
    lowered = lower_schema(schema)
    loose = copy.deepcopy(lowered.schema)
    for item in unenforced:
        node = resolve_pointer(loose, item.pointer)
        if isinstance(node, dict):
            node.pop(item.keyword, None)
            for dependent in _READ_BESIDE.get(item.keyword, ()):
                node.pop(dependent, None)  # without it, they would refuse more, not less
    return replace(lowered, schema=loose)


_READ_BESIDE = {
    "properties": ("additionalProperties", "unevaluatedProperties"),
    "patternProperties": ("additionalProperties", "unevaluatedProperties"),
    "prefixItems": ("items", "unevaluatedItems"),
    "items": ("additionalItems", "unevaluatedItems"),
}
"""Keywords whose meaning depends on another: the properties (items) the other covers are
exempt from them, so dropping the other alone would tighten them."""


def validates(schema: Any, instance: Any, *, strict_integers: bool = False) -> bool:
    """jsonschema's verdict under the schema's own draft, formats checked. Formats a backend
    does not enforce are declared unenforced, so `loosen` has already removed them.
    `strict_integers`: "integer" as draft 4 reads it (a lowered draft-4 schema). Raises
    SchemaJudgeError where jsonschema cannot judge: two such errors are no agreement."""
    cls = validator_for(schema, default=jsonschema.Draft202012Validator)
    if strict_integers:
        cls = dialects.with_strict_integers(cls)
    try:
        return bool(cls(schema, format_checker=cls.FORMAT_CHECKER).is_valid(instance))
    except (Unresolvable, re.error) as exc:
        raise SchemaJudgeError(f"jsonschema cannot judge this schema: {exc}") from exc


def unchecked_formats(schema: Any) -> set[str]:
    """Formats in `schema` that jsonschema cannot check here (uri, hostname and the date
    formats need the jsonschema[format-nongpl] extra): a verdict that relies on them is
    unverified, never a pass."""
    cls = validator_for(schema, default=jsonschema.Draft202012Validator)
    known = cls.FORMAT_CHECKER.checkers
    return {
        node["format"]
        for node, _ in iter_reachable_subschemas(schema)
        if isinstance(node.get("format"), str) and node["format"] not in known
    }


def judge_invalid_accepted(schema: Any, unenforced: Sequence[Unenforced], instance: Any) -> str:
    """Why a matcher accepted an instance the corpus marks invalid: `label` (jsonschema
    finds it valid after all), `explained` (declared unenforced keywords), `unverified`
    (either, but only because jsonschema cannot check a format here, or cannot judge the
    schema at all) or `defect`."""
    try:
        if validates(schema, instance):
            return "unverified" if unchecked_formats(schema) else "label"
        loose = loosen(schema, unenforced)
        strict = loose.strict_integers
        if unenforced and validates(loose.schema, instance, strict_integers=strict):
            return "unverified" if unchecked_formats(loose.schema) else "explained"
    except SchemaJudgeError:
        return "unverified"
    return "defect"


# ---------------------------------------------------------------------------- parent side
@dataclass(frozen=True)
class ConformanceOptions:
    """How each schema is compiled and checked."""

    vocab: str = "deepseek"
    whitespace: str = "compact"
    strict: bool = False
    allow_unenforced: bool = False
    """Serve what backend="auto" finds no full enforcement for, declaring what it leaves out."""
    compile_timeout_s: float = 30.0
    check_timeout_s: float = 120.0
    start_timeout_s: float = 300.0
    mutate: int = 0
    """Mutants of the valid instances to feed per schema (tools/mutants.py); 0: none."""


def worker_command() -> list[str]:
    """The child process that compiles and checks (one vocabulary load per process)."""
    return [sys.executable, "-m", "grammarmask.tools._conformance_worker"]


class _Worker:
    """One child process and the thread that reads its protocol lines."""

    def __init__(self, argv: Sequence[str], options: ConformanceOptions) -> None:
        self._phases = {
            "compiling": ("compile", options.compile_timeout_s),
            "compiled": ("check", options.check_timeout_s),
        }
        self._argv = [*argv, "--vocab", options.vocab]
        self._options = options
        self._proc: subprocess.Popen[str] | None = None
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._stderr: IO[bytes] | None = None

    def _start(self) -> None:
        if self._stderr is not None:
            self._stderr.close()
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 (lives as long as the worker)
        self._proc = subprocess.Popen(
            self._argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
            bufsize=1,
        )
        self._lines = queue.Queue()
        threading.Thread(target=self._read, args=(self._proc, self._lines), daemon=True).start()
        try:
            ready = self._next(self._options.start_timeout_s)
        except queue.Empty:
            ready = None
        if ready is None or json.loads(ready).get("event") != "ready":
            self.close()
            raise RuntimeError(f"the conformance worker did not start: {self._error_tail()}")

    @staticmethod
    def _read(proc: subprocess.Popen[str], lines: queue.Queue[str | None]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)

    def _next(self, timeout_s: float) -> str | None:
        """The next protocol line; None at EOF; raises queue.Empty past `timeout_s`."""
        return self._lines.get(timeout=timeout_s)

    def _error_tail(self) -> str:
        if self._stderr is None:
            return ""
        self._stderr.seek(0)
        lines = [
            line
            for line in self._stderr.read().decode("utf-8", "replace").splitlines()
            if line.strip() and not line.startswith("[")
        ]
        return lines[-1][:300] if lines else ""

    def check(self, request: Mapping[str, Any]) -> Record:
        """Send one (schema, backend) request and wait for its record, or make one up for a
        timeout or a crash (the worker is then restarted on the next request)."""
        if self._proc is None or self._proc.poll() is not None:
            self._start()
        assert self._proc is not None and self._proc.stdin is not None
        self._proc.stdin.write(json.dumps(request) + "\n")
        self._proc.stdin.flush()
        phase, limit = "backend set-up", self._options.start_timeout_s
        while True:
            try:
                line = self._next(limit)
            except queue.Empty:
                self.close()
                return _failure(request, "timeout", f"{phase} took longer than {limit:g} s")
            if line is None:
                return _failure(request, "crash", self._death())
            event = json.loads(line)
            if event["event"] in self._phases:
                phase, limit = self._phases[event["event"]]
                continue
            return dict(event["record"])

    def _death(self) -> str:
        assert self._proc is not None
        code = self._proc.wait()
        tail = self._error_tail()
        self._proc = None
        if code < 0:
            how = f"killed by {signal.Signals(-code).name}"
        else:
            how = f"worker exited with code {code}"
        return f"{how}: {tail}" if tail else how

    def close(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
            self._proc = None


def _failure(request: Mapping[str, Any], status: str, detail: str) -> Record:
    return {
        "schema": Path(request["path"]).name,
        "backend": request["backend"],
        "status": status,
        "detail": detail,
    }


def run_conformance(
    files: Sequence[Path],
    backends: Sequence[str],
    options: ConformanceOptions,
    *,
    jobs: int = 1,
    on_record: Callable[[Record], None] | None = None,
    argv: Sequence[str] | None = None,
    skip: Iterable[tuple[str, str]] = (),
) -> list[Record]:
    """Check every file on every backend with `jobs` worker processes; `on_record` sees
    each record as it lands (in completion order). `skip` holds (schema name, backend)
    pairs already done, for resuming."""
    if jobs < 1:
        raise ValueError(f"jobs must be at least 1, not {jobs}")
    done = set(skip)
    tasks: queue.Queue[dict[str, Any]] = queue.Queue()
    for path in files:
        for backend in backends:
            if (path.name, backend) not in done:
                tasks.put(
                    {
                        "path": str(path),
                        "backend": backend,
                        "whitespace": options.whitespace,
                        "strict": options.strict,
                        "allow_unenforced": options.allow_unenforced,
                        "mutate": options.mutate,
                    }
                )
    records: list[Record] = []
    lock = threading.Lock()
    errors: list[BaseException] = []

    def serve() -> None:
        worker = _Worker(argv or worker_command(), options)
        try:
            while not errors:
                try:
                    request = tasks.get_nowait()
                except queue.Empty:
                    return
                record = worker.check(request)
                with lock:
                    records.append(record)
                    if on_record is not None:
                        on_record(record)
        except BaseException as exc:
            errors.append(exc)
        finally:
            worker.close()

    threads = [threading.Thread(target=serve) for _ in range(min(jobs, max(tasks.qsize(), 1)))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return records
