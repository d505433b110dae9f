"""How the tests build vLLM engines: the bench's SmolLM2 recipe, with grammarmask's path."""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

from grammarmask.integrations.vllm import PROCESSOR_PATH as PLUGIN
from grammarmask.tools.bench.vllm import smollm2_engine_args

__all__ = ["PLUGIN", "engine_args", "shutdown"]


def engine_args(model_dir: Path, **overrides: Any) -> dict[str, Any]:
    """The engine every test uses (`smollm2_engine_args`), holding CPU memory for vLLM's
    start-up check at 15 % (several engines live in one test session)."""
    return smollm2_engine_args(model_dir, **{"gpu_memory_utilization": 0.15, **overrides})


def shutdown(llm: Any) -> None:
    llm.llm_engine.engine_core.shutdown()
    del llm
    gc.collect()
