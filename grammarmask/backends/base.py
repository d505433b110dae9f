"""The small interface every grammar engine is wrapped into."""

from __future__ import annotations

import functools
import importlib.metadata
import logging
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

import torch

from ..errors import GrammarError
from ..grammars import Grammar
from ..schema import KeywordSupport, LoweredSchema, Unenforced
from ..vocabulary import Vocabulary

_logger = logging.getLogger("grammarmask")

DEFAULT_COMPILED_BYTES = 1 << 20
"""Memory assumed for a compiled grammar whose backend gives no estimate (a medium schema
compiled by xgrammar on a 129k vocabulary holds about 1 MB)."""


def words_per_row(vocab_size: int) -> int:
    """Width of one packed int32 bitmask row."""
    return (vocab_size + 31) // 32


def pack_bits(allowed: torch.Tensor) -> torch.Tensor:
    """Pack a bool vector (True = allowed) into int32 words, bit i of word w = id 32*w + i."""
    padded = torch.zeros(words_per_row(allowed.numel()) * 32, dtype=torch.int64)
    padded[: allowed.numel()] = allowed.to(torch.int64)
    weights = torch.ones(32, dtype=torch.int64) << torch.arange(32, dtype=torch.int64)
    words = (padded.view(-1, 32) * weights).sum(dim=1)
    return torch.where(words >= 1 << 31, words - (1 << 32), words).to(torch.int32)


def row_pointer(bitmask: torch.Tensor, row: int, words: int) -> int:
    """Address of `bitmask[row]` for engines that write raw memory; checks what they cannot."""
    if (
        bitmask.dtype != torch.int32
        or bitmask.device.type != "cpu"
        or not bitmask.is_contiguous()
        or bitmask.dim() != 2
        or bitmask.shape[1] != words
    ):
        raise ValueError(
            f"bitmask must be a contiguous CPU int32 tensor with {words} words per row"
        )
    return int(bitmask[row].data_ptr())


def fill_stop_only(bitmask: torch.Tensor, row: int, stop_token_ids: tuple[int, ...]) -> None:
    """A row that lets the request end and nothing else (fail-closed, never all zero)."""
    bitmask[row].zero_()
    set_token_bits(bitmask, row, stop_token_ids)


def token_allowed(bitmask: torch.Tensor, row: int, token_id: int) -> bool:
    """Whether `bitmask[row]` lets `token_id` through."""
    return bool(int(bitmask[row, token_id >> 5]) >> (token_id & 31) & 1)


def set_token_bits(bitmask: torch.Tensor, row: int, token_ids: tuple[int, ...]) -> None:
    """Allow `token_ids` in `bitmask[row]` in addition to what it allows already."""
    for token_id in token_ids:
        word = token_id >> 5
        value = (int(bitmask[row, word]) & 0xFFFFFFFF) | (1 << (token_id & 31))
        bitmask[row, word] = value - (1 << 32) if value >= 1 << 31 else value


class Matcher(ABC):
    """One request's position in a grammar.

    `accept` never changes state on a forbidden token; `rollback(n)` undoes the last n accepted
    tokens, so drafts can be tried and withdrawn.
    """

    __slots__ = ()  # subclasses may keep theirs in slots: a step reads them per request

    @abstractmethod
    def accept(self, token_id: int) -> bool:
        """Advance by one token; False (and no change) if the grammar forbids it."""

    @abstractmethod
    def fill(self, bitmask: torch.Tensor, row: int) -> None:
        """Write the allowed-next-token bits into `bitmask[row]` (int32, packed, CPU)."""

    def fill_drafts(self, bitmask: torch.Tensor, rows: Sequence[int], drafts: Sequence[int]) -> int:
        """One step's rows: rows[0] after the current state, rows[j] after drafts[:j].

        Stops at the first draft the grammar forbids, rolls the trial back, and returns how
        many drafts were accepted; rows past that are left untouched. A draft its row
        forbids is not tried: the row says so already, and a refused `accept` can cost more
        than an allowed one (llguidance's tells a forbidden token from a spent lexer).
        """
        self.fill(bitmask, rows[0])
        accepted = 0
        for draft in drafts:
            if not token_allowed(bitmask, rows[accepted], draft) or not self.accept(draft):
                break
            accepted += 1
            self.fill(bitmask, rows[accepted])
        self.rollback(accepted)
        return accepted

    @classmethod
    def fill_many(
        cls, matchers: Sequence[Matcher], bitmask: torch.Tensor, rows: Sequence[int]
    ) -> bool:
        """`fill` for several matchers of this class, `rows[i]` for `matchers[i]`, in one call
        of the engine's own batch fill; False (nothing written) where it has none."""
        return False

    @abstractmethod
    def rollback(self, num_tokens: int) -> None:
        """Undo the last `num_tokens` accepted tokens."""

    @abstractmethod
    def is_terminated(self) -> bool:
        """A stop token has been accepted."""

    @abstractmethod
    def can_stop(self) -> bool:
        """The text so far is complete: a stop token would be accepted now."""

    @abstractmethod
    def reset(self) -> None:
        """Back to the start of the grammar."""


@dataclass(frozen=True)
class CompiledGrammar:
    """A grammar compiled for one backend and vocabulary, with what that backend leaves out."""

    backend: str
    grammar: Grammar
    unenforced: tuple[Unenforced, ...]
    compile_seconds: float
    _new_matcher: Callable[[], Matcher] = field(repr=False, compare=False)
    memory_bytes: int = DEFAULT_COMPILED_BYTES
    """What holding this compiled grammar costs, as its backend estimates it; the compile
    cache is bounded by the sum."""

    @property
    def fully_enforced(self) -> bool:
        return not self.unenforced

    def matcher(self) -> Matcher:
        """A fresh matcher at the start of the grammar."""
        return self._new_matcher()


def _never_stop() -> GrammarError | None:
    return None


@dataclass(frozen=True)
class CompileBudget:
    """What one compile may spend. `stop()` returns the error to end it with once it should
    end (past its deadline, or nobody waits for it any more), else None; `memory_bytes`
    bounds the memory of a compile that runs in a process of its own (None: unbounded).
    Why: a compile nobody waits for must not keep the machine's CPU and memory."""

    memory_bytes: int | None = None
    stop: Callable[[], GrammarError | None] = _never_stop


UNBOUNDED = CompileBudget()


@functools.cache
def _warn_unmeasured(distribution: str, measured_on: tuple[str, ...]) -> None:
    version = importlib.metadata.version(distribution)
    if version not in measured_on:
        _logger.warning(
            "%s %s: its JSON Schema support table was measured on %s %s; what it declares "
            "as enforced is not measured on this version (run pytest tests/test_enforcement.py)",
            distribution,
            version,
            distribution,
            ", ".join(measured_on),
        )


class Backend(ABC):
    """A grammar engine bound to one vocabulary.

    `unenforced`, `compile` and `compile_within` take the grammar and its lowered schema
    (`Grammar.lower()`, None for other kinds), which the compiler computes once for every
    backend it asks."""

    name: ClassVar[str]
    stoppable: ClassVar[bool] = False
    """`compile_within` ends its work when the budget says so (the compile runs in a process
    of its own); False: a compile, once started, runs to its end."""
    support: ClassVar[KeywordSupport | None] = None
    """The JSON Schema keywords and formats this backend enforces (None: no JSON Schema)."""
    distribution: ClassVar[str] = ""
    """The engine's package, whose installed version `support` is checked against."""

    def __init__(self, vocab: Vocabulary) -> None:
        self.vocab = vocab
        if self.support is not None and self.distribution:
            _warn_unmeasured(self.distribution, self.support.measured_on)

    @abstractmethod
    def unenforced(self, grammar: Grammar, lowered: LoweredSchema | None) -> tuple[Unenforced, ...]:
        """What of `grammar` this backend would not enforce, found without compiling.

        Raises UnsupportedGrammarError for a kind of grammar it cannot serve at all.
        """

    @abstractmethod
    def compile(self, grammar: Grammar, lowered: LoweredSchema | None) -> CompiledGrammar:
        """Compile; raises a GrammarError subclass naming the problem."""

    def compile_within(
        self, grammar: Grammar, lowered: LoweredSchema | None, budget: CompileBudget
    ) -> CompiledGrammar:
        """`compile`, ended with `budget.stop()`'s error when that gives one, or with
        CompileMemoryError past `budget.memory_bytes`, where this backend can end its work
        (`stoppable`); the default cannot, and compiles to the end."""
        return self.compile(grammar, lowered)

    def close(self) -> None:  # noqa: B027 - most backends hold nothing outside the process
        """End what this backend runs outside the calling process (its compile processes)."""
