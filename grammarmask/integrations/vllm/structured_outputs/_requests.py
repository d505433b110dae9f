"""vLLM's structured-output requests as grammarmask requests.

vLLM hands a backend one `(kind, text)` pair per request (`StructuredOutputKey`): the JSON
schema, `json_object`, a regex, a choice list, a grammar (xgrammar's EBNF or Lark) or a
structural tag. Options of grammarmask's own (`backend`, `allow_unenforced`, `whitespace`,
`max_whitespace`, `strict`) may travel beside it in `vllm_xargs` / `extra_args` under
`grammarmask_options`.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator, Mapping
from typing import Any

from ....backends.xgrammar_backend import XGRAMMAR_SUPPORT
from ....errors import InvalidEBNFError, NotFullyEnforcedError, RequestSpecError
from ....schema import find_unenforced
from .._spec import GRAMMAR_KEYS, RequestSpec, json_object, parse_entry

BACKEND_NAME = "grammarmask"
"""The name that chooses this backend: `--structured-outputs-config.backend grammarmask`."""

OPTIONS_KEY = "grammarmask_options"
"""The key of `extra_args` (`vllm_xargs`) for a request's options under this backend; not
the logits processor's `grammarmask` key, whose entry names a grammar of its own."""

JSON_OBJECT_SCHEMA: dict[str, Any] = {"type": "object"}
"""What `response_format={"type": "json_object"}` asks for: any JSON object."""


def structured_spec(
    kind: str, text: str, extra_args: Mapping[str, Any] | None, allow_unenforced: bool
) -> RequestSpec:
    """The grammarmask request for vLLM's `(kind, text)` (kind: the name of a
    `StructuredOutputOptions` member) and the request's options (`allow_unenforced`: the
    engine's default). Raises a GrammarError naming the problem (vLLM answers it with HTTP
    400)."""
    entry = dict(_options(extra_args))
    declared: tuple[str, ...] = ()
    if kind == "JSON":
        entry["json_schema"] = text
    elif kind == "JSON_OBJECT":
        entry["json_schema"] = JSON_OBJECT_SCHEMA
    elif kind == "REGEX":
        entry["regex"] = text
    elif kind == "CHOICE":
        entry["choice"] = _choices(text)
    elif kind == "GRAMMAR":
        entry["ebnf"] = _as_ebnf(text)
    elif kind == "STRUCTURAL_TAG":
        loose = entry.get("allow_unenforced")
        entry["ebnf"], declared = _tag_as_ebnf(
            text, allow_unenforced if loose is None else bool(loose)
        )
    else:
        raise RequestSpecError(f"unknown structured-output kind {kind!r}")
    spec = parse_entry(entry)
    return dataclasses.replace(spec, declared=declared) if declared else spec


def _options(extra_args: Mapping[str, Any] | None) -> Mapping[str, Any]:
    """The request's grammarmask options: its entry, which must not name a grammar too."""
    if not extra_args or OPTIONS_KEY not in extra_args:
        return {}
    raw = extra_args[OPTIONS_KEY]
    if isinstance(raw, str):
        raw = json_object(raw, OPTIONS_KEY)
    if not isinstance(raw, Mapping):
        raise RequestSpecError(
            f"extra_args[{OPTIONS_KEY!r}] must be an object of options, not {type(raw).__name__}"
        )
    named = [key for key in GRAMMAR_KEYS if key in raw]
    if named:
        raise RequestSpecError(
            f"extra_args[{OPTIONS_KEY!r}] holds options only, not a grammar ({named[0]}): "
            "the request's structured output is its grammar"
        )
    return raw


def _choices(text: str) -> list[str]:
    try:
        choices = json.loads(text)
    except json.JSONDecodeError:
        raise RequestSpecError(f"the choice list is not JSON: {text[:60]!r}") from None
    if not isinstance(choices, list):
        raise RequestSpecError(f"choice must be a list of strings, not {type(choices).__name__}")
    return choices


def _as_ebnf(text: str) -> str:
    """vLLM's grammar text in xgrammar's EBNF dialect (`Grammar.ebnf`): EBNF as it is, Lark
    (what vLLM takes for a grammar without `::=`) through xgrammar's Lark reader."""
    if any("::=" in line.split("#", 1)[0] for line in text.splitlines()):
        return text
    import xgrammar

    try:
        return str(xgrammar.Grammar.from_lark(text))
    except (RuntimeError, ValueError) as exc:
        raise InvalidEBNFError(f"invalid Lark grammar: {str(exc).splitlines()[0]}") from None


def _tag_as_ebnf(text: str, allow_unenforced: bool) -> tuple[str, tuple[str, ...]]:
    """A structural tag (xgrammar's format, which vLLM's tool parsers build for tool calls)
    as EBNF, through xgrammar's reader, and what of it goes unenforced. xgrammar turns the
    tag's JSON schemas into rules, so what xgrammar does not enforce of them is refused
    (NotFullyEnforcedError) unless `allow_unenforced`, as for a schema."""
    import xgrammar

    try:
        tag = json.loads(text)
        ebnf = str(xgrammar.Grammar.from_structural_tag(text))
    except (json.JSONDecodeError, RuntimeError, ValueError, TypeError) as exc:
        raise InvalidEBNFError(f"invalid structural tag: {str(exc).splitlines()[0]}") from None
    loose = tuple(
        f"{item} (schema at {path or '/'})"
        for path, schema in _tag_schemas(tag, "")
        for item in find_unenforced(schema, XGRAMMAR_SUPPORT)
    )
    if loose and not allow_unenforced:
        raise NotFullyEnforcedError(
            "the structural tag's JSON schemas are compiled by xgrammar, which does not "
            f"enforce: {'; '.join(loose)}; pass allow_unenforced to serve it anyway",
            {"xgrammar": loose},
        )
    return ebnf, loose


def _tag_schemas(node: Any, path: str) -> Iterator[tuple[str, Any]]:
    """(where, schema) for each JSON schema inside a structural tag."""
    if isinstance(node, dict):
        if node.get("type") == "json_schema" and "json_schema" in node:
            yield path, node["json_schema"]
            return
        for key, value in node.items():
            yield from _tag_schemas(value, f"{path}/{key}")
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from _tag_schemas(value, f"{path}/{index}")
