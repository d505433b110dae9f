"""A reference sampler that respects grammar masks, with draft verification.

Order per row: grammar mask (already applied to the logits), repetition penalty,
temperature, top-k, top-p, min-p, then the draw. Every random number comes from the
request's own stream (its seed and the position of the draw), so a request samples the
same tokens whichever requests share its batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

_MASK64 = (1 << 64) - 1


def _splitmix64(value: int) -> int:
    value = (value + 0x9E3779B97F4A7C15) & _MASK64
    value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & _MASK64
    return value ^ (value >> 31)


def request_generator(seed: int, position: int, purpose: int = 0) -> torch.Generator:
    """The random stream of one draw: a hash of the request seed, its position and purpose."""
    mixed = _splitmix64(_splitmix64(seed & _MASK64) ^ (3 * position + purpose))
    return torch.Generator().manual_seed(mixed & ((1 << 63) - 1))


@dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling settings; temperature 0 means greedy."""

    temperature: float = 1.0
    top_k: int = -1
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, not {self.temperature}")
        if self.top_k == 0 or self.top_k < -1:
            raise ValueError(f"top_k must be -1 (off) or positive, not {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must lie in (0, 1], not {self.top_p}")
        if not 0 <= self.min_p < 1:
            raise ValueError(f"min_p must lie in [0, 1), not {self.min_p}")
        if self.repetition_penalty <= 0:
            raise ValueError(f"repetition_penalty must be > 0, not {self.repetition_penalty}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def processed_probs(
    logits: torch.Tensor,
    params: SamplingParams,
    previous_tokens: Sequence[int] = (),
    fallback_token_ids: Sequence[int] = (),
) -> torch.Tensor:
    """Probabilities of one already-masked logits row after penalty, temperature and filters.

    A row without any finite logit (everything masked) becomes uniform over
    `fallback_token_ids` (the stop tokens), never NaN.
    """
    row = logits.detach().to(torch.float32).clone()
    if not torch.isfinite(row).any() or torch.isnan(row).any():
        return _uniform(row.numel(), fallback_token_ids)
    if params.repetition_penalty != 1.0 and previous_tokens:
        seen = torch.tensor(sorted(set(previous_tokens)), dtype=torch.long)
        values = row[seen]
        row[seen] = torch.where(
            values > 0, values / params.repetition_penalty, values * params.repetition_penalty
        )
    if params.greedy:
        probs = torch.zeros_like(row)
        probs[int(torch.argmax(row))] = 1.0
        return probs
    row = row / params.temperature
    if params.top_k > 0 and params.top_k < row.numel():
        threshold = torch.topk(row, params.top_k).values[-1]
        row = row.masked_fill(row < threshold, float("-inf"))
    probs = torch.softmax(row, dim=-1)
    if params.top_p < 1.0:
        ordered, order = torch.sort(probs, descending=True, stable=True)
        before = torch.cumsum(ordered, dim=-1) - ordered
        drop = order[before > params.top_p]
        probs[drop] = 0.0
    if params.min_p > 0.0:
        probs = probs.masked_fill(probs < params.min_p * probs.max(), 0.0)
    return probs / probs.sum()


def _uniform(size: int, token_ids: Sequence[int]) -> torch.Tensor:
    probs = torch.zeros(size, dtype=torch.float32)
    if not token_ids:
        raise ValueError("a row with every token masked needs fallback (stop) token ids")
    probs[list(token_ids)] = 1.0 / len(token_ids)
    return probs


def draw(probs: torch.Tensor, generator: torch.Generator) -> int:
    return int(torch.multinomial(probs, 1, generator=generator))


@dataclass(frozen=True)
class Verification:
    """Outcome for one request: how many drafts were accepted, and the tokens to commit
    (the accepted drafts followed by one bonus token)."""

    accepted: int
    tokens: tuple[int, ...]


def verify_drafts(
    target_logits: torch.Tensor,
    drafts: Sequence[int],
    params: SamplingParams,
    *,
    position: int,
    previous_tokens: Sequence[int] = (),
    draft_probs: torch.Tensor | None = None,
    draft_mask: torch.Tensor | None = None,
    fallback_token_ids: Sequence[int] = (),
) -> Verification:
    """Verify `drafts` against target rows [len(drafts) + 1, vocab] (grammar masks applied).

    Greedy: accept while the target's argmax equals the draft. Otherwise speculative
    rejection sampling: accept draft d with probability min(1, p(d) / q(d)); on rejection
    draw from normalize(max(0, p - q)). Without `draft_probs` the drafter is deterministic
    (prompt lookup): q is one-hot on the draft. `draft_mask` (bool [len(drafts), vocab]) masks
    q with the grammar too. The result keeps the target distribution exactly.
    """
    history = list(previous_tokens)
    tokens: list[int] = []
    for j, draft in enumerate(drafts):
        p = processed_probs(target_logits[j], params, history, fallback_token_ids)
        if params.greedy:
            if int(torch.argmax(p)) != draft:
                return Verification(j, (*tokens, int(torch.argmax(p))))
        else:
            q = _draft_distribution(draft, p.numel(), draft_probs, draft_mask, j)
            generator = request_generator(params.seed, position + j, purpose=1)
            ratio = float(p[draft] / q[draft]) if q[draft] > 0 else 0.0
            if float(torch.rand(1, generator=generator)) >= min(1.0, ratio):
                residual = torch.clamp(p - q, min=0.0)
                total = float(residual.sum())
                choice = residual / total if total > 0 else p
                return Verification(j, (*tokens, draw(choice, generator)))
        tokens.append(draft)
        history.append(draft)
    last = processed_probs(target_logits[len(drafts)], params, history, fallback_token_ids)
    generator = request_generator(params.seed, position + len(drafts), purpose=2)
    bonus = int(torch.argmax(last)) if params.greedy else draw(last, generator)
    return Verification(len(drafts), (*tokens, bonus))


def _draft_distribution(
    draft: int,
    size: int,
    draft_probs: torch.Tensor | None,
    draft_mask: torch.Tensor | None,
    j: int,
) -> torch.Tensor:
    if draft_probs is None:
        q = torch.zeros(size, dtype=torch.float32)
        q[draft] = 1.0
        return q
    q = draft_probs[j].to(torch.float32).clone()
    if draft_mask is not None:
        q = q.masked_fill(~draft_mask[j], 0.0)
    total = float(q.sum())
    return q / total if total > 0 else q
