"""grammarmask behind vLLM's structured-output interface, in the engine core process.

vLLM's `StructuredOutputManager` owns the step: it compiles each request's grammar on its
executor, asks for the step's bitmask (one row per draft position and one for the bonus
token), feeds accepted tokens and truncates drafts with `validate_tokens`. Here every one
of those goes to one `MatcherPool`, and the step's bitmask is one pool fill for the whole
batch (`step_bitmask`) instead of vLLM's fill, accept and rollback per request and token.
"""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from vllm.v1.structured_output.backend_types import (
    StructuredOutputBackend,
    StructuredOutputGrammar,
    StructuredOutputOptions,
)
from vllm.v1.structured_output.utils import strip_speculative_padding

from ....backends import words_per_row
from ....errors import GrammarError
from ....pool import MatcherPool
from .._plugin import Plugin, TrackedRequest
from .._settings import PluginSettings
from .._spec import RequestSpec
from ._requests import BACKEND_NAME, structured_spec

if TYPE_CHECKING:
    from vllm.v1.request import Request
    from vllm.v1.structured_output import StructuredOutputManager

_FULL = np.int32(-1)
"""A row that allows every token (a request still reasoning, a padded draft position)."""

_COMPILE_WAITERS = 64
"""Threads that wait for compiles (the pool compiles on its own threads): vLLM's executor has
half the CPUs, so a slow compile there would hold up the next requests' admission."""


class GrammarmaskGrammar(StructuredOutputGrammar):
    """One request's matcher in the pool, as vLLM's per-request grammar.

    vLLM's own per-token draft loop is replaced by `step_bitmask`; the per-request methods
    stay exact for any other caller: `validate_tokens` fills the request's draft rows once
    and reads how many the grammar allows; `rollback`, and a refused `accept_tokens`, replay
    the history that stays on a fresh matcher (the pool never undoes a commit, and fails a
    request given a token its grammar forbids)."""

    def __init__(
        self, backend: GrammarmaskBackend, request: TrackedRequest, spec: RequestSpec
    ) -> None:
        self._backend = backend
        self._pool: MatcherPool = backend.pool
        self._spec = spec
        self.request = request
        self._history: list[int] = []
        self._finalizer = weakref.finalize(self, self._pool.remove, request.pool_id)

    @property
    def pool_id(self) -> str:
        return self.request.pool_id

    def accept_tokens(self, request_id: str, tokens: list[int]) -> bool:
        """Commit `tokens`; False, with the matcher as it was, when the grammar refuses one
        (as vLLM's backends do). A request that had failed before stays failed."""
        self.request.label = request_id
        if not tokens:
            return True
        if self._pool.state(self.pool_id).status == "failed":
            return False
        state = self._pool.commit(self.pool_id, tokens)
        if state.status == "failed":
            self._backend.plugin.report(self.request, state.reason)
            self._restart(self._history)
            return False
        self._history.extend(tokens)
        return True

    def validate_tokens(self, tokens: list[int]) -> list[int]:
        if not tokens or self.is_terminated():
            return []
        masks = self._pool.fill([(self.pool_id, list(tokens))])
        if self.pool_id in masks.failures:
            return []
        return list(tokens[: max(0, masks.valid_rows[0] - 1)])

    def rollback(self, num_tokens: int) -> None:
        if num_tokens <= 0:
            return
        kept = self._history[: max(0, len(self._history) - num_tokens)]
        self._restart(kept)

    def fill_bitmask(self, bitmask: torch.Tensor, batch_index: int) -> None:
        masks = self._pool.fill([(self.pool_id, [])])
        bitmask[batch_index].copy_(masks.bitmask[0])

    def is_terminated(self) -> bool:
        return self._pool.state(self.pool_id).status == "finished"

    def reset(self) -> None:
        self._restart([])

    def _restart(self, history: list[int]) -> None:
        """A fresh matcher for the request that has seen `history` (its grammar is cached)."""
        self._finalizer.detach()
        self._pool.remove(self.pool_id)
        self.request.pool_id = self._backend.next_pool_id()
        self._finalizer = weakref.finalize(self, self._pool.remove, self.request.pool_id)
        self._backend.add_to_pool(self.request.pool_id, self._spec)
        self._backend.wait_compiled(self.request)
        self._history = []
        if not history:
            return
        state = self._pool.commit(self.pool_id, history)  # accepted before: no new refusal
        if state.status == "failed":  # the pool failed it (a dead worker): it stays failed
            self._backend.plugin.report(self.request, state.reason)
        else:
            self._history = list(history)


@dataclass
class GrammarmaskBackend(StructuredOutputBackend):
    """The engine's matcher pool as vLLM's structured-output backend."""

    plugin: Plugin = field(init=False)
    waiters: ThreadPoolExecutor = field(init=False)

    def __post_init__(self) -> None:
        settings = PluginSettings.from_additional_config(self.vllm_config.additional_config)
        max_drafts = int(self.vllm_config.num_speculative_tokens or 0)
        max_seqs = self.vllm_config.scheduler_config.max_num_seqs
        self.plugin = Plugin(
            self.vllm_config,
            torch.device("cpu"),
            settings,
            "serve",
            max_rows=max_seqs * (1 + max_drafts),
            max_drafts=max_drafts,
        )
        self.settings = settings
        self._ids = itertools.count()
        self.waiters = ThreadPoolExecutor(_COMPILE_WAITERS, thread_name_prefix="grammarmask-wait")
        self._words = words_per_row(self.vocab_size)

    @property
    def pool(self) -> MatcherPool:
        assert self.plugin.pool is not None
        return self.plugin.pool

    def next_pool_id(self) -> str:
        return f"so-{next(self._ids)}"

    # ------------------------------------------------------------------ compile
    def submit(self, request: Request) -> Future[StructuredOutputGrammar]:
        """Start compiling the request's grammar; the future holds its grammar, or the
        error that fails this request alone (vLLM ends it with that reason)."""
        return self.waiters.submit(self.compile_request, request)

    def compile_request(self, request: Request) -> StructuredOutputGrammar:
        struct = request.structured_output_request
        assert struct is not None
        kind, text = struct.structured_output_key
        extra = request.sampling_params.extra_args if request.sampling_params else None
        return self._compile(kind.name, text, extra, request.request_id)

    def compile_grammar(
        self,
        request_type: StructuredOutputOptions,
        grammar_spec: str,
        stop_token_ids: set[int] | None = None,
    ) -> StructuredOutputGrammar:
        return self._compile(request_type.name, grammar_spec, None, "")

    def _compile(
        self, kind: str, text: str, extra_args: Mapping[str, Any] | None, label: str
    ) -> GrammarmaskGrammar:
        spec = structured_spec(kind, text, extra_args, self.settings.allow_unenforced)
        pool_id = self.next_pool_id()
        tracked = TrackedRequest(pool_id, label or pool_id)
        grammar = GrammarmaskGrammar(self, tracked, spec)
        self.add_to_pool(pool_id, spec)
        self.wait_compiled(tracked)
        if spec.declared:
            self.plugin.declare(tracked, spec.declared)
        return grammar

    def add_to_pool(self, pool_id: str, spec: RequestSpec) -> None:
        self.pool.add(
            pool_id, spec.grammar, backend=spec.backend, allow_unenforced=spec.allow_unenforced
        )

    def wait_compiled(self, tracked: TrackedRequest) -> None:
        """Block until the request's grammar is compiled; raise its failure."""
        state = self.pool.wait_ready([tracked.pool_id])[tracked.pool_id]
        if state.status == "failed":
            self.plugin.report(tracked, state.reason)
            raise GrammarError(f"grammarmask: {state.reason}")
        self.plugin.announce(tracked)

    # ------------------------------------------------------------------ step
    def allocate_token_bitmask(self, max_num_seqs: int) -> torch.Tensor:
        return torch.full((max_num_seqs, self._words), -1, dtype=torch.int32)

    def step_bitmask(
        self,
        manager: StructuredOutputManager,
        requests: Mapping[str, Request],
        request_ids: Sequence[str],
        spec_tokens: Mapping[str, list[int]],
    ) -> np.ndarray:
        """The step's bitmask, in vLLM's layout (per request in `request_ids` order: one row
        per scheduled draft position, then the bonus row), from one pool fill.

        Row i of a request is the mask after its committed tokens and its first i drafts;
        rows where vLLM does not constrain (still reasoning, past a padded draft) allow
        everything, as vLLM's own fill leaves them."""
        batch: list[tuple[str, list[int]]] = []
        served: dict[str, GrammarmaskGrammar] = {}
        rows: list[list[int]] = []
        constrained: list[int] = []
        total = 0
        for request_id in request_ids:
            request = requests[request_id]
            struct = request.structured_output_request
            assert struct is not None
            grammar = struct.grammar
            scheduled = spec_tokens.get(request_id, [])
            drafts = strip_speculative_padding(scheduled)
            first_row = total
            total += len(scheduled) + 1
            if not isinstance(grammar, GrammarmaskGrammar):
                continue
            grammar_start, constraint_start = manager._get_constraint_bounds(request, drafts)
            if constraint_start > len(drafts):
                continue  # reasoning through every row of this step
            entry_rows = [first_row + i for i in range(grammar_start, len(drafts) + 1)]
            batch.append((grammar.pool_id, drafts[grammar_start:]))
            served[grammar.pool_id] = grammar
            rows.append(entry_rows)
            constrained.extend(entry_rows[constraint_start - grammar_start :])
        bitmask = np.full((total, self._words), _FULL, dtype=np.int32)
        if batch:
            masks = self.pool.fill(batch, row_indices=rows, num_rows=total)
            wanted = np.asarray(constrained, dtype=np.int64)
            bitmask[wanted] = masks.bitmask.numpy()[wanted]
            for pool_id, reason in masks.failures.items():  # their rows allow only stopping
                self.plugin.report(served[str(pool_id)].request, reason)
        return bitmask

    def destroy(self) -> None:
        self.waiters.shutdown(wait=False, cancel_futures=True)
        if self.plugin.pool is not None:
            self.plugin.pool.close()


__all__ = ["BACKEND_NAME", "GrammarmaskBackend", "GrammarmaskGrammar"]
