"""Where grammarmask's structured-output backend enters vLLM, which has no registry for a
third-party backend: the places below, each wrapped so that it hands everything to vLLM's
own code unless the engine's backend is grammarmask.

- `StructuredOutputsConfig.backend` accepts "grammarmask" (its Literal, rebuilt);
- `InputProcessor._validate_params` (front end) makes the engine's grammarmask settings
  known to `SamplingParams._validate_structured_outputs`, which admits the request the
  grammarmask way (HTTP 400 with the reason) instead of vLLM's backend checks;
- `StructuredOutputManager.grammar_init` (engine core) builds grammarmask's backend and
  compiles through it, `grammar_bitmask` fills the step through it.

The modules are wrapped when vLLM first imports them (a finder on `sys.meta_path`), so a
process that never imports them loads nothing.
"""

from __future__ import annotations

import contextvars
import functools
import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any, Literal, get_args, get_type_hints

from ....errors import GrammarError
from .._settings import PluginSettings
from ._requests import BACKEND_NAME

TESTED_VLLM = ("0.32.",)
"""vLLM releases whose internals (above) the backend is tested against."""

_SETTINGS: contextvars.ContextVar[PluginSettings] = contextvars.ContextVar("grammarmask_settings")
"""The engine's settings while the front end validates one request."""


def install() -> None:
    """Install every hook (once per process); on an untested vLLM only the refusal."""
    import vllm
    from vllm.config import StructuredOutputsConfig

    if BACKEND_NAME in get_args(get_type_hints(StructuredOutputsConfig)["backend"]):
        return
    tested = vllm.__version__.startswith(TESTED_VLLM)
    _accept_backend_name(StructuredOutputsConfig, None if tested else vllm.__version__)
    if not tested:
        return
    from vllm.sampling_params import SamplingParams

    SamplingParams._validate_structured_outputs = _admit(
        SamplingParams._validate_structured_outputs
    )
    _after_import("vllm.v1.engine.input_processor", _wrap_input_processor)
    _after_import("vllm.v1.structured_output", _wrap_manager)


def _accept_backend_name(config_class: Any, untested: str | None) -> None:
    """Rebuild the config dataclass with "grammarmask" among its backends; on an untested
    vLLM choosing it is refused when the config is built (`vllm serve` stops at once)."""
    from pydantic.dataclasses import rebuild_dataclass

    field = config_class.__dataclass_fields__["backend"]
    names = (*get_args(get_type_hints(config_class)["backend"]), BACKEND_NAME)
    widened = Literal[names]  # type: ignore[valid-type]
    field.type = widened
    config_class.__annotations__["backend"] = widened
    inherited = config_class.__dict__.get("__post_init__")

    def __post_init__(self: Any) -> None:
        if inherited is not None:
            inherited(self)
        if self.backend == BACKEND_NAME and untested is not None:
            raise ValueError(
                f"grammarmask's structured-output backend rests on vLLM internals tested "
                f"with vLLM {' and '.join(v + 'x' for v in TESTED_VLLM)}; this is vLLM "
                f"{untested}. Install a tested vLLM, or serve grammars through grammarmask's "
                "logits processor (docs/vllm.md)"
            )

    config_class.__post_init__ = __post_init__
    del config_class.__pydantic_fields__
    config_class.__pydantic_complete__ = False
    rebuild_dataclass(config_class, force=True)
    from vllm.config import VllmConfig  # validates the field from a dict: rebuilt too

    rebuild_dataclass(VllmConfig, force=True)


def chosen(structured_outputs_config: Any) -> bool:
    return getattr(structured_outputs_config, "backend", None) == BACKEND_NAME


# ---------------------------------------------------------------------- front end
def _wrap_input_processor(module: ModuleType) -> None:
    processor = module.InputProcessor
    original = processor._validate_params

    @functools.wraps(original)
    def _validate_params(self: Any, params: Any, *args: Any, **kwargs: Any) -> Any:
        if not chosen(self.structured_outputs_config):
            return original(self, params, *args, **kwargs)
        token = _SETTINGS.set(_settings(self))
        try:
            return original(self, params, *args, **kwargs)
        finally:
            _SETTINGS.reset(token)

    processor._validate_params = _validate_params


_SETTINGS_ATTRIBUTE = "_grammarmask_settings"


def _settings(processor: Any) -> PluginSettings:
    """The engine's grammarmask settings, read from `additional_config` once per input
    processor (the config is fixed for an engine's lifetime): not again per request."""
    settings: PluginSettings | None = getattr(processor, _SETTINGS_ATTRIBUTE, None)
    if settings is None:
        settings = PluginSettings.from_additional_config(processor.vllm_config.additional_config)
        setattr(processor, _SETTINGS_ATTRIBUTE, settings)
    return settings


def _admit(original: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(original)
    def _validate_structured_outputs(
        self: Any, model_config: Any, structured_outputs_config: Any, tokenizer: Any
    ) -> None:
        if not chosen(structured_outputs_config) or self.structured_outputs is None:
            return original(self, model_config, structured_outputs_config, tokenizer)
        from ._admission import admit

        admit(self, model_config, tokenizer, _SETTINGS.get(PluginSettings()))

    return _validate_structured_outputs


# ---------------------------------------------------------------------- engine core
def _wrap_manager(module: ModuleType) -> None:
    manager = module.StructuredOutputManager
    grammar_init = manager.grammar_init
    grammar_bitmask = manager.grammar_bitmask

    @functools.wraps(grammar_init)
    def _grammar_init(self: Any, request: Any) -> None:
        params = request.sampling_params
        if (
            request.structured_output_request is None
            or params is None
            or params.structured_outputs is None
            or params.structured_outputs._backend != BACKEND_NAME
        ):
            grammar_init(self, request)
            return
        from ._backend import GrammarmaskBackend

        if self.backend is None:
            self.backend = GrammarmaskBackend(
                self.vllm_config,
                tokenizer=self.tokenizer,
                vocab_size=self.vllm_config.model_config.get_vocab_size(),
            )
        if not isinstance(self.backend, GrammarmaskBackend):
            raise GrammarError(f"this engine serves structured outputs with {self.backend}")
        request.structured_output_request.grammar = self.backend.submit(request)

    @functools.wraps(grammar_bitmask)
    def _grammar_bitmask(
        self: Any, requests: Any, request_ids: Sequence[str], spec_tokens: Any
    ) -> Any:
        from ._backend import GrammarmaskBackend

        if not isinstance(self.backend, GrammarmaskBackend):
            return grammar_bitmask(self, requests, request_ids, spec_tokens)
        if not request_ids:
            return None
        return self.backend.step_bitmask(self, requests, request_ids, spec_tokens)

    manager.grammar_init = _grammar_init
    manager.grammar_bitmask = _grammar_bitmask


# ---------------------------------------------------------------------- imports
def _after_import(name: str, patch: Callable[[ModuleType], None]) -> None:
    """Run `patch` on module `name` right after it is first imported (now if it is)."""
    if name in sys.modules:
        patch(sys.modules[name])
        return
    sys.meta_path.insert(0, _PatchOnImport(name, patch))


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Finds one module with the other finders and patches it once it has run."""

    def __init__(self, name: str, patch: Callable[[ModuleType], None]) -> None:
        self._name = name
        self._patch = patch

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != self._name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is None or spec.loader is None:
            return spec
        spec.loader = _PatchingLoader(spec.loader, self._patch)
        return spec


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, inner: importlib.abc.Loader, patch: Callable[[ModuleType], None]) -> None:
        self._inner = inner
        self._patch = patch

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._inner.exec_module(module)
        self._patch(module)
