"""The mutation oracle: mutants name the keyword they break, a sound mask refuses them or
declares why not, and silenced declarations show up as holes."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import jsonschema
import pytest
from hypothesis import given
from hypothesis import strategies as st

from grammarmask.errors import SchemaJudgeError
from grammarmask.tools import conformance as cf
from grammarmask.tools import conformance_report
from grammarmask.tools.cli import main
from grammarmask.tools.mutants import mutants

SAMPLE = Path(cf.__file__).parent.parent / "data" / "maskbench_sample"

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 3, "pattern": "^[a-z]+$"},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "uniqueItems": True},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}


def test_each_mutant_breaks_the_keyword_it_names_at_its_pointer() -> None:
    found = {(m.at, m.edit): m for m in mutants(PERSON, {"name": "ab", "age": 30, "tags": ["a"]})}
    expected = {
        ("/name", "longer"): ("maxLength", "/properties/name/maxLength"),
        ("/name", "backslash"): ("pattern", "/properties/name/pattern"),
        ("/age", "negative"): ("minimum", "/properties/age/minimum"),
        ("/age", "fraction"): ("type", "/properties/age/type"),
        ("/tags", "first item repeated"): ("uniqueItems", "/properties/tags/uniqueItems"),
        ("", "member 'age' dropped"): ("required", "/required"),
        ("", "unknown member"): ("additionalProperties", "/additionalProperties"),
    }
    for key, (keyword, pointer) in expected.items():
        assert (found[key].keyword, found[key].schema_pointer) == (keyword, pointer), key
    # edits the schema allows are not mutants: "ab" shortened to "a" still fits
    assert ("/name", "shorter") not in found


@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
        max_leaves=8,
    )
)
def test_every_mutant_is_refused_by_the_schema_and_the_limit_holds(instance: object) -> None:
    schema = {"const": instance}
    found = list(mutants(schema, instance, limit=5))
    assert len(found) <= 5
    for mutant in found:
        assert not jsonschema.Draft202012Validator(schema).is_valid(mutant.instance)
        assert mutant.keyword == "const" and mutant.schema_pointer == "/const"


def test_a_decimal_multiple_that_binary_floats_miss_is_no_mutant() -> None:
    # jsonschema refuses -1200.1 for multipleOf 0.01 (the float quotient is not whole);
    # as decimals it is a multiple, and a mask that accepts it is right
    schema = {"type": "number", "multipleOf": 0.01}
    assert not jsonschema.Draft202012Validator(schema).is_valid(-1200.1)
    edits = {m.edit: m.instance for m in mutants(schema, 1200.1)}
    assert "negative" not in edits and "fraction" not in edits
    assert edits["another type"] == "0"
    off_step = {m.edit: m.keyword for m in mutants({"type": "number", "multipleOf": 0.3}, 0.6)}
    assert off_step["fraction"] == "multipleOf"  # 1.1 is no multiple of 0.3, as decimals


def test_a_schema_jsonschema_cannot_judge_is_said() -> None:
    with pytest.raises(SchemaJudgeError, match="cannot judge"):
        list(mutants({"$ref": "#/$defs/missing"}, 1))


SILENCED_WORKER = """
import dataclasses, sys
from grammarmask.tools import _conformance_worker as worker

feed_mutants = worker.Checker._mutants

def silenced(self, schema, lowered, compiled, *args):
    quiet = dataclasses.replace(compiled, unenforced=())
    return feed_mutants(self, schema, lowered, quiet, *args)

worker.Checker._mutants = silenced
worker.main(sys.argv[1:])
"""


def _mutant_totals(records: list[cf.Record], backend: str) -> dict[str, int]:
    totals = conformance_report.summarize(records)[backend]
    return {k: v for k, v in totals.items() if k.startswith("mutant")}


def test_a_sound_backend_refuses_or_declares_every_mutant(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "report.jsonl"
    args = ["conformance", str(SAMPLE), "--backend", "xgrammar", "--mutate", "30"]
    assert main([*args, "--json", str(out)]) == 0
    records = [json.loads(line) for line in out.read_text().splitlines()]
    totals = _mutant_totals(records, "xgrammar")
    assert totals["mutants"] > 50
    assert totals.get("mutant_accepted_defect", 0) == 0
    # xgrammar declares keywords on this sample, and the mutants find them
    assert totals["mutant_accepted_explained"] > 0
    assert (
        totals["mutants_rejected"]
        + totals["mutant_accepted_explained"]
        + totals.get("mutant_accepted_unverified", 0)
        == totals["mutants"]
    )
    header = capsys.readouterr().out.splitlines()[-4]
    assert "MUTANT" in header and "mutants" in header.split()


def test_silenced_declarations_are_found_as_holes_at_their_keywords(tmp_path: Path) -> None:
    script = tmp_path / "silenced_worker.py"
    script.write_text(SILENCED_WORKER)
    records = cf.run_conformance(
        cf.select_files(SAMPLE),
        ["xgrammar"],
        cf.ConformanceOptions(mutate=30),
        argv=[sys.executable, str(script)],
    )
    holes = {
        record["schema"]: [
            finding
            for finding in record.get("findings", [])
            if finding["outcome"] == "mutant_accepted_defect"
        ]
        for record in records
    }
    found = [finding for findings in holes.values() for finding in findings]
    assert found and _mutant_totals(records, "xgrammar")["mutant_accepted_defect"] == len(found)
    for record in records:
        # holes exactly where xgrammar had declared something, each naming its keyword
        assert bool(holes[record["schema"]]) == bool(record["unenforced"]), record["schema"]
        for finding in holes[record["schema"]]:
            assert finding["schema_pointer"].endswith(f"/{finding['keyword']}")
