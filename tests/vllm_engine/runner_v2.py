"""Model Runner V2 as its custom logits processors see it, on this CPU machine.

The request state is vLLM's own `RequestState` over the CPU buffers that vLLM's CPU V2
runner uses (`vllm.v1.worker.cpu.buffer_utils.UvaBuffer`, swapped in the way
`vllm/v1/worker/cpu/shm.py` does); the processor gets `LogitsProcRequestState` from it as
the sampler builds it. Two of the runner's Triton kernels have no CPU backend here, so
their effect is written in Python: the staged writes of `add_request`
(`_apply_write_kernel`) and the post-sampling update that appends accepted tokens to the
history (`_post_update_kernel`). The per-step order is the runner's: finished requests
leave their slots, new ones are added, staged writes are flushed (the processor's
`apply_staged_writes` last), the forward, then `apply` on the step's logits rows.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
import torch
import vllm.v1.worker.cpu.buffer_utils as cpu_buffers
import vllm.v1.worker.gpu.buffer_utils as gpu_buffers
from vllm import SamplingParams
from vllm.config import VllmConfig
from vllm.v1.worker.gpu.buffer_utils import StagedWriteTensor
from vllm.v1.worker.gpu.sample.logits_processor import (
    LogitsContext,
    LogitsProcessor,
    LogitsProcRequestState,
)
from vllm.v1.worker.gpu.states import RequestState


@contextmanager
def cpu_buffers_swapped() -> Iterator[None]:
    """vLLM's CPU V2 runner's buffers in place of the pinned ones (no CUDA here)."""
    saved = gpu_buffers.UvaBuffer
    gpu_buffers.UvaBuffer = cpu_buffers.UvaBuffer  # type: ignore[misc]
    try:
        yield
    finally:
        gpu_buffers.UvaBuffer = saved  # type: ignore[misc]


def _flush(tensor: StagedWriteTensor) -> None:
    """`StagedWriteTensor.apply_write` without its Triton kernel: each staged run of values
    lands at row * stride(0) + start."""
    flat = tensor.gpu.view(-1)
    stride = tensor.gpu.stride(0)
    begin = 0
    for index, start, end in zip(
        tensor._staged_write_indices,
        tensor._staged_write_starts,
        tensor._staged_write_cu_lens,
        strict=True,
    ):
        values = tensor._staged_write_contents[begin:end]
        offset = index * stride + start
        flat[offset : offset + len(values)] = torch.tensor(values, dtype=flat.dtype)
        begin = end
    tensor.clear_staged_writes()


@dataclass
class V2Runner:
    """One engine's request slots and processors, driven step by step."""

    vllm_config: VllmConfig
    processor_classes: Sequence[type[LogitsProcessor]]
    vocab_size: int
    max_num_reqs: int = 8
    max_model_len: int = 512
    states: RequestState = field(init=False)
    processors: list[LogitsProcessor] = field(init=False)
    needs_processing: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        with cpu_buffers_swapped():
            self.states = RequestState(
                self.max_num_reqs,
                self.max_model_len,
                max_num_batched_tokens=4096,
                num_speculative_steps=self.vllm_config.num_speculative_tokens,
                vocab_size=self.vocab_size,
                device=torch.device("cpu"),
            )
        shared = LogitsProcRequestState.from_request_state(self.states)
        self.processors = [cls(self.vllm_config, shared) for cls in self.processor_classes]
        self.needs_processing = np.zeros(self.max_num_reqs, dtype=bool)

    # ------------------------------------------------------------------ requests
    def add(
        self, req_id: str, prompt: Sequence[int], params: SamplingParams, output: Sequence[int] = ()
    ) -> int:
        """A new request (or one resumed after preemption, with its `output` so far)."""
        self.states.add_request(
            req_id=req_id,
            prompt_len=len(prompt),
            all_token_ids=[*prompt, *output],
            num_computed_tokens=0,
            max_tokens=params.max_tokens or 16,
        )
        req_idx = self.states.req_id_to_index[req_id]
        needs = False
        for processor in self.processors:  # `req_id` is a local here, as in the runner
            needs |= processor.add_request(req_idx, params)
        self.needs_processing[req_idx] = needs
        return req_idx

    def finish(self, req_id: str) -> None:
        """A request finished or was preempted: its slot goes back to the free list."""
        self.states.remove_request(req_id)

    def slot(self, req_id: str) -> int:
        return self.states.req_id_to_index[req_id]

    def history(self, req_id: str) -> list[int]:
        """The request's output tokens, as the runner's history holds them."""
        slot = self.slot(req_id)
        start = int(self.states.prompt_len.np[slot])
        total = int(self.states.total_len.gpu[slot])
        return self.states.all_token_ids.gpu[slot, start:total].tolist()

    # ------------------------------------------------------------------ one step
    def before_forward(self) -> None:
        states = self.states
        states.prompt_len.copy_to_uva()
        states.prefill_len.copy_to_uva()
        for tensor in (states.total_len, states.all_token_ids, states.num_computed_tokens):
            _flush(tensor)
        for processor in self.processors:
            processor.apply_staged_writes()

    def context(self, batch: Sequence[tuple[str, Sequence[int]]]) -> LogitsContext:
        """The step's layout for (request, drafts) in batch order: one row for the last
        committed token and one per draft, as the runner's InputBatch lays them out."""
        slots, expanded, local, inputs, positions, upper = [], [], [], [], [], []
        for req_id, drafts in batch:
            slot = self.slot(req_id)
            total = int(self.states.total_len.gpu[slot])
            last = int(self.states.all_token_ids.gpu[slot, total - 1])
            slots.append(slot)
            for j, token in enumerate([last, *drafts]):
                expanded.append(slot)
                local.append(j)
                inputs.append(token)
                positions.append(total - 1 + j)
            upper.append(total + len(drafts))
        return LogitsContext(
            expanded_idx_mapping=torch.tensor(expanded, dtype=torch.int32),
            idx_mapping=torch.tensor(slots, dtype=torch.int32),
            idx_mapping_np=np.array(slots, dtype=np.int32),
            expanded_local_pos=torch.tensor(local, dtype=torch.int32),
            input_ids=torch.tensor(inputs, dtype=torch.int32),
            pos=torch.tensor(positions, dtype=torch.int64),
            seq_lens_upper_bound_np=np.array(upper, dtype=np.int32),
        )

    def sample_logits(self, logits: torch.Tensor, ctx: LogitsContext) -> torch.Tensor:
        """`Sampler.apply_sampling_params` up to the processors: skipped when no request
        of the batch needs processing, else on an FP32 copy."""
        if not np.any(self.needs_processing[ctx.idx_mapping_np]):
            return logits
        processed = torch.empty_like(logits, dtype=torch.float32).copy_(logits)
        for processor in self.processors:
            processed = processor.apply(processed, ctx)
        return processed

    def append(self, req_id: str, tokens: Sequence[int]) -> None:
        """`post_update`: the accepted tokens join the history, total_len grows."""
        slot = self.slot(req_id)
        total = int(self.states.total_len.gpu[slot])
        self.states.all_token_ids.gpu[slot, total : total + len(tokens)] = torch.tensor(
            list(tokens), dtype=torch.int32
        )
        self.states.total_len.gpu[slot] = total + len(tokens)
