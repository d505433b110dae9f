"""Fixtures for the tests on the real vLLM engine (vLLM's CPU build here): SmolLM2, engines
in this process (so a test can watch the plugin), and the bundled schemas' cases.

These tests run in an environment of their own (vLLM pins its own versions):
`scripts/test.sh` runs them there, after the main suite.
"""

from __future__ import annotations

import logging
import os

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine core in this process
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from grammarmask.integrations.transformers import smollm2_checkpoint
from grammarmask.resources import schemas_dir
from grammarmask.tools.demo import DemoCase, bundled_cases
from vllm_engine.engines import PLUGIN, engine_args, shutdown


@pytest.fixture(scope="session")
def model_dir() -> Path:
    return smollm2_checkpoint()


@pytest.fixture(scope="session")
def make_llm(model_dir: Path) -> Iterator[Callable[..., Any]]:
    """Builds engines and shuts each down at the end of the session."""
    from vllm import LLM

    built: list[Any] = []

    def make(**overrides: Any) -> Any:
        llm = LLM(**engine_args(model_dir, **overrides))
        built.append(llm)
        return llm

    yield make
    for llm in built:
        shutdown(llm)


@pytest.fixture(scope="session")
def plugin_llm(make_llm: Callable[..., Any]) -> Any:
    """An engine with grammarmask named as its logits processor."""
    return make_llm(logits_processors=[PLUGIN])


@pytest.fixture(scope="session")
def cases() -> list[DemoCase]:
    return bundled_cases(schemas_dir())


@pytest.fixture
def plugin_log() -> Iterator[list[str]]:
    """The plugin's warnings (its failure log) while the test runs."""
    messages: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            messages.append(record.getMessage())

    handler = Collect(logging.WARNING)
    logger = logging.getLogger("vllm.grammarmask")
    logger.addHandler(handler)
    yield messages
    logger.removeHandler(handler)
