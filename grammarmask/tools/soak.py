"""`grammarmask soak`: vLLM's OpenAI server with the plugin in process isolation, given every
schema of a corpus and a set of adversarial grammars by concurrent streaming clients with
short answers; reports what a serving team needs to trust it under load.

The report: engine deaths (the server gone or unhealthy), HTTP 400s with their reasons,
requests the plugin ended and why, each answer judged (finished: valid for its grammar, or
invalid only where the plugin declared a keyword unenforced; unfinished: a valid prefix),
the resident memory of the server and of grammarmask's workers sampled every second, and
the longest gap between two streamed chunks of any answer: a hard compile must not stall
the other requests past the compile timeout.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from ..compiler import GrammarCompiler
from ..errors import GrammarError, SchemaJudgeError
from ..grammars import Grammar
from ..schema import Unenforced
from ..vocabulary import Vocabulary
from .conformance import byte_token_ids, feed, loosen, validates
from .vllm_server import VllmServer

DEFAULT_CLIENTS = 16
DEFAULT_MAX_TOKENS = 24
COMPILE_TIMEOUT_S = 10.0
SETTINGS = {"isolation": "process", "workers": 2, "compile_timeout_s": COMPILE_TIMEOUT_S}
"""The plugin's settings for the soak: process isolation, the default compile timeout."""


@dataclass(frozen=True)
class SoakCase:
    """One request: its grammarmask entry (what a client sends), and, for a grammar the
    soak can judge locally, that grammar."""

    name: str
    entry: dict[str, Any]
    grammar: Grammar | None = None


@dataclass
class Answer:
    """What came back for one case."""

    case: SoakCase
    status: str = "ok"
    """ok, 400, error (another HTTP or client error) or lost (no connection)."""
    detail: str = ""
    text: str = ""
    finish: str | None = None
    request_id: str = ""
    first_token_s: float = 0.0
    """From sending the request to its first text: queueing and its own compile."""
    longest_gap_s: float = 0.0
    """The longest wait between two chunks with text: a step that stalled."""
    verdict: str = ""


@dataclass
class SoakReport:
    """The figures of one run."""

    cases: int
    schemas: int
    clients: int
    deaths: int
    seconds: float
    bad_requests: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)
    ended: Counter[str] = field(default_factory=Counter)
    verdicts: Counter[str] = field(default_factory=Counter)
    broken: list[str] = field(default_factory=list)
    ended_cases: list[str] = field(default_factory=list)
    server_mib: tuple[float, float, float] = (0.0, 0.0, 0.0)
    """(start, end, peak) resident memory of the server's own processes."""
    workers_mib: tuple[float, float, float] = (0.0, 0.0, 0.0)
    """(start, end, peak) of grammarmask's workers with their compile processes."""
    longest_gap_s: float = 0.0
    longest_gap_case: str = ""
    p99_gap_s: float = 0.0
    longest_first_token_s: float = 0.0
    memory_samples: list[tuple[float, float]] = field(default_factory=list)
    """(server, workers) MiB, one sample a second over the run."""

    def to_json(self) -> dict[str, Any]:
        """The report as plain JSON data (counters as objects)."""
        return {
            f.name: dict(value) if isinstance(value := getattr(self, f.name), Counter) else value
            for f in fields(self)
        }

    def table(self) -> str:
        rows = [
            (
                "cases (schemas + adversarial)",
                f"{self.cases} ({self.schemas} + {self.cases - self.schemas})",
            ),
            ("concurrent clients", str(self.clients)),
            ("engine deaths", str(self.deaths)),
            ("HTTP 400", str(sum(self.bad_requests.values()))),
            ("other errors", str(sum(self.errors.values()))),
            ("ended by the plugin", str(sum(self.ended.values()))),
            ("finished: valid / declared / broken", self._finished()),
            ("unfinished: valid prefix / broken", self._unfinished()),
            ("served, not judged here", str(self.verdicts["not judged"])),
            ("server memory start / end / peak", _mib(self.server_mib)),
            ("workers' memory start / end / peak", _mib(self.workers_mib)),
            ("workers' memory over the run", self._workers_over_time()),
            ("longest gap between chunks", f"{self.longest_gap_s:.2f} s ({self.longest_gap_case})"),
            ("answers' longest gap, p99", f"{self.p99_gap_s * 1e3:.0f} ms"),
            ("longest time to first token", f"{self.longest_first_token_s:.2f} s"),
            ("wall time", f"{self.seconds:.0f} s"),
        ]
        width = max(len(name) for name, _ in rows)
        lines = [f"{name:<{width}}  {value}" for name, value in rows]
        for title, counts in (
            ("HTTP 400 reasons", self.bad_requests),
            ("other errors", self.errors),
            ("ended by the plugin, why", self.ended),
        ):
            if counts:
                lines += ["", f"{title}:"]
                lines += [f"  {n:5d}  {reason}" for reason, n in counts.most_common()]
        if self.ended_cases:
            lines += ["", "ended requests:"] + [f"  {e}" for e in self.ended_cases[:40]]
        if self.broken:
            lines += ["", "broken answers:"] + [f"  {b}" for b in self.broken]
        return "\n".join(lines)

    def _workers_over_time(self) -> str:
        """Ten evenly spaced samples of the workers' memory, in MiB."""
        series = [workers for _, workers in self.memory_samples]
        if not series:
            return "-"
        picks = [series[round(i * (len(series) - 1) / 9)] for i in range(10)]
        return " ".join(f"{value:,.0f}" for value in picks)

    def _finished(self) -> str:
        v = self.verdicts
        return f"{v['valid']} / {v['declared']} / {v['broken']}"

    def _unfinished(self) -> str:
        v = self.verdicts
        return f"{v['valid prefix']} / {v['broken prefix']}"


def _mib(figures: tuple[float, float, float]) -> str:
    return " / ".join(f"{value:,.0f} MiB" for value in figures)


# ---------------------------------------------------------------------------- the cases
def schema_cases(paths: Iterable[Path]) -> list[SoakCase]:
    """One case per corpus file (MaskBench: {"schema": ..., "tests": ...}, or a bare
    schema); a schema grammarmask refuses locally is still sent: the server must say 400."""
    cases = []
    for path in paths:
        document = json.loads(path.read_text(encoding="utf-8"))
        schema = document.get("schema", document) if isinstance(document, dict) else document
        entry = {"json_schema": schema, "allow_unenforced": True}
        try:
            grammar: Grammar | None = Grammar.json_schema(schema)
        except GrammarError:
            grammar = None
        cases.append(SoakCase(f"schema:{path.stem}", entry, grammar))
    return cases


def retitled_copies(cases: Sequence[SoakCase], copies: int) -> list[SoakCase]:
    """Each schema case `copies` times under a new title: the same language, a grammar the
    server has not compiled yet (a soak of many compiles from a few schemas)."""
    out = []
    for case in cases:
        schema = case.entry.get("json_schema")
        if copies == 1 or not isinstance(schema, dict):
            out.append(case)
            continue
        for copy in range(copies):
            titled = {**schema, "title": f"{schema.get('title', case.name)} (copy {copy})"}
            try:
                grammar: Grammar | None = Grammar.json_schema(titled)
            except GrammarError:
                grammar = None
            out.append(
                SoakCase(f"{case.name}#{copy}", {**case.entry, "json_schema": titled}, grammar)
            )
    return out


def _nested(depth: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "integer"}
    for _ in range(depth):
        schema = {"type": "array", "items": schema}
    return schema


def adversarial_cases() -> list[SoakCase]:
    """Grammars meant to hurt: catastrophic-backtracking regexes, nesting past the limits,
    a 20,000-way choice, a 3,000-property schema, left-recursive and malformed EBNF, and
    an entry with an unknown key."""
    wide = {
        "type": "object",
        "properties": {f"p{i}": {"type": "integer"} for i in range(3000)},
        "required": ["p0"],
    }
    raw: list[tuple[str, dict[str, Any]]] = [
        ("adversarial:regex:(a+)+$", {"regex": "(a+)+$"}),
        ("adversarial:regex:(a|aa)+b", {"regex": "(a|aa)+b"}),
        ("adversarial:regex:(x+x+)+y", {"regex": "(x+x+)+y"}),
        ("adversarial:regex:([a-z]{1,40}){1,40}", {"regex": "([a-z]{1,40}){1,40}"}),
        ("adversarial:schema:150-deep", {"json_schema": _nested(150)}),
        ("adversarial:schema:90-deep", {"json_schema": _nested(90)}),
        ("adversarial:schema:3000-properties", {"json_schema": wide}),
        ("adversarial:choice:20000", {"choice": [f"option-{i}" for i in range(20000)]}),
        ("adversarial:ebnf:left-recursive", {"ebnf": 'root ::= root "a" | "a"'}),
        ("adversarial:ebnf:malformed", {"ebnf": "root ::= ("}),
        ("adversarial:entry:unknown-key", {"regexp": "a+"}),
    ]
    cases = []
    for name, entry in raw:
        try:
            grammar = _local_grammar(entry)
        except (GrammarError, KeyError, ValueError):
            grammar = None
        cases.append(SoakCase(name, entry, grammar))
    return cases


def _local_grammar(entry: dict[str, Any]) -> Grammar:
    kind, value = next(iter(entry.items()))
    if kind == "json_schema":
        return Grammar.json_schema(value)
    if kind == "regex":
        return Grammar.regex(value)
    if kind == "ebnf":
        return Grammar.ebnf(value)
    if kind == "choice":
        return Grammar.choice(value)
    raise KeyError(kind)


# ---------------------------------------------------------------------------- the run
class _MemorySampler:
    """Samples the server's and the workers' memory every `every_s` on its own thread."""

    def __init__(self, server: VllmServer, every_s: float = 1.0) -> None:
        self._server = server
        self._every_s = every_s
        self.samples: list[tuple[float, float]] = [server.memory_mib()]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._every_s):
            self.samples.append(self._server.memory_mib())

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self.samples.append(self._server.memory_mib())

    def figures(self, which: int) -> tuple[float, float, float]:
        series = [sample[which] for sample in self.samples]
        return series[0], series[-1], max(series)


def _ask(server: VllmServer, client: Any, case: SoakCase, max_tokens: int) -> Answer:
    import openai

    answer = Answer(case)
    started = time.perf_counter()
    last: float | None = None  # when the previous chunk with text came
    try:
        stream = client.chat.completions.create(
            model=server.model,
            messages=[{"role": "user", "content": f"Answer briefly ({case.name})."}],
            temperature=0,
            max_tokens=max_tokens,
            stream=True,
            extra_body={"vllm_xargs": {"grammarmask": json.dumps(case.entry)}},
        )
        for chunk in stream:
            answer.request_id = answer.request_id or chunk.id
            if not chunk.choices:
                continue
            choice = chunk.choices[0]
            answer.finish = choice.finish_reason or answer.finish
            if not choice.delta.content:
                continue
            now = time.perf_counter()
            if last is None:
                answer.first_token_s = now - started
            else:
                answer.longest_gap_s = max(answer.longest_gap_s, now - last)
            last = now
            answer.text += choice.delta.content
    except openai.APIConnectionError as exc:
        answer.status, answer.detail = "lost", type(exc).__name__
    except openai.APIError as exc:
        answer.status = "400" if _bad_request(exc) else "error"
        answer.detail = _reason(exc)
    return answer


def _bad_request(exc: Exception) -> bool:
    """An HTTP 400, or (a streamed request) the error event vLLM sends in its place once
    the stream has begun: code 400 in the event's body."""
    import openai

    if isinstance(exc, openai.BadRequestError):
        return True
    body = getattr(exc, "body", None)
    return isinstance(body, dict) and (
        body.get("code") == 400 or body.get("type") == "BadRequestError"
    )


def _reason(exc: Exception) -> str:
    """The message of an API error without ids and numbers, so that alike ones count once."""
    body = getattr(exc, "body", None)
    message = body.get("message", str(exc)) if isinstance(body, dict) else str(exc)
    return re.sub(r"\d+", "N", str(message))[:160]


def run_soak(
    server: VllmServer,
    cases: Sequence[SoakCase],
    *,
    vocab: Vocabulary,
    clients: int = DEFAULT_CLIENTS,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    progress: Callable[[], None] | None = None,
) -> tuple[SoakReport, list[Answer]]:
    """Send every case through `clients` concurrent streaming clients, then judge the
    answers locally against their grammars (`vocab`: the served model's)."""
    client = server.client(timeout_s=600)
    sampler = _MemorySampler(server)
    started = time.perf_counter()

    def one(case: SoakCase) -> Answer:
        answer = _ask(server, client, case, max_tokens)
        if progress is not None:
            progress()
        return answer

    with ThreadPoolExecutor(clients) as pool:
        answers = list(pool.map(one, cases))
    seconds = time.perf_counter() - started
    sampler.stop()
    deaths = 0 if server.healthy() else 1
    report = SoakReport(
        len(cases),
        sum(c.name.startswith("schema:") for c in cases),
        clients,
        deaths,
        seconds,
        server_mib=sampler.figures(0),
        workers_mib=sampler.figures(1),
        memory_samples=sampler.samples,
    )
    failures = server.plugin_failures()
    for answer in answers:
        if answer.status == "400":
            report.bad_requests[answer.detail] += 1
        elif answer.status != "ok":
            report.errors[f"{answer.status}: {answer.detail}"] += 1
    ended_ids = set()
    for request_id, reason in failures:
        ended_ids.add(request_id)
        report.ended[re.sub(r"\d+", "N", reason)[:160]] += 1
        case = next(
            (a.case.name for a in answers if a.request_id and request_id.startswith(a.request_id)),
            "?",
        )
        report.ended_cases.append(f"{case}: {reason[:120]}")
    judge_answers(answers, vocab, ended_ids, report)
    gaps = sorted(a.longest_gap_s for a in answers if a.status == "ok")
    if gaps:
        report.longest_gap_s = gaps[-1]
        report.p99_gap_s = gaps[min(len(gaps) - 1, int(0.99 * len(gaps)))]
        worst = max((a for a in answers if a.status == "ok"), key=lambda a: a.longest_gap_s)
        report.longest_gap_case = worst.case.name
        report.longest_first_token_s = max(a.first_token_s for a in answers if a.status == "ok")
    return report, answers


def judge_answers(
    answers: list[Answer], vocab: Vocabulary, ended_ids: set[str], report: SoakReport
) -> None:
    """Each served answer against its grammar, with a compiler of the soak's own (auto, as
    the requests ask): a finished JSON answer must validate (jsonschema), or fail only
    where the plugin declared a keyword unenforced; another finished answer must take the
    grammar to an end; an unfinished one (out of tokens, or ended by the plugin) must be a
    valid prefix. A grammar that does not compile here within the server's compile timeout
    is not judged (the server ended such a request too)."""
    compiler = GrammarCompiler(vocab, timeout_s=COMPILE_TIMEOUT_S)
    byte_ids = byte_token_ids(vocab)
    try:
        for answer in answers:
            grammar = answer.case.grammar
            if answer.status != "ok" or grammar is None:
                continue
            try:
                compiled = compiler.compile(grammar, "auto", allow_unenforced=True)
            except GrammarError:
                report.verdicts["not judged"] += 1
                continue
            ended = bool(answer.request_id) and any(
                rid.startswith(answer.request_id) for rid in ended_ids
            )
            try:
                complete, accepted = feed(
                    compiled.matcher(), [byte_ids[b] for b in answer.text.encode("utf-8")]
                )
            except RuntimeError:  # a matcher error: the plugin ends such a request too
                report.verdicts["not judged"] += 1
                continue
            if answer.finish != "stop" or ended:
                whole = accepted == len(answer.text.encode("utf-8"))
                answer.verdict = "valid prefix" if whole else "broken prefix"
            elif grammar.kind == "json_schema":
                answer.verdict = _schema_verdict(grammar, compiled.unenforced, answer.text)
            else:
                answer.verdict = "valid" if complete else "broken"
            report.verdicts[answer.verdict] += 1
            if answer.verdict.startswith("broken"):
                report.broken.append(f"{answer.case.name}: {answer.verdict}: {answer.text[:120]!r}")
    finally:
        compiler.close()


def _schema_verdict(grammar: Grammar, unenforced: Sequence[Unenforced], text: str) -> str:
    try:
        instance = json.loads(text)
    except json.JSONDecodeError:
        return "broken"
    try:
        if validates(grammar.schema, instance):
            return "valid"
        loose = loosen(grammar.schema, unenforced)
        strict = loose.strict_integers
        if unenforced and validates(loose.schema, instance, strict_integers=strict):
            return "declared"
    except SchemaJudgeError:
        return "not judged"
    return "broken"
