"""The examples run as documented."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import ROOT


@pytest.mark.parametrize(("backend", "seed"), [("xgrammar", 0), ("xgrammar", 7), ("outlines", 1)])
def test_random_walk_example_produces_valid_json(backend: str, seed: int) -> None:
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "examples" / "random_walk.py"),
            "--backend",
            backend,
            "--seed",
            str(seed),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    assert f"{backend}: fully enforced = True" in result.stdout
    assert "valid JSON that validates against the schema" in result.stdout


def test_engine_loop_example_finishes_every_request() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "engine_loop.py"), "--workers", "2"],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    for rid in ("weather", "answer", "code"):
        assert f"{rid}: finished" in result.stdout
    lines = {
        line.split()[0]: line.split(maxsplit=1)[1]
        for line in result.stdout.splitlines()
        if line.split() and line.split()[0] in ("answer", "code")
    }
    assert lines["answer"] in ("yes", "no", "maybe")
    assert len(lines["code"]) == 8 and lines["code"][3] == "-"
