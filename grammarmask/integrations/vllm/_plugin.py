"""What grammarmask's processors for both of vLLM's model runners share: the settings, the
pool, the vocabulary, the admission of a request, its commits, and the log.

Each runner's processor (`_v1.py`, `_v2.py`) follows its runner's batch and hands this
class the requests it finds there; every per-request problem ends that request alone.
"""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import torch
from vllm.logger import init_logger

from ...backends import installed_backends
from ...errors import GrammarError
from ...grammars import Grammar
from ...masks import StepMasks
from ...pool import MatcherPool
from ...vocabulary import Vocabulary
from ._settings import PROCESSOR_PATH, PluginSettings
from ._spec import request_spec

if TYPE_CHECKING:
    from vllm import SamplingParams
    from vllm.config import VllmConfig

logger = init_logger("vllm.grammarmask")

Mode = Literal["serve", "refuse", "aside"]
"""An instance serves grammars, ends the requests that ask for one (switched off), or
stands aside for another instance that serves them."""


@dataclass(eq=False, slots=True)
class TrackedRequest:
    """One vLLM request that asked for a grammar."""

    pool_id: str
    label: str
    """vLLM's request id where it can be found, for the log."""
    refused: str | None = None
    """Why the plugin ends this request itself (it never reached the pool, or left it)."""
    committed: int = 0
    """How many of the request's output tokens the pool has been given."""
    reported: bool = False
    announced: bool = False


class Plugin:
    """The engine's matcher pool and what every processor does with it.

    `max_rows` bounds the logits rows of one step and `max_drafts` the draft tokens of one
    request (0 where the runner gives a processor no draft rows)."""

    def __init__(
        self,
        vllm_config: VllmConfig,
        device: torch.device,
        settings: PluginSettings,
        mode: Mode,
        *,
        max_rows: int,
        max_drafts: int,
    ) -> None:
        self.settings = settings
        self.mode = mode
        self.pool: MatcherPool | None = None
        self._ids = itertools.count()
        if mode == "aside":
            return
        self.vocab = _vocabulary(vllm_config.model_config)
        bias = torch.full((self.vocab.size,), float("-inf"))
        bias[list(self.vocab.stop_token_ids)] = 0.0
        self._stop_bias = bias.to(device)
        """Added to a row that may only stop (-inf elsewhere, NaN stays NaN)."""
        if mode == "refuse":
            logger.warning(
                "grammarmask is switched off (autoload false): requests that ask for a "
                "grammar end at once"
            )
            return
        self.pool = MatcherPool(
            self.vocab,
            backend=settings.backend,
            workers=settings.fill_workers,
            device=device if device.type == "cuda" else None,
            isolation=settings.isolation,
            max_rows=max_rows,
            max_drafts=max_drafts,
            compile_timeout_s=settings.compile_timeout_s,
            compile_memory_bytes=settings.compile_memory_bytes,
            log_failures=False,  # logged here, with vLLM's request ids
            allow_unenforced=settings.allow_unenforced,
        )
        weakref.finalize(self, self.pool.close)  # vLLM may rebuild its processors
        self._warm_up()
        logger.info(
            "grammarmask: backend %s, %d %s worker(s), compile timeout %g s, %d draft rows",
            settings.backend,
            settings.fill_workers,
            settings.isolation,
            settings.compile_timeout_s,
            max_drafts,
        )

    def _warm_up(self) -> None:
        """Compile a one-token grammar on every installed backend in the background, while
        vLLM loads the model: a backend's first compile builds its tables for the
        vocabulary (seconds), which would otherwise stall the first step that uses it."""
        assert self.pool is not None
        for name in installed_backends():
            warm = f"warm-up-{name}"
            self.pool.add(warm, Grammar.regex("a"), backend=name)
            self.pool.remove(warm)

    # ------------------------------------------------------------------ requests
    def admit(self, params: SamplingParams, label: str = "") -> TrackedRequest | None:
        """The record of a request that asks for a grammar (None for one that does not);
        its grammar starts compiling. A request the plugin cannot serve comes back with
        `refused` set (not yet logged: the caller may not know its label yet)."""
        refused: str | None = None
        try:
            spec = request_spec(params.extra_args)
        except GrammarError as exc:  # validate_params refused it already, unless bypassed
            spec, refused = None, f"grammarmask: {exc}"
        if spec is None and refused is None:
            return None
        pool_id = f"vllm-{next(self._ids)}"
        request = TrackedRequest(pool_id, label or pool_id, refused=refused)
        if self.pool is None:
            request.refused = (
                'grammarmask is switched off on this engine (additional_config {"grammarmask": '
                f'{{"autoload": false}}}} and no --logits-processors {PROCESSOR_PATH})'
            )
        elif spec is not None and refused is None:
            self.pool.add(
                pool_id, spec.grammar, backend=spec.backend, allow_unenforced=spec.allow_unenforced
            )
        return request

    def commit(self, request: TrackedRequest, tokens: Sequence[int]) -> None:
        """Hand the pool tokens vLLM appended to the request's output."""
        if not tokens or request.refused is not None:
            return
        assert self.pool is not None
        state = self.pool.commit(request.pool_id, tokens)
        request.committed += len(tokens)
        if state.status == "failed":
            self.report(request, state.reason)

    def refuse(self, request: TrackedRequest, reason: str) -> None:
        """End the request here: its rows allow only the stop tokens from now on."""
        if request.refused is None:
            request.refused = reason
            self.forget(request)
        self.report(request, reason)

    def forget(self, request: TrackedRequest) -> None:
        """The request left vLLM's batch (or the plugin ended it): out of the pool."""
        if self.pool is not None:
            self.pool.remove(request.pool_id)

    # ------------------------------------------------------------------ masks
    def stop_only(self, logits: torch.Tensor, rows: Sequence[int]) -> None:
        """Rows that may only stop: the requests the plugin ended itself."""
        if rows:
            logits[list(rows)] += self._stop_bias

    def note(self, masks: StepMasks, requests: Iterable[TrackedRequest]) -> None:
        """After a step's masks: log the requests that failed in the pool, and once per
        request what its backend leaves unenforced (allow_unenforced)."""
        tracked = list(requests)
        if masks.failures:
            by_id = {request.pool_id: request for request in tracked}
            for pool_id, reason in masks.failures.items():
                failed = by_id.get(str(pool_id))
                if failed is not None:
                    self.report(failed, reason)
        for request in tracked:
            if not request.announced and request.refused is None:
                self.announce(request)

    def announce(self, request: TrackedRequest) -> None:
        """Once its backend is known: log what of its grammar that backend leaves
        unenforced (allow_unenforced)."""
        assert self.pool is not None
        state = self.pool.state(request.pool_id)
        if state.status == "failed" or state.unenforced:
            request.announced = True
            if state.unenforced:
                logger.warning(
                    "grammarmask: request %s is served by %s, which does not enforce: %s",
                    request.label,
                    state.backend,
                    "; ".join(map(str, state.unenforced)),
                )
        elif state.backend not in (None, "auto"):
            request.announced = True

    def declare(self, request: TrackedRequest, unenforced: Sequence[str]) -> None:
        """Log what of a served request's grammar was known to go unenforced before its
        compile (a structural tag's JSON schemas, allowed by allow_unenforced)."""
        logger.warning(
            "grammarmask: request %s is served with its structural tag's JSON schemas as "
            "xgrammar compiles them, which does not enforce: %s",
            request.label,
            "; ".join(unenforced),
        )

    def report(self, request: TrackedRequest, reason: str | None) -> None:
        """Log a failed request once, with vLLM's request id."""
        if not request.reported:
            request.reported = True
            logger.warning("grammarmask: request %s failed: %s", request.label, reason)


def _vocabulary(model_config: Any) -> Vocabulary:
    """The served model's vocabulary: its tokenizer, its logits width, and every token vLLM
    stops on by default (the tokenizer's EOS and the generation config's)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(
        model_config.tokenizer,
        revision=model_config.tokenizer_revision,
        trust_remote_code=model_config.trust_remote_code,
    )
    eos = model_config.try_get_generation_config().get("eos_token_id")
    extra = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
    return Vocabulary.from_transformers(
        tokenizer, logits_width=model_config.get_vocab_size(), stop_token_ids=extra
    )
