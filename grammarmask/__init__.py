"""grammarmask: grammar-constrained decoding masks for an LLM engine's sampler.

The public API is what this module exports; every other module is internal.
"""

from __future__ import annotations

__version__ = "0.1.0"

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
from .device.kernels import apply_bitmask
from .errors import (
    ApplyError,
    BatchError,
    CompileError,
    CompileMemoryError,
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
    WorkerStartError,
)
from .grammars import Grammar, GrammarLimits
from .masks import StepMasks
from .pool import MaskFuture, MatcherPool, RequestState
from .schema import Unenforced
from .vocabulary import Vocabulary

__all__ = [
    "AUTO_ORDER",
    "ApplyError",
    "Backend",
    "BatchError",
    "CompileError",
    "CompileMemoryError",
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
    "WorkerStartError",
    "__version__",
    "apply_bitmask",
    "backend_names",
    "create_backend",
    "installed_backends",
    "words_per_row",
]
