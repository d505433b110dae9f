"""A `pattern` as the language it denotes, so that its complement and its intersection with
another can be written back as one pattern: a `not` of a pattern, or two patterns of which
only one may match, then have an exact positive form.

A pattern means what jsonschema makes of it: Python's `re.search` on the decoded string
(`.` all but a newline, `\\d`, `\\w`, `\\s` as Python's Unicode classes, `$` at the end or
before a final newline, `^`/`\\A`, `\\Z` and `\\b` wherever they stand). Constructs outside
that reading (lookarounds, backreferences, flags, `\\B`) raise UnreadablePatternError, and the
caller keeps the keyword. The patterns written back hold only anchors at both ends,
character classes, alternation, groups and `*`, `+`, `?`: the dialect every backend parses
alike.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from ...errors import UnreadablePatternError

MAX_CODE_POINT = 0x10FFFF
SURROGATES = (0xD800, 0xDFFF)
MAX_STATES = 2000
"""Automata larger than this are not built: the pattern keeps its keyword."""
MAX_PATTERN_LENGTH = 6000
"""A written pattern longer than this is given up: backends compile long ones slowly."""
NO_STRING = "[^\\s\\S]"
"""A pattern no string matches."""
MAX_DEPTH = 150
"""Nesting of groups past this is given up (a long counted repetition written out)."""

Intervals = tuple[tuple[int, int], ...]
"""A set of code points: sorted, disjoint, non-adjacent inclusive ranges."""


# -- character sets ---------------------------------------------------------------------


def _normal(ranges: Iterable[tuple[int, int]]) -> Intervals:
    merged: list[tuple[int, int]] = []
    for low, high in sorted(ranges):
        if merged and low <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], high))
        else:
            merged.append((low, high))
    return tuple(merged)


def _invert(intervals: Intervals) -> Intervals:
    gaps, start = [], 0
    for low, high in intervals:
        if low > start:
            gaps.append((start, low - 1))
        start = high + 1
    if start <= MAX_CODE_POINT:
        gaps.append((start, MAX_CODE_POINT))
    return tuple(gaps)


EVERYTHING: Intervals = ((0, MAX_CODE_POINT),)
NEWLINE: Intervals = ((10, 10),)


@functools.cache
def _python_class(test: Callable[[str], bool]) -> Intervals:
    """The code points `test` accepts, as ranges (Python's `\\d`, `\\w`, `\\s` on str)."""
    ranges: list[tuple[int, int]] = []
    for code in range(MAX_CODE_POINT + 1):
        if test(chr(code)):
            if ranges and ranges[-1][1] == code - 1:
                ranges[-1] = (ranges[-1][0], code)
            else:
                ranges.append((code, code))
    return tuple(ranges)


def _is_word(char: str) -> bool:
    return char.isalnum() or char == "_"


_CLASS_ESCAPES: dict[str, tuple[Callable[[str], bool], bool]] = {
    "d": (str.isdecimal, False),
    "D": (str.isdecimal, True),
    "s": (str.isspace, False),
    "S": (str.isspace, True),
    "w": (_is_word, False),
    "W": (_is_word, True),
}
_CHAR_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "f": "\f", "v": "\v", "a": "\a"}


# -- the syntax tree --------------------------------------------------------------------


@dataclass(frozen=True)
class _Chars:
    intervals: Intervals


@dataclass(frozen=True)
class _Sequence:
    items: tuple[_Node, ...]


@dataclass(frozen=True)
class _Either:
    options: tuple[_Node, ...]


@dataclass(frozen=True)
class _Repeat:
    item: _Node
    low: int
    high: int | None


@dataclass(frozen=True)
class _Anchor:
    """A zero-width assertion: `START` (`^`, `\\A`), `END` (`$`: the end or a final newline
    before it), `VERY_END` (`\\Z`) or `WORD_BOUNDARY` (`\\b`)."""

    kind: str


START, END, VERY_END, WORD_BOUNDARY = "start", "end", "very end", "word boundary"
_ESCAPED_ANCHORS = {"A": START, "Z": VERY_END, "b": WORD_BOUNDARY}


_Node = _Chars | _Sequence | _Either | _Repeat | _Anchor


class _Parser:
    """A recursive-descent reader of Python's regex syntax, the constructs above only."""

    def __init__(self, pattern: str) -> None:
        self.text, self.at = pattern, 0
        self.escaped_anchor = False
        """Whether the pattern holds `\\A`, `\\Z` or `\\b` (which backends spell otherwise)."""

    def parse(self) -> _Node:
        node = self._either()
        if self.at != len(self.text):
            raise UnreadablePatternError(f"unbalanced ')' at {self.at}")
        return node

    def _peek(self, ahead: int = 0) -> str:
        index = self.at + ahead
        return self.text[index] if index < len(self.text) else ""

    def _either(self) -> _Node:
        options = [self._sequence()]
        while self._peek() == "|":
            self.at += 1
            options.append(self._sequence())
        return options[0] if len(options) == 1 else _Either(tuple(options))

    def _sequence(self) -> _Node:
        items: list[_Node] = []
        while self._peek() not in ("", "|", ")"):
            item = self._atom()
            low_high = self._quantifier()
            if low_high is not None:
                if isinstance(item, _Anchor):
                    raise UnreadablePatternError("a quantified anchor")
                item = _Repeat(item, *low_high)
            items.append(item)
        return items[0] if len(items) == 1 else _Sequence(tuple(items))

    def _quantifier(self) -> tuple[int, int | None] | None:
        char = self._peek()
        bounds: tuple[int, int | None] | None = None
        if char in ("*", "+", "?"):
            self.at += 1
            bounds = {"*": (0, None), "+": (1, None), "?": (0, 1)}[char]
        elif char == "{":
            bounds = self._counted()
        if bounds is None:
            return None
        if self._peek() == "?":
            self.at += 1  # lazy: the same language
        if self._peek() in ("*", "+", "?", "{") and self._peek():
            raise UnreadablePatternError("a possessive or repeated quantifier")
        return bounds

    def _counted(self) -> tuple[int, int | None] | None:
        end = self.text.find("}", self.at)
        if end < 0:
            return None
        body = self.text[self.at + 1 : end]
        low_text, comma, high_text = body.partition(",")
        if not (low_text.isdigit() or (comma and not low_text)) or not (
            high_text.isdigit() or not high_text
        ):
            return None  # Python reads such a brace as a literal
        if not low_text and not high_text:
            return None
        if not all(part.isascii() for part in (low_text, high_text)):
            return None
        low = int(low_text) if low_text else 0
        high = (int(high_text) if high_text else None) if comma else low
        if high is not None and high < low:
            raise UnreadablePatternError("a counted repetition whose maximum is below its minimum")
        self.at = end + 1
        return low, high

    def _atom(self) -> _Node:
        char = self._peek()
        self.at += 1
        if char == "(":
            if self._peek() == "?":
                if self._peek(1) != ":":
                    raise UnreadablePatternError("a group with flags, a name or a lookaround")
                self.at += 2
            inner = self._either()
            if self._peek() != ")":
                raise UnreadablePatternError("an unclosed group")
            self.at += 1
            return inner
        if char in ("*", "+", "?"):
            raise UnreadablePatternError("a quantifier with nothing to repeat")
        if char == "^":
            return _Anchor(START)
        if char == "$":
            return _Anchor(END)
        if char == ".":
            return _Chars(_invert(NEWLINE))
        if char == "[":
            return _Chars(self._class())
        if char == "\\":
            anchor = _ESCAPED_ANCHORS.get(self._peek())
            if anchor is not None:
                self.at += 1
                self.escaped_anchor = True
                return _Anchor(anchor)
            return _Chars(self._escape(in_class=False))
        return _Chars(((ord(char), ord(char)),))

    def _class(self) -> Intervals:
        negated = self._peek() == "^"
        if negated:
            self.at += 1
        ranges: list[tuple[int, int]] = []
        first = True
        while True:
            char = self._peek()
            if not char:
                raise UnreadablePatternError("an unclosed character class")
            if char == "]" and not first:
                self.at += 1
                break
            if char == "[" and self._peek(1) in (":", "=", "."):
                raise UnreadablePatternError("a POSIX class")
            first = False
            low = self._class_item()
            if self._peek() == "-" and self._peek(1) not in ("]", ""):
                self.at += 1
                high = self._class_item()
                if len(low) != 1 or len(high) != 1 or low[0][0] != low[0][1]:
                    raise UnreadablePatternError("a range between classes")
                if high[0][0] != high[0][1] or high[0][0] < low[0][0]:
                    raise UnreadablePatternError("a range out of order")
                ranges.append((low[0][0], high[0][0]))
            else:
                ranges.extend(low)
        intervals = _normal(ranges)
        return _invert(intervals) if negated else intervals

    def _class_item(self) -> Intervals:
        char = self._peek()
        self.at += 1
        if char == "\\":
            return self._escape(in_class=True)
        return ((ord(char), ord(char)),)

    def _escape(self, *, in_class: bool) -> Intervals:
        char = self._peek()
        self.at += 1
        if not char:
            raise UnreadablePatternError("a pattern ending in a backslash")
        if char in _CLASS_ESCAPES:
            test, negated = _CLASS_ESCAPES[char]
            intervals = _python_class(test)
            return _invert(intervals) if negated else intervals
        if char in _CHAR_ESCAPES:
            code = ord(_CHAR_ESCAPES[char])
            return ((code, code),)
        if char in ("x", "u", "U"):
            width = {"x": 2, "u": 4, "U": 8}[char]
            digits = self.text[self.at : self.at + width]
            if len(digits) != width or any(d not in "0123456789abcdefABCDEF" for d in digits):
                raise UnreadablePatternError(f"a malformed \\{char} escape")
            self.at += width
            code = int(digits, 16)
            if code > MAX_CODE_POINT:
                raise UnreadablePatternError("an escape past the last code point")
            return ((code, code),)
        if char.isascii() and char.isalnum():
            raise UnreadablePatternError(f"the escape \\{char}")
        if not char.isascii() and not in_class and char.isalnum():
            raise UnreadablePatternError(f"the escape \\{char}")
        return ((ord(char), ord(char)),)


# -- reading a pattern as search --------------------------------------------------------


def _searched(tree: _Node, *, end_only: bool = False) -> _Node:
    """What `re.search(pattern, s)` accepts, as a whole-string match: each top-level
    option is preceded by anything unless it starts with `^`, and followed by anything
    unless it ends with `$` (then by an optional newline; `end_only`: by nothing, as a
    backend reads `$`, which holds for every other `$` too) or `\\Z`. Anchors elsewhere
    stay in the tree as assertions."""
    anything = _Repeat(_Chars(EVERYTHING), 0, None)
    whole = []
    for starts, items, ending in _options(_ends_only(tree) if end_only else tree):
        head: list[_Node] = [] if starts else [anything]
        tail: list[_Node] = [anything]
        if ending == _Anchor(END):
            tail = [_Repeat(_Chars(NEWLINE), 0, 1)]
        elif ending == _Anchor(VERY_END):
            tail = []
        whole.append(_Sequence((*head, *items, *tail)))
    return _Either(tuple(whole))


def _options(tree: _Node) -> list[tuple[bool, tuple[_Node, ...], _Anchor | None]]:
    """Each top-level option of `tree`: whether it starts with `^`, the items between, and
    the `$` or `\\Z` it ends with (None where it ends otherwise)."""
    found = []
    for option in tree.options if isinstance(tree, _Either) else (tree,):
        items = option.items if isinstance(option, _Sequence) else (option,)
        starts = bool(items) and items[0] == _Anchor(START)
        if starts:
            items = items[1:]
        ending = items[-1] if items and items[-1] in (_Anchor(END), _Anchor(VERY_END)) else None
        found.append((starts, items[:-1] if ending else items, ending))
    return found


def _read(pattern: str) -> tuple[_Node, bool]:
    """The tree of `pattern`, and whether it holds an anchor a backend reads otherwise or
    not at all: `\\A`, `\\Z` or `\\b` anywhere, or `^`/`$` other than at a top-level
    option's ends."""
    parser = _Parser(pattern)
    tree = parser.parse()
    inside = any(_holds_anchor(item, _ANCHORS) for _, items, _ in _options(tree) for item in items)
    return tree, parser.escaped_anchor or inside


def _ends_only(node: _Node) -> _Node:
    """`node` with each `$` read as `\\Z` (a backend's `$`)."""
    if node == _Anchor(END):
        return _Anchor(VERY_END)
    if isinstance(node, _Sequence):
        return _Sequence(tuple(map(_ends_only, node.items)))
    if isinstance(node, _Either):
        return _Either(tuple(map(_ends_only, node.options)))
    if isinstance(node, _Repeat):
        return _Repeat(_ends_only(node.item), node.low, node.high)
    return node


def _holds_anchor(node: _Node, kinds: frozenset[str]) -> bool:
    """Whether `node` holds an assertion of one of `kinds`."""
    if isinstance(node, _Anchor):
        return node.kind in kinds
    if isinstance(node, _Sequence):
        return any(_holds_anchor(item, kinds) for item in node.items)
    if isinstance(node, _Either):
        return any(_holds_anchor(option, kinds) for option in node.options)
    if isinstance(node, _Repeat):
        return _holds_anchor(node.item, kinds)
    return False


def _char_sets(node: _Node) -> Iterable[Intervals]:
    if isinstance(node, _Chars):
        yield node.intervals
    elif isinstance(node, _Sequence):
        for item in node.items:
            yield from _char_sets(item)
    elif isinstance(node, _Either):
        for option in node.options:
            yield from _char_sets(option)
    elif isinstance(node, _Repeat):
        yield from _char_sets(node.item)
    elif node == _Anchor(WORD_BOUNDARY):
        yield _python_class(_is_word)


# -- automata ---------------------------------------------------------------------------


class Alphabet:
    """The code points split into classes that every character set of some patterns either
    holds whole or not at all: automata over one alphabet combine class by class."""

    def __init__(self, sets: Iterable[Intervals]) -> None:
        sets = list(dict.fromkeys([EVERYTHING, *sets]))
        cuts = sorted(
            {0, MAX_CODE_POINT + 1} | {c for s in sets for lo, hi in s for c in (lo, hi + 1)}
        )
        pieces = list(itertools.pairwise(cuts))
        signatures: dict[tuple[bool, ...], list[tuple[int, int]]] = {}
        for low, end in pieces:
            key = tuple(_contains(s, low) for s in sets)
            signatures.setdefault(key, []).append((low, end - 1))
        self.classes: list[Intervals] = [_normal(r) for r in signatures.values()]
        self._signatures = list(signatures)
        self.sets = sets
        """The character sets given, each a union of classes."""

    def class_of(self, code: int) -> int:
        """The class that holds the code point `code`."""
        return next(i for i, klass in enumerate(self.classes) if _contains(klass, code))

    def members(self, intervals: Intervals) -> frozenset[int]:
        """The classes that make up `intervals` (one of the sets given)."""
        column = self.sets.index(intervals)
        return frozenset(i for i, key in enumerate(self._signatures) if key[column])


def _contains(intervals: Intervals, code: int) -> bool:
    return any(low <= code <= high for low, high in intervals)


@dataclass(frozen=True)
class Automaton:
    """A complete deterministic automaton over an Alphabet's classes: `moves[state][c]` is
    the next state on class c; state 0 starts."""

    moves: tuple[tuple[int, ...], ...]
    accepting: frozenset[int]

    def complement(self) -> Automaton:
        return Automaton(self.moves, frozenset(range(len(self.moves))) - self.accepting)

    def intersection(self, other: Automaton) -> Automaton:
        return _product(self, other, lambda a, b: a and b)

    def accepts(self, text: str, alphabet: Alphabet) -> bool:
        state = 0
        for char in text:
            state = self.moves[state][alphabet.class_of(ord(char))]
        return state in self.accepting

    def is_empty(self) -> bool:
        return not (self.accepting & _reachable(self.moves))


def _reachable(moves: Sequence[Sequence[int]]) -> set[int]:
    seen, todo = {0}, [0]
    while todo:
        for target in moves[todo.pop()]:
            if target not in seen:
                seen.add(target)
                todo.append(target)
    return seen


def _product(first: Automaton, second: Automaton, keep: Callable[[bool, bool], bool]) -> Automaton:
    index = {(0, 0): 0}
    order = [(0, 0)]
    moves: list[tuple[int, ...]] = []
    for a, b in order:
        row = []
        for target in zip(first.moves[a], second.moves[b], strict=True):
            if target not in index:
                if len(order) >= MAX_STATES:
                    raise UnreadablePatternError("an automaton past the size limit")
                index[target] = len(order)
                order.append(target)
            row.append(index[target])
        moves.append(tuple(row))
    accepting = frozenset(
        i for i, (a, b) in enumerate(order) if keep(a in first.accepting, b in second.accepting)
    )
    return _minimal(Automaton(tuple(moves), accepting))


def automaton(pattern: str, alphabet: Alphabet) -> Automaton:
    """The strings `re.search(pattern, s)` finds a match in, as an automaton over
    `alphabet` (built from `sets_of` of this pattern and any it will be combined with)."""
    return _determinise(_searched(_Parser(pattern).parse()), alphabet)


def sets_of(pattern: str) -> list[Intervals]:
    """The character sets `pattern` uses, for an Alphabet."""
    return [*_char_sets(_Parser(pattern).parse()), NEWLINE]


_Thread = tuple[int, int, int]
"""A state of the construction below with what its assertions still ask of the rest: how
it must end (`_FREE`, `_NEWLINE_OR_END`, `_AT_END`) and what the next character must be
(`_ANY`, `_WORD`, `_NON_WORD_OR_END`)."""
_FREE, _NEWLINE_OR_END, _AT_END = 0, 1, 2
_ANY, _WORD, _NON_WORD_OR_END = 0, 1, 2


def _asserted(
    kind: str, thread: _Thread, target: int, *, at_start: bool, after_word: bool
) -> _Thread | None:
    """`thread` past an assertion of `kind` into `target`, or None where it cannot hold."""
    _, ending, following = thread
    if kind == START:
        return (target, ending, following) if at_start else None
    if kind in (END, VERY_END):
        return (target, max(ending, _NEWLINE_OR_END if kind == END else _AT_END), following)
    wanted = _NON_WORD_OR_END if after_word else _WORD
    return (target, ending, wanted) if following in (_ANY, wanted) else None


def _determinise(tree: _Node, alphabet: Alphabet) -> Automaton:
    edges: list[list[tuple[frozenset[int] | str | None, int]]] = [[]]

    def state() -> int:
        edges.append([])
        if len(edges) > 20 * MAX_STATES:
            raise UnreadablePatternError("a pattern past the size limit")
        return len(edges) - 1

    def build(node: _Node, start: int) -> int:  # Thompson's construction: the end state
        if isinstance(node, _Chars | _Anchor):
            end = state()
            label = node.kind if isinstance(node, _Anchor) else alphabet.members(node.intervals)
            edges[start].append((label, end))
            return end
        if isinstance(node, _Sequence):
            for item in node.items:
                start = build(item, start)
            return start
        if isinstance(node, _Either):
            end = state()
            for option in node.options:
                edges[build(option, start)].append((None, end))
            return end
        assert isinstance(node, _Repeat)
        for _ in range(node.low):
            start = build(node.item, start)
        if node.high is None:
            loop = state()
            edges[start].append((None, loop))
            edges[build(node.item, loop)].append((None, loop))
            return loop
        end = state()
        edges[start].append((None, end))
        for _ in range(node.high - node.low):
            start = build(node.item, start)
            edges[start].append((None, end))
        return end

    final = build(tree, 0)
    word = None
    if _holds_anchor(tree, _BOUNDARY):
        if _python_class(_is_word) not in alphabet.sets:
            raise UnreadablePatternError("a \\b over an alphabet that does not split off \\w")
        word = alphabet.members(_python_class(_is_word))
    newline = alphabet.class_of(10)
    if _holds_anchor(tree, _ENDS) and alphabet.classes[newline] != NEWLINE:
        raise UnreadablePatternError("an anchor over an alphabet that does not split off \\n")

    def closure(
        threads: Iterable[_Thread], *, at_start: bool, after_word: bool
    ) -> frozenset[_Thread]:
        seen, todo = set(threads), list(threads)
        while todo:
            thread = todo.pop()
            for label, target in edges[thread[0]]:
                if isinstance(label, frozenset):
                    continue
                if label is None:
                    reached: _Thread | None = (target, thread[1], thread[2])
                else:
                    reached = _asserted(
                        label, thread, target, at_start=at_start, after_word=after_word
                    )
                if reached is not None and reached not in seen:
                    seen.add(reached)
                    todo.append(reached)
        return frozenset(seen)

    def step(threads: frozenset[_Thread], klass: int) -> frozenset[_Thread]:
        is_word = word is not None and klass in word
        moved: list[_Thread] = []
        for current, ending, following in threads:
            if following == (_NON_WORD_OR_END if is_word else _WORD):
                continue  # the boundary before this character does not hold
            if ending == _AT_END or (ending == _NEWLINE_OR_END and klass != newline):
                continue
            after = _AT_END if ending == _NEWLINE_OR_END else _FREE
            moved.extend(
                (target, after, _ANY)
                for label, target in edges[current]
                if isinstance(label, frozenset) and klass in label
            )
        return closure(moved, at_start=False, after_word=is_word)

    start_set = closure([(0, _FREE, _ANY)], at_start=True, after_word=False)
    index = {start_set: 0}
    order = [start_set]
    moves: list[tuple[int, ...]] = []
    for current in order:
        row = []
        for klass in range(len(alphabet.classes)):
            target = step(current, klass)
            if target not in index:
                if len(order) >= MAX_STATES:
                    raise UnreadablePatternError("an automaton past the size limit")
                index[target] = len(order)
                order.append(target)
            row.append(index[target])
        moves.append(tuple(row))
    accepting = frozenset(
        i
        for i, threads in enumerate(order)
        if any(t[0] == final and t[2] != _WORD for t in threads)
    )
    return _minimal(Automaton(tuple(moves), accepting))


_BOUNDARY = frozenset({WORD_BOUNDARY})
_ENDS = frozenset({END, VERY_END})
_ANCHORS = frozenset({START, END, VERY_END, WORD_BOUNDARY})


def _minimal(machine: Automaton) -> Automaton:
    """The equivalent automaton with fewest states (Moore's refinement), reachable only."""
    alive = sorted(_reachable(machine.moves))
    renumber = {s: i for i, s in enumerate(alive)}
    moves = [tuple(renumber[t] for t in machine.moves[s]) for s in alive]
    block = [int(s in machine.accepting) for s in alive]
    while True:
        keys = [(block[s], *(block[t] for t in moves[s])) for s in range(len(moves))]
        numbering: dict[tuple[int, ...], int] = {}
        refined = [numbering.setdefault(k, len(numbering)) for k in keys]
        if len(numbering) == len(set(block)):
            break
        block = refined
    first: dict[int, int] = {}
    for s in range(len(moves)):
        first.setdefault(block[s], s)  # state 0's block comes first: the start stays 0
    names = {b: i for i, b in enumerate(first)}
    merged = tuple(tuple(names[block[t]] for t in moves[s]) for s in first.values())
    accepting = frozenset(names[block[renumber[s]]] for s in alive if s in machine.accepting)
    return Automaton(merged, accepting)


# -- writing an automaton back as a pattern ----------------------------------------------


@dataclass(frozen=True)
class _Set:
    classes: frozenset[int]


@dataclass(frozen=True)
class _Cat:
    items: tuple[_Written, ...]


@dataclass(frozen=True)
class _Alt:
    options: tuple[_Written, ...]


@dataclass(frozen=True)
class _Loop:
    item: _Written
    at_least_once: bool


_Written = _Set | _Cat | _Alt | _Loop
_EMPTY = _Cat(())
"""The empty string."""


def _cat(*parts: _Written) -> _Written:
    items: list[_Written] = []
    for part in parts:
        items.extend(part.items if isinstance(part, _Cat) else [part])
    for index in range(1, len(items)):  # x x* -> x+
        if items[index] == _Loop(items[index - 1], at_least_once=False):
            items[index - 1], items[index] = _Loop(items[index - 1], at_least_once=True), _EMPTY
    items = [item for item in items if item != _EMPTY]
    return items[0] if len(items) == 1 else _Cat(tuple(items))


def _alt(*parts: _Written) -> _Written:
    options: list[_Written] = []
    classes: frozenset[int] = frozenset()
    for part in parts:
        for option in part.options if isinstance(part, _Alt) else (part,):
            if isinstance(option, _Set):
                classes |= option.classes
            elif option not in options:
                options.append(option)
    if classes:
        options.insert(0, _Set(classes))
    return options[0] if len(options) == 1 else _Alt(tuple(options))


def _star(part: _Written) -> _Written:
    if part == _EMPTY:
        return _EMPTY
    if isinstance(part, _Alt) and _EMPTY in part.options:
        part = _alt(*(o for o in part.options if o != _EMPTY))
    if isinstance(part, _Loop):
        part = part.item
    return _Loop(part, at_least_once=False)


def _pattern_of(machine: Automaton, alphabet: Alphabet) -> str:
    """The whole-string language of `machine` as one pattern body (no anchors), by state
    elimination; UnreadablePatternError past MAX_PATTERN_LENGTH or MAX_DEPTH."""
    moves, accepting = machine.moves, machine.accepting
    useful = _coreachable(moves, accepting)
    start, final = len(moves), len(moves) + 1
    edges: dict[tuple[int, int], _Written] = {(start, 0): _EMPTY}
    for state in useful:
        by_target: dict[int, set[int]] = {}
        for klass, target in enumerate(moves[state]):
            if target in useful:
                by_target.setdefault(target, set()).add(klass)
        for target, classes in by_target.items():
            edges[(state, target)] = _Set(frozenset(classes))
        if state in accepting:
            edges[(state, final)] = _EMPTY
    left = set(useful)
    while left:
        state = min(sorted(left), key=lambda s: _cost(edges, s))
        left.remove(state)
        loop = edges.pop((state, state), None)
        ins = [(p, r) for (p, q), r in edges.items() if q == state]
        outs = [(q, r) for (p, q), r in edges.items() if p == state]
        for p, _ in ins:
            del edges[(p, state)]
        for q, _ in outs:
            del edges[(state, q)]
        for p, into in ins:
            for q, out in outs:
                through = _cat(into, _star(loop), out) if loop else _cat(into, out)
                edges[(p, q)] = _alt(edges[(p, q)], through) if (p, q) in edges else through
                size, depth = _measure(edges[(p, q)])
                if size > MAX_PATTERN_LENGTH or depth > MAX_DEPTH:
                    raise UnreadablePatternError("a written pattern past the size limit")
    body = _write(edges.get((start, final), _Alt(())), alphabet, in_sequence=True)
    if len(body) > MAX_PATTERN_LENGTH:
        raise UnreadablePatternError("a written pattern past the size limit")
    return body


def _cost(edges: dict[tuple[int, int], _Written], state: int) -> int:
    """How many edges eliminating `state` makes: fewest first keeps the pattern short."""
    ins = sum(1 for (p, q) in edges if q == state and p != state)
    outs = sum(1 for (p, q) in edges if p == state and q != state)
    return ins * outs


@functools.lru_cache(maxsize=65536)
def _measure(part: _Written) -> tuple[int, int]:
    """A lower bound on the written length of `part` (a character set counts 1) and its
    nesting depth; measured as parts are made, so each call recurses one level."""
    if isinstance(part, _Set):
        return 1, 1
    children = (
        part.items
        if isinstance(part, _Cat)
        else part.options
        if isinstance(part, _Alt)
        else (part.item,)
    )
    measured = [_measure(child) for child in children]
    return sum(m[0] for m in measured) + 1, max((m[1] for m in measured), default=0) + 1


def _coreachable(moves: Sequence[Sequence[int]], accepting: frozenset[int]) -> set[int]:
    useful = set(accepting)
    changed = True
    while changed:
        changed = False
        for state, row in enumerate(moves):
            if state not in useful and any(t in useful for t in row):
                useful.add(state)
                changed = True
    return useful


def _write(part: _Written, alphabet: Alphabet, *, in_sequence: bool = False) -> str:
    """`part` as pattern text; `in_sequence`: an alternation there needs a group."""
    if isinstance(part, _Set):
        return _write_chars(_normal(r for c in part.classes for r in alphabet.classes[c]))
    if isinstance(part, _Cat):
        if not part.items:
            return "()" if in_sequence else ""
        return "".join(_write(item, alphabet, in_sequence=True) for item in part.items)
    if isinstance(part, _Alt):
        options = [o for o in part.options if o != _EMPTY]
        if not options:
            return "" if part.options else NO_STRING
        text = "|".join(_write(o, alphabet) for o in options)
        if len(options) < len(part.options):
            return _quantified(options, text, "?")
        return f"({text})" if in_sequence and len(options) > 1 else text
    return _quantified([part.item], _write(part.item, alphabet), "+" if part.at_least_once else "*")


def _quantified(options: Sequence[_Written], text: str, quantifier: str) -> str:
    """`text` under a quantifier: one character set as it is, anything else grouped."""
    if len(options) == 1 and isinstance(options[0], _Set):
        return text + quantifier
    return f"({text}){quantifier}"


def _write_chars(intervals: Intervals) -> str:
    """A character set as a class; surrogates (no string a backend emits holds one alone)
    are left out of a listed class, and a negated class is used only where the set holds
    them all, so the class written never holds more than the set."""
    listed = _without_surrogates(intervals)
    excluded = _without_surrogates(_invert(intervals))
    holds_surrogates = any(
        low <= SURROGATES[0] and SURROGATES[1] <= high for low, high in intervals
    )
    if not excluded and holds_surrogates:
        return "[\\s\\S]"
    if len(listed) == 1 and listed[0][0] == listed[0][1]:
        return _char(listed[0][0])
    if holds_surrogates and len(excluded) < len(listed):
        return "[^" + "".join(_range(r) for r in excluded) + "]"
    if not listed:
        return NO_STRING
    return "[" + "".join(_range(r) for r in listed) + "]"


def _without_surrogates(intervals: Intervals) -> Intervals:
    low_s, high_s = SURROGATES
    pieces = []
    for low, high in intervals:
        if high < low_s or low > high_s:
            pieces.append((low, high))
            continue
        if low < low_s:
            pieces.append((low, low_s - 1))
        if high > high_s:
            pieces.append((high_s + 1, high))
    return tuple(pieces)


def _range(bounds: tuple[int, int]) -> str:
    low, high = bounds
    if low == high:
        return _char(low)
    if high == low + 1:
        return _char(low) + _char(high)
    return f"{_char(low)}-{_char(high)}"


def _char(code: int) -> str:
    """One code point in every backend's dialect: ASCII letters and digits as they are, the
    rest of the BMP as `\\uXXXX`, the planes above as the character itself."""
    char = chr(code)
    if char.isascii() and char.isalnum():
        return char
    if code >= 0x10000:
        return char
    return f"\\u{code:04x}"


# -- the entry point ---------------------------------------------------------------------


def combined_pattern(
    matching: Sequence[str], failing: Sequence[str], *, whole: bool = False
) -> str | bool:
    """One anchored pattern for the strings every `matching` pattern finds a match in and no
    `failing` pattern does (each read as jsonschema reads it); False where no string is
    such, True where every string is. UnreadablePatternError where a pattern is outside the
    constructs read here, the automata or the written pattern are too large, or the
    written pattern would read differently under Python's `$` (a final newline). `whole`:
    written for a backend, whose `$` is only the end: its reading is exactly these strings,
    and jsonschema's also takes each with one more final newline (for property names,
    which a backend must match exactly: a name it fails to match falls to
    `additionalProperties`)."""
    sets = [s for p in [*matching, *failing] for s in sets_of(p)]
    alphabet = Alphabet(sets)
    machine = _everything(alphabet)
    for pattern in matching:
        machine = machine.intersection(automaton(pattern, alphabet))
    for pattern in failing:
        machine = machine.intersection(automaton(pattern, alphabet).complement())
    if machine.is_empty():
        return False
    if machine.complement().is_empty():
        return True
    return _written_whole(machine if whole else _as_python_reads_it(machine, alphabet), alphabet)


@dataclass(frozen=True)
class Matching:
    """The strings `pattern` finds a match in (jsonschema's reading)."""

    pattern: str


@dataclass(frozen=True)
class Lengths:
    """The strings of `least` to `most` code points (`most` None: no upper bound)."""

    least: int
    most: int | None


@dataclass(frozen=True)
class AllOf:
    """The strings in every part (no parts: every string)."""

    parts: tuple[Strings, ...]


@dataclass(frozen=True)
class AnyOf:
    """The strings in some part (no parts: none)."""

    parts: tuple[Strings, ...]


@dataclass(frozen=True)
class Outside:
    """The strings not in `part`."""

    part: Strings


@dataclass(frozen=True)
class Listed:
    """These strings and no others."""

    values: tuple[str, ...]


Strings = Matching | Lengths | Listed | AllOf | AnyOf | Outside
"""A set of strings as a boolean combination of patterns and length bounds."""


def language_pattern(strings: Strings, *, whole: bool = False) -> str | bool:
    """One anchored pattern for `strings`, written as `combined_pattern` writes it (with
    `whole`: for a backend, whose `$` is only the end; jsonschema then also takes each
    string with one more final newline). False where no string is in it, True where every
    string is; UnreadablePatternError as there."""
    alphabet = Alphabet(_string_sets(strings))
    machine = _language(strings, alphabet, _everything(alphabet))
    if machine.is_empty():
        return False
    if machine.complement().is_empty():
        return True
    return _written_whole(machine if whole else _as_python_reads_it(machine, alphabet), alphabet)


def _string_sets(strings: Strings) -> list[Intervals]:
    if isinstance(strings, Matching):
        return sets_of(strings.pattern)
    if isinstance(strings, Lengths):
        return [NEWLINE]
    if isinstance(strings, Listed):
        return [NEWLINE, *(((ord(c), ord(c)),) for value in strings.values for c in value)]
    if isinstance(strings, Outside):
        return _string_sets(strings.part)
    return [NEWLINE, *(s for part in strings.parts for s in _string_sets(part))]


def _language(strings: Strings, alphabet: Alphabet, within: Automaton) -> Automaton:
    """The strings of `strings` that `within` holds: every part is built inside the bounds
    met so far, so that the automata stay small (a length bound first keeps them finite)."""
    if isinstance(strings, Matching):
        return within.intersection(automaton(strings.pattern, alphabet))
    if isinstance(strings, Lengths):
        if max(strings.least, strings.most or 0) > MAX_STATES:
            raise UnreadablePatternError("a length bound past the size limit")
        bounded = _determinise(_Repeat(_Chars(EVERYTHING), strings.least, strings.most), alphabet)
        return within.intersection(bounded)
    if isinstance(strings, Listed):
        words = tuple(
            _Sequence(tuple(_Chars(((ord(c), ord(c)),)) for c in value)) for value in strings.values
        )
        return within.intersection(_determinise(_Either(words), alphabet))
    if isinstance(strings, Outside):
        return within.intersection(_language(strings.part, alphabet, within).complement())
    if isinstance(strings, AllOf):
        for part in sorted(strings.parts, key=_building_order):
            within = _language(part, alphabet, within)
        return within
    found = _nothing(alphabet)
    for part in strings.parts:
        found = _product(found, _language(part, alphabet, within), lambda a, b: a or b)
    return found


def _building_order(strings: Strings) -> int:
    """Length bounds first, then patterns, then the combinations: the cheap bounds first."""
    return 0 if isinstance(strings, Lengths) else 1 if isinstance(strings, Matching) else 2


def _everything(alphabet: Alphabet) -> Automaton:
    return Automaton((tuple(0 for _ in alphabet.classes),), frozenset({0}))


def _nothing(alphabet: Alphabet) -> Automaton:
    return Automaton((tuple(0 for _ in alphabet.classes),), frozenset())


def _as_python_reads_it(machine: Automaton, alphabet: Alphabet) -> Automaton:
    """The automaton R to write as `^R$`: Python reads that as R and R with a final newline,
    a backend as R alone; so R is the largest set that Python's reading keeps inside
    `machine`, its strings that stay in it with one more final newline (a backend then
    refuses a final newline that Python passes: stricter). UnreadablePatternError where even
    that R misses some of `machine`: then no R exists."""
    (newline,) = alphabet.members(NEWLINE)
    before_newline = frozenset(
        state for state, row in enumerate(machine.moves) if row[newline] in machine.accepting
    )
    written = machine.intersection(Automaton(machine.moves, before_newline))
    if not _equal(_product(written, _then_newline(written, newline), lambda a, b: a or b), machine):
        raise UnreadablePatternError(
            "no pattern reads alike with and without Python's final newline"
        )
    return written


def _then_newline(machine: Automaton, newline: int) -> Automaton:
    """The strings of `machine` followed by one newline."""
    index = {(0, False): 0}
    order = [(0, False)]
    moves: list[tuple[int, ...]] = []
    for state, _ in order:
        row = []
        for klass, target in enumerate(machine.moves[state]):
            key = (target, klass == newline and state in machine.accepting)
            if key not in index:
                index[key] = len(order)
                order.append(key)
            row.append(index[key])
        moves.append(tuple(row))
    return _minimal(Automaton(tuple(moves), frozenset(i for i, (_, f) in enumerate(order) if f)))


def _equal(first: Automaton, second: Automaton) -> bool:
    return _product(first, second, lambda a, b: a != b).is_empty()


MAX_REGIONS = 24
"""Overlapping patterns are split into at most this many regions."""


def regions(patterns: Sequence[str]) -> list[tuple[str | bool, tuple[int, ...]]] | None:
    """The strings matched by exactly the patterns at some indices, for each such set of
    indices that some string has: (one pattern for them, or True for every string; the
    indices). None where the patterns are already disjoint; UnreadablePatternError where they
    cannot be split or give too many regions. The patterns are written for a backend, as
    `combined_pattern` with `whole` writes them."""
    alphabet = Alphabet([s for p in patterns for s in sets_of(p)])
    machines = [automaton(p, alphabet) for p in patterns]
    if all(a.intersection(b).is_empty() for a, b in itertools.combinations(machines, 2)):
        return None
    return [(_written_whole(r, alphabet), members) for r, members in _refined(machines)]


@dataclass(frozen=True)
class NameSplit:
    """Property names cut by a language of allowed names (`propertyNames`): which listed
    names it allows, the regions of the patterns inside it (as `regions` gives them), and
    the allowed names that no listed name or pattern covers (a pattern, True for every
    string, False for none). Patterns written for a backend."""

    allowed: tuple[bool, ...]
    regions: tuple[tuple[str | bool, tuple[int, ...]], ...]
    rest: str | bool


def split_names(allowed: Strings, listed: Sequence[str], patterns: Sequence[str]) -> NameSplit:
    """`listed` names and `patterns` (jsonschema's reading) within the `allowed` names;
    UnreadablePatternError as for `regions`."""
    alphabet = Alphabet(
        [*_string_sets(allowed), *_string_sets(Listed(tuple(listed)))]
        + [s for p in patterns for s in sets_of(p)]
    )
    inside = _language(allowed, alphabet, _everything(alphabet))
    machines = [inside.intersection(automaton(p, alphabet)) for p in patterns]
    rest = inside.intersection(
        _language(Listed(tuple(listed)), alphabet, _everything(alphabet)).complement()
    )
    for machine in machines:
        rest = rest.intersection(machine.complement())
    return NameSplit(
        tuple(bool(inside.accepts(name, alphabet)) for name in listed),
        tuple((_written_whole(r, alphabet), m) for r, m in _refined(machines)),
        False if rest.is_empty() else _written_whole(rest, alphabet),
    )


def _refined(machines: Sequence[Automaton]) -> list[tuple[Automaton, tuple[int, ...]]]:
    """The non-empty regions of `machines`: each with the indices of the machines it is in."""
    found: list[tuple[Automaton, tuple[int, ...]]] = []
    for index, machine in enumerate(machines):
        alone = machine
        refined: list[tuple[Automaton, tuple[int, ...]]] = []
        for region, members in found:
            for part, part_members in (
                (region.intersection(machine), (*members, index)),
                (region.intersection(machine.complement()), members),
            ):
                if not part.is_empty():
                    refined.append((part, part_members))
            alone = alone.intersection(region.complement())
        if not alone.is_empty():
            refined.append((alone, (index,)))
        if len(refined) > MAX_REGIONS:
            raise UnreadablePatternError(
                f"overlapping patterns that make more than {MAX_REGIONS} regions"
            )
        found = refined
    return found


def _written_whole(machine: Automaton, alphabet: Alphabet) -> str | bool:
    if machine.complement().is_empty():
        return True
    return f"^{_pattern_of(machine, alphabet)}$"


def name_pattern(pattern: str) -> str | None:
    """A pattern that a backend (whose `$` is only the end) matches on exactly the property
    names jsonschema matches `pattern` on (Python's `$` also before a final newline); None
    where both read `pattern` alike. A pattern of one option ending in `$` gets an
    optional newline before it; other names, and patterns with leading lookaheads or
    anchors inside (which backends do not read as Python does), are written as
    `combined_pattern` with `whole` writes them."""
    if pattern.startswith(_LEADING_LOOKAHEADS):
        written = without_lookaheads(pattern, whole=True)
        if written is None:
            raise UnreadablePatternError("a lookahead past the leading ones, or past the limits")
    else:
        tree, unlike = _read(pattern)
        if not unlike:
            alphabet = Alphabet(sets_of(pattern))
            python = _determinise(_searched(tree), alphabet)
            if _equal(python, _determinise(_searched(tree, end_only=True), alphabet)):
                return None
            if len(_options(tree)) == 1 and pattern.endswith("$"):  # else `$` closes a group
                return pattern[:-1] + "\\n?$"
        written = combined_pattern([pattern], [], whole=True)
    if isinstance(written, bool):
        return "" if written else NO_STRING
    return written


# -- leading lookaheads -----------------------------------------------------------------


def _closing_paren(pattern: str, start: int) -> int:
    """The index of the `)` that closes the group opening at `pattern[start]`, skipping
    escapes and character classes; -1 where it is not closed."""
    depth, at = 0, start
    while at < len(pattern):
        char = pattern[at]
        if char == "\\":
            at += 2
            continue
        if char == "[":
            at = _class_end(pattern, at)
            if at < 0:
                return -1
        elif char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
            if depth == 0:
                return at
        at += 1
    return -1


def _top_level_options(pattern: str) -> list[str]:
    """`pattern` split at each `|` outside every group and class (one option: itself)."""
    options, start, at = [], 0, 0
    while at < len(pattern):
        char = pattern[at]
        if char == "\\":
            at += 2
            continue
        if char in "([":
            end = _closing_paren(pattern, at) if char == "(" else _class_end(pattern, at)
            if end < 0:
                return [pattern]  # unbalanced: the parser says so
            at = end + 1
            continue
        if char == "|":
            options.append(pattern[start:at])
            start = at + 1
        at += 1
    return [*options, pattern[start:]]


def _class_end(pattern: str, start: int) -> int:
    """The index of the `]` that closes the class opening at `pattern[start]`; -1 if none."""
    at = start + 1
    if pattern[at : at + 1] == "^":
        at += 1
    if pattern[at : at + 1] == "]":
        at += 1
    while at < len(pattern):
        if pattern[at] == "\\":
            at += 2
            continue
        if pattern[at] == "]":
            return at
        at += 1
    return -1


_LEADING_LOOKAHEADS = ("^(?=", "^(?!")


def without_lookaheads(pattern: str, *, whole: bool = False) -> str | bool | None:
    """`pattern` written without the lookaheads it starts with (`^(?!X)Y`: the strings that
    `^Y` finds a match in and `^X` does not; `^(?=X)Y`: that both do), as `combined_pattern`
    writes it (with `whole` as there; True: every string matches, False: none); None where
    it does not start so (after `^`) or another part is outside the constructs read here."""
    if not pattern.startswith(_LEADING_LOOKAHEADS):
        return None
    matching: list[str] = []
    failing: list[str] = []
    at = 1
    while pattern.startswith(("(?=", "(?!"), at):
        end = _closing_paren(pattern, at)
        if end < 0:
            return None
        options = _top_level_options(pattern[at + 3 : end])
        anchored = "|".join("^" + option.lstrip("^") for option in options)
        (matching if pattern[at + 2] == "=" else failing).append(anchored)
        at = end + 1
    rest = pattern[at:]
    if len(_top_level_options(rest)) > 1:
        return None  # `^(?!X)a|b`: the lookahead belongs to the first option only
    try:
        return combined_pattern(["^" + rest, *matching], failing, whole=whole)
    except UnreadablePatternError:
        return None


# -- anchors inside ---------------------------------------------------------------------


def without_inner_anchors(pattern: str) -> str | bool | None:
    """`pattern` written without anchors inside it or `\\A`, `\\Z`, `\\b` (which backends
    read unlike Python, or not at all: `^(a($|/))*$`), as `combined_pattern` writes it (True:
    every string matches, False: none); None where it has none of them, or where it is
    outside the constructs read here or too large to write."""
    try:
        if not _read(pattern)[1]:
            return None
        return combined_pattern([pattern], [])
    except UnreadablePatternError:
        return None
