"""Timing, results and their presentation: interleaved repeats, ratio rows, table, JSON, plots.

Every figure is a ratio against a baseline timed in the same run, repeat by repeat in a
shuffled order, so the noise of a shared machine hits both sides alike.
"""

from __future__ import annotations

import json
import random
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

JSON_FORMAT = "grammarmask-bench/1"
_NUMBER = {"type": ["number", "null"]}
RESULT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["format", "meta", "rows"],
    "properties": {
        "format": {"const": JSON_FORMAT},
        "meta": {"type": "object", "required": ["machine", "size", "repeats"]},
        "rows": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["scenario", "point", "variant", "baseline", "unit", "met"],
                "properties": {
                    "scenario": {"type": "string"},
                    "point": {"type": "string"},
                    "variant": {"type": "string"},
                    "baseline": {"type": "string"},
                    "unit": {"enum": ["ms", "tok/s"]},
                    "p50": _NUMBER,
                    "p99": _NUMBER,
                    "ratio_p50": _NUMBER,
                    "ratio_p99": _NUMBER,
                    "target": {"type": ["string", "null"]},
                    "met": {"type": ["boolean", "null"]},
                    "repeats": {"type": "integer"},
                    "unavailable": {"type": ["string", "null"]},
                    "extra": {"type": "object"},
                },
            },
        },
    },
}
"""What `--json OUT` writes (a JSON Schema)."""


def percentile(values: Sequence[float], q: float) -> float:
    """The q-quantile (nearest rank) of a non-empty sample."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def interleave(
    runs: Mapping[str, Callable[[], object]],
    repeats: int,
    rng: random.Random,
    tick: Callable[[], None] = lambda: None,
    setup: Mapping[str, Callable[[], object]] | None = None,
) -> dict[str, list[float]]:
    """Seconds per call of each run, `repeats` times, in a fresh random order each repeat;
    `setup[name]`, if any, runs untimed right before each call of `name`."""
    timings: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name in rng.sample(list(runs), len(runs)):
            if setup and name in setup:
                setup[name]()
            started = time.perf_counter()
            runs[name]()
            timings[name].append(time.perf_counter() - started)
        tick()
    return timings


@dataclass(frozen=True)
class Target:
    """A goal on a row's p50 ratio: `ratio <= value` (costs) or `ratio >= value`."""

    op: str
    value: float

    def met(self, ratio: float) -> bool:
        return ratio <= self.value if self.op == "<=" else ratio >= self.value

    def __str__(self) -> str:
        return f"{self.op} {self.value:g}"


@dataclass(frozen=True)
class Row:
    """One variant at one point of a scenario, against that point's baseline.

    `ratio_p50` = variant p50 / baseline p50 of the measured quantity (time, or tokens/s
    where `unit` says so; e2e: the median of paired runs' ratios, see bench/e2e.py);
    `ratio_p99` the same for p99. `unavailable` says why a variant could not run here (no
    CUDA device, a pool option not built yet).
    """

    scenario: str
    point: str
    variant: str
    baseline: str
    unit: str = "ms"
    p50: float | None = None
    p99: float | None = None
    ratio_p50: float | None = None
    ratio_p99: float | None = None
    target: Target | None = None
    repeats: int = 0
    unavailable: str | None = None
    extra: dict[str, float] = field(default_factory=dict)

    @property
    def met(self) -> bool | None:
        if self.target is None or self.ratio_p50 is None:
            return None
        return self.target.met(self.ratio_p50)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["target"] = None if self.target is None else str(self.target)
        data["met"] = self.met
        return data


def compare(
    scenario: str,
    point: str,
    timings: Mapping[str, Sequence[float]],
    baseline: str,
    targets: Mapping[str, Target] | None = None,
    *,
    scale: float = 1e3,
    unit: str = "ms",
) -> list[Row]:
    """Rows for every run of one interleaved measurement, the baseline first (ratio 1)."""
    base50 = statistics.median(timings[baseline])
    base99 = percentile(timings[baseline], 0.99)
    rows = []
    for name in [baseline, *[n for n in timings if n != baseline]]:
        values = timings[name]
        p50, p99 = statistics.median(values), percentile(values, 0.99)
        rows.append(
            Row(
                scenario,
                point,
                name,
                baseline,
                unit,
                p50 * scale,
                p99 * scale,
                p50 / base50,
                p99 / base99,
                (targets or {}).get(name),
                len(values),
            )
        )
    return rows


def _fmt(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def table(rows: Sequence[Row]) -> str:
    """The console table: one line per row, ratios against the baseline of its point."""
    header = ["scenario", "point", "variant", "p50", "p99", "unit", "x base p50", "x base p99"]
    lines = [[*header, "target", "met", "notes"]]
    for row in rows:
        if row.unavailable is not None:
            lines.append([row.scenario, row.point, row.variant, "unavailable: " + row.unavailable])
            continue
        met = {None: "", True: "yes", False: "NO"}[row.met]
        notes = ", ".join(f"{name} {value:.3f}" for name, value in row.extra.items())
        lines.append(
            [
                row.scenario,
                row.point,
                row.variant,
                _fmt(row.p50),
                _fmt(row.p99),
                row.unit,
                _fmt(row.ratio_p50, 3),
                _fmt(row.ratio_p99, 3),
                "" if row.target is None else str(row.target),
                met,
                notes,
            ]
        )
    columns = len(header) + 3
    widths = [  # an "unavailable" note spans the figure columns and sets no width
        max(len(line[i]) for line in lines if len(line) == columns or i < 3) for i in range(columns)
    ]
    out = [
        "  ".join(cell.ljust(widths[i]) for i, cell in enumerate(line)).rstrip() for line in lines
    ]
    out.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(out)


def write_json(path: Path, rows: Sequence[Row], meta: Mapping[str, Any]) -> None:
    """Machine-readable results: {"format", "meta", "rows": [Row...]}."""
    document = {"format": JSON_FORMAT, "meta": dict(meta), "rows": [r.to_json() for r in rows]}
    path.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
