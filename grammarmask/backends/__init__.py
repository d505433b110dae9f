"""Grammar engines behind one interface; which are installed decides which can be used."""

from __future__ import annotations

import importlib
import importlib.util

from ..errors import GrammarMaskError
from ..vocabulary import Vocabulary
from .base import Backend, CompiledGrammar, Matcher, words_per_row

_REGISTRY = {
    "llguidance": ("llguidance", "llguidance_backend", "LLGuidanceBackend"),
    "xgrammar": ("xgrammar", "xgrammar_backend", "XGrammarBackend"),
    "outlines": ("outlines_core", "outlines_backend", "OutlinesBackend"),
}
"""Every backend: its engine package, and the module of this package and class that wrap
it (each module holds its backend's support table). Adding a backend is one module and one
line here; the order is `auto`'s."""

AUTO = "auto"
"""The backend name that picks, per grammar, a backend that enforces all of it."""

AUTO_ORDER = tuple(_REGISTRY)
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
    return tuple(_REGISTRY)


def installed_backends() -> tuple[str, ...]:
    """Backends whose engine package can be imported here."""
    return tuple(
        name for name, (engine, _, _) in _REGISTRY.items() if importlib.util.find_spec(engine)
    )


def create_backend(name: str, vocab: Vocabulary) -> Backend:
    """Bind the named backend to `vocab`; a clear error if unknown or not installed."""
    if name not in _REGISTRY:
        raise GrammarMaskError(
            f"unknown backend {name!r}; choose from {', '.join(_REGISTRY)} (or {AUTO!r})"
        )
    engine, module, cls = _REGISTRY[name]
    if name not in installed_backends():
        raise GrammarMaskError(
            f"backend {name!r} needs the {engine} package: pip install 'grammarmask[{name}]'"
        )
    backend: type[Backend] = getattr(importlib.import_module(f".{module}", __name__), cls)
    return backend(vocab)


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
