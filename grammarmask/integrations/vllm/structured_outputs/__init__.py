"""grammarmask as vLLM's structured-output backend, for unmodified OpenAI clients:

    vllm serve MODEL --structured-outputs-config.backend grammarmask

Every structured-output request vLLM makes (`response_format`, `structured_outputs`, tool
calls that tool parsers turn into JSON schemas) is then compiled and masked by grammarmask.
Installing grammarmask registers `register` under vLLM's `vllm.general_plugins` entry
point, which vLLM runs in each of its processes before the engine starts; it changes
nothing in an engine that chooses another backend (see `_hooks.py` for where it enters).
"""

from __future__ import annotations

from ._requests import BACKEND_NAME, OPTIONS_KEY


def register() -> None:
    """vLLM's general-plugin hook: makes `grammarmask` a structured-output backend name."""
    from ._hooks import install

    install()


__all__ = ["BACKEND_NAME", "OPTIONS_KEY", "register"]
