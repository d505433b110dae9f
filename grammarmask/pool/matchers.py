"""Where a pool's matchers live: the interface the pool talks to, over threads of this
process (ThreadMatchers) or worker processes (ProcessMatchers)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

import torch

from ..backends import Backend
from ..grammars import Grammar
from ..masks import RequestId
from ..vocabulary import Vocabulary
from .plan import StepPlan
from .requests import RequestState
from .step_fill import FillResult
from .sync import StepSync

BackendFactory = Callable[[Vocabulary], Mapping[str, Backend]]
"""Extra backends by name, built from the pool's vocabulary (in each worker process, so a
picklable function: a module-level one)."""

StepRun = Callable[[int, torch.Tensor, StepSync, Callable[[], object]], FillResult]
"""Fills a step's rows into (host slot index, host slot) until done or past the deadline;
the last argument is work for the calling thread while the fill runs elsewhere."""


class Matchers(Protocol):
    """The requests of one pool and their matchers, wherever they live.

    Every method answers for one request without raising for it (a failure is a state with
    a reason), except `add` for an id already present, which is the engine's mistake.
    """

    def add(
        self,
        request_id: RequestId,
        grammar: Grammar,
        backend: str,
        *,
        allow_unenforced: bool = False,
    ) -> RequestState:
        """Register a request; its grammar compiles in the background."""

    def remove(self, request_id: RequestId) -> None:
        """Forget a request; unknown ids are ignored."""

    def state(self, request_id: RequestId) -> RequestState:
        """The request's state now."""

    def commit(self, request_id: RequestId, tokens: Sequence[int]) -> RequestState:
        """Advance the request by the tokens the sampler accepted."""

    def begin(self, plan: StepPlan) -> StepRun:
        """Resolve a step's requests on the caller's thread (before any later `remove`);
        the rest happens where the step is filled."""

    def close(self) -> None:
        """Stop the matchers' threads or processes, without waiting for a hanging fill."""
