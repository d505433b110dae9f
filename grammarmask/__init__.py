"""grammarmask: grammar-constrained decoding masks for an LLM engine's sampler."""

from __future__ import annotations

from .backends import (
    AUTO_ORDER,
    Backend,
    CompiledGrammar,
    Matcher,
    backend_names,
    create_backend,
    installed_backends,
    words_per_row,
)
from .compiler import GrammarCompiler
from .enforcement import Unenforced
from .errors import (
    CompileError,
    CompileTimeoutError,
    GrammarError,
    GrammarMaskError,
    GrammarTooLargeError,
    InvalidChoiceError,
    InvalidEBNFError,
    InvalidJSONError,
    InvalidRegexError,
    InvalidSchemaError,
    NotFullyEnforcedError,
    UnsupportedGrammarError,
    VocabularyError,
)
from .grammars import Grammar, GrammarLimits
from .kernels import ApplyError, apply_bitmask
from .pool import MaskFuture, MatcherPool, RequestState
from .steps import BatchError, StepMasks
from .vocabulary import Vocabulary

__all__ = [
    "AUTO_ORDER",
    "ApplyError",
    "Backend",
    "BatchError",
    "CompileError",
    "CompileTimeoutError",
    "CompiledGrammar",
    "Grammar",
    "GrammarCompiler",
    "GrammarError",
    "GrammarLimits",
    "GrammarMaskError",
    "GrammarTooLargeError",
    "InvalidChoiceError",
    "InvalidEBNFError",
    "InvalidJSONError",
    "InvalidRegexError",
    "InvalidSchemaError",
    "MaskFuture",
    "Matcher",
    "MatcherPool",
    "NotFullyEnforcedError",
    "RequestState",
    "StepMasks",
    "Unenforced",
    "UnsupportedGrammarError",
    "Vocabulary",
    "VocabularyError",
    "apply_bitmask",
    "backend_names",
    "create_backend",
    "installed_backends",
    "words_per_row",
]
