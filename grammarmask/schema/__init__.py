"""JSON Schema, known once: its vocabulary and formats (`keywords`, `formats`), pointers
and references (`pointers`), the one walk over subschemas (`walk`), the judge of what a
backend enforces (`judge`, `patterns`) and lowering (`lowering`). Nothing here knows a
backend or a grammar engine: each backend's support table lives beside its code."""

from __future__ import annotations

from .judge import KeywordSupport, Unenforced, find_unenforced
from .lowering import LoweredSchema, Rewrite, lower_schema
from .pointers import json_pointer, resolve_pointer
from .walk import iter_reachable_subschemas, iter_subschemas

__all__ = [
    "KeywordSupport",
    "LoweredSchema",
    "Rewrite",
    "Unenforced",
    "find_unenforced",
    "iter_reachable_subschemas",
    "iter_subschemas",
    "json_pointer",
    "lower_schema",
    "resolve_pointer",
]
