"""grammarmask: grammar-constrained decoding masks for an LLM engine's sampler."""

from __future__ import annotations

from .backends import (
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
    InvalidChoiceError,
    InvalidEBNFError,
    InvalidJSONError,
    InvalidRegexError,
    InvalidSchemaError,
    UnsupportedGrammarError,
    VocabularyError,
)
from .grammars import Grammar
from .vocabulary import Vocabulary

__all__ = [
    "Backend",
    "CompileError",
    "CompileTimeoutError",
    "CompiledGrammar",
    "Grammar",
    "GrammarCompiler",
    "GrammarError",
    "GrammarMaskError",
    "InvalidChoiceError",
    "InvalidEBNFError",
    "InvalidJSONError",
    "InvalidRegexError",
    "InvalidSchemaError",
    "Matcher",
    "Unenforced",
    "UnsupportedGrammarError",
    "Vocabulary",
    "VocabularyError",
    "backend_names",
    "create_backend",
    "installed_backends",
    "words_per_row",
]
