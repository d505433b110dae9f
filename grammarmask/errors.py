"""Exception classes: one family per kind of bad input, so callers can catch precisely."""

from __future__ import annotations


class GrammarMaskError(Exception):
    """Base of every error grammarmask raises on purpose."""


class VocabularyError(GrammarMaskError, ValueError):
    """A tokenizer or logits width that cannot be turned into a sound vocabulary."""


class GrammarError(GrammarMaskError, ValueError):
    """A grammar spec that cannot be served; the message names the problem."""


class InvalidJSONError(GrammarError):
    """Schema text that is not JSON at all."""


class InvalidSchemaError(GrammarError):
    """A JSON document that is not a valid JSON Schema; `pointer` locates the offending part."""

    def __init__(self, message: str, pointer: str = "") -> None:
        super().__init__(f"{message} (at {pointer or '/'})")
        self.pointer = pointer


class InvalidRegexError(GrammarError):
    """A regular expression that does not parse."""


class InvalidEBNFError(GrammarError):
    """An EBNF grammar that does not parse."""


class InvalidChoiceError(GrammarError):
    """A choice list that is empty or holds something other than non-empty strings."""


class UnsupportedGrammarError(GrammarError):
    """A valid spec that a backend refuses to compile (a feature it does not implement)."""


class CompileError(GrammarError):
    """A backend failed while compiling a spec it should support."""


class CompileTimeoutError(GrammarError):
    """Compilation did not finish within the allowed time."""


class GrammarTooLargeError(GrammarError):
    """A spec over a size or nesting limit (`GrammarLimits`): bounded before any backend
    spends memory, threads or Python's recursion limit on it."""


class NotFullyEnforcedError(GrammarError):
    """backend="auto" found no installed backend that enforces all of a grammar; `reasons`
    maps each backend to what it leaves out or why it refused."""

    def __init__(self, message: str, reasons: dict[str, tuple[str, ...]]) -> None:
        super().__init__(message)
        self.reasons = reasons
