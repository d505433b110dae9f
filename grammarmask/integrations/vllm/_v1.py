"""grammarmask in vLLM's V1 model runner (the runner of vLLM's CPU build).

Per step, vLLM calls `update_state` before the forward and `apply` after it. The processor
commits each request's new tokens and starts the mask fill in `update_state`, so the fill
runs while the model computes the logits; `apply` waits for the masks and applies them in
place. Requests are followed by identity through vLLM's batch updates (`BatchRows`). The
V1 runner gives a processor one row per request and refuses processors under speculative
decoding, so there are no draft rows here.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from vllm.v1.sample.logits_processor import BatchUpdate, MoveDirectionality

from ...device.kernels import apply_bitmask
from ...pool import MaskFuture
from ...pool.plan import BatchEntry
from ._batch import BatchRows
from ._plugin import Mode, Plugin, TrackedRequest, logger
from ._settings import PROCESSOR_PATH, PluginSettings

if TYPE_CHECKING:
    from vllm import SamplingParams
    from vllm.config import VllmConfig

PLACEHOLDER = -1
"""What vLLM's async scheduler puts in a request's output list for a token it has sampled
but not yet copied back; it is replaced before the sampler runs."""


@dataclass(eq=False, slots=True)
class _Request:
    """A tracked request and vLLM's own list of its output tokens (a live reference)."""

    tracked: TrackedRequest
    output: list[int]
    labelled: bool = False


class V1Processor:
    """The V1 runner's side of `GrammarLogitsProcessor`."""

    def __init__(
        self,
        vllm_config: VllmConfig,
        device: torch.device,
        settings: PluginSettings,
        mode: Mode,
        named: bool,
    ) -> None:
        self.plugin = Plugin(
            vllm_config,
            device,
            settings,
            mode,
            max_rows=vllm_config.scheduler_config.max_num_seqs,
            max_drafts=0,
        )
        self._rows: BatchRows[_Request] = BatchRows()
        self._batch_size = 0
        self._future: MaskFuture | None = None
        self._deferred: list[BatchEntry] | None = None
        hidden = vllm_config.scheduler_config.async_scheduling and not named
        if self.plugin.pool is not None and hidden:
            logger.warning(
                "grammarmask was loaded through its entry point only: with async "
                "scheduling vLLM then hides the sampled tokens from it and every grammar "
                "request ends at once; start vLLM with --logits-processors %s",
                PROCESSOR_PATH,
            )

    # ------------------------------------------------------------------ before the forward
    def update_state(self, batch_update: BatchUpdate | None) -> None:
        """Follow the batch's changes, commit each request's new tokens, start the fill."""
        plugin = self.plugin
        if plugin.mode == "aside":
            return
        if batch_update is not None:
            self._batch_size = batch_update.batch_size
            added = [
                (index, self._admit(params, output))
                for index, params, _, output in batch_update.added
            ]
            moved = [(a, b, d is MoveDirectionality.SWAP) for a, b, d in batch_update.moved]
            for request in self._rows.update(batch_update.removed, added, moved):
                plugin.forget(request.tracked)
            if added:
                self._label_new()
        self._future = self._deferred = None
        if plugin.pool is None or not self._rows:
            return
        pending = False
        for request in self._rows.values():
            pending |= self._commit(request)
        entries: list[BatchEntry] = [(None, ())] * self._batch_size
        for index, request in self._rows.items():
            if request.tracked.refused is None:
                entries[index] = (request.tracked.pool_id, ())
        if pending:  # async scheduling: the last tokens arrive just before the sampler
            self._deferred = entries
        else:
            self._future = plugin.pool.fill_async(entries)

    def _admit(self, params: SamplingParams, output: list[int]) -> _Request | None:
        tracked = self.plugin.admit(params)
        return None if tracked is None else _Request(tracked, output)

    def _label_new(self) -> None:
        """Name new requests by vLLM's request id (vLLM's batch updates carry none, but
        the batch that calls us holds them by row), and log those refused on arrival."""
        req_ids = _calling_batch_ids()
        for index, request in self._rows.items():
            if not request.labelled:
                request.labelled = True
                found = req_ids[index] if req_ids is not None and index < len(req_ids) else None
                if found is not None:
                    request.tracked.label = str(found)
                if request.tracked.refused is not None:
                    self.plugin.report(request.tracked, request.tracked.refused)

    def _commit(self, request: _Request) -> bool:
        """Hand the pool the request's new tokens; True if a placeholder stopped it."""
        tracked, output = request.tracked, request.output
        if tracked.refused is not None or len(output) == tracked.committed:
            return False
        if len(output) < tracked.committed:
            self.plugin.refuse(
                tracked, "vLLM discarded output tokens that the grammar had accepted"
            )
            return False
        new = output[tracked.committed :]
        pending = PLACEHOLDER in new
        if pending:
            new = new[: new.index(PLACEHOLDER)]
        self.plugin.commit(tracked, new)
        return pending

    # ------------------------------------------------------------------ after the forward
    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """Mask the rows of the requests with a grammar, in place."""
        if not self._rows:
            return logits
        plugin = self.plugin
        pool = plugin.pool
        if pool is not None and (self._future is not None or self._deferred is not None):
            if self._deferred is not None:
                masks = pool.fill(self._sync_deferred(self._deferred))
            else:
                assert self._future is not None
                masks = self._future.wait(timeout=plugin.settings.step_timeout_s)
            apply_bitmask(logits, masks)
            plugin.note(masks, (request.tracked for request in self._rows.values()))
        plugin.stop_only(
            logits,
            [index for index, request in self._rows.items() if request.tracked.refused is not None],
        )
        return logits

    def _sync_deferred(self, entries: list[BatchEntry]) -> list[BatchEntry]:
        """Commit the tokens the async scheduler filled in since `update_state`; a request
        whose token is still a placeholder cannot be masked soundly and ends."""
        for index, request in self._rows.items():
            if self._commit(request) and request.tracked.refused is None:
                self.plugin.refuse(
                    request.tracked,
                    "vLLM did not pass the sampled tokens to the plugin (async scheduling "
                    f"without --logits-processors {PROCESSOR_PATH})",
                )
                entries[index] = (None, ())
        return entries

    def tracked(self) -> list[TrackedRequest]:
        """The requests with a grammar in the batch now (for tests and monitoring)."""
        return [request.tracked for request in self._rows.values()]


def _calling_batch_ids() -> Sequence[str | None] | None:
    """The request ids of the vLLM input batch whose `refresh_metadata` called
    `update_state` (found by walking up the stack: no public API names them)."""
    frame = inspect.currentframe()
    try:
        for _ in range(8):
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
