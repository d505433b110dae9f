"""`grammarmask bench`: every scenario on smoke sizes, the JSON format, the plots, the CLI's
exit codes; and the timing and ratio helpers."""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import jsonschema
import pytest

import grammarmask as gm
from grammarmask.resources import bundled_sample_dir
from grammarmask.tools.bench import SCENARIOS, BenchConfig, run_bench
from grammarmask.tools.bench.context import Bench
from grammarmask.tools.bench.fill import NAIVE, SPLIT, GridCell, fill_grid
from grammarmask.tools.bench.overlap import FILL_ALONE, FORWARDS, WITH_MASKS
from grammarmask.tools.bench.report import (
    RESULT_SCHEMA,
    Row,
    Target,
    compare,
    interleave,
    percentile,
    table,
)
from grammarmask.tools.bench.workload import pick_instances
from grammarmask.tools.cli import main

CPU_SCENARIOS = [name for name in SCENARIOS if name not in ("e2e", "vllm")]


def test_ratios_are_against_the_baseline_of_the_same_run() -> None:
    timings = {"base": [1.0, 2.0, 3.0], "fast": [0.5, 1.0, 1.5], "slow": [2.0, 4.0, 9.0]}
    rows = compare("s", "p", timings, "base", {"fast": Target("<=", 0.6)})
    by_name = {r.variant: r for r in rows}
    assert rows[0].variant == "base" and rows[0].ratio_p50 == 1.0
    assert by_name["fast"].ratio_p50 == pytest.approx(0.5) and by_name["fast"].met is True
    assert by_name["slow"].ratio_p99 == pytest.approx(3.0) and by_name["slow"].met is None
    assert "NO" not in table(rows) and "yes" in table(rows)
    assert percentile([5.0, 1.0, 3.0], 0.99) == 5.0


def test_interleave_runs_setup_untimed_and_shuffles_the_order() -> None:
    calls: list[str] = []
    runs = {name: (lambda n=name: calls.append(n)) for name in "abc"}
    timings = interleave(runs, 20, random.Random(0), setup={"a": lambda: calls.append("setup")})
    assert all(len(v) == 20 for v in timings.values())
    assert calls.count("setup") == 20 and calls.count("a") == 20
    firsts = {tuple(calls[i : i + 4]) for i in range(0, 80, 4)}
    assert len(firsts) > 1, "the order must change between repeats"


def test_unknown_scenario_and_missing_inputs_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["bench", "nope"]) == 2
    assert "unknown scenario(s) nope" in capsys.readouterr().err
    assert main(["bench", "fill", "--corpus", str(tmp_path / "missing")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["bench", "fill", "--tiny", "--repeats", "0"]) == 2
    with pytest.raises(ValueError, match="unknown scenario"):
        run_bench(["nope"], BenchConfig("tiny", 1))


def test_every_cpu_scenario_on_smoke_sizes(tmp_path: Path) -> None:
    """One CLI run: table, JSON valid against its schema, ratios, targets, unavailable rows,
    one PNG per scenario with figures and the overlap timeline."""
    out = tmp_path / "bench.json"
    plots = tmp_path / "plots"
    argv = ["bench", *CPU_SCENARIOS, "--tiny", "--repeats", "2", "--corpus", "bundled"]
    assert main([*argv, "--json", str(out), "--plot", str(plots)]) == 0
    document = json.loads(out.read_text())
    jsonschema.validate(document, RESULT_SCHEMA)
    rows = document["rows"]
    assert {r["scenario"] for r in rows} == set(CPU_SCENARIOS)
    for row in rows:
        if row["unavailable"] is None:
            assert row["p50"] > 0 and row["ratio_p50"] > 0, row
            if row["variant"] == row["baseline"]:
                assert row["ratio_p50"] == 1.0
    fill = [r for r in rows if r["scenario"] == "fill"]
    assert {r["variant"] for r in fill} >= {
        "naive loop (1 thread)",
        "xgrammar batch matcher (2 threads)",
        "xgrammar draft tree (1 thread)",
        "naive loop on 2 threads, one queue (reference)",
        "pool, 1 worker",
        "pool, 2 workers",
        "pool, 2 workers, fill_async + wait",
    }
    targeted = {"pool, 1 worker", "pool, 2 workers"}
    assert all(r["target"] is not None for r in fill if r["variant"] in targeted)
    reference = {r["point"]: r["ratio_p50"] for r in fill if r["variant"].endswith("(reference)")}
    two_workers = [r for r in fill if r["variant"].startswith("pool, 2 workers")]
    assert len(two_workers) == 2 * len(reference) > 0
    for row in two_workers:  # how far from what two threads give here, in the same run
        assert row["extra"]["x_reference"] == pytest.approx(
            row["ratio_p50"] / reference[row["point"]]
        )
    assert all(not r["extra"] for r in fill if not r["variant"].startswith("pool, 2 workers"))
    apply = [r for r in rows if r["variant"] == "grammarmask apply_bitmask"]
    assert len(apply) == 2 and all(r["target"] == "<= 1.5" for r in apply)
    cuda = [r for r in rows if r["scenario"] == "cuda"]
    assert all(r["unavailable"] == "no CUDA device" for r in cuda)
    overlap = [r for r in rows if r["scenario"] == "overlap"]
    assert [r["point"].rsplit(", ", 1)[1] for r in overlap if r["variant"] == r["baseline"]] == [
        f"{kind} forward" for kind in FORWARDS
    ]
    steps = [r for r in overlap if r["variant"] == WITH_MASKS]
    assert len(steps) == len(FORWARDS)
    assert all(set(r["extra"]) == {"caller_part", "forward_beside_fill", "wait"} for r in steps)
    fill_alone = {r["p50"] for r in overlap if r["variant"] == FILL_ALONE}
    assert len(fill_alone) == 1  # one fill alone, set against each forward
    isolation = [r for r in rows if r["scenario"] == "isolation"]
    assert any(r["variant"] == "pool, process isolation" for r in isolation)
    names = {p.name for p in plots.iterdir()}
    assert names >= {
        "fill.png",
        "fill_grid.png",
        "apply.png",
        "overlap.png",
        "compile.png",
        "overlap_timeline.png",
    }
    assert all((plots / n).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for n in names)


def test_fill_grid_sets_the_two_worker_pool_against_the_best_variant_an_engine_would_use() -> None:
    """Neither the reference nor the other pools count as "the best other"; cold runs get
    their own grid; rows of other scenarios and points without the pool are left out."""

    def row(point: str, variant: str, ratio: float, scenario: str = "fill") -> Row:
        return Row(scenario, point, variant, NAIVE, ratio_p50=ratio, target=Target("<=", 0.7))

    rows = [
        row("qwen B=64 D=5", NAIVE, 1.0),
        row("qwen B=64 D=5", SPLIT, 0.5),
        row("qwen B=64 D=5", "xgrammar batch matcher (2 threads)", 0.8),
        row("qwen B=64 D=5", "pool, 1 worker", 0.55),
        row("qwen B=64 D=5", "pool, 2 workers", 0.6),
        row("qwen B=64 D=5, cold", NAIVE, 1.0),
        row("qwen B=64 D=5, cold", "pool, 2 workers", 1.2),
        row("qwen B=16 D=0", NAIVE, 1.0),
        row("deepseek B=64 D=5", "pool, 2 workers", 0.6, scenario="isolation"),
    ]
    grids = fill_grid(rows)
    assert set(grids) == {"qwen", "qwen, cold"}
    assert grids["qwen"] == {(64, 5): GridCell(pytest.approx(0.75), 0.6, True)}
    assert grids["qwen, cold"] == {(64, 5): GridCell(pytest.approx(1.2), 1.2, False)}


def test_cold_caches_evict_before_every_timed_fill(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--cold-caches streams a buffer twice the last-level cache before each timed call of
    every fill variant (untimed), and says so in the points and the JSON."""
    flushes: list[int] = []
    real_flush = Bench.flush_caches

    def counted(bench: Bench) -> None:
        real_flush(bench)
        assert bench._flush_buffer is not None
        flushes.append(bench._flush_buffer.numel() * 4)

    monkeypatch.setattr(Bench, "flush_caches", counted)
    out = tmp_path / "cold.json"
    argv = ["bench", "fill", "--tiny", "--repeats", "3", "--corpus", "bundled", "--cold-caches"]
    assert main([*argv, "--json", str(out)]) == 0
    document = json.loads(out.read_text())
    assert document["meta"]["cold_caches"] is True
    fill = document["rows"]
    assert fill and all(row["point"].endswith(", cold") for row in fill)
    variants = {row["variant"] for row in fill}
    assert len(flushes) == 3 * len(variants)
    assert min(flushes) >= 2 * (1 << 20)  # at least twice a (small) last-level cache


@pytest.mark.slow
def test_e2e_on_the_real_model() -> None:
    rows, _ = run_bench(["e2e"], BenchConfig("tiny", 1), progress=False)
    assert [r.unit for r in rows] == ["tok/s", "tok/s"]
    assert rows[1].target == Target(">=", 0.97) and rows[1].ratio_p50 is not None


def test_pinned_schemas_are_replayed_by_name_and_draws_are_per_point(
    deepseek: gm.Vocabulary, deepseek_encode: Callable[[str], list[int]]
) -> None:
    """A corpus holding the pinned names gives exactly those schemas, in that order; one
    that lacks a name is searched instead. Each point's draws come from its own generator:
    the same whatever the run drew before."""
    sample = bundled_sample_dir()
    names = ["Kubernetes---kb_705_Normalized", "Github_easy---o71312"]
    compiler = gm.GrammarCompiler(deepseek)
    try:
        pinned = pick_instances(sample, 2, compiler, deepseek_encode, random.Random(0), names=names)
        assert [i.name for i in pinned] == names
        searched = pick_instances(
            sample, 2, compiler, deepseek_encode, random.Random(0), names=["absent", names[0]]
        )
        assert len(searched) == 2 and all((sample / f"{i.name}.json").is_file() for i in searched)
    finally:
        compiler.close()
    bench = Bench(BenchConfig("tiny", 1, sample), progress=False)
    try:
        first = bench.replays("deepseek", 4, 2)
        bench.rng.random()  # what the run does in between must not matter
        bench.replays("deepseek", 8, 0)
        assert bench.replays("deepseek", 4, 2) == first
    finally:
        bench.close()


@pytest.mark.parametrize(
    ("script", "env", "message"),
    [
        ("gpu_check.sh", {}, "no .gpukit/ here: run scripts/gpu_kit.sh"),
        ("gpu_kit.sh", {"GRAMMARMASK_CORPUS": "/nonexistent"}, "no MaskBench corpus at"),
    ],
)
def test_gpu_scripts_name_what_is_missing(
    tmp_path: Path, script: str, env: dict[str, str], message: str
) -> None:
    """The offline GPU check refuses (exit 2, saying why) before installing or fetching
    anything when its kit, or the kit's corpus, is not there."""
    folder = tmp_path / "scripts"
    folder.mkdir()
    shutil.copy(Path(__file__).parent.parent / "scripts" / script, folder)
    done = subprocess.run(
        ["bash", str(folder / script)],
        env={**os.environ, **env, "OUT": str(tmp_path / "out")},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert message in done.stderr
