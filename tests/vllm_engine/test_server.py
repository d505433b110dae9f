"""grammarmask in vLLM's OpenAI-compatible server: started by the test on a loopback port
with process isolation, and used through the `openai` client as a serving team would."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import openai
import psutil
import pytest

import grammarmask as gm
from grammarmask.integrations.vllm import xargs
from grammarmask.tools.demo import DemoCase, validate
from vllm_engine.engines import PLUGIN
from vllm_engine.prefixes import PrefixChecker

START_TIMEOUT_S = 240


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Server:
    def __init__(self, process: subprocess.Popen[bytes], port: int, log: Path) -> None:
        self.process = process
        self.log = log
        self.client = openai.OpenAI(
            base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=120
        )
        self.model = ""

    def plugin_log(self) -> list[str]:
        return [
            line
            for line in self.log.read_text(errors="replace").splitlines()
            if "grammarmask: request" in line
        ]

    def grammarmask_workers(self) -> list[psutil.Process]:
        """The pool's worker processes: children of vLLM's model worker."""
        tree = psutil.Process(self.process.pid).children(recursive=True)
        return [child for p in tree if p.name() == "VLLM::Worker" for child in p.children()]


@pytest.fixture(scope="module")
def server(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    port = free_port()
    log = tmp_path_factory.mktemp("server") / "vllm.log"
    env = {k: v for k, v in os.environ.items() if k != "VLLM_ENABLE_V1_MULTIPROCESSING"}
    env["VLLM_LOGGING_LEVEL"] = "INFO"
    settings = {"grammarmask": {"isolation": "process", "workers": 1}}
    command = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model_dir),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--dtype",
        "bfloat16",
        "--max-model-len",
        "2048",
        "--enforce-eager",
        "--max-num-seqs",
        "8",
        "--kv-cache-memory-bytes",
        str(1 << 30),
        "--logits-processors",
        PLUGIN,
        "--additional-config",
        json.dumps(settings),
    ]
    with log.open("wb") as sink:
        process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, env=env)
    server = Server(process, port, log)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if process.poll() is not None:
                pytest.fail(f"vllm exited with {process.returncode}:\n{log.read_text()[-3000:]}")
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(
                    f"vllm did not start in {START_TIMEOUT_S} s:\n{log.read_text()[-3000:]}"
                )
            time.sleep(1)
        server.model = server.client.models.list().data[0].id
        yield server
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()


def chat(server: Server, content: str, grammar: gm.Grammar | None, **kwargs: Any) -> Any:
    extra = {"vllm_xargs": xargs(grammar)} if grammar is not None else {}
    return server.client.chat.completions.create(
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
    server: Server, cases: list[DemoCase], smollm2: gm.Vocabulary
) -> None:
    def ask(case: DemoCase) -> tuple[str, str | None]:
        grammar = gm.Grammar.json_schema(case.schema)
        extra = {"vllm_xargs": xargs(grammar, allow_unenforced=True)}
        stream = server.client.chat.completions.create(
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


def test_a_malformed_grammar_gets_http_400_and_the_next_request_is_served(
    server: Server,
) -> None:
    bad = {"vllm_xargs": {"grammarmask": json.dumps({"json_schema": {"type": "objekt"}})}}
    with pytest.raises(openai.BadRequestError) as raised:
        server.client.chat.completions.create(
            model=server.model,
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=5,
            extra_body=bad,
        )
    assert raised.value.status_code == 400
    assert "grammarmask: not a valid JSON Schema" in str(raised.value)
    with pytest.raises(openai.BadRequestError, match="unknown key 'regexp'"):
        server.client.completions.create(
            model=server.model,
            prompt="x",
            max_tokens=5,
            extra_body={"vllm_xargs": {"grammarmask": '{"regexp": "a+"}'}},
        )
    answer = chat(server, "Is the sky blue?", gm.Grammar.choice(["yes", "no"]), max_tokens=5)
    assert answer.choices[0].message.content in ("yes", "no")


def test_a_request_whose_worker_dies_mid_generation_ends_alone(server: Server) -> None:
    letters = gm.Grammar.regex("[a-z ]{1,2000}")
    before = len(server.plugin_log())
    started = threading.Event()

    def constrained() -> tuple[str, str | None]:
        stream = server.client.completions.create(
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
                server.client.completions.create(
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
    failures = server.plugin_log()[before:]
    assert len(failures) == 1 and "worker process died" in failures[0], failures
    assert "cmpl-" in failures[0]  # vLLM's request id
    after = chat(server, "Is the sky blue?", gm.Grammar.choice(["yes", "no"]), max_tokens=5)
    assert after.choices[0].message.content in ("yes", "no")  # a restarted worker serves it
