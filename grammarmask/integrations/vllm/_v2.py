"""grammarmask in vLLM's Model Runner V2 (the default runner wherever Triton works).

The V2 runner keys a processor's requests by slot (`add_request(slot, params)`; slots are
recycled through a free list, with no removal hook), keeps each slot's committed tokens in
`req_states.all_token_ids` up to `total_len`, and hands `apply` one logits row per draft
position under speculative decoding (`LogitsContext`). So, per step:

- `add_request` replaces whatever the slot held before: the previous occupant leaves the
  pool there, which keeps the pool as large as the slots, whatever the number of requests.
- `apply_staged_writes` (before the forward) reads each tracked slot's history and commits
  what vLLM appended since the last step: the bonus token and the accepted drafts, never a
  rejected one. A resumed request (after preemption) comes back through `add_request` with
  its partial output in the history and is committed again from its first output token. A
  history shorter than what the pool committed, or a prompt that changed, ends the request.
  Without speculative decoding the fill starts here, beside the forward, in a slot-indexed
  layout that `apply` gathers into the step's rows.
- `apply` (after the forward, before temperature, top-k/top-p and draft verification) masks
  the rows. Under speculative decoding the drafts are known only here (`ctx.input_ids`), so
  the fill runs here: row j of a request is the mask after its committed tokens and its
  first j drafts, the fill stops at the first draft the grammar forbids and rolls back.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from ...device.kernels import apply_bitmask, check_dtype, mask_rows
from ...masks import StepMasks
from ...pool import MaskFuture
from ._plugin import Mode, Plugin, TrackedRequest
from ._settings import PluginSettings

if TYPE_CHECKING:
    from vllm import SamplingParams
    from vllm.config import VllmConfig
    from vllm.v1.worker.gpu.sample.logits_processor import (
        LogitsContext,
        LogitsProcRequestState,
    )


@dataclass(eq=False, slots=True)
class _SlotRequest:
    """A tracked request in its slot, and the prompt length its history was read with."""

    tracked: TrackedRequest
    prompt_len: int | None = None


@dataclass(frozen=True, slots=True)
class _StepRows:
    """This step's logits rows of the tracked slots: each slot's rows in draft order, and
    the drafts those rows verify (`ctx.input_ids` at rows 1..k)."""

    rows: dict[int, list[int]]
    drafts: dict[int, list[int]]


class V2Processor:
    """The V2 runner's side of `GrammarLogitsProcessor`."""

    def __init__(
        self,
        vllm_config: VllmConfig,
        req_states: LogitsProcRequestState,
        settings: PluginSettings,
        mode: Mode,
    ) -> None:
        self._states = req_states
        self._slots_total = req_states.max_num_reqs
        self._max_drafts = int(vllm_config.num_speculative_tokens or 0)
        self.plugin = Plugin(
            vllm_config,
            req_states.device,
            settings,
            mode,
            max_rows=self._slots_total * (1 + self._max_drafts),
            max_drafts=self._max_drafts,
        )
        self._slots: dict[int, _SlotRequest] = {}
        self._recent: set[int] = set()
        """Slots that were in the last step's batch or arrived since: the fill beside the
        forward covers these (a finished request's slot stays tracked until reused)."""
        self._future: MaskFuture | None = None
        self._filled: frozenset[int] = frozenset()

    # ------------------------------------------------------------------ requests
    def add_request(self, slot: int, params: SamplingParams) -> bool:
        """Take the slot for a new request; True if it asks for a grammar (or must stop)."""
        plugin = self.plugin
        if plugin.mode == "aside":
            return False
        previous = self._slots.pop(slot, None)
        if previous is not None:
            plugin.forget(previous.tracked)
        tracked = plugin.admit(params, label=_calling_request_id())
        if tracked is None:
            self._recent.discard(slot)
            return False
        if tracked.refused is not None:
            plugin.report(tracked, tracked.refused)
        self._slots[slot] = _SlotRequest(tracked)
        self._recent.add(slot)
        return True

    # ------------------------------------------------------------------ before the forward
    def apply_staged_writes(self) -> None:
        """Commit each tracked slot's new tokens; without drafts, start the fill."""
        self._future, self._filled = None, frozenset()
        pool = self.plugin.pool
        if pool is None or not self._slots:
            return
        self._commit_history()
        if self._max_drafts:
            return
        ready = sorted(
            slot
            for slot in self._recent
            if slot in self._slots and self._slots[slot].tracked.refused is None
        )
        if ready:
            self._future = pool.fill_async(
                [(self._slots[slot].tracked.pool_id, ()) for slot in ready],
                row_indices=[[slot] for slot in ready],
                num_rows=self._slots_total,
            )
            self._filled = frozenset(ready)

    def _commit_history(self) -> None:
        """Read the tracked slots' committed tokens (two gathers: on CUDA each waits for the
        stream's work queued so far, i.e. the last step's sampling) and commit the new ones."""
        live = [(slot, e) for slot, e in self._slots.items() if e.tracked.refused is None]
        if not live:
            return
        states = self._states
        device = states.total_len.gpu.device
        slots = torch.tensor([slot for slot, _ in live], dtype=torch.int64, device=device)
        totals: list[int] = states.total_len.gpu.index_select(0, slots).tolist()
        prompt_lens = states.prompt_len.np
        wanted_slots: list[int] = []
        wanted_positions: list[int] = []
        spans: list[tuple[_SlotRequest, int]] = []
        for (slot, entry), total in zip(live, totals, strict=True):
            prompt = int(prompt_lens[slot])
            if entry.prompt_len is None:
                entry.prompt_len = prompt
            elif entry.prompt_len != prompt:
                self.plugin.refuse(entry.tracked, "vLLM replaced the request's prompt in its slot")
                continue
            have = total - prompt
            committed = entry.tracked.committed
            if have < committed:
                self.plugin.refuse(
                    entry.tracked,
                    f"vLLM's history holds {have} output tokens, fewer than the {committed} "
                    "the grammar accepted",
                )
                continue
            if have > committed:
                wanted_slots.extend([slot] * (have - committed))
                wanted_positions.extend(range(prompt + committed, total))
                spans.append((entry, have - committed))
        if not spans:
            return
        history = states.all_token_ids.gpu
        tokens: list[int] = history[
            torch.tensor(wanted_slots, dtype=torch.int64, device=history.device),
            torch.tensor(wanted_positions, dtype=torch.int64, device=history.device),
        ].tolist()
        start = 0
        for entry, count in spans:
            self.plugin.commit(entry.tracked, tokens[start : start + count])
            start += count

    # ------------------------------------------------------------------ after the forward
    def apply(self, logits: torch.Tensor, ctx: LogitsContext) -> torch.Tensor:
        """Mask the rows of the tracked requests in place; other rows are untouched."""
        plugin = self.plugin
        if plugin.mode == "aside" or not self._slots:
            return logits
        check_dtype(logits, "logits")
        batch_slots = [int(slot) for slot in ctx.idx_mapping_np.tolist()]
        self._recent = {slot for slot in batch_slots if slot in self._slots}
        step = self._rows(logits, ctx, batch_slots)
        pool = plugin.pool
        if pool is not None:
            serving = [slot for slot in step.rows if self._slots[slot].tracked.refused is None]
            if self._future is not None:
                masks = self._future.wait(timeout=plugin.settings.step_timeout_s)
                self._apply_by_slot(logits, masks, ctx, batch_slots)
                self._note(masks)
            late = [slot for slot in serving if slot not in self._filled]
            if late:
                masks = pool.fill(
                    [(self._slots[slot].tracked.pool_id, step.drafts[slot]) for slot in late],
                    row_indices=[step.rows[slot] for slot in late],
                    num_rows=logits.shape[0],
                    deadline_s=plugin.settings.step_timeout_s,
                )
                apply_bitmask(logits, masks)
                self._note(masks)
        plugin.stop_only(
            logits,
            [
                row
                for slot, rows in step.rows.items()
                if self._slots[slot].tracked.refused is not None
                for row in rows
            ],
        )
        return logits

    def _rows(self, logits: torch.Tensor, ctx: LogitsContext, batch_slots: list[int]) -> _StepRows:
        """Where the tracked slots' rows are this step, and their drafts. With one row a
        request (no drafts) the host mapping says it all; otherwise the row mapping and the
        input tokens are read from the device (on CUDA: one wait for the forward)."""
        rows: dict[int, list[int]] = {}
        drafts: dict[int, list[int]] = {}
        if logits.shape[0] == len(batch_slots):
            for row, slot in enumerate(batch_slots):
                if slot in self._slots:
                    rows[slot], drafts[slot] = [row], []
            return _StepRows(rows, drafts)
        mapping = ctx.expanded_idx_mapping.tolist()
        local = ctx.expanded_local_pos.tolist()
        inputs = ctx.input_ids.tolist()
        placed: dict[int, list[tuple[int, int]]] = {}
        for row, (slot, position) in enumerate(zip(mapping, local, strict=True)):
            if slot in self._slots:
                placed.setdefault(slot, []).append((position, row))
        for slot, found in placed.items():
            ordered = [row for _, row in sorted(found)]
            rows[slot] = ordered
            drafts[slot] = [int(inputs[row]) for row in ordered[1:]]
        return _StepRows(rows, drafts)

    def _apply_by_slot(
        self, logits: torch.Tensor, masks: StepMasks, ctx: LogitsContext, batch_slots: list[int]
    ) -> None:
        """Apply masks filled in slot order (one row a slot) to this step's rows."""
        rows = [row for row, slot in enumerate(batch_slots) if slot in self._filled]
        if not rows:
            return
        gathered = masks.bitmask.index_select(0, ctx.idx_mapping.to(masks.bitmask.device))
        if not logits.is_contiguous():
            raise ValueError("grammarmask needs contiguous logits")
        mask_rows(logits, gathered, torch.tensor(rows, dtype=torch.int64))

    def _note(self, masks: StepMasks) -> None:
        self.plugin.note(masks, (entry.tracked for entry in self._slots.values()))

    def tracked(self) -> list[TrackedRequest]:
        """The requests with a grammar in the slots now (for tests and monitoring)."""
        return [entry.tracked for entry in self._slots.values()]


def _calling_request_id() -> str:
    """vLLM's id of the request being added (the model runner's `req_id` a few frames up:
    `add_request` receives only the slot)."""
    frame = inspect.currentframe()
    try:
        for _ in range(8):
            if frame is None:
                return ""
            found = frame.f_locals.get("req_id")
            if isinstance(found, str):
                return found
            frame = frame.f_back
        return ""
    finally:
        del frame
