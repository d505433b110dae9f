"""The plugin's vLLM logits processor: one class for both of vLLM's model runners.

vLLM's V1 runner (its CPU build) and Model Runner V2 (the default wherever Triton works)
each load the classes named by `--logits-processors` and by the `vllm.logits_processors`
entry point, and each refuses a class that does not subclass its own interface. So
`GrammarLogitsProcessor` subclasses both, and its constructor tells the runners apart by
what they pass: `(vllm_config, device, is_pin_memory)` from V1, `(vllm_config,
req_states)` from V2. The work is done by the runner's side (`V1Processor`, `V2Processor`).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

import torch
from vllm.v1.sample.logits_processor import BatchUpdate
from vllm.v1.sample.logits_processor import LogitsProcessor as V1LogitsProcessor

from ...errors import GrammarError
from ...vocabulary import Vocabulary
from ._plugin import Mode, TrackedRequest
from ._settings import PluginSettings
from ._spec import request_spec
from ._v1 import V1Processor
from ._v2 import V2Processor

try:
    from vllm.v1.worker.gpu.sample.logits_processor.interface import (
        LogitsProcessor as V2LogitsProcessor,
    )
except ImportError:  # a vLLM without Model Runner V2's processor interface
    _BASES: tuple[type, ...] = (V1LogitsProcessor,)
else:
    _BASES = (V1LogitsProcessor, V2LogitsProcessor)

if TYPE_CHECKING:
    from vllm import SamplingParams
    from vllm.config import VllmConfig
    from vllm.v1.worker.gpu.sample.logits_processor import LogitsContext


class GrammarLogitsProcessor(*_BASES):  # type: ignore[misc]
    """Constrains the requests whose `SamplingParams.extra_args` hold a grammarmask entry
    (see `xargs`); every other request is untouched.

    Load it with `vllm serve MODEL --logits-processors
    grammarmask.integrations.vllm:GrammarLogitsProcessor` or `LLM(logits_processors=[...])`,
    under either model runner; settings come from `additional_config["grammarmask"]`
    (`PluginSettings`).
    """

    @classmethod
    def validate_params(cls, sampling_params: SamplingParams) -> None:
        """Refuse a malformed entry when vLLM admits the request (HTTP 400 over the API)."""
        try:
            request_spec(sampling_params.extra_args)
        except GrammarError as exc:
            raise ValueError(f"grammarmask: {exc}") from None

    def __init__(self, vllm_config: VllmConfig, *runner_args: Any) -> None:
        settings = PluginSettings.from_additional_config(vllm_config.additional_config)
        mode = self._choose_mode(vllm_config, settings)
        self._side: V1Processor | V2Processor
        if len(runner_args) == 1 and hasattr(runner_args[0], "all_token_ids"):
            self._side = V2Processor(vllm_config, runner_args[0], settings, mode)
        elif len(runner_args) == 2 and isinstance(runner_args[0], torch.device):
            named = _named(vllm_config, GrammarLogitsProcessor)
            self._side = V1Processor(vllm_config, runner_args[0], settings, mode, named)
        else:
            raise TypeError(
                "GrammarLogitsProcessor takes (vllm_config, device, is_pin_memory) from "
                "vLLM's V1 model runner or (vllm_config, req_states) from Model Runner V2, "
                f"not {len(runner_args) + 1} arguments"
            )

    def _choose_mode(self, vllm_config: VllmConfig, settings: PluginSettings) -> Mode:
        """Whether this instance serves grammars (see the entry-point subclass)."""
        return "serve"

    @property
    def vocab(self) -> Vocabulary:
        """The served model's vocabulary (absent on an instance that stands aside)."""
        return self._side.plugin.vocab

    def tracked(self) -> list[TrackedRequest]:
        """The requests with a grammar that this instance follows now."""
        return self._side.tracked()

    # ------------------------------------------------------------------ V1 runner
    def is_argmax_invariant(self) -> bool:
        return False

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        self._v1().update_state(batch_update)

    def _v1(self) -> V1Processor:
        if not isinstance(self._side, V1Processor):
            raise TypeError("update_state is the V1 runner's call; this instance serves V2")
        return self._side

    # ------------------------------------------------------------------ Model Runner V2
    def add_request(self, req_idx: int, sampling_params: SamplingParams) -> bool:
        return self._v2().add_request(req_idx, sampling_params)

    def apply_staged_writes(self) -> None:
        self._v2().apply_staged_writes()

    def _v2(self) -> V2Processor:
        if not isinstance(self._side, V2Processor):
            raise TypeError("add_request is Model Runner V2's call; this instance serves V1")
        return self._side

    # ------------------------------------------------------------------ both
    def apply(self, logits: torch.Tensor, ctx: LogitsContext | None = None) -> torch.Tensor:
        """Mask the rows of the requests with a grammar, in place (V2 passes `ctx`)."""
        if isinstance(self._side, V2Processor):
            if ctx is None:
                raise TypeError("Model Runner V2 passes a LogitsContext to apply")
            return self._side.apply(logits, ctx)
        return self._side.apply(logits)


class EntryPointGrammarLogitsProcessor(GrammarLogitsProcessor):
    """What the `vllm.logits_processors` entry point loads into every vLLM engine of an
    environment where grammarmask[vllm] is installed, under either model runner. It stands
    aside when the engine also names GrammarLogitsProcessor (vLLM would run both), and when
    `additional_config["grammarmask"]["autoload"]` is false, where it ends the requests that
    ask for a grammar rather than let them run unconstrained."""

    def _choose_mode(self, vllm_config: VllmConfig, settings: PluginSettings) -> Mode:
        if _named(vllm_config, GrammarLogitsProcessor):
            return "aside"
        return "serve" if settings.autoload else "refuse"


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
