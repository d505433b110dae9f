"""Grammar engines behind one interface; which are installed decides which can be used."""

from __future__ import annotations

import importlib.util

from ..errors import GrammarMaskError
from ..vocabulary import Vocabulary
from .base import Backend, CompiledGrammar, Matcher, words_per_row

_MODULES = {"xgrammar": "xgrammar", "outlines": "outlines_core", "llguidance": "llguidance"}

AUTO = "auto"
"""The backend name that picks, per grammar, a backend that enforces all of it."""

AUTO_ORDER = ("llguidance", "xgrammar", "outlines")
"""The order in which `auto` tries backends. llguidance first: it compiles fastest, covers
the most schemas, has the best tail latency per token (docs/backends.md has the figures)
and refuses what it does not implement. xgrammar next: every grammar kind, fast masks, but
it ignores more keywords silently (its table declares them). outlines last: index builds
take seconds and it serves regular languages only."""


def auto_order(kind: str) -> tuple[str, ...]:
    """AUTO_ORDER, except that EBNF goes to xgrammar first: `Grammar.ebnf` is validated in
    xgrammar's dialect, which llguidance only reads through its GBNF-to-Lark converter."""
    if kind == "ebnf":
        return ("xgrammar", *(name for name in AUTO_ORDER if name != "xgrammar"))
    return AUTO_ORDER


def backend_names() -> tuple[str, ...]:
    """Every backend grammarmask knows, installed or not."""
    return tuple(_MODULES)


def installed_backends() -> tuple[str, ...]:
    """Backends whose engine package can be imported here."""
    return tuple(name for name, module in _MODULES.items() if importlib.util.find_spec(module))


def create_backend(name: str, vocab: Vocabulary) -> Backend:
    """Bind the named backend to `vocab`; a clear error if unknown or not installed."""
    if name not in _MODULES:
        raise GrammarMaskError(
            f"unknown backend {name!r}; choose from {', '.join(_MODULES)} (or {AUTO!r})"
        )
    if name not in installed_backends():
        raise GrammarMaskError(
            f"backend {name!r} needs the {_MODULES[name]} package: "
            f"pip install 'grammarmask[{name}]'"
        )
    if name == "xgrammar":
        from .xgrammar_backend import XGrammarBackend

        return XGrammarBackend(vocab)
    if name == "llguidance":
        from .llguidance_backend import LLGuidanceBackend

        return LLGuidanceBackend(vocab)
    from .outlines_backend import OutlinesBackend

    return OutlinesBackend(vocab)


__all__ = [
    "AUTO",
    "AUTO_ORDER",
    "Backend",
    "CompiledGrammar",
    "Matcher",
    "auto_order",
    "backend_names",
    "create_backend",
    "installed_backends",
    "words_per_row",
]
