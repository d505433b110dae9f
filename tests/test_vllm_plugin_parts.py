"""The vLLM plugin's parts that need no vLLM: the request entry, the settings, and the batch
rows followed through vLLM's updates (checked against a model of vLLM's persistent batch)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from conftest import bundled_schema
from hypothesis import given
from hypothesis import strategies as st

import grammarmask as gm
from grammarmask.errors import RequestSpecError, SettingsError
from grammarmask.integrations.vllm import EXTRA_ARGS_KEY, PluginSettings, request_spec, xargs
from grammarmask.integrations.vllm._batch import BatchRows

# ---------------------------------------------------------------------- the request entry


@pytest.mark.parametrize(
    "grammar",
    [
        gm.Grammar.json_schema(bundled_schema("person")),
        gm.Grammar.json_schema(bundled_schema("invoice"), whitespace="flexible", strict=True),
        gm.Grammar.json(),
        gm.Grammar.json(whitespace="flexible", max_whitespace=4),
        gm.Grammar.regex(r"[0-9]{3}-[a-z]+"),
        gm.Grammar.ebnf('root ::= "a" | "b" root'),
        gm.Grammar.choice(["yes", "no", "it depends"]),
    ],
    ids=lambda g: g.kind,
)
def test_xargs_round_trips_every_grammar_kind(grammar: gm.Grammar) -> None:
    entry = xargs(grammar)
    assert set(entry) == {EXTRA_ARGS_KEY}
    assert isinstance(entry[EXTRA_ARGS_KEY], str)  # vllm_xargs values are strings or numbers
    spec = request_spec(entry)
    assert spec is not None
    assert spec.grammar == grammar
    assert (spec.backend, spec.allow_unenforced) == (None, None)
    as_object = request_spec({EXTRA_ARGS_KEY: json.loads(entry[EXTRA_ARGS_KEY])})
    assert as_object == spec


def test_xargs_carries_the_options() -> None:
    spec = request_spec(xargs(gm.Grammar.json(), backend="xgrammar", allow_unenforced=True))
    assert spec is not None
    assert (spec.backend, spec.allow_unenforced) == ("xgrammar", True)


def test_requests_without_an_entry_ask_nothing() -> None:
    assert request_spec(None) is None
    assert request_spec({}) is None
    assert request_spec({"other_plugin": 1}) is None


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ("{not json", "is not JSON"),
        ("[1, 2]", "must be a JSON object"),
        (17, "must be an object or its JSON text"),
        ({}, "needs exactly one of"),
        ({"regex": "a", "choice": ["a"]}, "found regex and choice"),
        ({"json": True, "colour": "red"}, "unknown key 'colour'"),
        ({"json": False}, "json must be true"),
        ({"regex": "a", "whitespace": "flexible"}, "'whitespace' applies to json_schema"),
        ({"choice": ["a"], "strict": True}, "'strict' applies to json_schema only"),
        ({"json": True, "backend": "fast"}, "unknown backend 'fast'"),
        ({"json": True, "allow_unenforced": "yes"}, "'allow_unenforced' must be a bool"),
        ({"json": True, "max_whitespace": 2.5}, "'max_whitespace' must be an integer"),
        ({"json": True, "whitespace": "wide"}, "whitespace must be 'compact' or 'flexible'"),
        ({"json_schema": 3}, "json_schema must be a schema object"),
        ({"json_schema": {"type": "objekt"}}, "not a valid JSON Schema"),
        ({"json_schema": '{"type": '}, "schema text is not JSON"),
        ({"regex": "a(b"}, "invalid regex"),
        ({"ebnf": "root ::= "}, "invalid EBNF"),
        ({"choice": "yes"}, "choice must be a list"),
        ({"choice": []}, "at least one option"),
        ("[" * 100_000, "nests too deep"),
        ('{"regex": "' + "a" * (2 << 20) + '"}', "over the limit"),
    ],
    ids=lambda value: value[:40] if isinstance(value, str) else None,
)
def test_malformed_entries_name_their_problem(entry: Any, message: str) -> None:
    with pytest.raises(gm.GrammarError, match=message) as raised:
        request_spec({EXTRA_ARGS_KEY: entry})
    assert isinstance(raised.value, ValueError)  # what vLLM turns into HTTP 400


def test_entry_errors_are_request_spec_errors_or_the_grammars_own() -> None:
    with pytest.raises(RequestSpecError):
        request_spec({EXTRA_ARGS_KEY: {"json": True, "colour": 1}})
    with pytest.raises(gm.InvalidRegexError):
        request_spec({EXTRA_ARGS_KEY: {"regex": "("}})


# ---------------------------------------------------------------------- the settings


def test_settings_default_when_the_engine_names_none() -> None:
    assert PluginSettings.from_additional_config(None) == PluginSettings()
    assert PluginSettings.from_additional_config({"other": {}}) == PluginSettings()
    assert 1 <= PluginSettings().fill_workers <= 4


def test_settings_are_read_and_checked() -> None:
    settings = PluginSettings.from_additional_config(
        {
            "grammarmask": {
                "backend": "xgrammar",
                "workers": 3,
                "isolation": "process",
                "compile_timeout_s": 5,
                "compile_memory_mb": 512,
                "allow_unenforced": True,
            }
        }
    )
    assert settings.compile_memory_bytes == 512 << 20
    assert PluginSettings().compile_memory_bytes is None  # the machine's default
    assert (settings.backend, settings.fill_workers, settings.isolation) == (
        "xgrammar",
        3,
        "process",
    )
    assert settings.compile_timeout_s == 5 and settings.allow_unenforced


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ([], "must be an object"),
        ({"worker": 2}, "unknown key 'worker'"),
        ({"workers": "2"}, "must be a int"),
        ({"workers": True}, "must be a int"),
        ({"workers": -1}, "workers must be 0"),
        ({"backend": "fast"}, "unknown backend 'fast'"),
        ({"isolation": "container"}, "isolation must be"),
        ({"compile_timeout_s": 0}, "compile_timeout_s must be positive"),
        ({"compile_timeout_s": 20, "step_timeout_s": 10}, "at least compile_timeout_s"),
        ({"autoload": "no"}, "must be a bool"),
        ({"compile_memory_mb": -1}, "compile_memory_mb must be 0"),
        ({"compile_memory_mb": 1.5}, "must be a int"),
    ],
)
def test_bad_settings_stop_the_engine_with_the_reason(raw: Any, message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        PluginSettings.from_additional_config({"grammarmask": raw})


# ---------------------------------------------------------------------- the batch rows


class PersistentBatch:
    """A model of vLLM's persistent batch: requests in rows, removals leaving holes that
    adds fill first, condensing by one-way moves from the end, and swaps (reordering)."""

    def __init__(self) -> None:
        self.rows: list[int | None] = []
        self.next_id = 0

    def step(self, data: st.DataObject) -> tuple[list[int], list[tuple[int, int]], list[Any]]:
        occupied = [i for i, r in enumerate(self.rows) if r is not None]
        removed = data.draw(st.lists(st.sampled_from(occupied), unique=True)) if occupied else []
        for index in removed:
            self.rows[index] = None
        added = []
        for _ in range(data.draw(st.integers(0, 3))):
            holes = [i for i, r in enumerate(self.rows) if r is None]
            index = holes[0] if holes else len(self.rows)
            if index == len(self.rows):
                self.rows.append(None)
            self.rows[index] = self.next_id
            added.append((index, self.next_id))
            self.next_id += 1
        moved: list[Any] = []
        while None in self.rows:  # condense: the last request fills the first hole
            hole = self.rows.index(None)
            last = (
                max(i for i, r in enumerate(self.rows) if r is not None)
                if any(r is not None for r in self.rows)
                else -1
            )
            if last < hole:
                del self.rows[hole:]
                break
            self.rows[hole], self.rows[last] = self.rows[last], None
            moved.append((last, hole, False))
        if len(self.rows) >= 2 and data.draw(st.booleans()):
            a, b = data.draw(st.lists(st.integers(0, len(self.rows) - 1), min_size=2, max_size=2))
            if a != b:
                self.rows[a], self.rows[b] = self.rows[b], self.rows[a]
                moved.append((a, b, True))
        return removed, added, moved


@given(st.data())
def test_batch_rows_follow_requests_through_removes_adds_moves_and_swaps(
    data: st.DataObject,
) -> None:
    batch = PersistentBatch()
    tracked: BatchRows[int] = BatchRows()
    with_grammar: set[int] = set()
    for _ in range(data.draw(st.integers(1, 25))):
        before = {r for r in batch.rows if r is not None}
        removed, added, moved = batch.step(data)
        flagged = [(index, rid if rid % 3 else None) for index, rid in added]  # every third: none
        with_grammar |= {rid for _, rid in flagged if rid is not None}
        gone = tracked.update(removed, flagged, moved)
        after = {r for r in batch.rows if r is not None}
        assert sorted(gone) == sorted((before - after) & with_grammar)
        expected = {i: r for i, r in enumerate(batch.rows) if r is not None and r in with_grammar}
        assert dict(tracked.items()) == expected


def test_batch_rows_drop_an_item_that_an_add_or_a_move_replaces() -> None:
    rows: BatchRows[str] = BatchRows()
    assert rows.update([], [(0, "a"), (1, "b"), (2, None)], []) == []
    assert rows.update([], [(0, "c")], []) == ["a"]
    assert rows.update([], [], [(1, 0, False)]) == ["c"]
    assert dict(rows.items()) == {0: "b"}
    assert rows.update([], [], [(0, 5, True)]) == []
    assert dict(rows.items()) == {5: "b"}
