"""vLLM's OpenAI-compatible server with grammarmask, started on a loopback port for the
server soak and the server tests: its process tree, its log and the plugin's failure lines.

Needs vLLM (its own environment, `scripts/vllm-env.sh`) and the `openai` client it brings.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from ..errors import ServerStartError
from ..integrations.vllm import PROCESSOR_PATH
from ..integrations.vllm.structured_outputs import BACKEND_NAME
from .bench.vllm import cpu_dtype

START_TIMEOUT_S = 240.0
_FAILED = re.compile(r"grammarmask: request (\S+) failed: (.*)$")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class VllmServer:
    """A running server: its process, port and log."""

    process: subprocess.Popen[bytes]
    port: int
    log: Path
    model: str = ""

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def client(self, timeout_s: float = 120.0) -> Any:
        """An `openai.OpenAI` client for this server (no retries: each error is counted)."""
        import openai

        return openai.OpenAI(
            base_url=self.base_url, api_key="unused", max_retries=0, timeout=timeout_s
        )

    def healthy(self) -> bool:
        import httpx

        if self.process.poll() is not None:
            return False
        try:
            answer = httpx.get(f"http://127.0.0.1:{self.port}/health", timeout=5)
            return bool(answer.status_code == 200)
        except httpx.HTTPError:
            return False

    def log_lines(self) -> list[str]:
        return self.log.read_text(errors="replace").splitlines()

    def plugin_failures(self) -> list[tuple[str, str]]:
        """(vLLM request id, reason) for each request the plugin ended, in log order."""
        found = []
        for line in self.log_lines():
            match = _FAILED.search(line)
            if match:
                found.append((match.group(1), match.group(2)))
        return found

    def grammarmask_workers(self) -> list[psutil.Process]:
        """grammarmask's worker processes (children of vLLM's model worker) and their
        compile processes."""
        workers = []
        for process in self._tree():
            try:
                if process.name() == "VLLM::Worker":
                    workers.extend(process.children(recursive=True))
            except psutil.NoSuchProcess:
                continue
        return workers

    def memory_mib(self) -> tuple[float, float]:
        """Current resident memory (MiB) of the server's own processes, and of grammarmask's
        workers with their compile processes."""
        workers = {p.pid for p in self.grammarmask_workers()}
        server = plugin = 0
        for process in self._tree():
            try:
                resident = process.memory_info().rss
            except psutil.NoSuchProcess:
                continue
            if process.pid in workers:
                plugin += resident
            else:
                server += resident
        return server / 2**20, plugin / 2**20

    def _tree(self) -> list[psutil.Process]:
        try:
            root = psutil.Process(self.process.pid)
            return [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []


@contextmanager
def serve(
    model_dir: Path,
    log: Path,
    settings: Mapping[str, Any],
    *,
    extra_args: Sequence[str] = (),
    start_timeout_s: float = START_TIMEOUT_S,
    structured_outputs: bool = False,
) -> Iterator[VllmServer]:
    """Start `vllm.entrypoints.openai.api_server` for `model_dir` with `settings` as
    grammarmask's settings and grammarmask named as its logits processor, or, with
    `structured_outputs`, as its structured-output backend; stop it on exit."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "VLLM_ENABLE_V1_MULTIPROCESSING"}
    env["VLLM_LOGGING_LEVEL"] = "INFO"
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
        cpu_dtype(),
        "--max-model-len",
        "2048",
        "--enforce-eager",
        "--kv-cache-memory-bytes",
        str(1 << 30),
        *(
            ("--structured-outputs-config.backend", BACKEND_NAME)
            if structured_outputs
            else ("--logits-processors", PROCESSOR_PATH)
        ),
        "--additional-config",
        json.dumps({"grammarmask": dict(settings)}),
        *extra_args,
    ]
    with log.open("wb") as sink:
        process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, env=env)
    server = VllmServer(process, port, log)
    try:
        _wait_until_ready(server, start_timeout_s)
        server.model = server.client().models.list().data[0].id
        yield server
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(30)


def _wait_until_ready(server: VllmServer, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not server.healthy():
        if server.process.poll() is not None:
            raise ServerStartError(
                f"vllm exited with {server.process.returncode}:\n{_tail(server.log)}"
            )
        if time.monotonic() > deadline:
            raise ServerStartError(f"vllm did not start in {timeout_s:g} s:\n{_tail(server.log)}")
        time.sleep(1)


def _tail(log: Path) -> str:
    return log.read_text(errors="replace")[-3000:]
