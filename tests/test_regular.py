"""Patterns as languages (lowering/regular.py): the pattern written for "every `matching`
pattern and no `failing` one" finds a match in exactly the strings Python's `re.search`
says it should, read by Python (`$` before a final newline) and by a backend (the whole
string) alike, up to a final newline a backend may refuse."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from grammarmask.errors import UnreadablePatternError
from grammarmask.schema.lowering.regular import (
    Alphabet,
    automaton,
    combined_pattern,
    sets_of,
    without_lookaheads,
)

PATTERNS = (
    "^a", "b$", "abc", "^a+$", "^[a-c]{2,3}$", "x|^y", r"^\d+$", r"\s", "^.{1,3}$", "[^a-z]",
    "^(ab|c)*d?$", "é", "^[^é😀]+$", r"^\u00e9{2}", "a{,2}b", "{", "^$", "", r"\.", "a.b",
    "^[0-9a-f]{4}-", "^(a|b)$", "a^b", "(^a)b", "a$b", "^((a|b*)($|-))*$", r"(^|x)a", r"\Aa",
)  # fmt: skip
"""Anchors at either end or none, and inside, classes (negated, Unicode, `\\d`, `\\s`),
counted and open repetition, alternation, a literal brace, the empty pattern."""
SELDOM_WRITTEN = (
    r"\ba", r"a\b", r"^(\b.)*$", r"(a|\b)\b-", r"\b", r"^\b$", r"a\b$|\b\b", r"a\Z",
    r"a\Z|^b$", "a$\n",
)  # fmt: skip
"""`\\b` between Unicode word characters and others (at either end, repeated, in a loop),
whose written form spells Python's word class out, past the size limit; `\\Z` and a `$`
before a newline, whose strings end without a final newline, which a pattern read with
Python's `$` cannot say."""
TEXT = st.text(alphabet=st.sampled_from("abcdxy0 -é😀٣\n{."), max_size=7)
"""Strings near the patterns: their letters, a Unicode digit, an astral character, a
newline (Python's `$` passes one at the end)."""


def _wanted(matching: list[str], failing: list[str], text: str) -> bool:
    return all(re.search(p, text) for p in matching) and not any(
        re.search(p, text) for p in failing
    )


@settings(max_examples=300)
@given(
    matching=st.lists(st.sampled_from(PATTERNS), max_size=2),
    failing=st.lists(st.sampled_from(PATTERNS), max_size=2),
    texts=st.lists(TEXT, min_size=1, max_size=20),
)
def test_the_written_pattern_matches_what_search_says(
    matching: list[str], failing: list[str], texts: list[str]
) -> None:
    try:
        written = combined_pattern(matching, failing)
    except UnreadablePatternError:
        return  # the caller keeps the keyword: sound, and measured below not to be common
    for text in texts:
        wanted = _wanted(matching, failing, text)
        if isinstance(written, bool):
            assert written == wanted, (matching, failing, text)
            continue
        assert bool(re.search(written, text)) == wanted, (written, text)  # as jsonschema
        whole = re.fullmatch(written[1:-1], text) is not None  # as a backend
        assert whole <= wanted and (whole == wanted or text.endswith("\n")), (written, text)


@settings(max_examples=300)
@given(
    matching=st.lists(st.sampled_from(PATTERNS + SELDOM_WRITTEN), min_size=1, max_size=2),
    failing=st.lists(st.sampled_from(PATTERNS + SELDOM_WRITTEN), max_size=1),
    texts=st.lists(TEXT, min_size=1, max_size=20),
)
def test_the_automaton_holds_the_strings_search_finds_a_match_in(
    matching: list[str], failing: list[str], texts: list[str]
) -> None:
    """The language before it is written back, for the patterns seldom written too."""
    alphabet = Alphabet([s for p in [*matching, *failing] for s in sets_of(p)])
    machine = automaton(matching[0], alphabet)
    for pattern in matching[1:]:
        machine = machine.intersection(automaton(pattern, alphabet))
    for pattern in failing:
        machine = machine.intersection(automaton(pattern, alphabet).complement())
    for text in texts:
        assert machine.accepts(text, alphabet) == _wanted(matching, failing, text), text


def test_most_pairs_of_the_patterns_are_written() -> None:
    """UnreadablePatternError (a pattern past the size limits, no reading alike with and without
    a final newline) stays the exception on these patterns."""
    pairs = [(m, f) for m in PATTERNS for f in PATTERNS]
    unreadable = 0
    for matching, failing in pairs:
        try:
            combined_pattern([matching], [failing])
        except UnreadablePatternError:
            unreadable += 1
    assert unreadable < len(pairs) // 10, unreadable


def test_empty_and_full_languages_are_booleans() -> None:
    assert combined_pattern([], []) is True
    assert combined_pattern([], [""]) is False  # the empty pattern matches every string
    assert combined_pattern(["^a+$"], ["^a"]) is False
    assert combined_pattern(["^a+$", "^b"], []) is False
    assert combined_pattern([], ["(?:)"]) is False


@pytest.mark.parametrize(
    "pattern",
    ["(?=a)", "(?!a)b", r"(a)\1", r"a\Bb", "(?i)a", "a**", "[[:alpha:]]", "(?P<n>a)", "a++",
     "(a", "[a", "\\", "^*"],
)  # fmt: skip
def test_constructs_outside_the_reading_are_refused_by_name(pattern: str) -> None:
    with pytest.raises(UnreadablePatternError):
        combined_pattern([], [pattern])


def test_the_limits_refuse_what_would_be_too_long() -> None:
    """A long counted repetition written out, and `\\w` (hundreds of Unicode ranges)."""
    with pytest.raises(UnreadablePatternError, match="size limit"):
        combined_pattern(["^[a-z0-9]{1,255}$"], [])
    with pytest.raises(UnreadablePatternError, match="size limit"):
        combined_pattern([], [r"^\w+$"])


LOOKAHEADS = (
    "^(?!ab)", "^(?!a|b$).*$", "^(?=.{1,3}$)[a-c]+$", "^(?!^x|y)[a-z]*", "^(?!.*\\.\\.).+$",
    "^(?=a)(?!ab)", "^(?![]a])x", "^(?!a)(b|c)$",
)  # fmt: skip
"""Negative and positive lookaheads at the start: alternation and anchors inside them, a
class whose first member is `]`, two in a row, a group after them."""


@settings(max_examples=200)
@given(pattern=st.sampled_from(LOOKAHEADS), texts=st.lists(TEXT, min_size=1, max_size=20))
def test_leading_lookaheads_are_written_without_them(pattern: str, texts: list[str]) -> None:
    written = without_lookaheads(pattern)
    assert written is not None, pattern
    for text in texts:
        wanted = re.search(pattern, text) is not None
        if isinstance(written, bool):
            assert written == wanted, (pattern, text)
            continue
        assert bool(re.search(written, text)) == wanted, (pattern, written, text)


@pytest.mark.parametrize("pattern", ["^(?!a)b|c", "(?!a)b", "^a(?!b)", "^(?<!a)b"])
def test_lookaheads_elsewhere_are_left(pattern: str) -> None:
    """Only a lookahead at the start of the one option is read (`^(?!a)b|c` guards `b`)."""
    assert without_lookaheads(pattern) is None
