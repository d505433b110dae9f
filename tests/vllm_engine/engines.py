"""How the tests build vLLM engines."""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

PLUGIN = "grammarmask.integrations.vllm:GrammarLogitsProcessor"
MAX_NUM_SEQS = 16


def engine_args(model_dir: Path, **overrides: Any) -> dict[str, Any]:
    """The engine every test uses: SmolLM2 in bf16 on the CPU, one worker in this process,
    no prefix cache (so two runs of one batch take steps of the same shapes)."""
    return {
        "model": str(model_dir),
        "dtype": "bfloat16",
        "max_model_len": 2048,
        "enforce_eager": True,
        "max_num_seqs": MAX_NUM_SEQS,
        "gpu_memory_utilization": 0.15,
        "kv_cache_memory_bytes": 1 << 30,
        "enable_prefix_caching": False,
        "distributed_executor_backend": "uni",
        "seed": 0,
        **overrides,
    }


def shutdown(llm: Any) -> None:
    llm.llm_engine.engine_core.shutdown()
    del llm
    gc.collect()
