"""The matcher interface behaves the same on every backend."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import llguidance
import pytest
import torch
from conftest import (
    XGRAMMAR_028,
    accepts_all,
    allowed_ids,
    bundled_examples,
    bundled_schema,
    ids_in_row,
)
from hypothesis import given
from hypothesis import strategies as st

import grammarmask as gm
from grammarmask.backends import llguidance_backend
from grammarmask.backends.llguidance_backend import LLGuidanceBackend
from grammarmask.schema import LoweredSchema
from grammarmask.tools.conformance import byte_token_ids, feed

BACKENDS = ("xgrammar", "outlines", "llguidance")
TINY_SCHEMA = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}, "n": {"enum": [1, 22]}},
    "required": ["ok"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def compiled(deepseek_compiler: gm.GrammarCompiler) -> dict[str, gm.CompiledGrammar]:
    grammar = gm.Grammar.json_schema(TINY_SCHEMA)
    return {name: deepseek_compiler.compile(grammar, name) for name in BACKENDS}


def _mask(matcher: gm.Matcher, size: int) -> torch.Tensor:
    row = torch.zeros(1, gm.words_per_row(size), dtype=torch.int32)
    matcher.fill(row, 0)
    return row


def _walk(matcher: gm.Matcher, ids: list[int], size: int, *, last: bool = True) -> torch.Tensor:
    """The mask before each token (and after the last, where `last`), accepting each."""
    rows = torch.zeros(len(ids) + last, gm.words_per_row(size), dtype=torch.int32)
    for position in range(len(rows)):
        matcher.fill(rows, position)
        if position < len(ids):
            assert matcher.accept(ids[position]), position
    return rows


@pytest.mark.parametrize("backend", BACKENDS)
def test_forbidden_token_leaves_state_unchanged(
    backend: str,
    compiled: dict[str, gm.CompiledGrammar],
    deepseek: gm.Vocabulary,
    deepseek_encode: Callable[[str], list[int]],
) -> None:
    matcher = compiled[backend].matcher()
    before = _mask(matcher, deepseek.size)
    forbidden = deepseek_encode("[")[0]
    assert not matcher.accept(forbidden)
    assert torch.equal(before, _mask(matcher, deepseek.size))
    assert matcher.accept(deepseek_encode("{")[0])


@pytest.mark.parametrize("backend", BACKENDS)
def test_full_instance_then_stop_then_stop_only_rows(
    backend: str,
    compiled: dict[str, gm.CompiledGrammar],
    deepseek: gm.Vocabulary,
    deepseek_encode: Callable[[str], list[int]],
) -> None:
    matcher = compiled[backend].matcher()
    ids = deepseek_encode('{"ok":true,"n":22}')
    stop = deepseek.stop_token_ids[0]
    for token_id in ids[:-1]:
        assert matcher.accept(token_id)
        assert not matcher.accept(stop), "stop before the JSON is complete"
    assert matcher.accept(ids[-1])
    assert matcher.can_stop()
    assert allowed_ids(matcher, deepseek.size) == {stop}
    assert matcher.accept(stop)
    assert matcher.is_terminated() and not matcher.can_stop()
    assert allowed_ids(matcher, deepseek.size) == {stop}
    assert not matcher.accept(ids[0])
    matcher.rollback(1)
    assert not matcher.is_terminated() and matcher.can_stop()
    matcher.reset()
    assert not matcher.can_stop()
    assert torch.equal(
        _mask(matcher, deepseek.size), _mask(compiled[backend].matcher(), deepseek.size)
    )


@pytest.mark.parametrize("backend", BACKENDS)
@given(data=st.data())
def test_rollback_restores_every_earlier_mask(
    backend: str,
    compiled: dict[str, gm.CompiledGrammar],
    deepseek: gm.Vocabulary,
    deepseek_encode: Callable[[str], list[int]],
    data: st.DataObject,
) -> None:
    ok = data.draw(st.booleans())
    n = data.draw(st.sampled_from(["", ',"n":1', ',"n":22']))
    ids = deepseek_encode(f'{{"ok":{json.dumps(ok)}{n}}}')
    matcher = compiled[backend].matcher()
    masks = [_mask(matcher, deepseek.size)]
    for token_id in ids:
        assert matcher.accept(token_id)
        masks.append(_mask(matcher, deepseek.size))
    back = data.draw(st.integers(0, len(ids)))
    matcher.rollback(back)
    assert torch.equal(_mask(matcher, deepseek.size), masks[len(ids) - back])


@pytest.mark.parametrize("backend", ["outlines", "llguidance"])
def test_every_stop_token_ends_the_text(backend: str, qwen: gm.Vocabulary) -> None:
    """outlines-core knows one EOS and llguidance a list: the wrappers must allow and accept
    every stop token of the vocabulary (Qwen has two)."""
    matcher = gm.GrammarCompiler(qwen).compile(gm.Grammar.choice(["yes", "no"]), backend).matcher()
    assert matcher.accept(9693)  # b'yes'
    assert allowed_ids(matcher, qwen.size) == set(qwen.stop_token_ids)
    assert matcher.accept(qwen.stop_token_ids[1])
    assert matcher.is_terminated()


@pytest.mark.parametrize("backend", BACKENDS)
def test_choice_and_regex(
    backend: str, deepseek_compiler: gm.GrammarCompiler, deepseek_encode: Callable[[str], list[int]]
) -> None:
    choice = deepseek_compiler.compile(
        gm.Grammar.choice(["north", "south-east", 'a "quoted" \\ one']), backend
    )
    for option in ("north", "south-east", 'a "quoted" \\ one'):
        assert accepts_all(choice.matcher(), deepseek_encode(option)), option
    assert not accepts_all(choice.matcher(), deepseek_encode("south"))
    regex = deepseek_compiler.compile(gm.Grammar.regex(r"[0-9]{3}-[A-Z]{2}"), backend)
    assert accepts_all(regex.matcher(), deepseek_encode("123-AB"))
    assert not accepts_all(regex.matcher(), deepseek_encode("123-ABC"))


@pytest.mark.parametrize("backend", ["xgrammar", "llguidance"])
def test_serves_any_json_and_ebnf(
    backend: str,
    deepseek_compiler: gm.GrammarCompiler,
    deepseek_encode: Callable[[str], list[int]],
) -> None:
    any_json = deepseek_compiler.compile(gm.Grammar.json(), backend)
    if backend == "xgrammar" and XGRAMMAR_028:
        # 0.2.8 separates the items and members of untyped values with ", " even when
        # compact (0.2.9 fixed it): still JSON, but compact JSON is refused there
        assert accepts_all(any_json.matcher(), deepseek_encode('{"a":[1, {"b":null}], "c":"d"}'))
        assert not accepts_all(any_json.matcher(), deepseek_encode('{"a":[1,{"b":null}]}'))
    else:
        assert accepts_all(any_json.matcher(), deepseek_encode('{"a":[1,{"b":null}],"c":"d"}'))
    assert not accepts_all(any_json.matcher(), deepseek_encode('{"a" :1}'))  # compact: no spaces
    ebnf = deepseek_compiler.compile(gm.Grammar.ebnf('root ::= "go " ("left" | "right")'), backend)
    assert accepts_all(ebnf.matcher(), deepseek_encode("go left"))
    assert not accepts_all(ebnf.matcher(), deepseek_encode("go up"))


@pytest.mark.parametrize(
    ("grammar", "message"),
    [
        (gm.Grammar.json(), "regular languages only; json grammars need xgrammar"),
        (gm.Grammar.ebnf('root ::= "a"'), "regular languages only; ebnf grammars need xgrammar"),
    ],
)
def test_outlines_refuses_non_regular_grammars(
    deepseek_compiler: gm.GrammarCompiler, grammar: gm.Grammar, message: str
) -> None:
    with pytest.raises(gm.UnsupportedGrammarError, match=message):
        deepseek_compiler.compile(grammar, "outlines")


def test_backend_compile_failure_is_a_grammar_error(deepseek_compiler: gm.GrammarCompiler) -> None:
    with pytest.raises(gm.GrammarError, match="xgrammar cannot compile"):
        deepseek_compiler.compile(
            gm.Grammar.json_schema(
                {"type": "object", "properties": {"a": False}, "required": ["a"]}
            ),
            "xgrammar",
        )


def test_unknown_backend(deepseek: gm.Vocabulary) -> None:
    with pytest.raises(
        gm.GrammarMaskError,
        match="unknown backend 'llama'; choose from llguidance, xgrammar, outlines",
    ):
        gm.create_backend("llama", deepseek)


def test_xgrammar_strings_never_take_raw_control_characters(
    deepseek_compiler: gm.GrammarCompiler,
    deepseek: gm.Vocabulary,
    deepseek_encode: Callable[[str], list[int]],
) -> None:
    """xgrammar 0.2.9 alone admits raw control bytes in length-limited strings (invalid JSON)."""
    schema = {
        "type": "object",
        "properties": {"s": {"type": "string", "maxLength": 9}},
        "required": ["s"],
    }
    matcher = deepseek_compiler.compile(gm.Grammar.json_schema(schema), "xgrammar").matcher()
    for token_id in deepseek_encode('{"s":"'):
        assert matcher.accept(token_id)
    allowed = allowed_ids(matcher, deepseek.size)
    assert len(allowed) > 10_000
    assert not [i for i in allowed if any(b < 0x20 for b in deepseek.token_bytes[i])]
    tab = deepseek.token_bytes.index(b"\t")
    assert not matcher.accept(tab)
    assert matcher.accept(deepseek_encode("x")[0])


def _dialect_difference(token: bytes) -> bool:
    """Documented completeness gaps: xgrammar forbids escapes in length-limited strings;
    outlines forbids U+007F..U+009F and \\u escapes; llguidance forbids a raw U+007F.
    None lets invalid JSON through."""
    text = token.decode("utf-8", "surrogateescape")
    return "\\" in text or any(0x7F <= ord(ch) <= 0x9F for ch in text)


@pytest.mark.parametrize("name", ["function_call", "matrix"])
def test_backends_agree_along_valid_instances(
    name: str,
    deepseek_compiler: gm.GrammarCompiler,
    deepseek: gm.Vocabulary,
    deepseek_encode: Callable[[str], list[int]],
) -> None:
    """Where all enforce a schema fully, they allow the same tokens at every position."""
    schema = bundled_schema(name)
    grammar = gm.Grammar.json_schema(schema)
    compiled = {b: deepseek_compiler.compile(grammar, b) for b in BACKENDS}
    assert all(c.fully_enforced for c in compiled.values())
    positions = 0
    for instance in schema["examples"]:
        ids = deepseek_encode(json.dumps(instance, separators=(",", ":"), ensure_ascii=False))
        matchers = {b: c.matcher() for b, c in compiled.items()}
        for position in range(len(ids) + 1):
            xg, *others = (allowed_ids(matchers[b], deepseek.size) for b in BACKENDS)
            for other in others:
                unexplained = [
                    i for i in xg ^ other if not _dialect_difference(deepseek.token_bytes[i])
                ]
                assert not unexplained, (
                    position,
                    [deepseek.token_bytes[i] for i in unexplained[:5]],
                )
            positions += 1
            if position < len(ids):
                assert all(m.accept(ids[position]) for m in matchers.values())
        assert all(m.can_stop() for m in matchers.values())
    assert positions > 30


def test_llguidance_whitespace_bound_and_strict(
    deepseek_compiler: gm.GrammarCompiler, deepseek_encode: Callable[[str], list[int]]
) -> None:
    array = {"type": "array", "items": {"type": "integer"}}
    bounded = gm.Grammar.json_schema(array, whitespace="flexible", max_whitespace=3)
    backend = deepseek_compiler.backend("llguidance")
    assert isinstance(backend, LLGuidanceBackend)
    if backend.bounds_whitespace_runs:
        flexible = deepseek_compiler.compile(bounded, "llguidance")
        assert accepts_all(flexible.matcher(), deepseek_encode("[1,\n  2 ]"))
        assert not accepts_all(flexible.matcher(), deepseek_encode("[1,    2]"))  # a run of 4
    else:  # llguidance 1.7 lets runs grow past the bound: refused, never served loose
        with pytest.raises(gm.UnsupportedGrammarError, match="does not bound whitespace runs"):
            deepseek_compiler.compile(bounded, "llguidance")
        served = deepseek_compiler.compile(bounded, "auto")
        assert served.backend != "llguidance"
        assert not accepts_all(served.matcher(), deepseek_encode("[1,    2]"))
    compact = deepseek_compiler.compile(gm.Grammar.json_schema(array), "llguidance")
    assert not accepts_all(compact.matcher(), deepseek_encode("[1, 2]"))
    assert accepts_all(compact.matcher(), deepseek_encode("[1,2]"))
    open_object = {"type": "object", "properties": {"a": {"type": "integer"}}}
    extra = deepseek_encode('{"a":1,"b":2}')
    loose = deepseek_compiler.compile(gm.Grammar.json_schema(open_object), "llguidance")
    strict = deepseek_compiler.compile(
        gm.Grammar.json_schema(open_object, strict=True), "llguidance"
    )
    assert accepts_all(loose.matcher(), extra)
    assert not accepts_all(strict.matcher(), extra)
    assert accepts_all(strict.matcher(), deepseek_encode('{"a":1}'))


DECIMAL_STEP = {"type": "number", "multipleOf": 0.25, "minimum": 0, "maximum": 100}
DECIMAL_STEP_VERDICTS = {
    "0.5": True,  # one fraction digit: llguidance alone writes 0.25's multiples with two
    "75.0": True,
    "75.5": True,
    "75.50": True,
    "0.75": True,
    "75": True,
    "0.3": False,
    "75.1": False,
    "100.25": False,
    "-0.5": False,
}
"""A step of two fraction digits and numbers written with none, one or two of them."""


def test_llguidance_takes_a_decimal_steps_multiples_written_with_fewer_digits(
    deepseek_compiler: gm.GrammarCompiler, deepseek_encode: Callable[[str], list[int]]
) -> None:
    """llguidance writes the multiples of 0.25 with exactly two fraction digits (or none):
    `0.5`, which a model writes as often as `0.50`, would be refused. Lowered as one step
    per count of digits, every multiple is taken, however many digits up to two it has,
    and nothing else."""
    grammar = gm.Grammar.json_schema(DECIMAL_STEP)
    backend = deepseek_compiler.backend("llguidance")
    as_written = backend.compile(grammar, LoweredSchema(DECIMAL_STEP))
    assert not accepts_all(as_written.matcher(), deepseek_encode("0.5"))
    served = deepseek_compiler.compile(grammar, "llguidance")
    assert served.fully_enforced
    for text, valid in DECIMAL_STEP_VERDICTS.items():
        assert accepts_all(served.matcher(), deepseek_encode(text)) is valid, text


def test_llguidance_schema_options_cannot_loosen_it(deepseek_compiler: gm.GrammarCompiler) -> None:
    """A schema's own x-guidance asking for lenient (ignore unknown keywords) is overridden."""
    schema = {"type": "integer", "not": {"multipleOf": 3}, "x-guidance": {"lenient": True}}
    with pytest.raises(gm.UnsupportedGrammarError, match='Unimplemented keys: \\["not"\\]'):
        deepseek_compiler.compile(gm.Grammar.json_schema(schema), "llguidance")


def test_llguidance_matchers_of_one_grammar_fill_identically_from_two_threads(
    deepseek_compiler: gm.GrammarCompiler,
    deepseek: gm.Vocabulary,
    deepseek_encode: Callable[[str], list[int]],
) -> None:
    """Copies of one compiled grammar share llguidance's lazily built lexer states; filling
    them from two threads (the GIL is released) must give the masks of a lone walk."""
    schema = bundled_schema("person")
    compiled = deepseek_compiler.compile(gm.Grammar.json_schema(schema), "llguidance")
    walks = [
        deepseek_encode(json.dumps(e, separators=(",", ":"), ensure_ascii=False))
        for e in schema["examples"]
    ]

    def masks(ids: list[int]) -> torch.Tensor:
        return _walk(compiled.matcher(), ids, deepseek.size)

    alone = [masks(ids) for ids in walks]
    with ThreadPoolExecutor(2) as threads:
        together = list(threads.map(masks, walks * 4))
    assert all(torch.equal(t, alone[i % len(walks)]) for i, t in enumerate(together))


def test_xgrammar_filters_every_draft_row_wherever_it_lies(
    deepseek: gm.Vocabulary, deepseek_compiler: gm.GrammarCompiler
) -> None:
    """Rows 3, 0, 1, 6 (first and last differ by len - 1, yet not a run): each filled row
    still loses the raw control-byte tokens xgrammar lets into strings with minLength, and
    the rows between them are not touched."""
    grammar = gm.Grammar.json_schema({"type": "string", "minLength": 1})
    matcher = deepseek_compiler.compile(grammar, "xgrammar").matcher()
    quote, letter = deepseek.token_bytes.index(b'"'), deepseek.token_bytes.index(b"a")
    controls = {i for i, t in enumerate(deepseek.token_bytes) if t and t[0] < 0x20}
    rows = [3, 0, 1, 6]
    bitmask = torch.zeros(7, gm.words_per_row(deepseek.size), dtype=torch.int32)
    assert matcher.fill_drafts(bitmask, rows, [quote, letter, letter]) == 3
    for row in rows:
        assert ids_in_row(bitmask[row], deepseek.size) & controls == set(), row
    assert not bitmask[[2, 4, 5]].any()


@pytest.fixture(scope="module")
def instances(
    deepseek_encode: Callable[[str], list[int]],
) -> list[tuple[gm.Grammar, list[int]]]:
    """Bundled schemas with the token ids of their first example."""
    names = ["person", "invoice", "function_call", "matrix"]
    return list(bundled_examples(names, deepseek_encode).values())


@given(data=st.data())
def test_xgrammar_draft_fill_matches_the_interface_loop(
    deepseek: gm.Vocabulary,
    deepseek_compiler: gm.GrammarCompiler,
    instances: list[tuple[gm.Grammar, list[int]]],
    data: st.DataObject,
) -> None:
    """XGrammarMatcher.fill_drafts (its own loop, the token filter inlined: the pool's hot
    path) against the interface's loop over fill/accept/rollback on the same matcher: the
    same accepted count, the same rows up to it, the rows past it untouched, and the state
    unchanged."""
    matcher, drafts = _draw_drafts(data, "xgrammar", deepseek, deepseek_compiler, instances)
    words = gm.words_per_row(deepseek.size)
    untouched = torch.full((words,), 0x5A5A5A5A, dtype=torch.int32)
    drafted = untouched.repeat(len(drafts) + 1, 1)
    looped = torch.zeros_like(drafted)
    before = _mask(matcher, deepseek.size)
    accepted = matcher.fill_drafts(drafted, range(len(drafts) + 1), drafts)
    assert torch.equal(_mask(matcher, deepseek.size), before)
    assert gm.Matcher.fill_drafts(matcher, looped, range(len(drafts) + 1), drafts) == accepted
    assert torch.equal(drafted[: accepted + 1], looped[: accepted + 1])
    assert all(torch.equal(row, untouched) for row in drafted[accepted + 1 :])


@given(data=st.data())
def test_llguidance_draft_loop_stops_where_accept_stops(
    deepseek: gm.Vocabulary,
    deepseek_compiler: gm.GrammarCompiler,
    instances: list[tuple[gm.Grammar, list[int]]],
    data: st.DataObject,
) -> None:
    """The interface's draft loop skips `accept` for a draft its row forbids: it must stop
    exactly where accepting the drafts one by one stops, and leave the state unchanged."""
    matcher, drafts = _draw_drafts(data, "llguidance", deepseek, deepseek_compiler, instances)
    before = _mask(matcher, deepseek.size)
    rows = torch.zeros(len(drafts) + 1, gm.words_per_row(deepseek.size), dtype=torch.int32)
    accepted = matcher.fill_drafts(rows, range(len(drafts) + 1), drafts)
    assert torch.equal(_mask(matcher, deepseek.size), before)
    one_by_one = 0
    while one_by_one < len(drafts) and matcher.accept(drafts[one_by_one]):
        one_by_one += 1
    assert accepted == one_by_one


def _draw_drafts(
    data: st.DataObject,
    backend: str,
    deepseek: gm.Vocabulary,
    deepseek_compiler: gm.GrammarCompiler,
    instances: list[tuple[gm.Grammar, list[int]]],
) -> tuple[gm.Matcher, list[int]]:
    """A matcher part way through a real instance, and drafts that go on from there with
    a forbidden token, a stop token, a raw control byte or a surrogate lead/continuation
    spliced in (or not)."""
    grammar, instance = data.draw(st.sampled_from(instances))
    ids = [*instance, deepseek.stop_token_ids[0]]
    matcher = deepseek_compiler.compile(grammar, backend).matcher()
    near_end = st.integers(max(0, len(ids) - 7), len(ids) - 1)  # drafts reach the stop token
    position = data.draw(st.one_of(st.integers(0, len(ids) - 1), near_end))
    assert all(matcher.accept(token) for token in ids[:position])
    drafts = ids[position : position + data.draw(st.integers(0, 6))]
    tokens = deepseek.token_bytes
    splice = st.sampled_from(
        [
            deepseek.stop_token_ids[0],
            tokens.index(b"\n"),
            tokens.index(b"["),
            next(i for i, t in enumerate(tokens) if t.endswith(b"\xed")),
            next(i for i, t in enumerate(tokens) if t[:1] == b"\xa0"),
        ]
    )
    if drafts and data.draw(st.booleans()):
        drafts[data.draw(st.integers(0, len(drafts) - 1))] = data.draw(splice)
    return matcher, drafts


@given(data=st.data())
def test_xgrammar_batch_fill_writes_what_filling_one_by_one_writes(
    deepseek: gm.Vocabulary,
    deepseek_compiler: gm.GrammarCompiler,
    instances: list[tuple[gm.Grammar, list[int]]],
    data: st.DataObject,
) -> None:
    """XGrammarMatcher.fill_many (one xgrammar batch call, then the stop rows and the rows
    after a surrogate lead) against `fill` per matcher: the same rows, wherever they lie,
    and no other row touched. Matchers sit at positions of real instances, some after the
    stop token, some inside a string right after a token ending in the lead byte ED."""
    tokens = deepseek.token_bytes
    lead = next(i for i, t in enumerate(tokens) if t.endswith(b"\xed") and t[:1] != b'"')
    string = deepseek_compiler.compile(gm.Grammar.json_schema({"type": "string"}), "xgrammar")
    matchers = []
    for _ in range(data.draw(st.integers(1, 6))):
        kind = data.draw(st.sampled_from(["instance", "stopped", "after lead"]))
        if kind == "after lead":
            matcher = string.matcher()
            assert matcher.accept(tokens.index(b'"')) and matcher.accept(lead)
        else:
            grammar, instance = data.draw(st.sampled_from(instances))
            matcher = deepseek_compiler.compile(grammar, "xgrammar").matcher()
            ids = [*instance, deepseek.stop_token_ids[0]] if kind == "stopped" else instance
            position = len(ids) if kind == "stopped" else data.draw(st.integers(0, len(ids) - 1))
            assert all(matcher.accept(token) for token in ids[:position])
        matchers.append(matcher)
    rows = data.draw(st.permutations(range(len(matchers) + 2)))[: len(matchers)]
    words = gm.words_per_row(deepseek.size)
    untouched = torch.full((len(matchers) + 2, words), 0x5A5A5A5A, dtype=torch.int32)
    batched, single = untouched.clone(), untouched.clone()
    assert type(matchers[0]).fill_many(matchers, batched, rows)
    for matcher, row in zip(matchers, rows, strict=True):
        matcher.fill(single, row)
    assert torch.equal(batched, single)
    for row in set(range(len(matchers) + 2)) - set(rows):
        assert torch.equal(batched[row], untouched[row])


def test_backends_without_a_batch_fill_say_so(
    deepseek: gm.Vocabulary, compiled: dict[str, gm.CompiledGrammar]
) -> None:
    """Only xgrammar has a batch call; the others write nothing and say False, so the pool
    fills their rows one by one."""
    bitmask = torch.zeros(1, gm.words_per_row(deepseek.size), dtype=torch.int32)
    for name in ("outlines", "llguidance"):
        matcher = compiled[name].matcher()
        assert not type(matcher).fill_many([matcher], bitmask, [0])
        assert not bitmask.any()


SPENDING_SCHEMA = {"type": "string", "pattern": "^[ab]*a[ab]{12}$"}
"""Its lexer builds new derivatives for every new text: a small budget is spent within a
few dozen requests."""
SMALL_FUEL = 60_000


def _spending_texts(count: int, seed: int, lengths: tuple[int, int] = (20, 120)) -> list[str]:
    rng = random.Random(seed)
    texts = []
    for _ in range(count):
        head = "".join(rng.choice("ab") for _ in range(rng.randint(*lengths)))
        texts.append(json.dumps(head + "a" + "".join(rng.choice("ab") for _ in range(12))))
    return texts


def _spent_by_raw_llguidance(
    backend: LLGuidanceBackend, texts: list[str], table: dict[int, int]
) -> bool:
    """Whether copies of one raw LLMatcher with SMALL_FUEL fail some of `texts`."""
    grammar = gm.Grammar.json_schema(SPENDING_SCHEMA)
    lark = llguidance.LLMatcher.grammar_from_lark(
        llguidance_backend._NO_FORCING
        + backend._lark(grammar, llguidance_backend._served_schema(grammar.lower()))
    )
    limits = llguidance.LLParserLimits(initial_lexer_fuel=SMALL_FUEL)
    template = llguidance.LLMatcher(backend._tokenizer, lark, log_level=0, limits=limits)
    ids = [[table[b] for b in text.encode()] for text in texts]
    return any(template.deep_copy().try_consume_tokens(i) < len(i) for i in ids)


def test_llguidance_requests_go_on_past_a_lexer_other_requests_spent(
    deepseek: gm.Vocabulary, monkeypatch: pytest.MonkeyPatch
) -> None:
    """All copies of a compiled grammar share one lexer budget; once some requests spend it,
    llguidance fails every copy at its next new lexer state (later ones at their first
    token). Each request must go on with the masks a fresh grammar gives: one in flight
    across the spending, and every later one."""
    table = byte_token_ids(deepseek)
    backend = LLGuidanceBackend(deepseek)
    grammar = gm.Grammar.json_schema(SPENDING_SCHEMA)
    reference = backend.compile(grammar, grammar.lower())
    texts = _spending_texts(80, seed=1)
    assert _spent_by_raw_llguidance(backend, texts, table)
    monkeypatch.setattr(llguidance_backend, "_LEXER_FUEL", SMALL_FUEL)
    compiled = backend.compile(grammar, grammar.lower())

    ids = [table[b] for b in texts[0].encode()]
    half = len(ids) // 2
    in_flight = compiled.matcher()
    before = _walk(in_flight, ids[:half], deepseek.size, last=False)
    for text in texts[1:]:
        assert feed(compiled.matcher(), [table[b] for b in text.encode()])[0], text
    after = _walk(in_flight, ids[half:], deepseek.size)
    assert in_flight.can_stop()
    assert torch.equal(torch.cat([before, after]), _walk(reference.matcher(), ids, deepseek.size))


def test_llguidance_request_spending_the_whole_lexer_budget_alone_fails_with_the_reason(
    deepseek: gm.Vocabulary, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A text that needs more than the whole budget by itself cannot be served: the request
    fails naming the budget (conformance counts it as refused, with the message)."""
    table = byte_token_ids(deepseek)
    monkeypatch.setattr(llguidance_backend, "_LEXER_FUEL", 2_000)
    grammar = gm.Grammar.json_schema(SPENDING_SCHEMA)
    compiled = LLGuidanceBackend(deepseek).compile(grammar, grammar.lower())
    ids = [table[b] for b in _spending_texts(1, seed=2, lengths=(600, 600))[0].encode()]
    errors: list[str] = []
    complete, accepted = feed(compiled.matcher(), ids, errors)
    assert not complete and 0 < accepted < len(ids)
    assert len(errors) == 1 and "initial_lexer_fuel=2000" in errors[0]
    with pytest.raises(RuntimeError, match=r"initial_lexer_fuel=2000\) on this request's own"):
        feed(compiled.matcher(), ids)


def test_llguidance_serves_an_anyof_of_thousands_of_objects(
    deepseek: gm.Vocabulary, deepseek_compiler: gm.GrammarCompiler
) -> None:
    """3,000 branches open after `{` are more Earley items in one row than llguidance's
    default bound (2,000): every answer failed at its first token."""
    branches = [
        {"type": "object", "properties": {"k": {"const": i}}, "required": ["k"],
         "additionalProperties": False}
        for i in range(3_000)
    ]  # fmt: skip
    compiled = deepseek_compiler.compile(gm.Grammar.json_schema({"anyOf": branches}), "llguidance")
    table = byte_token_ids(deepseek)
    errors: list[str] = []
    assert feed(compiled.matcher(), [table[b] for b in b'{"k":2999}'], errors)[0], errors
    assert not feed(compiled.matcher(), [table[b] for b in b'{"k":3000}'], errors)[0]
    assert errors == []
