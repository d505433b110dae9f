"""`grammarmask check`: a table per backend, non-zero exit for invalid schemas."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from grammarmask.tools.cli import main


def _write(tmp_path: Path, schema: object) -> str:
    path = tmp_path / "schema.json"
    path.write_text(json.dumps(schema) if not isinstance(schema, str) else schema)
    return str(path)


def test_check_reports_each_backend_and_what_it_leaves_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _write(
        tmp_path,
        {
            "type": "object",
            "properties": {"age": {"type": "integer", "maximum": 9}},
            "required": ["age"],
        },
    )
    assert main(["check", path]) == 0
    out = capsys.readouterr().out
    assert "vocabulary deepseek" in out
    lines = {
        line.split()[0]: line
        for line in out.splitlines()
        if line.startswith(("xgrammar", "outlines"))
    }
    assert "compiled" in lines["xgrammar"] and lines["xgrammar"].endswith("full")
    assert "partial: 1 constraint(s) not enforced" in lines["outlines"]
    assert "outlines: not enforced: maximum at /properties/age" in out


def test_check_defaults_to_a_bundled_schema(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "--backend", "xgrammar"]) == 0
    out = capsys.readouterr().out
    assert "person.json" in out
    assert "xgrammar  compiled" in out


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ({"properties": {"age": {"type": "int"}}}, "/properties/age/type"),
        ('{"type": "object",', "schema text is not JSON"),
    ],
)
def test_check_invalid_schema_exits_non_zero(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: object, message: str
) -> None:
    assert main(["check", _write(tmp_path, content)]) == 1
    assert message in capsys.readouterr().err


def test_check_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", str(tmp_path / "absent.json")]) == 2
    assert "cannot read schema" in capsys.readouterr().err


def test_check_when_no_backend_can_compile(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _write(tmp_path, {"type": "object", "properties": {"a": False}, "required": ["a"]})
    assert main(["check", path, "--backend", "xgrammar"]) == 3
    assert "xgrammar cannot compile" in capsys.readouterr().out


def test_demo_on_one_bundled_schema(capsys: pytest.CaptureFixture[str]) -> None:
    """The main job on the real model, for one schema: the constrained answer validates."""
    assert main(["demo", "--schema", "function_call"]) == 0
    out = capsys.readouterr().out
    assert "=== function_call" in out
    answer = next(line for line in out.splitlines() if line.startswith("with grammarmask:"))
    json.loads(answer.split(":", 1)[1])
    assert "-> valid;" in out
    assert "0 constrained answer(s) failed validation" in out


def test_generate_streams_a_valid_answer(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 20}},
        "required": ["city"],
        "additionalProperties": False,
    }
    path = _write(tmp_path, schema)
    assert (
        main(
            [
                "generate",
                "--schema",
                path,
                "--prompt",
                "Which city is the capital of France?",
                "--stream",
            ]
        )
        == 0
    )
    captured = capsys.readouterr()
    assert json.loads(captured.out.strip())["city"]
    assert "-> valid;" in captured.err
