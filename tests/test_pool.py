"""The matcher pool: the step invariants of docs/design.md, each as a test."""

from __future__ import annotations

import itertools
import json
import logging
import random
import threading
from collections.abc import Callable
from typing import Any

import numpy
import pytest
import torch
from conftest import bundled_examples, ids_in_row
from faults import faulty_compiler
from hypothesis import given
from hypothesis import strategies as st

import grammarmask as gm
import grammarmask.pool
from grammarmask.backends import xgrammar_backend
from grammarmask.backends.xgrammar_backend import XGrammarMatcher
from grammarmask.errors import BatchError
from grammarmask.pool import step_fill
from grammarmask.pool.plan import StepPlan, _entries_one_by_one
from grammarmask.pool.requests import RequestTable
from grammarmask.pool.thread_matchers import ThreadMode

NAMES = [
    "person",
    "invoice",
    "function_call",
    "service_config",
    "matrix",
    "meeting",
    "product_review",
]


@pytest.fixture(scope="module")
def compiler(deepseek: gm.Vocabulary) -> gm.GrammarCompiler:
    return faulty_compiler(deepseek, compile_timeout_s=1.0)


@pytest.fixture(scope="module")
def cases(
    deepseek_encode: Callable[[str], list[int]], compiler: gm.GrammarCompiler
) -> dict[str, tuple[gm.Grammar, list[int]]]:
    """Each bundled schema with the real token ids of its first valid example; compiled once
    up front, so that the tests' 1 s compile timeout holds on a loaded machine."""
    out = bundled_examples(NAMES, deepseek_encode)
    for grammar, _ in out.values():
        for backend in ("xgrammar", "faulty-fill", "faulty-accept", "faulty-rollback"):
            compiler.compile(grammar, backend, timeout_s=600)
    return out


def _reference_row(
    compiler: gm.GrammarCompiler, grammar: gm.Grammar, tokens: list[int], size: int
) -> torch.Tensor | None:
    """Mask after `tokens` from a fresh matcher (no rollback involved); None if refused."""
    matcher = compiler.compile(grammar, "xgrammar").matcher()
    if not all(matcher.accept(t) for t in tokens):
        return None
    row = torch.zeros(1, gm.words_per_row(size), dtype=torch.int32)
    matcher.fill(row, 0)
    return row[0]


def _new_pool(
    deepseek: gm.Vocabulary, compiler: gm.GrammarCompiler, workers: int = 2
) -> gm.MatcherPool:
    return gm.MatcherPool(deepseek, workers=workers, compiler=compiler, compile_timeout_s=1.0)


def draw_step(
    data: st.DataObject, ids: list[int], accepted: int, vocab_size: int
) -> tuple[int, list[int]]:
    """A committed prefix of a valid instance and up to 6 drafts that follow it, one of them
    sometimes replaced by a random token id."""
    committed = data.draw(st.integers(0, accepted - 1))
    drafts = list(ids[committed : committed + data.draw(st.integers(0, 6))])
    if drafts and data.draw(st.booleans()):
        drafts[data.draw(st.integers(0, len(drafts) - 1))] = data.draw(
            st.integers(0, vocab_size - 1)
        )
    return committed, drafts


def check_draft_rows(
    vocab: gm.Vocabulary,
    compiler: gm.GrammarCompiler,
    grammar: gm.Grammar,
    prefix: list[int],
    drafts: list[int],
) -> None:
    """Row j equals a fresh replay of prefix + drafts[:j]; the fill stops at the first
    forbidden draft; don't-care rows are never all zero; the matcher is left as it was."""
    with _new_pool(vocab, compiler) as pool:
        pool.add("r", grammar)
        assert pool.commit("r", prefix).status == "active"
        masks = pool.fill([("r", drafts)])
        expected_valid = 1
        for j in range(len(drafts) + 1):
            reference = _reference_row(compiler, grammar, prefix + drafts[:j], vocab.size)
            if reference is None:
                break
            assert torch.equal(masks.bitmask[j], reference), f"row {j}"
            expected_valid = j + 1
        assert masks.valid_rows == (expected_valid,)
        for row in masks.bitmask[expected_valid:]:
            assert ids_in_row(row, vocab.size), "a don't-care row must never be all zero"
        after = pool.fill([("r", [])])
        assert torch.equal(after.bitmask[0], _reference_row(compiler, grammar, prefix, vocab.size))


def test_worked_example_layout(deepseek: gm.Vocabulary, compiler: gm.GrammarCompiler) -> None:
    """Three requests with seqlen_q 6, 6, 4 own rows [0..5], [6..11], [12..15]."""
    with _new_pool(deepseek, compiler) as pool:
        for rid in "abc":
            pool.add(rid, gm.Grammar.json())
        drafts = [[9] * 5, [9] * 5, [9] * 3]
        masks = pool.fill(list(zip("abc", drafts, strict=True)))
    assert masks.row_to_request.tolist() == [0] * 6 + [1] * 6 + [2] * 4
    assert masks.local_step.tolist() == [0, 1, 2, 3, 4, 5] * 2 + [0, 1, 2, 3]
    verify = [True] * 5 + [False]
    assert masks.is_verify.tolist() == verify * 2 + [True, True, True, False]
    assert masks.bitmask.shape == (16, gm.words_per_row(deepseek.size))


@given(data=st.data())
def test_rows_follow_drafts_and_only_the_confirmed_prefix_persists(
    data: st.DataObject,
    deepseek: gm.Vocabulary,
    compiler: gm.GrammarCompiler,
    cases: dict[str, tuple[gm.Grammar, list[int]]],
) -> None:
    """Invariants 1 and 2: row j = mask after prefix + drafts[:j]; the fill stops at the first
    forbidden draft; don't-care rows are never all zero; the matcher is left as it was."""
    name = data.draw(st.sampled_from(NAMES))
    grammar, ids = cases[name]
    committed, drafts = draw_step(data, ids, len(ids), deepseek.size)
    check_draft_rows(deepseek, compiler, grammar, ids[:committed], drafts)


@given(data=st.data())
def test_masks_do_not_depend_on_workers_order_or_company(
    data: st.DataObject,
    deepseek: gm.Vocabulary,
    compiler: gm.GrammarCompiler,
    cases: dict[str, tuple[gm.Grammar, list[int]]],
) -> None:
    """Invariant 3: bit-identical masks for any worker count, batch order and composition."""
    chosen = data.draw(st.lists(st.sampled_from(NAMES), min_size=2, max_size=7))
    plan = []
    for index, name in enumerate(chosen):
        grammar, ids = cases[name]
        committed = data.draw(st.integers(0, len(ids) - 1))
        drafts = ids[committed : committed + data.draw(st.integers(0, 5))]
        plan.append((f"{name}-{index}", grammar, ids[:committed], drafts))

    def run(order: list[int], workers: int, subset: list[int]) -> dict[str, torch.Tensor]:
        with _new_pool(deepseek, compiler, workers) as pool:
            for i in subset:
                rid, grammar, prefix, _ = plan[i]
                pool.add(rid, grammar)
                pool.commit(rid, prefix)
            batch = [(plan[i][0], plan[i][3]) for i in order if i in subset]
            first = pool.fill(batch)
            rows = {
                str(rid): first.bitmask[list(rows)]
                for rid, rows in zip(first.request_ids, first.rows, strict=True)
            }
            # later steps run in the thread mode the pool measured faster (one or all)
            again = pool.fill_async(batch).wait()
            for rid, entry_rows in zip(again.request_ids, again.rows, strict=True):
                assert torch.equal(again.bitmask[list(entry_rows)], rows[str(rid)]), rid
            return rows

    everyone = list(range(len(plan)))
    baseline = run(everyone, 1, everyone)
    shuffled = data.draw(st.permutations(everyone))
    workers = data.draw(st.integers(2, 4))
    subset = sorted(data.draw(st.lists(st.sampled_from(everyone), min_size=1, unique=True)))
    for result in (run(shuffled, workers, everyone), run(shuffled, workers, subset)):
        for rid, rows in result.items():
            assert torch.equal(rows, baseline[rid]), rid


def _stop_only(deepseek: gm.Vocabulary, row: torch.Tensor) -> bool:
    return ids_in_row(row, deepseek.size) == set(deepseek.stop_token_ids)


@pytest.mark.parametrize("seed", range(4))
def test_one_request_failing_changes_only_its_rows(
    seed: int,
    deepseek: gm.Vocabulary,
    compiler: gm.GrammarCompiler,
    cases: dict[str, tuple[gm.Grammar, list[int]]],
) -> None:
    """Invariant 4, with faults injected into random requests of random batches."""
    rng = random.Random(seed)
    faults = [
        "fill",
        "accept",
        "rollback",
        "slow compile",
        "bad grammar",
        "illegal commit",
        "draft out of range",
        "unknown id",
    ]
    # every fault in every seed (at random places), beside two healthy requests
    assigned: list[str | None] = [*faults, None, None]
    rng.shuffle(assigned)
    requests = [(f"r{index}", rng.choice(NAMES), fault) for index, fault in enumerate(assigned)]
    healthy = _new_pool(deepseek, compiler)
    faulty = _new_pool(deepseek, compiler)
    bad_grammar = gm.Grammar.json_schema(
        {"type": "object", "properties": {"a": False}, "required": ["a"]}
    )
    for rid, name, fault in requests:
        grammar = cases[name][0]
        healthy.add(rid, grammar)
        if fault == "slow compile":  # a title no seed used: its compile is not cached
            retitled = {**json.loads(grammar.source), "title": f"slow compile {seed}"}
            faulty.add(rid, gm.Grammar.json_schema(retitled), backend="faulty-slow compile")
        elif fault in ("fill", "accept", "rollback"):
            faulty.add(rid, grammar, backend=f"faulty-{fault}")
        elif fault == "bad grammar":
            faulty.add(rid, bad_grammar)
        elif fault != "unknown id":
            faulty.add(rid, grammar)
    for step in range(4):
        batch_healthy, batch_faulty = [], []
        for rid, name, fault in requests:
            ids = cases[name][1]
            drafts = ids[step * 2 : step * 2 + 3]
            batch_healthy.append((rid, drafts))
            bad_drafts = (
                [*drafts[:1], deepseek.size + 5] if fault == "draft out of range" else drafts
            )
            batch_faulty.append((rid, bad_drafts))
        order = list(range(len(requests)))
        rng.shuffle(order)
        want = healthy.fill([batch_healthy[i] for i in order])
        got = faulty.fill([batch_faulty[i] for i in order])
        for position, i in enumerate(order):
            rid, _, fault = requests[i]
            rows_want = want.bitmask[list(want.rows[position])]
            rows_got = got.bitmask[list(got.rows[position])]
            state = faulty.state(rid)
            if state.status == "active":
                assert torch.equal(rows_got, rows_want), rid
            else:
                assert fault is not None and state.status == "failed", (rid, state)
                assert all(_stop_only(deepseek, row) for row in rows_got), (rid, fault, state)
        for rid, name, fault in requests:
            ids = cases[name][1]
            tokens = ids[step * 2 : step * 2 + 2]
            healthy.commit(rid, tokens)
            faulty.commit(rid, [deepseek.size - 1] if fault == "illegal commit" else tokens)
    reasons = {
        "fill": "injected fault in fill",
        "accept": "injected fault in accept",
        "rollback": "injected fault in rollback",
        "slow compile": "did not finish within 1 s",
        "bad grammar": "grammar error: xgrammar cannot compile",
        "illegal commit": "is not allowed by the grammar after 0 tokens",
        "draft out of range": f"draft token id {deepseek.size + 5} is outside the vocabulary",
        "unknown id": "unknown request id",
    }
    for rid, _, fault in requests:
        state = faulty.state(rid)
        if fault is None:
            assert state.status == "active", state
        else:
            assert state.status == "failed" and reasons[fault] in (state.reason or ""), (
                fault,
                state,
            )
    healthy.close()
    faulty.close()


def test_a_batch_without_grammar_does_nothing(deepseek: gm.Vocabulary) -> None:
    """Invariant 6: no fill, no copy, no kernel."""
    from simdevice import SimDevice

    device = SimDevice(0)
    with gm.MatcherPool(deepseek, device_ops=device) as pool:
        future = pool.fill_async([(None, []), (None, [5, 6])])
        assert future.done()  # nothing was queued for the workers
        masks = future.wait()
    device.close()
    assert device.copies == 0
    assert masks.grammar_rows.numel() == 0 and not masks.has_grammar.any()
    logits = torch.randn(4, deepseek.size)
    before = logits.clone()
    gm.apply_bitmask(logits, masks)
    assert torch.equal(logits, before)


def test_steps_in_flight_keep_their_own_numbers(
    deepseek: gm.Vocabulary, compiler: gm.GrammarCompiler
) -> None:
    """An engine may start step N+1 before waiting for step N: each StepMasks names its own
    step, however late its coordinator thread builds it."""
    with gm.MatcherPool(deepseek, workers=1, compiler=compiler) as pool:
        for index in range(8):
            pool.add(f"r{index}", gm.Grammar.json())
        batch = [(f"r{index}", []) for index in range(8)]
        first = pool.fill(batch).step
        futures = [pool.fill_async(batch) for _ in range(4)]
        assert [future.wait().step for future in futures] == [first + 1 + i for i in range(4)]


def _staggered(
    pool: gm.MatcherPool, grammar: gm.Grammar, ids: list[int], count: int, *, drafts: int
) -> list[tuple[str | None, list[int]]]:
    """`count` requests r0.. of one instance, request k after its first k tokens, each with
    its next `drafts` tokens as drafts: the batch of a step."""
    batch: list[tuple[str | None, list[int]]] = []
    for k in range(count):
        pool.add(f"r{k}", grammar)
        assert pool.commit(f"r{k}", ids[:k]).status == "active"
        batch.append((f"r{k}", ids[k : k + drafts]))
    return batch


def test_the_pool_times_both_thread_modes_and_keeps_the_faster() -> None:
    """Both modes in turn first (the first step of each not counted), then whichever took
    less per request in its recent steps (their median: one slow step is not enough), the
    other tried every EXPLORE_EVERY-th step; a step of one request always keeps to one
    thread."""
    mode = ThreadMode()
    assert mode.alone(1) and mode.alone_seconds(10) == 0.0
    turns = []
    for _ in range(2 * mode.WARM_UP):
        alone = mode.alone(8)
        turns.append(alone)
        # one thread: 0.5 ms a request, all threads 1 ms; the cold first steps 10x that
        seconds = (4e-3 if alone else 8e-3) * (10 if turns.count(alone) == 1 else 1)
        mode.note(alone, seconds, 8)
    assert turns == [False, True] * mode.WARM_UP
    assert mode.alone_seconds(10) == pytest.approx(5e-3)
    choices = [mode.alone(8) for _ in range(3 * mode.EXPLORE_EVERY)]
    assert choices.count(False) == 3  # one exploration per EXPLORE_EVERY steps
    mode.note(True, 40e-3, 8)  # one slow step (a busy machine) does not flip the choice
    assert [mode.alone(8) for _ in range(mode.EXPLORE_EVERY)].count(True) == mode.EXPLORE_EVERY - 1
    for _ in range(8):  # the traffic changes: one thread now takes 4 ms a request
        mode.note(True, 32e-3, 8)
    assert [mode.alone(8) for _ in range(mode.EXPLORE_EVERY)].count(True) == 1


def test_steps_on_one_thread_or_on_all(
    deepseek: gm.Vocabulary,
    compiler: gm.GrammarCompiler,
    cases: dict[str, tuple[gm.Grammar, list[int]]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A step filled on one thread runs on the caller's in a synchronous fill and on one
    fill thread under fill_async (which the waiting caller may relieve); on all threads it
    starts every fill thread. Same masks."""
    grammar, ids = cases["person"]
    fillers: list[threading.Thread] = []
    submitted: list[object] = []
    real_fill_rows = RequestTable.fill_rows

    def noted_fill_rows(table: RequestTable, *args: Any) -> tuple[int, str | None]:
        fillers.append(threading.current_thread())
        return real_fill_rows(table, *args)

    with _new_pool(deepseek, compiler, workers=2) as pool:
        batch = _staggered(pool, grammar, ids, 6, drafts=2)
        expected = pool.fill(batch).bitmask.clone()
        mode = pool.matchers.mode
        monkeypatch.setattr(mode, "alone", lambda requests: True)
        monkeypatch.setattr(mode, "alone_seconds", lambda requests: 10.0)  # never widened
        monkeypatch.setattr(RequestTable, "fill_rows", noted_fill_rows)
        executor = pool.matchers.fill_threads
        real_submit = executor.submit
        monkeypatch.setattr(
            executor, "submit", lambda *a, **k: (submitted.append(a), real_submit(*a, **k))[1]
        )
        alone = pool.fill(batch).bitmask.clone()
        assert set(fillers) == {threading.current_thread()} and not submitted
        fillers.clear()
        one_thread = pool.fill_async(batch).wait().bitmask.clone()
        assert len(submitted) == 1
        assert len(set(fillers) - {threading.current_thread()}) <= 1
        monkeypatch.setattr(mode, "alone", lambda requests: False)
        submitted.clear()
        shared = pool.fill_async(batch).wait().bitmask.clone()
        assert len(submitted) == 2
        for masks in (alone, one_thread, shared):
            assert torch.equal(masks, expected)


def test_one_row_requests_share_batch_calls_on_two_threads(
    deepseek: gm.Vocabulary,
    compiler: gm.GrammarCompiler,
    cases: dict[str, tuple[gm.Grammar, list[int]]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On two fill threads, requests without drafts are claimed a few at a time (24 on 2
    threads: 24 / (2 x _CLAIMS_PER_THREAD), at most _CHUNK_MAX) and filled in one xgrammar
    batch call each, with the masks filled one by one; not while the step has a deadline; a
    failed request among them keeps its stop-only rows; a batch call that raises leaves its
    requests to be filled one by one. A worker process with two fill threads gives the same
    masks."""
    grammar, ids = cases["invoice"]
    calls: list[int] = []
    real_fill_many = XGrammarMatcher.fill_many.__func__  # type: ignore[attr-defined]

    def noted_fill_many(cls: type, matchers: list[gm.Matcher], *args: Any) -> bool:
        calls.append(len(matchers))
        return bool(real_fill_many(cls, matchers, *args))

    monkeypatch.setattr(XGrammarMatcher, "fill_many", classmethod(noted_fill_many))
    with _new_pool(deepseek, compiler, workers=1) as one_thread:
        batch = _staggered(one_thread, grammar, ids, 24, drafts=0)
        expected = one_thread.fill(batch).bitmask.clone()
    assert not calls  # one thread: a call per request cost no more
    with _new_pool(deepseek, compiler, workers=2) as pool:
        _staggered(pool, grammar, ids, 24, drafts=0)
        monkeypatch.setattr(pool.matchers.mode, "alone", lambda requests: False)
        assert torch.equal(pool.fill(batch).bitmask, expected)
        chunk = min(step_fill._CHUNK_MAX, 24 // (2 * step_fill._CLAIMS_PER_THREAD))
        assert sum(calls) == 24, f"batch calls filled {sum(calls)} of the 24 one-row requests"
        assert max(calls) == chunk, f"claims of {max(calls)} requests, not {chunk}"
        calls.clear()
        assert torch.equal(pool.fill_async(batch).wait().bitmask, expected) and calls
        calls.clear()
        assert torch.equal(pool.fill(batch, deadline_s=30.0).bitmask, expected) and not calls
        assert pool.commit("r5", [ids[5], ids[5]]).status == "failed"
        masks = pool.fill(batch)
        assert _stop_only(deepseek, masks.bitmask[5]) and masks.failures == {}  # told at commit
        others = [row for row in range(24) if row != 5]
        assert torch.equal(masks.bitmask[others], expected[others])

        class Refusing:
            def batch_fill_next_token_bitmask(self, *args: object) -> None:
                raise RuntimeError("injected batch fault")

        monkeypatch.setattr(xgrammar_backend, "_thread_batcher", Refusing)
        for slot in pool.transfer.host_slots:
            slot.zero_()  # no rows left over from earlier steps
        calls.clear()
        masks = pool.fill(batch)
        assert calls and torch.equal(masks.bitmask[others], expected[others])
        assert masks.failures == {} and _stop_only(deepseek, masks.bitmask[5])
    with gm.MatcherPool(deepseek, workers=1, isolation="process") as process:
        _staggered(process, grammar, ids, 24, drafts=0)
        assert torch.equal(process.fill(batch).bitmask, expected)
        assert torch.equal(process.fill(batch, deadline_s=60.0).bitmask, expected)


def test_the_thread_waiting_for_a_step_fills_too(
    deepseek: gm.Vocabulary,
    compiler: gm.GrammarCompiler,
    cases: dict[str, tuple[gm.Grammar, list[int]]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """MaskFuture.wait() without a timeout joins the fill instead of only waiting: here the
    one fill thread is held until the waiting thread has filled a request (5 s at most)."""
    grammar, ids = cases["invoice"]
    caller = threading.current_thread()
    filled_by_caller = threading.Event()
    fillers: list[threading.Thread] = []
    real_fill_rows = RequestTable.fill_rows

    def held_fill_rows(table: RequestTable, *args: Any) -> tuple[int, str | None]:
        fillers.append(threading.current_thread())
        if threading.current_thread() is not caller:
            filled_by_caller.wait(timeout=5.0)
        result = real_fill_rows(table, *args)
        if threading.current_thread() is caller:
            filled_by_caller.set()
        return result

    with _new_pool(deepseek, compiler, workers=1) as pool:
        batch = _staggered(pool, grammar, ids, 4, drafts=3)
        expected = pool.fill(batch).bitmask.clone()
        monkeypatch.setattr(RequestTable, "fill_rows", held_fill_rows)
        masks = pool.fill_async(batch).wait()
        assert filled_by_caller.is_set() and caller in fillers
        assert torch.equal(masks.bitmask, expected) and masks.failures == {}


def test_lifecycle_states(
    deepseek: gm.Vocabulary, deepseek_encode: Callable[[str], list[int]]
) -> None:
    with gm.MatcherPool(deepseek, workers=1) as pool:
        state = pool.add("yes", gm.Grammar.choice(["yes", "no"]))
        assert (state.status, state.backend) == ("active", "xgrammar")
        with pytest.raises(gm.GrammarMaskError, match="'yes' is already in the pool"):
            pool.add("yes", gm.Grammar.json())
        state = pool.commit("yes", deepseek_encode("yes"))
        assert (state.status, state.reason, state.committed) == ("finished", "grammar complete", 1)
        masks = pool.fill([("yes", [])])
        assert _stop_only(deepseek, masks.bitmask[0])
        assert pool.commit("yes", [1]).status == "finished"  # a stop token after finishing
        late = pool.commit("yes", deepseek_encode("no"))
        assert late.status == "failed" and "after the request finished" in (late.reason or "")
        pool.add("json", gm.Grammar.json())
        state = pool.commit("json", [*deepseek_encode("[1]"), 1])
        assert (state.status, state.reason) == ("finished", "stop token")
        pool.remove("json")
        assert pool.state("json").reason == "unknown request id 'json'"
        assert pool.commit("ghost", [1]).status == "failed"
        masks = pool.fill([("ghost", [])])
        assert "add() it before its first step" in masks.failures["ghost"]
        assert _stop_only(deepseek, masks.bitmask[0])
        again = pool.fill([("ghost", [])]).failures  # no record kept: refused every step
        assert "add() it before its first step" in again["ghost"]


@pytest.mark.parametrize("log_failures", [True, False])
def test_each_failed_request_is_logged_once_with_its_id_and_reason(
    deepseek: gm.Vocabulary,
    deepseek_encode: Callable[[str], list[int]],
    caplog: pytest.LogCaptureFixture,
    log_failures: bool,
) -> None:
    """A failure is logged at WARNING once, however often the engine hears of it (steps,
    commits, state queries); again after the id is removed and reused; never when the
    engine logs failures itself."""
    caplog.set_level(logging.WARNING, logger="grammarmask")
    with gm.MatcherPool(deepseek, workers=1, log_failures=log_failures) as pool:
        pool.add("bad", gm.Grammar.regex("a"))
        pool.add("good", gm.Grammar.regex("[0-9]+"))
        no = deepseek_encode("b")
        assert pool.commit("bad", no).status == "failed"
        for _ in range(3):
            pool.fill([("bad", []), ("good", [])])
            pool.state("bad")
            pool.commit("bad", no)
        assert pool.state("good").status == "active"
        pool.remove("bad")
        pool.add("bad", gm.Grammar.regex("a"))
        pool.commit("bad", no)
    records = [r for r in caplog.records if r.name == "grammarmask"]
    if not log_failures:
        assert records == []
        return
    assert [r.levelno for r in records] == [logging.WARNING] * 2
    assert all("'bad'" in r.getMessage() and "is not allowed" in r.getMessage() for r in records)


_MESSY_IDS = st.sampled_from([None, "a", "b", "c", ["unhashable"], 3])
_MESSY_DRAFTS = st.one_of(
    st.lists(st.one_of(st.integers(0, 9), st.sampled_from([True, 2.5, "7", numpy.int64(4)]))),
    st.lists(st.integers(0, 9)).map(tuple),
    st.lists(st.integers(0, 9)).map(lambda ids: torch.tensor(ids, dtype=torch.int64)),
    st.sampled_from(["12", 5, None]),
)
_MESSY_ENTRIES = st.one_of(
    st.tuples(_MESSY_IDS, _MESSY_DRAFTS),
    st.tuples(_MESSY_IDS, _MESSY_DRAFTS).map(list),
    st.sampled_from(["ab", ("a",), ("a", [], [])]),
)


@given(batch=st.lists(_MESSY_ENTRIES, max_size=5), max_drafts=st.integers(0, 4))
def test_whole_batch_checks_agree_with_checking_entry_by_entry(
    batch: list[Any], max_drafts: int
) -> None:
    """StepPlan.build checks a batch in whole-batch passes and hands anything unusual to the
    entry-by-entry checks that name it: both take the same batches, to the same ids and
    drafts (integers only, nothing truncated), and refuse the same ones."""
    try:
        ids, drafts = _entries_one_by_one(batch, max_drafts)
    except BatchError as refusal:
        with pytest.raises(BatchError) as raised:
            StepPlan.build(batch, max_drafts=max_drafts)
        assert str(raised.value) == str(refusal)
        return
    plan = StepPlan.build(batch, max_drafts=max_drafts)
    assert (plan.request_ids, plan.drafts) == (ids, drafts)
    assert all(type(token) is int for entry in plan.drafts for token in entry)
    assert plan.counts == tuple(len(d) + 1 for d in drafts)
    assert [list(rows) for rows in plan.rows] == [
        list(range(start, start + count))
        for start, count in zip(
            itertools.accumulate(plan.counts, initial=0), plan.counts, strict=False
        )
    ]


@given(data=st.data())
def test_step_row_metadata_matches_a_row_by_row_walk(data: st.DataObject) -> None:
    """The step's row metadata, built with whole-tensor ops, against the definition walked
    row by row: default and explicit layouts, entries without a grammar, spare rows."""
    count = data.draw(st.integers(0, 6))
    batch = [
        (data.draw(st.sampled_from([None, f"r{i}"])), [7] * data.draw(st.integers(0, 4)))
        for i in range(count)
    ]
    needed = sum(len(drafts) + 1 for _, drafts in batch)
    num_rows = needed + data.draw(st.integers(0, 3))
    row_indices = None
    if data.draw(st.booleans()):
        spots = data.draw(st.permutations(range(num_rows)))
        starts = [sum(len(d) + 1 for _, d in batch[:i]) for i in range(count)]
        row_indices = [spots[s : s + len(d) + 1] for s, (_, d) in zip(starts, batch, strict=True)]
    plan = StepPlan.build(batch, row_indices, num_rows)
    to_request, step, verify = [-1] * num_rows, [0] * num_rows, [False] * num_rows
    for entry, rows in enumerate(plan.rows):
        for position, row in enumerate(rows):
            to_request[row], step[row] = entry, position
            verify[row] = position < len(rows) - 1
    metadata = plan.metadata
    # steps of one layout share their metadata (a later step gets it from the cache)
    assert StepPlan.build(batch, row_indices, num_rows).metadata is metadata
    assert metadata.row_to_request.tolist() == to_request
    assert metadata.local_step.tolist() == step
    assert metadata.is_verify.tolist() == verify
    expected = [row for (rid, _), rows in zip(batch, plan.rows, strict=True) if rid for row in rows]
    assert metadata.grammar_rows.tolist() == expected
    assert metadata.has_grammar.tolist() == [row in expected for row in range(num_rows)]


def test_explicit_row_indices(deepseek: gm.Vocabulary) -> None:
    with gm.MatcherPool(deepseek, workers=1) as pool:
        pool.add("a", gm.Grammar.regex("[0-9]+"))
        pool.add("b", gm.Grammar.choice(["x"]))
        masks = pool.fill([("a", [15]), ("b", [])], row_indices=[[4, 1], [2]], num_rows=6)
        assert masks.row_to_request.tolist() == [-1, 0, 1, -1, 0, -1]
        assert masks.local_step.tolist() == [0, 1, 0, 0, 0, 0]
        assert sorted(masks.grammar_rows.tolist()) == [1, 2, 4]
        digits = {i for i, t in enumerate(deepseek.token_bytes) if t and t.isdigit()}
        assert ids_in_row(masks.bitmask[4], deepseek.size) == digits


@pytest.mark.parametrize(
    ("batch", "kwargs", "message"),
    [
        ([("a", []), ("a", [])], {}, "'a' appears twice"),
        ([("a", [1])], {"row_indices": [[0]]}, "needs 2 rows, got 1"),
        ([("a", []), ("b", [])], {"row_indices": [[0], [0]]}, "claim the same logits row"),
        ([("a", [])], {"row_indices": [[3]], "num_rows": 2}, r"must lie in \[0, 2\)"),
        ([("a", [1, 2])], {"num_rows": 2}, "smaller than the 3 rows"),
        ([("a", [0] * 9)], {}, "max_rows=8"),
    ],
)
def test_inconsistent_batches_are_the_engines_error(
    deepseek: gm.Vocabulary,
    batch: list[tuple[str, list[int]]],
    kwargs: dict[str, object],
    message: str,
) -> None:
    with gm.MatcherPool(deepseek, workers=1, max_rows=8) as pool:
        pool.add("a", gm.Grammar.json())
        pool.add("b", gm.Grammar.json())
        with pytest.raises(gm.BatchError, match=message):
            pool.fill(batch, **kwargs)  # type: ignore[arg-type]


def test_outlines_requests_follow_the_same_protocol(
    qwen: gm.Vocabulary,
) -> None:
    """The generic draft loop (outlines-core) gives the same rows as fresh replays."""
    compiler = gm.GrammarCompiler(qwen)
    grammar = gm.Grammar.choice(["north", "northeast", "south"])
    table = {t: i for i, t in enumerate(qwen.token_bytes) if len(t) == 1}
    drafts = [table[c] for c in (b"n", b"o", b"r", b"x", b"h")]
    with gm.MatcherPool(qwen, backend="outlines", workers=1, compiler=compiler) as pool:
        pool.add("r", grammar)
        masks = pool.fill([("r", drafts)])
        assert masks.valid_rows == (4,)  # "x" is forbidden after "nor"
        for j in range(4):
            matcher = compiler.compile(grammar, "outlines").matcher()
            assert all(matcher.accept(t) for t in drafts[:j])
            row = torch.zeros(1, gm.words_per_row(qwen.size), dtype=torch.int32)
            matcher.fill(row, 0)
            assert torch.equal(masks.bitmask[j], row[0])
        assert torch.equal(masks.bitmask[4], masks.bitmask[3])  # don't care: a copy, not zeros
        assert pool.state("r").backend == "outlines"


def test_rows_in_any_order_get_their_own_masks(deepseek: gm.Vocabulary) -> None:
    """Explicit rows out of order (0, 2, 1, 3: first and last differ by len - 1, yet not a
    run) each get the mask of their own draft depth."""
    digits = [deepseek.token_bytes.index(d) for d in (b"1", b"2", b"3")]
    with gm.MatcherPool(deepseek, workers=1) as pool:
        pool.add("in-order", gm.Grammar.regex("1(2(3x)?)?"))
        pool.add("shuffled", gm.Grammar.regex("1(2(3x)?)?"))
        ordered = pool.fill([("in-order", digits)])
        rows = [0, 2, 1, 3]
        shuffled = pool.fill([("shuffled", digits)], row_indices=[rows], num_rows=4)
        for depth, row in enumerate(rows):
            assert torch.equal(shuffled.bitmask[row], ordered.bitmask[depth]), depth


def test_a_free_threaded_interpreter_is_refused_with_the_way_out() -> None:
    """The step's lock-free claims rely on the GIL (see StepFill): without it, importing
    grammarmask fails and says how to turn the GIL back on."""
    from grammarmask.pool.gil import require_gil

    require_gil(lambda: True)
    with pytest.raises(ImportError, match=r"needs the GIL.*PYTHON_GIL=1"):
        require_gil(lambda: False)
