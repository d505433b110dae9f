"""A request's grammarmask entry in vLLM's `SamplingParams.extra_args`, read and written.

The entry is an object, or its JSON text (over HTTP it travels in `vllm_xargs`, whose
values are strings or numbers): exactly one grammar key and optional settings. Reading it
builds the `Grammar`, so every mistake is found when vLLM admits the request (HTTP 400),
never in the middle of a step.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from ...backends import AUTO, backend_names
from ...errors import GrammarError, RequestSpecError
from ...grammars import DEFAULT_LIMITS, DEFAULT_MAX_WHITESPACE, Grammar

EXTRA_ARGS_KEY = "grammarmask"
"""The key of `SamplingParams.extra_args` (and of `vllm_xargs`) that holds the entry."""

GRAMMAR_KEYS = ("json_schema", "json", "regex", "ebnf", "choice")
OPTION_KEYS = ("backend", "allow_unenforced", "whitespace", "strict", "max_whitespace")
_OPTIONS_BYTES = 4096
"""Room for the keys and options around the grammar itself (GrammarLimits bounds that)."""


@dataclass(frozen=True)
class RequestSpec:
    """What one request asks of the plugin: its grammar and how to serve it (None: the
    engine's setting)."""

    grammar: Grammar
    backend: str | None = None
    allow_unenforced: bool | None = None
    declared: tuple[str, ...] = ()
    """What is known before the compile to go unenforced (a structural tag's JSON schemas,
    turned into grammar rules by xgrammar): logged when the request is served."""


def xargs(
    grammar: Grammar, *, backend: str | None = None, allow_unenforced: bool | None = None
) -> dict[str, str]:
    """The `extra_args` / `vllm_xargs` entry that asks the plugin for `grammar`: JSON text,
    which both `SamplingParams(extra_args=...)` and the OpenAI server's `vllm_xargs` take."""
    entry: dict[str, Any] = {}
    if grammar.kind == "json_schema":
        entry["json_schema"] = grammar.schema
        entry["strict"] = grammar.strict
    elif grammar.kind == "json":
        entry["json"] = True
    elif grammar.kind == "choice":
        entry["choice"] = list(grammar.choices)
    else:
        entry[grammar.kind] = grammar.source
    if grammar.kind in ("json_schema", "json"):
        entry["whitespace"] = grammar.whitespace
        entry["max_whitespace"] = grammar.max_whitespace
    if backend is not None:
        entry["backend"] = backend
    if allow_unenforced is not None:
        entry["allow_unenforced"] = allow_unenforced
    parse_entry(entry)  # the checks the server makes, here and now
    return {EXTRA_ARGS_KEY: json.dumps(entry, separators=(",", ":"))}


def request_spec(extra_args: Mapping[str, Any] | None) -> RequestSpec | None:
    """The request's spec, or None when it asks nothing of grammarmask."""
    if not extra_args or EXTRA_ARGS_KEY not in extra_args:
        return None
    entry = extra_args[EXTRA_ARGS_KEY]
    if isinstance(entry, str):
        return _parse_text(entry)
    if isinstance(entry, Mapping):
        return parse_entry(entry)
    raise RequestSpecError(
        f"extra_args[{EXTRA_ARGS_KEY!r}] must be an object or its JSON text, "
        f"not {type(entry).__name__}"
    )


_CACHED_TEXT_BYTES = 64 << 10
"""Entries up to this size are parsed once and remembered (vLLM validates a request in its
front end and the plugin reads it again in the worker; servers see the same few schemas
again and again); larger ones are parsed each time, so the cache stays small."""


def _parse_text(text: str) -> RequestSpec:
    if len(text) > DEFAULT_LIMITS.max_source_bytes + _OPTIONS_BYTES:
        raise RequestSpecError(
            f"extra_args[{EXTRA_ARGS_KEY!r}] holds {len(text):,} characters, over the limit of "
            f"{DEFAULT_LIMITS.max_source_bytes + _OPTIONS_BYTES:,}"
        )
    return _parse_small(text) if len(text) <= _CACHED_TEXT_BYTES else _parse_json(text)


@lru_cache(maxsize=256)
def _parse_small(text: str) -> RequestSpec:
    return _parse_json(text)


def _parse_json(text: str) -> RequestSpec:
    return parse_entry(json_object(text, EXTRA_ARGS_KEY))


def json_object(text: str, key: str) -> dict[str, Any]:
    """`extra_args[key]`'s JSON text as an object; RequestSpecError says what is wrong."""
    try:
        entry = json.loads(text)
    except json.JSONDecodeError as exc:
        raise RequestSpecError(
            f"extra_args[{key!r}] is not JSON: {exc.msg} at character {exc.pos}"
        ) from None
    except RecursionError:
        raise RequestSpecError(f"extra_args[{key!r}] nests too deep to parse") from None
    if not isinstance(entry, dict):
        raise RequestSpecError(
            f"extra_args[{key!r}] must be a JSON object, not {type(entry).__name__}"
        )
    return entry


def parse_entry(entry: Mapping[str, Any]) -> RequestSpec:
    """Check every key and value and build the Grammar; RequestSpecError (or the
    Grammar's own GrammarError) names the first problem."""
    unknown = sorted(set(entry) - set(GRAMMAR_KEYS) - set(OPTION_KEYS))
    if unknown:
        raise RequestSpecError(
            f"unknown key {unknown[0]!r} in the grammarmask entry; grammar keys: "
            f"{', '.join(GRAMMAR_KEYS)}; options: {', '.join(OPTION_KEYS)}"
        )
    kinds = [key for key in GRAMMAR_KEYS if key in entry]
    if len(kinds) != 1:
        found = f"{' and '.join(kinds)}" if kinds else "none"
        raise RequestSpecError(
            f"the grammarmask entry needs exactly one of {', '.join(GRAMMAR_KEYS)} (found {found})"
        )
    kind = kinds[0]
    backend = _optional(entry, "backend", str)
    if backend is not None and backend not in (*backend_names(), AUTO):
        raise RequestSpecError(
            f"unknown backend {backend!r}; choose from {', '.join((*backend_names(), AUTO))}"
        )
    allow_unenforced = _optional(entry, "allow_unenforced", bool)
    return RequestSpec(_grammar(kind, entry), backend, allow_unenforced)


def _grammar(kind: str, entry: Mapping[str, Any]) -> Grammar:
    value = entry[kind]
    json_like = kind in ("json_schema", "json")
    for key in ("whitespace", "max_whitespace"):
        if key in entry and not json_like:
            raise RequestSpecError(f"{key!r} applies to json_schema and json only, not {kind}")
    if "strict" in entry and kind != "json_schema":
        raise RequestSpecError(f"'strict' applies to json_schema only, not {kind}")
    whitespace = _optional(entry, "whitespace", str) or "compact"
    max_whitespace = _optional(entry, "max_whitespace", int)
    max_whitespace = DEFAULT_MAX_WHITESPACE if max_whitespace is None else max_whitespace
    try:
        if kind == "json_schema":
            if not isinstance(value, (dict, bool, str)):
                raise RequestSpecError(
                    f"json_schema must be a schema object or its JSON text, "
                    f"not {type(value).__name__}"
                )
            strict = bool(_optional(entry, "strict", bool))
            return Grammar.json_schema(
                value,
                whitespace=whitespace,  # type: ignore[arg-type]
                strict=strict,
                max_whitespace=max_whitespace,
            )
        if kind == "json":
            if value is not True:
                raise RequestSpecError("json must be true (any JSON value)")
            return Grammar.json(whitespace=whitespace, max_whitespace=max_whitespace)  # type: ignore[arg-type]
        if kind == "regex":
            return Grammar.regex(value)
        if kind == "ebnf":
            return Grammar.ebnf(value)
        if not isinstance(value, list):
            raise RequestSpecError(f"choice must be a list of strings, not {type(value).__name__}")
        return Grammar.choice(value)
    except ValueError as exc:  # GrammarError, and the whitespace checks
        if isinstance(exc, GrammarError):
            raise
        raise RequestSpecError(str(exc)) from None


def _optional(entry: Mapping[str, Any], key: str, kind: type) -> Any:
    value = entry.get(key)
    if value is None:
        return None
    if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise RequestSpecError(f"{key!r} must be an integer, not {value!r}")
    if not isinstance(value, kind):
        raise RequestSpecError(f"{key!r} must be a {kind.__name__}, not {value!r}")
    return value
