"""A compact reference engine loop around any causal model, with grammar masks and drafts.

Written to be copied by engine authors. Per step: drafts from a prompt-lookup (n-gram)
proposer; `fill_async` before the forward; the forward; `wait` right before sampling;
masks applied before any sampling transform; draft verification; the model's cache trimmed
to the accepted tokens; `commit` of exactly those tokens; streaming text.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import torch

from ...device.kernels import apply_bitmask
from ...grammars import Grammar
from ...pool import MatcherPool
from ...pool.plan import BatchEntry
from ...vocabulary import Vocabulary
from .detokenize import IncrementalDetokenizer
from .sampling import SamplingParams, verify_drafts

FinishReason = Literal["stop", "grammar", "length", "error"]


class CausalModel(Protocol):
    """What the engine needs of a model: logits for new tokens given a cache, and trimming."""

    def __call__(self, input_ids: Sequence[int], cache: Any) -> tuple[torch.Tensor, Any]:
        """Logits [len(input_ids), vocab] for the tokens appended after `cache`."""
        ...

    def trim(self, cache: Any, num_tokens: int) -> Any:
        """Keep only the first `num_tokens` positions of `cache`."""
        ...


def propose_ngram(tokens: Sequence[int], num_drafts: int, ngram: int = 2) -> list[int]:
    """Prompt lookup: the tokens that followed the latest earlier occurrence of the last n-gram."""
    if num_drafts == 0 or len(tokens) <= ngram:
        return []
    key = list(tokens[-ngram:])
    for start in range(len(tokens) - ngram - 1, -1, -1):
        if list(tokens[start : start + ngram]) == key:
            return list(tokens[start + ngram : start + ngram + num_drafts])
    return []


@dataclass
class GenerationRequest:
    request_id: str
    prompt_ids: list[int]
    grammar: Grammar | None = None
    params: SamplingParams = field(default_factory=SamplingParams)
    max_new_tokens: int = 256
    backend: str | None = None
    """The backend for its grammar (None: the pool's)."""


@dataclass
class GenerationResult:
    request_id: str
    token_ids: list[int]
    text: str
    finish_reason: FinishReason
    error: str | None
    steps: int
    drafted: int
    accepted_drafts: int
    mask_wait_seconds: float
    fill_seconds: float
    seconds: float
    masking_seconds: float = 0.0
    """The engine thread's own time on masks: the fill_async calls, the waits, the applies
    (the fill itself runs beside the forward)."""

    @property
    def tokens_per_second(self) -> float:
        return len(self.token_ids) / self.seconds if self.seconds > 0 else 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted_drafts / self.drafted if self.drafted else 0.0


@dataclass
class _Running:
    request: GenerationRequest
    detokenizer: IncrementalDetokenizer
    started: float
    cache: Any = None
    context: list[int] = field(default_factory=list)
    pending: list[int] = field(default_factory=list)
    output: list[int] = field(default_factory=list)
    text: str = ""
    steps: int = 0
    drafted: int = 0
    accepted: int = 0
    mask_wait: float = 0.0
    fill: float = 0.0
    masking: float = 0.0


_ADMIT_WAIT_S = 0.05
"""How long a step waits for a compilation when no request is ready to run."""


class ReferenceEngine:
    """Runs requests to completion, one forward per request per step, masks for all at once."""

    def __init__(
        self,
        model: CausalModel,
        vocab: Vocabulary,
        pool: MatcherPool,
        *,
        num_drafts: int = 3,
        ngram: int = 2,
    ) -> None:
        """An engine over `model`, masked by `pool`.

        Args:
            model: the causal model whose logits are masked.
            vocab: its vocabulary.
            pool: the matcher pool that fills the masks.
            num_drafts: prompt-lookup drafts per step (at most the pool's max_drafts).
            ngram: the n-gram length prompt lookup matches.
        """
        if not 0 <= num_drafts <= pool.max_drafts:
            raise ValueError(
                f"num_drafts must lie in [0, {pool.max_drafts}] (the pool's max_drafts), "
                f"not {num_drafts}"
            )
        self.model = model
        self.vocab = vocab
        self.pool = pool
        self.num_drafts = num_drafts
        self.ngram = ngram

    def run(
        self,
        requests: Sequence[GenerationRequest],
        on_text: Callable[[str, str], None] | None = None,
    ) -> list[GenerationResult]:
        """Generate for every request; `on_text(request_id, delta)` streams complete text.

        A request joins the batch once its grammar is compiled (`MatcherPool.wait_ready`):
        the others step meanwhile, so a slow compilation stalls nobody; one whose grammar
        fails ends at once with the reason."""
        running: dict[str, _Running] = {}
        results: dict[str, GenerationResult] = {}
        admitted: set[str] = set()
        for request in requests:
            if request.grammar is not None:
                self.pool.add(request.request_id, request.grammar, backend=request.backend)
            else:
                admitted.add(request.request_id)
            running[request.request_id] = _Running(
                request,
                IncrementalDetokenizer(self.vocab),
                time.perf_counter(),
                context=list(request.prompt_ids),
                pending=list(request.prompt_ids),
            )
        while running:
            compiling = [rid for rid in running if rid not in admitted]
            if compiling:
                wait = 0.0 if admitted else _ADMIT_WAIT_S  # nothing else to do: wait a little
                for rid, ready in self.pool.wait_ready(compiling, timeout=wait).items():
                    if ready.readiness == "ready":
                        admitted.add(rid)
                    elif ready.readiness == "failed":
                        results[rid] = self._finish(
                            running.pop(rid), "error", ready.reason, on_text
                        )
            batch = [state for rid, state in running.items() if rid in admitted]
            if not batch:
                continue
            for rid, reason, error in self._step(batch, on_text):
                state = running.pop(rid)
                admitted.discard(rid)
                results[rid] = self._finish(state, reason, error, on_text)
        return [results[r.request_id] for r in requests]

    def _step(
        self, batch: list[_Running], on_text: Callable[[str, str], None] | None
    ) -> list[tuple[str, FinishReason, str | None]]:
        drafts = {
            s.request.request_id: propose_ngram(
                s.context,
                min(self.num_drafts, s.request.max_new_tokens - len(s.output) - 1),
                self.ngram,
            )
            for s in batch
        }
        entries: list[BatchEntry] = [
            (
                s.request.request_id if s.request.grammar is not None else None,
                drafts[s.request.request_id],
            )
            for s in batch
        ]
        started = time.perf_counter()
        future = self.pool.fill_async(entries)  # masks are filled while the model runs
        asked = time.perf_counter() - started
        rows = []
        for state in batch:
            new = [*state.pending, *drafts[state.request.request_id]]
            logits, state.cache = self.model(new, state.cache)
            rows.append(logits[-(len(drafts[state.request.request_id]) + 1) :])
        logits = torch.cat(rows).to(torch.float32)
        waited = time.perf_counter()
        masks = future.wait()
        mask_wait = time.perf_counter() - waited
        apply_bitmask(logits, masks)
        masking = asked + time.perf_counter() - waited
        finished = []
        for index, state in enumerate(batch):
            rid = state.request.request_id
            own = logits[list(masks.rows[index])]
            verdict = verify_drafts(
                own,
                drafts[rid],
                state.request.params,
                position=len(state.context),
                previous_tokens=state.output,
                fallback_token_ids=self.vocab.stop_token_ids,
            )
            state.steps += 1
            state.drafted += len(drafts[rid])
            state.accepted += verdict.accepted
            state.mask_wait += mask_wait
            state.fill += masks.fill_seconds
            state.masking += masking
            processed = len(state.context) + len(drafts[rid])
            state.cache = self.model.trim(
                state.cache, processed - (len(drafts[rid]) - verdict.accepted)
            )
            outcome = self._commit(state, list(verdict.tokens), on_text)
            if outcome is not None:
                finished.append((rid, *outcome))
        return finished

    def _commit(
        self, state: _Running, tokens: list[int], on_text: Callable[[str, str], None] | None
    ) -> tuple[FinishReason, str | None] | None:
        request = state.request
        stops = self.vocab.stop_token_ids
        if any(t in stops for t in tokens):
            tokens = tokens[: next(i for i, t in enumerate(tokens) if t in stops) + 1]
        budget = request.max_new_tokens - len(state.output)
        tokens = tokens[:budget]
        if request.grammar is not None:
            status = self.pool.commit(request.request_id, tokens)
            if status.status == "failed":
                return "error", status.reason
        text_tokens = [t for t in tokens if t not in stops]
        state.output.extend(text_tokens)
        state.context.extend(tokens)
        state.pending = tokens[-1:]
        delta = state.detokenizer.feed(text_tokens)
        state.text += delta
        if on_text is not None and delta:
            on_text(request.request_id, delta)
        if tokens and tokens[-1] in stops:
            return "stop", None
        if request.grammar is not None and self.pool.state(request.request_id).status == "finished":
            return "grammar", None
        if len(state.output) >= request.max_new_tokens:
            return "length", None
        return None

    def _finish(
        self,
        state: _Running,
        reason: FinishReason,
        error: str | None,
        on_text: Callable[[str, str], None] | None,
    ) -> GenerationResult:
        tail = state.detokenizer.finish()
        state.text += tail
        if on_text is not None and tail:
            on_text(state.request.request_id, tail)
        if state.request.grammar is not None:
            self.pool.remove(state.request.request_id)
        return GenerationResult(
            state.request.request_id,
            state.output,
            state.text,
            reason,
            error,
            state.steps,
            state.drafted,
            state.accepted,
            state.mask_wait,
            state.fill,
            time.perf_counter() - state.started,
            state.masking,
        )
