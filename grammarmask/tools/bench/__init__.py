"""`grammarmask bench`: performance scenarios whose figures are ratios against baselines
timed in the same run (see runner.SCENARIOS)."""

from .context import BenchConfig
from .report import Row
from .runner import SCENARIOS, run_bench

__all__ = ["SCENARIOS", "BenchConfig", "Row", "run_bench"]
