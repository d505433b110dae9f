"""The vLLM V1 logits processor: grammarmask's pool inside vLLM's sampler.

Per step, vLLM calls `update_state` before the forward and `apply` after it. The plugin
commits each request's new tokens and starts the mask fill in `update_state`, so the fill
runs while the model computes the logits; `apply` waits for the masks and applies them in
place. Requests are followed by identity through vLLM's batch updates (`BatchRows`), and
every per-request problem ends that request alone: its rows allow only stop tokens.
"""

from __future__ import annotations

import importlib
import inspect
import itertools
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import torch
from vllm.logger import init_logger
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor, MoveDirectionality

from ...backends import installed_backends
from ...device.kernels import apply_bitmask
from ...errors import GrammarError
from ...grammars import Grammar
from ...pool import MaskFuture, MatcherPool
from ...pool.plan import BatchEntry
from ...vocabulary import Vocabulary
from ._batch import BatchRows
from ._settings import PROCESSOR_PATH, PluginSettings
from ._spec import request_spec

if TYPE_CHECKING:
    from vllm import SamplingParams
    from vllm.config import VllmConfig

logger = init_logger("vllm.grammarmask")

Mode = Literal["serve", "refuse", "aside"]
"""An instance serves grammars, ends the requests that ask for one (switched off), or
stands aside for another instance that serves them."""

PLACEHOLDER = -1
"""What vLLM's async scheduler puts in a request's output list for a token it has sampled
but not yet copied back; it is replaced before the sampler runs."""


@dataclass(eq=False, slots=True)
class _Request:
    """One vLLM request that asked for a grammar."""

    pool_id: str
    label: str
    """vLLM's request id where it can be found, for the log."""
    output: list[int]
    """vLLM's own list of the request's output tokens (a live reference)."""
    committed: int = 0
    """How many of `output` the pool has been given."""
    refused: str | None = None
    """Why the plugin ends this request itself (it never reached the pool)."""
    reported: bool = False
    announced: bool = False
    labelled: bool = False


class GrammarLogitsProcessor(LogitsProcessor):
    """Constrains the requests whose `SamplingParams.extra_args` hold a grammarmask entry
    (see `xargs`); every other request is untouched.

    Load it with `vllm serve MODEL --logits-processors
    grammarmask.integrations.vllm:GrammarLogitsProcessor` or `LLM(logits_processors=[...])`;
    settings come from `additional_config["grammarmask"]` (`PluginSettings`).
    """

    @classmethod
    def validate_params(cls, sampling_params: SamplingParams) -> None:
        """Refuse a malformed entry when vLLM admits the request (HTTP 400 over the API)."""
        try:
            request_spec(sampling_params.extra_args)
        except GrammarError as exc:
            raise ValueError(f"grammarmask: {exc}") from None

    def __init__(self, vllm_config: VllmConfig, device: torch.device, is_pin_memory: bool) -> None:
        self._settings = PluginSettings.from_additional_config(vllm_config.additional_config)
        self._mode = self._choose_mode(vllm_config)
        self._rows: BatchRows[_Request] = BatchRows()
        self._batch_size = 0
        self._future: MaskFuture | None = None
        self._deferred: list[BatchEntry] | None = None
        self._ids = itertools.count()
        self._pool: MatcherPool | None = None
        if self._mode == "aside":
            return
        self.vocab = _vocabulary(vllm_config.model_config)
        bias = torch.full((self.vocab.size,), float("-inf"))
        bias[list(self.vocab.stop_token_ids)] = 0.0
        self._stop_bias = bias.to(device)
        """Added to a row that may only stop (-inf elsewhere, NaN stays NaN)."""
        if self._mode == "refuse":
            logger.warning(
                "grammarmask is switched off (autoload false): requests that ask for a "
                "grammar end at once"
            )
            return
        settings = self._settings
        self._pool = MatcherPool(
            self.vocab,
            backend=settings.backend,
            workers=settings.fill_workers,
            device=device if device.type == "cuda" else None,
            isolation=settings.isolation,
            max_rows=vllm_config.scheduler_config.max_num_seqs,
            max_drafts=0,
            compile_timeout_s=settings.compile_timeout_s,
            log_failures=False,  # logged here, with vLLM's request ids
            allow_unenforced=settings.allow_unenforced,
        )
        weakref.finalize(self, self._pool.close)  # vLLM rebuilds its batch (and us) once
        self._warm_up()
        if vllm_config.scheduler_config.async_scheduling and not _named(vllm_config, type(self)):
            logger.warning(
                "grammarmask was loaded through its entry point only: with async scheduling "
                "vLLM then hides the sampled tokens from it and every grammar request ends "
                "at once; start vLLM with --logits-processors %s",
                PROCESSOR_PATH,
            )
        logger.info(
            "grammarmask: backend %s, %d %s worker(s), compile timeout %g s",
            settings.backend,
            settings.fill_workers,
            settings.isolation,
            settings.compile_timeout_s,
        )

    def _choose_mode(self, vllm_config: VllmConfig) -> Mode:
        """Whether this instance serves grammars (see the entry-point subclass)."""
        return "serve"

    def _warm_up(self) -> None:
        """Compile a one-token grammar on every installed backend in the background, while
        vLLM loads the model: a backend's first compile builds its tables for the
        vocabulary (seconds), which would otherwise stall the first step that uses it."""
        assert self._pool is not None
        for name in installed_backends():
            warm = f"warm-up-{name}"
            self._pool.add(warm, Grammar.regex("a"), backend=name)
            self._pool.remove(warm)

    def is_argmax_invariant(self) -> bool:
        return False

    # ------------------------------------------------------------------ before the forward
    def update_state(self, batch_update: BatchUpdate | None) -> None:
        """Follow the batch's changes, commit each request's new tokens, start the fill."""
        if self._mode == "aside":
            return
        if batch_update is not None:
            self._batch_size = batch_update.batch_size
            added = [
                (index, self._admit(params, output))
                for index, params, _, output in batch_update.added
            ]
            moved = [(a, b, d is MoveDirectionality.SWAP) for a, b, d in batch_update.moved]
            for request in self._rows.update(batch_update.removed, added, moved):
                if self._pool is not None:
                    self._pool.remove(request.pool_id)
            if added:
                self._label_new()
        self._future = self._deferred = None
        if self._pool is None or not self._rows:
            return
        pending = False
        for request in self._rows.values():
            pending |= self._commit(request)
        entries: list[BatchEntry] = [(None, ())] * self._batch_size
        for index, request in self._rows.items():
            if request.refused is None:
                entries[index] = (request.pool_id, ())
        if pending:  # async scheduling: the last tokens arrive just before the sampler
            self._deferred = entries
        else:
            self._future = self._pool.fill_async(entries)

    def _admit(self, params: SamplingParams, output: list[int]) -> _Request | None:
        refused: str | None = None
        try:
            spec = request_spec(params.extra_args)
        except GrammarError as exc:  # validate_params refused it already, unless bypassed
            spec, refused = None, f"grammarmask: {exc}"
        if spec is None and refused is None:
            return None
        request = _Request(f"vllm-{next(self._ids)}", "", output, refused=refused)
        if self._pool is None:
            request.refused = (
                'grammarmask is switched off on this engine (additional_config {"grammarmask": '
                f'{{"autoload": false}}}} and no --logits-processors {PROCESSOR_PATH})'
            )
        elif spec is not None and refused is None:
            self._pool.add(
                request.pool_id,
                spec.grammar,
                backend=spec.backend,
                allow_unenforced=spec.allow_unenforced,
            )
        return request

    def _label_new(self) -> None:
        """Name new requests by vLLM's request id (vLLM's batch updates carry none, but
        the batch that calls us holds them by row), and log those refused on arrival."""
        req_ids = _calling_batch_ids()
        for index, request in self._rows.items():
            if not request.labelled:
                request.labelled = True
                found = req_ids[index] if req_ids is not None and index < len(req_ids) else None
                request.label = str(found) if found is not None else request.pool_id
                if request.refused is not None:
                    self._report(request, request.refused)

    def _commit(self, request: _Request) -> bool:
        """Hand the pool the request's new tokens; True if a placeholder stopped it."""
        output = request.output
        if request.refused is not None or len(output) == request.committed:
            return False
        assert self._pool is not None
        if len(output) < request.committed:
            self._refuse(request, "vLLM discarded output tokens that the grammar had accepted")
            return False
        new = output[request.committed :]
        pending = PLACEHOLDER in new
        if pending:
            new = new[: new.index(PLACEHOLDER)]
        if new:
            state = self._pool.commit(request.pool_id, new)
            request.committed += len(new)
            if state.status == "failed":
                self._report(request, state.reason)
        return pending

    # ------------------------------------------------------------------ after the forward
    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """Mask the rows of the requests with a grammar, in place."""
        if not self._rows:
            return logits
        pool = self._pool
        if pool is not None and (self._future is not None or self._deferred is not None):
            if self._deferred is not None:
                masks = pool.fill(self._sync_deferred(self._deferred))
            else:
                assert self._future is not None
                masks = self._future.wait(timeout=self._settings.step_timeout_s)
            for request_id, reason in masks.failures.items():
                self._report_id(str(request_id), reason)
            apply_bitmask(logits, masks)
            self._announce()
        refused = [index for index, request in self._rows.items() if request.refused is not None]
        if refused:
            logits[refused] += self._stop_bias
        return logits

    def _sync_deferred(self, entries: list[BatchEntry]) -> list[BatchEntry]:
        """Commit the tokens the async scheduler filled in since `update_state`; a request
        whose token is still a placeholder cannot be masked soundly and ends."""
        for index, request in self._rows.items():
            if self._commit(request) and request.refused is None:
                self._refuse(
                    request,
                    "vLLM did not pass the sampled tokens to the plugin (async scheduling "
                    f"without --logits-processors {PROCESSOR_PATH})",
                )
                entries[index] = (None, ())
        return entries

    def _refuse(self, request: _Request, reason: str) -> None:
        request.refused = reason
        if self._pool is not None:
            self._pool.remove(request.pool_id)
        self._report(request, reason)

    # ------------------------------------------------------------------ the log
    def _report(self, request: _Request, reason: str | None) -> None:
        if not request.reported:
            request.reported = True
            logger.warning("grammarmask: request %s failed: %s", request.label, reason)

    def _report_id(self, pool_id: str, reason: str) -> None:
        for request in self._rows.values():
            if request.pool_id == pool_id:
                self._report(request, reason)
                return

    def _announce(self) -> None:
        """Log once per request what its backend leaves unenforced (allow_unenforced)."""
        assert self._pool is not None
        for request in self._rows.values():
            if request.announced or request.refused is not None:
                continue
            state = self._pool.state(request.pool_id)
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


class EntryPointGrammarLogitsProcessor(GrammarLogitsProcessor):
    """What the `vllm.logits_processors` entry point loads into every vLLM engine of an
    environment where grammarmask[vllm] is installed. It stands aside when the engine also
    names GrammarLogitsProcessor (vLLM would run both), and when
    `additional_config["grammarmask"]["autoload"]` is false, where it ends the requests that
    ask for a grammar rather than let them run unconstrained."""

    def _choose_mode(self, vllm_config: VllmConfig) -> Mode:
        if _named(vllm_config, GrammarLogitsProcessor):
            return "aside"
        return "serve" if self._settings.autoload else "refuse"


def _named(vllm_config: VllmConfig, cls: type) -> bool:
    """Whether the engine's `logits_processors` name `cls` (a class or "module:Class")."""
    for entry in vllm_config.model_config.logits_processors or ():
        if isinstance(entry, type):
            if issubclass(entry, cls):
                return True
            continue
        module, _, qualname = str(entry).partition(":")
        try:
            found: Any = importlib.import_module(module)
            for part in qualname.split("."):
                found = getattr(found, part)
        except (ImportError, AttributeError):
            continue
        if isinstance(found, type) and issubclass(found, cls):
            return True
    return False


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


def _calling_batch_ids() -> Sequence[str | None] | None:
    """The request ids of the vLLM input batch whose `refresh_metadata` called
    `update_state` (found by walking up the stack: no public API names them)."""
    frame = inspect.currentframe()
    try:
        for _ in range(6):
            if frame is None:
                return None
            owner = frame.f_locals.get("self")
            ids = getattr(owner, "req_ids", None) if owner is not None else None
            if isinstance(ids, list):
                return ids
            frame = frame.f_back
        return None
    finally:
        del frame
