"""The conformance run's report: its JSON-lines records read back, totals per backend, and
the plain-text table and lowering line `grammarmask conformance` prints."""

from __future__ import annotations

import json
import statistics
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path

from .conformance import STATUSES, Record


def read_records(path: Path) -> Iterator[Record]:
    """Records of an earlier (possibly interrupted) run's JSON-lines report."""
    with path.open(encoding="utf-8") as handle:
        for line in handle:
            if line.strip():
                try:
                    yield json.loads(line)
                except json.JSONDecodeError:
                    continue  # a line cut short when the run was interrupted


# ---------------------------------------------------------------------------- summary
SUMMARY_COLUMNS = (
    "schemas",
    *STATUSES,
    "fully_enforced",
    "lowered",
    "valid",
    "valid_accepted",
    "valid_rejected_key_order",
    "invalid",
    "invalid_rejected",
    "invalid_accepted_label",
    "invalid_accepted_explained",
    "invalid_accepted_unverified",
    "invalid_accepted_defect",
    "bytes_tokens_disagree",
    "matcher_errors",
)
MUTANT_COLUMNS = (
    "mutants",
    "mutants_rejected",
    "mutant_accepted_explained",
    "mutant_accepted_unverified",
    "mutant_accepted_defect",
    "mutants_unjudged",
)
"""Shown where a run fed mutants (`--mutate`)."""


def summarize(records: Iterable[Record]) -> dict[str, Counter[str]]:
    """Per backend: schema outcomes and instance counts, in SUMMARY_COLUMNS."""
    totals: dict[str, Counter[str]] = {}
    for record in records:
        counts = totals.setdefault(record["backend"], Counter())
        counts["schemas"] += 1
        counts[record["status"]] += 1
        counts["fully_enforced"] += bool(record.get("fully_enforced"))
        counts["lowered"] += bool(record.get("rewrites"))
        for key, value in record.get("counts", {}).items():
            counts[key] += value
    return totals


def lowering_line(records: Sequence[Record]) -> str:
    """How many schemas lowering changed, and its median time beside the median compile."""
    timed = [r for r in records if "lower_s" in r]
    if not timed:
        return "lowering: no schema timed"
    lower = statistics.median(r["lower_s"] for r in timed)
    compiles = [r["compile_s"] for r in timed if "compile_s" in r]
    share = f", {lower / statistics.median(compiles):.1%} of the median compile" if compiles else ""
    changed = sum(bool(r.get("rewrites")) for r in timed)
    return (
        f"lowering: {changed} of {len(timed)} schema checks rewritten; "
        f"median {lower * 1000:.3f} ms per schema{share}"
    )


def summary_table(totals: Mapping[str, Counter[str]]) -> str:
    """A plain-text table, one row per backend (with the mutant columns where any were fed)."""
    headers = {
        "compile_error": "error",
        "invalid_schema": "bad schema",
        "fully_enforced": "full",
        "valid_accepted": "valid ok",
        "valid_rejected_key_order": "key order",
        "invalid_rejected": "invalid rej",
        "invalid_accepted_label": "label",
        "invalid_accepted_explained": "explained",
        "invalid_accepted_unverified": "unverified",
        "invalid_accepted_defect": "DEFECT",
        "bytes_tokens_disagree": "bytes!=ids",
        "matcher_errors": "matcher err",
        "mutants_rejected": "mutant rej",
        "mutant_accepted_explained": "m explained",
        "mutant_accepted_unverified": "m unverified",
        "mutant_accepted_defect": "MUTANT HOLE",
        "mutants_unjudged": "m unjudged",
    }
    mutated = any(counts["mutants"] or counts["mutants_unjudged"] for counts in totals.values())
    columns = (*SUMMARY_COLUMNS, *MUTANT_COLUMNS) if mutated else SUMMARY_COLUMNS
    rows = [["backend", *(headers.get(c, c) for c in columns)]]
    rows.extend([name, *(str(counts[c]) for c in columns)] for name, counts in totals.items())
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.rjust(w) for cell, w in zip(row, widths, strict=True)) for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
