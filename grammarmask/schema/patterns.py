"""Reading a schema's regular expressions for the judge: optional groups, negated
character classes and what they may exclude. The backends' own rules are built on these."""

from __future__ import annotations

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


def negated_classes(pattern: str) -> list[str]:
    """The bodies of the pattern's negated character classes (`[^...]`), escapes kept."""
    bodies, index = [], 0
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
        if negated:
            bodies.append(pattern[start:end])
        index = end + 1
    return bodies


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


def may_exclude_quote_or_backslash(body: str) -> bool:
    """A negated class with this body may exclude `"` or `\\`."""
    for item in _class_items(body):
        if isinstance(item, str):
            if item in "SDW":  # these cover both
                return True
        elif any(item[0] <= code <= item[1] for code in (0x22, 0x5C)):
            return True
    return False


def may_exclude_non_ascii(body: str) -> bool:
    """A negated class with this body may exclude a character outside ASCII."""
    return any(isinstance(item, str) or item[1] >= 0x80 for item in _class_items(body))


def negated_class_rule(
    node: dict[str, Any], pointer: str, excludes: Callable[[str], bool], what: str
) -> Iterable[Unenforced]:
    """The `pattern` and `patternProperties` of `node` whose negated classes `excludes`
    judges risky, reported as letting `what` through as a JSON escape."""
    reason = f"a negated character class that excludes {what} lets it through as a JSON escape"
    pattern = node.get("pattern")
    if isinstance(pattern, str) and any(map(excludes, negated_classes(pattern))):
        yield Unenforced(pointer, "pattern", reason)
    keys = node.get("patternProperties")
    if isinstance(keys, dict) and any(excludes(b) for k in keys for b in negated_classes(k)):
        yield Unenforced(pointer, "patternProperties", reason)
