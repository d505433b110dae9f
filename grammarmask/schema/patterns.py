"""Reading a schema's regular expressions for the judge: optional groups, character
classes and what they hold or may exclude, and the one rewrite of a class a backend needs
(U+0000 in a negated class, for llguidance). The backends' own rules are built on these."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Any

from .judge import Unenforced


def has_optional_group_ending_in_repetition(pattern: str) -> bool:
    """`pattern` holds a group like `(bc+)?`: optional, its last item repeated."""
    depth = 0
    escaped = in_class = False
    for index, char in enumerate(pattern):
        if escaped:
            escaped = False
        elif char == "\\":
            escaped = True
        elif in_class:
            in_class = char != "]"
        elif char == "[":
            in_class = True
        elif char == "(":
            depth += 1
        elif char == ")" and depth:
            depth -= 1
            last = pattern[index - 1] if index else ""
            follows = pattern[index + 1 : index + 2]
            if follows == "?" and last in "+*?}" and pattern[index - 2 : index - 1] != "\\":
                return True
    return False


def _class_spans(pattern: str) -> list[tuple[int, bool, str]]:
    """The pattern's character classes: (where the body starts, negated, body), escapes
    kept in the body."""
    spans, index = [], 0
    while index < len(pattern):
        char = pattern[index]
        if char == "\\":
            index += 2
            continue
        if char != "[":
            index += 1
            continue
        end = index + 1
        negated = pattern[end : end + 1] == "^"
        end += negated
        start = end
        while end < len(pattern) and pattern[end] != "]":
            end += 2 if pattern[end] == "\\" else 1
        spans.append((start, negated, pattern[start:end]))
        index = end + 1
    return spans


def character_classes(pattern: str) -> list[tuple[bool, str]]:
    """The pattern's character classes: (negated, body), escapes kept in the body."""
    return [(negated, body) for _, negated, body in _class_spans(pattern)]


def _outside_classes(pattern: str) -> str:
    """The pattern with every character class (brackets and all) cut out."""
    pieces, index = [], 0
    for start, negated, body in _class_spans(pattern):
        opening = start - 1 - negated
        pieces.append(pattern[index:opening])
        index = start + len(body) + 1
    return "".join(pieces) + pattern[index:]


_SHORTHANDS = frozenset("sSdDwW")
_ESCAPED = {"n": 10, "t": 9, "r": 13, "f": 12, "v": 11, "0": 0}


def _class_items(body: str) -> list[tuple[int, int] | str]:
    """A class body as code point ranges and shorthand letters (`\\s`, `\\W`, ...)."""
    atoms: list[int | str] = []  # code points, shorthands, and "-" for a bare hyphen
    index = 0
    while index < len(body):
        char = body[index]
        if char != "\\" or index + 1 == len(body):
            atoms.append("-" if char == "-" else ord(char))
            index += 1
            continue
        escaped = body[index + 1]
        digits = {"x": 2, "u": 4}.get(escaped, 0)
        code = body[index + 2 : index + 2 + digits]
        if digits and len(code) == digits and all(c in "0123456789abcdefABCDEF" for c in code):
            atoms.append(int(code, 16))
            index += 2 + digits
        else:
            atoms.append(escaped if escaped in _SHORTHANDS else _ESCAPED.get(escaped, ord(escaped)))
            index += 2
    items: list[tuple[int, int] | str] = []
    position = 0
    while position < len(atoms):
        atom = ord("-") if atoms[position] == "-" else atoms[position]  # a bare hyphen
        after = atoms[position + 2] if position + 2 < len(atoms) else None
        if isinstance(atom, str):
            items.append(atom)
            position += 1
        elif atoms[position + 1 : position + 2] == ["-"] and isinstance(after, int):
            items.append((atom, after))
            position += 3
        else:
            items.append((atom, atom))
            position += 1
    return items


def _covers(items: list[tuple[int, int] | str], code: int) -> bool:
    return any(
        item in "SDW" if isinstance(item, str) else item[0] <= code <= item[1] for item in items
    )  # \S, \D and \W cover a quote, a backslash and every character above U+FFFF


def may_exclude_non_ascii(negated: bool, body: str) -> bool:
    """A negated class with this body may exclude a character outside ASCII."""
    return negated and any(isinstance(i, str) or i[1] >= 0x80 for i in _class_items(body))


def _nul_without_quote_or_backslash(negated: bool, body: str) -> bool:
    """A class that holds U+0000 but not both `"` and `\\`."""
    items = _class_items(body)

    def holds(code: int) -> bool:
        return _covers(items, code) != negated

    return holds(0) and not (holds(0x22) and holds(0x5C))


_NUL_ESCAPE = re.compile(r"\\(?:x00|u0000|u\{0+\}|0+(?![1-7]))")
"""U+0000 written outside a class: `\\x00`, `\\u0000`, `\\u{0}`, `\\0` and its octal
spellings (`\\000`; `\\01` is U+0001)."""


def holds_nul_without_quote_or_backslash(pattern: str) -> bool:
    """Some class of `pattern` holds U+0000 but not both `"` and `\\`, or U+0000 stands
    alone outside a class (where the characters beside it are read together)."""
    if any(_nul_without_quote_or_backslash(*c) for c in character_classes(pattern)):
        return True
    outside = _outside_classes(pattern).replace("\\\\", "")
    return "\x00" in outside or _NUL_ESCAPE.search(outside) is not None


def without_nul_in_negated_classes(pattern: str) -> str:
    """`pattern` with U+0000 added to each negated class that holds it but not both `"` and
    `\\` (`[^\\\\]` becomes `[^\\x00\\\\]`): stricter by the strings that hold U+0000."""
    pieces, index = [], 0
    for start, negated, body in _class_spans(pattern):
        if negated and body and _nul_without_quote_or_backslash(negated, body):
            pieces.append(pattern[index:start] + "\\x00" + ("\\" if body[0] == "-" else ""))
            index = start
    return "".join(pieces) + pattern[index:]


def astral_beside_backslash(negated: bool, body: str) -> bool:
    """A class that holds a character above U+FFFF and the backslash."""
    items = _class_items(body)
    astral = any(not isinstance(i, str) and i[1] >= 0x10000 for i in items)
    return not negated and astral and _covers(items, 0x5C)


def pattern_rule(
    node: dict[str, Any], pointer: str, risky: Callable[[str], bool], reason: str
) -> Iterable[Unenforced]:
    """The `pattern` and `patternProperties` of `node` with a regex that `risky` judges a
    way for a JSON escape through."""
    pattern = node.get("pattern")
    if isinstance(pattern, str) and risky(pattern):
        yield Unenforced(pointer, "pattern", reason)
    keys = node.get("patternProperties")
    if isinstance(keys, dict) and any(risky(key) for key in keys):
        yield Unenforced(pointer, "patternProperties", reason)


def class_rule(
    node: dict[str, Any], pointer: str, risky: Callable[[bool, str], bool], reason: str
) -> Iterable[Unenforced]:
    """`pattern_rule` for a regex with a character class that `risky` (given whether it is
    negated, and its body) judges a way for a JSON escape through."""

    def has_risky_class(pattern: str) -> bool:
        return any(risky(*c) for c in character_classes(pattern))

    yield from pattern_rule(node, pointer, has_risky_class, reason)
