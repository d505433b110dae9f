"""The front end's admission of a structured-output request under grammarmask's backend:
everything that can be refused without compiling is refused here, as HTTP 400 with the
reason, so that a request the engine core takes up fails there only for what a compile
finds."""

from __future__ import annotations

import threading
from typing import Any

from vllm.exceptions import VLLMValidationError
from vllm.v1.structured_output.request import get_structured_output_key

from ....compiler import GrammarCompiler
from ....errors import GrammarError
from .._plugin import _vocabulary
from .._settings import PluginSettings
from ._requests import BACKEND_NAME, structured_spec


def admit(params: Any, model_config: Any, tokenizer: Any, settings: PluginSettings) -> None:
    """Check `params` (vLLM's SamplingParams) and mark it for grammarmask's backend;
    VLLMValidationError names the problem."""
    structured = params.structured_outputs
    if model_config.is_diffusion:
        raise VLLMValidationError(
            "structured outputs are not supported for diffusion language models"
        )
    if tokenizer is None:
        raise VLLMValidationError(
            "structured outputs need a tokenizer; they cannot be used with skip_tokenizer_init"
        )
    if structured._backend not in (None, BACKEND_NAME):
        raise VLLMValidationError(
            f"this engine serves structured outputs with {BACKEND_NAME}, not "
            f"{structured._backend!r} (request-level backends are not supported)"
        )
    structured._backend = BACKEND_NAME
    try:
        kind, text = get_structured_output_key(structured)
    except ValueError as exc:
        raise VLLMValidationError(str(exc)) from None
    try:
        spec = structured_spec(kind.name, text, params.extra_args, settings.allow_unenforced)
        backend = spec.backend or settings.backend
        loose = spec.allow_unenforced
        if loose is None:
            loose = settings.allow_unenforced
        _compiler(model_config).check(spec.grammar, backend, loose)
    except GrammarError as exc:
        raise VLLMValidationError(f"grammarmask: {exc}") from None


_COMPILERS: dict[tuple[Any, ...], GrammarCompiler] = {}
_COMPILERS_LOCK = threading.Lock()


def _compiler(model_config: Any) -> GrammarCompiler:
    """A compiler for the served vocabulary, only ever asked what it would refuse (its
    backends' support tables): it compiles nothing. One per model of the process."""
    key = (
        model_config.tokenizer,
        model_config.tokenizer_revision,
        model_config.get_vocab_size(),
    )
    with _COMPILERS_LOCK:
        if key not in _COMPILERS:
            _COMPILERS[key] = GrammarCompiler(_vocabulary(model_config), threads=1)
        return _COMPILERS[key]
