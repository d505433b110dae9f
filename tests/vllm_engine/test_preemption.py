"""Preemption and resumption inside vLLM's engine: a KV cache too small for the batch, so
vLLM's scheduler preempts running grammar requests (their KV freed) and resumes them later
with their tokens so far. The plugin then serves each resumed request from a new pool
request that commits those tokens again; every answer must still match its grammar in
full, and no request may fail.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from vllm import LLM, SamplingParams
from vllm.v1.core.sched.scheduler import Scheduler

import grammarmask as gm
from grammarmask.integrations.vllm import _v1, xargs
from grammarmask.tools.bench.vllm import cpu_dtype
from vllm_engine.engines import PLUGIN, engine_args, shutdown

KV_CACHE_BYTES = (12 << 20) * {"bfloat16": 2, "float32": 4}[cpu_dtype()]
"""About 1,000 tokens of SmolLM2's KV cache in the engine's dtype: two requests' worth of
max_model_len."""
REQUESTS = 8


@pytest.fixture(scope="module")
def small_cache_llm(model_dir: Path) -> Iterator[Any]:
    llm = LLM(
        **engine_args(
            model_dir,
            logits_processors=[PLUGIN],
            kv_cache_memory_bytes=KV_CACHE_BYTES,
            max_model_len=512,
            max_num_seqs=REQUESTS,
        )
    )
    yield llm
    shutdown(llm)


def test_preempted_grammar_requests_resume_and_stay_valid(
    small_cache_llm: Any, plugin_log: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    preempted: list[str] = []
    resumed: list[int] = []  # tokens a request already had when the plugin took it (again)
    preempt, admit = Scheduler._preempt_request, _v1.V1Processor._admit

    def preempting(self: Scheduler, request: Any, *args: Any, **kwargs: Any) -> Any:
        preempted.append(request.request_id)
        return preempt(self, request, *args, **kwargs)

    def admitting(self: _v1.V1Processor, params: SamplingParams, output: list[int]) -> Any:
        if output:
            resumed.append(len(output))
        return admit(self, params, output)

    monkeypatch.setattr(Scheduler, "_preempt_request", preempting)
    monkeypatch.setattr(_v1.V1Processor, "_admit", admitting)

    patterns = [f"item{i:02d}=[a-z]{{{120 + 10 * i}}}" for i in range(REQUESTS)]
    params = [
        SamplingParams(temperature=0.0, max_tokens=400, extra_args=xargs(gm.Grammar.regex(pattern)))
        for pattern in patterns
    ]
    prompts = [{"prompt": f"Write tag number {i} in letters:"} for i in range(REQUESTS)]
    outputs = small_cache_llm.generate(prompts, params, use_tqdm=False)

    assert preempted, "the KV cache was large enough: nothing was preempted"
    assert resumed, "no preempted grammar request came back with its tokens so far"
    for pattern, output in zip(patterns, outputs, strict=True):
        completion = output.outputs[0]
        assert completion.finish_reason == "stop", (pattern, completion.text)
        assert re.fullmatch(pattern, completion.text), (pattern, completion.text)
    assert [m for m in plugin_log if " failed: " in m] == []
