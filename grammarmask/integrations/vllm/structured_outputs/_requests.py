"""vLLM's structured-output requests as grammarmask requests.

vLLM hands a backend one `(kind, text)` pair per request (`StructuredOutputKey`): the JSON
schema, `json_object`, a regex, a choice list, a grammar (xgrammar's EBNF or Lark) or a
structural tag. Options of grammarmask's own (`backend`, `allow_unenforced`, `whitespace`,
`max_whitespace`, `strict`) may travel beside it in `vllm_xargs` / `extra_args` under
`grammarmask_options`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from ....errors import InvalidEBNFError, RequestSpecError
from .._spec import GRAMMAR_KEYS, RequestSpec, parse_entry

BACKEND_NAME = "grammarmask"
"""The name that chooses this backend: `--structured-outputs-config.backend grammarmask`."""

OPTIONS_KEY = "grammarmask_options"
"""The key of `extra_args` (`vllm_xargs`) for a request's options under this backend; not
the logits processor's `grammarmask` key, whose entry names a grammar of its own."""

JSON_OBJECT_SCHEMA: dict[str, Any] = {"type": "object"}
"""What `response_format={"type": "json_object"}` asks for: any JSON object."""


def structured_spec(kind: str, text: str, extra_args: Mapping[str, Any] | None) -> RequestSpec:
    """The grammarmask request for vLLM's `(kind, text)` (kind: the name of a
    `StructuredOutputOptions` member) and the request's options. Raises a GrammarError
    naming the problem (vLLM answers it with HTTP 400)."""
    entry = dict(_options(extra_args))
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
        raise RequestSpecError(
            "grammarmask's structured-output backend does not serve structural tags; "
            "send the tool's parameters as a JSON schema (tool_choice 'required' or a named "
            "function), or serve this request with vLLM's xgrammar backend"
        )
    else:
        raise RequestSpecError(f"unknown structured-output kind {kind!r}")
    return parse_entry(entry)


def _options(extra_args: Mapping[str, Any] | None) -> Mapping[str, Any]:
    """The request's grammarmask options: its entry, which must not name a grammar too."""
    if not extra_args or OPTIONS_KEY not in extra_args:
        return {}
    raw = extra_args[OPTIONS_KEY]
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise RequestSpecError(
                f"extra_args[{OPTIONS_KEY!r}] is not JSON: {exc.msg} at character {exc.pos}"
            ) from None
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
