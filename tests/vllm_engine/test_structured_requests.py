"""vLLM's structured-output requests read as grammarmask requests (no engine needed)."""

from __future__ import annotations

import json
from typing import Any

import pytest

import grammarmask as gm
from grammarmask.integrations.vllm.structured_outputs._requests import structured_spec


def _tag(schema: Any) -> str:
    """A structural tag as vLLM's tool parsers build one for a strict tool."""
    content = {"type": "json_schema", "json_schema": schema}
    tag = {"begin": "<tool_call>", "content": content, "end": "</tool_call>"}
    trigger = {"type": "triggered_tags", "triggers": ["<tool_call>"], "tags": [tag]}
    return json.dumps({"type": "structural_tag", "format": trigger})


LOOSE = {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}
TIGHT = {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}


def test_a_loose_structural_tag_is_refused_unless_allowed_then_declared() -> None:
    with pytest.raises(gm.NotFullyEnforcedError, match="uniqueItems"):
        structured_spec("STRUCTURAL_TAG", _tag(LOOSE), None, allow_unenforced=False)
    spec = structured_spec("STRUCTURAL_TAG", _tag(LOOSE), None, allow_unenforced=True)
    assert spec.grammar.kind == "ebnf"
    assert [item for item in spec.declared if item.startswith("uniqueItems")], spec.declared


def test_a_request_option_allows_what_the_engine_refuses() -> None:
    options = {"grammarmask_options": {"allow_unenforced": True}}
    spec = structured_spec("STRUCTURAL_TAG", _tag(LOOSE), options, allow_unenforced=False)
    assert spec.declared


def test_a_fully_enforced_tag_declares_nothing() -> None:
    spec = structured_spec("STRUCTURAL_TAG", _tag(TIGHT), None, allow_unenforced=False)
    assert spec.grammar.kind == "ebnf" and spec.declared == ()
    assert structured_spec("JSON", json.dumps(LOOSE), None, allow_unenforced=True).declared == ()
