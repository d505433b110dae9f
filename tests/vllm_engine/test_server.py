"""grammarmask in vLLM's OpenAI-compatible server: started by the test on a loopback port
with process isolation, and used through the `openai` client as a serving team would."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import openai
import pytest

import grammarmask as gm
from grammarmask.integrations.vllm import xargs
from grammarmask.resources import bundled_sample_dir, schemas_dir
from grammarmask.tools.demo import DemoCase, validate
from grammarmask.tools.soak import adversarial_cases, retitled_copies, run_soak, schema_cases
from grammarmask.tools.vllm_server import VllmServer, serve
from vllm_engine.prefixes import PrefixChecker


@pytest.fixture(scope="module")
def server(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServer]:
    log = tmp_path_factory.mktemp("server") / "vllm.log"
    settings = {"isolation": "process", "workers": 1}
    try:
        with serve(model_dir, log, settings, extra_args=["--max-num-seqs", "8"]) as running:
            yield running
    except gm.GrammarMaskError as exc:  # ServerStartError, with the log's end
        pytest.fail(str(exc))


def plugin_log(server: VllmServer) -> list[str]:
    return [f"request {rid} failed: {reason}" for rid, reason in server.plugin_failures()]


def chat(server: VllmServer, content: str, grammar: gm.Grammar | None, **kwargs: Any) -> Any:
    extra = {"vllm_xargs": xargs(grammar)} if grammar is not None else {}
    return server.client().chat.completions.create(
        model=server.model,
        messages=[{"role": "user", "content": content}],
        temperature=0,
        extra_body=extra,
        **kwargs,
    )


def streamed(stream: Any) -> tuple[str, str | None]:
    text, finish = "", None
    for chunk in stream:
        choice = chunk.choices[0]
        text += getattr(choice, "text", None) or getattr(choice.delta, "content", None) or ""
        finish = choice.finish_reason or finish
    return text, finish


def test_concurrent_and_streaming_requests_follow_their_schemas(
    server: VllmServer, cases: list[DemoCase], smollm2: gm.Vocabulary
) -> None:
    def ask(case: DemoCase) -> tuple[str, str | None]:
        grammar = gm.Grammar.json_schema(case.schema)
        extra = {"vllm_xargs": xargs(grammar, allow_unenforced=True)}
        stream = server.client().chat.completions.create(
            model=server.model,
            messages=[{"role": "user", "content": f"{case.prompt} Answer in JSON."}],
            temperature=0,
            max_tokens=256,
            stream=True,
            extra_body=extra,
        )
        return streamed(stream)

    with ThreadPoolExecutor(len(cases) + 1) as threads:
        plain = threads.submit(chat, server, "Say hello.", None, max_tokens=40)
        answers = list(threads.map(ask, cases))
    assert plain.result().choices[0].message.content
    finished = 0
    prefixes = PrefixChecker(smollm2)
    for case, (text, finish) in zip(cases, answers, strict=True):
        if finish == "stop":
            finished += 1
            assert validate(text, case.schema) == "valid", (case.name, text)
        else:  # out of tokens: what it wrote must still lead to a valid answer
            assert finish == "length", (case.name, finish)
            verdict = prefixes.text(gm.Grammar.json_schema(case.schema), text)
            assert verdict == "valid", (case.name, verdict, text)
    prefixes.close()
    assert finished >= len(cases) // 2  # the rest ran out of tokens


def test_a_short_soak_keeps_the_engine_up_and_every_answer_whole(
    server: VllmServer, smollm2: gm.Vocabulary
) -> None:
    """`grammarmask soak` in short: the bundled schemas, each under 12 new titles (each a
    compile of its own), and the adversarial grammars, from 16 concurrent clients."""
    files = sorted(bundled_sample_dir().glob("*.json")) + sorted(schemas_dir().glob("*.json"))
    cases = retitled_copies(schema_cases(files), 12) + adversarial_cases()
    report, answers = run_soak(server, cases, vocab=smollm2, clients=16, max_tokens=24)
    print(report.table())
    assert report.deaths == 0 and not report.errors, report.table()
    assert report.broken == [], report.table()
    by_name = {answer.case.name: answer for answer in answers}
    for name, needle in [
        ("adversarial:schema:150-deep", "nests deeper than"),
        ("adversarial:ebnf:malformed", "EBNF"),
        ("adversarial:entry:unknown-key", "unknown key 'regexp'"),
    ]:
        assert by_name[name].status == "400" and needle in by_name[name].detail, by_name[name]
    assert report.verdicts["valid"] + report.verdicts["declared"] >= 10, report.verdicts
    # a hard compile waits aside: no running answer stalls for the compile timeout (10 s)
    assert report.longest_gap_s < 10, report.table()
    start, _, peak = report.workers_mib
    assert peak < start + 1536, report.table()  # bounded by the compile cache, not growing


def test_a_malformed_grammar_gets_http_400_and_the_next_request_is_served(
    server: VllmServer,
) -> None:
    bad = {"vllm_xargs": {"grammarmask": json.dumps({"json_schema": {"type": "objekt"}})}}
    with pytest.raises(openai.BadRequestError) as raised:
        server.client().chat.completions.create(
            model=server.model,
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=5,
            extra_body=bad,
        )
    assert raised.value.status_code == 400
    assert "grammarmask: not a valid JSON Schema" in str(raised.value)
    with pytest.raises(openai.BadRequestError, match="unknown key 'regexp'"):
        server.client().completions.create(
            model=server.model,
            prompt="x",
            max_tokens=5,
            extra_body={"vllm_xargs": {"grammarmask": '{"regexp": "a+"}'}},
        )
    answer = chat(server, "Is the sky blue?", gm.Grammar.choice(["yes", "no"]), max_tokens=5)
    assert answer.choices[0].message.content in ("yes", "no")


def test_a_request_whose_worker_dies_mid_generation_ends_alone(server: VllmServer) -> None:
    letters = gm.Grammar.regex("[a-z ]{1,2000}")
    before = len(plugin_log(server))
    started = threading.Event()

    def constrained() -> tuple[str, str | None]:
        stream = server.client().completions.create(
            model=server.model,
            prompt="Write many words:",
            temperature=0,
            max_tokens=400,
            stream=True,
            extra_body={"vllm_xargs": xargs(letters)},
        )
        text, finish = "", None
        for chunk in stream:
            text += chunk.choices[0].text
            finish = chunk.choices[0].finish_reason or finish
            if len(text) > 20:
                started.set()
        return text, finish

    with ThreadPoolExecutor(2) as threads:
        plain = threads.submit(
            lambda: streamed(
                server.client().completions.create(
                    model=server.model,
                    prompt="Once upon a time",
                    temperature=0,
                    max_tokens=300,
                    stream=True,
                    extra_body={"ignore_eos": True},
                )
            )
        )
        victim = threads.submit(constrained)
        assert started.wait(60), "the constrained stream did not start"
        workers = server.grammarmask_workers()
        assert workers, "no grammarmask worker process found"
        for worker in workers:
            worker.kill()
        text, finish = victim.result(timeout=120)
        plain_text, plain_finish = plain.result(timeout=120)

    assert finish == "stop" and set(text) <= set("abcdefghijklmnopqrstuvwxyz ")
    assert len(text) < 1500, "the request went on after its worker died"
    assert plain_finish == "length" and plain_text
    failures = plugin_log(server)[before:]
    assert len(failures) == 1 and "worker process died" in failures[0], failures
    assert "cmpl-" in failures[0]  # vLLM's request id
    after = chat(server, "Is the sky blue?", gm.Grammar.choice(["yes", "no"]), max_tokens=5)
    assert after.choices[0].message.content in ("yes", "no")  # a restarted worker serves it
