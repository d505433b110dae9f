"""`grammarmask bench vllm` on smoke sizes: every variant runs on the real engines and its
row carries the figures the README and the closing notes quote."""

from __future__ import annotations

import pytest

from grammarmask.tools.bench import BenchConfig, run_bench
from grammarmask.tools.bench.vllm import VARIANTS


@pytest.mark.slow  # six engines: ten minutes on two cores (run: pytest -m slow)
@pytest.mark.timeout(1500)
def test_bench_vllm_runs_every_variant_on_the_real_engines() -> None:
    rows, _ = run_bench(["vllm"], BenchConfig("tiny", 1), progress=False)
    assert [row.variant for row in rows] == list(VARIANTS)
    for row in rows:
        assert row.unavailable is None, row
        assert row.p50 is not None and row.p50 > 0 and row.ratio_p50 is not None
        assert row.extra["ms_per_step"] > 0
        assert 0 <= row.extra["plugin_share"] < 1
        assert 0 <= row.extra["structured_share"] < 1
        if VARIANTS[row.variant].grammar is not None:
            assert row.extra["finished"] > 0, row  # else "none broken" says nothing
            assert row.extra["valid"] <= row.extra["finished"]
    plugin = {row.variant: row for row in rows}
    for served in ("grammarmask auto", "grammarmask backend", "grammarmask backend, ngram"):
        assert plugin[served].extra["broken_enforced"] == 0, served
    assert plugin["grammarmask backend"].extra["structured_share"] > 0
    assert plugin["vLLM xgrammar"].extra["structured_share"] > 0
    assert plugin["no plugin, no grammar"].extra["plugin_share"] < 0.01
