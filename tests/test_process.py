"""Process isolation and mask deadlines: workers die mid-fill and the batch goes on.

One process pool (2 workers, the fault-injecting backends of faults.py) serves the module;
a thread pool with the same backends is the twin whose masks every survivor must match.
"""

from __future__ import annotations

import functools
import itertools
import json
import os
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from conftest import bundled_examples, ids_in_row
from faults import (
    HANG_S,
    START_FAULT,
    fails_once_marked_factory,
    faulty_backends,
    faulty_compiler,
)
from hypothesis import given, settings
from hypothesis import strategies as st

import grammarmask as gm

NAMES = ["person", "invoice", "function_call", "matrix", "meeting"]
_ids = itertools.count()


@pytest.fixture(scope="module")
def cases(
    deepseek_encode: Callable[[str], list[int]],
) -> dict[str, tuple[gm.Grammar, list[int]]]:
    return bundled_examples(NAMES, deepseek_encode)


@pytest.fixture(scope="module")
def process_pool(deepseek: gm.Vocabulary) -> Iterator[gm.MatcherPool]:
    with gm.MatcherPool(
        deepseek, workers=2, isolation="process", backend_factory=faulty_backends
    ) as pool:
        yield pool


@pytest.fixture(scope="module")
def thread_pool(deepseek: gm.Vocabulary) -> Iterator[gm.MatcherPool]:
    with gm.MatcherPool(deepseek, workers=2, backend_factory=faulty_backends) as pool:
        yield pool


@pytest.fixture(params=["thread", "process"])
def pool(
    request: pytest.FixtureRequest, thread_pool: gm.MatcherPool, process_pool: gm.MatcherPool
) -> gm.MatcherPool:
    return thread_pool if request.param == "thread" else process_pool


def _add(
    pools: list[gm.MatcherPool], grammar: gm.Grammar, prefix: list[int], backend: str | None = None
) -> str:
    """A fresh request id, added to every pool and advanced by `prefix`."""
    rid = f"q{next(_ids)}"
    for pool in {id(p): p for p in pools}.values():
        pool.add(rid, grammar, backend=backend)
        assert pool.commit(rid, prefix).status == "active"
    return rid


def _rows(masks: gm.StepMasks, rid: str) -> torch.Tensor:
    return masks.bitmask[list(masks.rows[masks.request_ids.index(rid)])].clone()


def _stop_only(vocab: gm.Vocabulary, rows: torch.Tensor) -> bool:
    return all(ids_in_row(row, vocab.size) == set(vocab.stop_token_ids) for row in rows)


@settings(max_examples=8)
@given(data=st.data())
def test_process_masks_equal_thread_masks(
    data: st.DataObject,
    thread_pool: gm.MatcherPool,
    process_pool: gm.MatcherPool,
    cases: dict[str, tuple[gm.Grammar, list[int]]],
) -> None:
    """A drop-in: the same batch gives bit-identical masks and states in both modes."""
    batch = []
    for name in data.draw(st.lists(st.sampled_from(NAMES), min_size=1, max_size=6)):
        grammar, ids = cases[name]
        committed = data.draw(st.integers(0, len(ids) - 1))
        rid = _add([thread_pool, process_pool], grammar, ids[:committed])
        drafts = list(ids[committed : committed + data.draw(st.integers(0, 5))])
        if drafts and data.draw(st.booleans()):
            drafts[-1] = data.draw(st.integers(0, 129_279))
        batch.append((rid, drafts))
    want = thread_pool.fill(batch)
    got = process_pool.fill(batch)
    assert torch.equal(got.bitmask, want.bitmask)
    assert got.valid_rows == want.valid_rows and got.failures == want.failures
    for rid, _ in batch:
        assert process_pool.commit(rid, [1]) == thread_pool.commit(rid, [1])


def test_faults_stay_with_their_request(
    pool: gm.MatcherPool,
    thread_pool: gm.MatcherPool,
    deepseek: gm.Vocabulary,
    cases: dict[str, tuple[gm.Grammar, list[int]]],
) -> None:
    """Matcher exceptions, a bad grammar, an illegal commit, an out-of-range draft and an
    unknown id fail their request alone, with the same reason in both modes."""
    grammar, ids = cases["invoice"]
    healthy = [_add([pool, thread_pool], grammar, ids[:k]) for k in (0, 3, 7)]
    faulty = {
        "fill": _add([pool], grammar, [], "faulty-fill"),
        "rollback": _add([pool], grammar, [], "faulty-rollback"),
        "bad grammar": f"q{next(_ids)}",
        "illegal commit": _add([pool], grammar, []),
        "draft out of range": _add([pool], grammar, []),
    }
    bad = {"type": "object", "properties": {"a": False}, "required": ["a"]}
    pool.add(faulty["bad grammar"], gm.Grammar.json_schema(bad))
    unknown = f"q{next(_ids)}"
    assert pool.commit(faulty["illegal commit"], [deepseek.size - 1]).status == "failed"
    batch = [(rid, ids[3:6]) for rid in healthy] + [(rid, ids[:2]) for rid in faulty.values()]
    batch[-1] = (faulty["draft out of range"], [deepseek.size + 5])
    batch.append((unknown, []))
    got = pool.fill(batch)
    want = thread_pool.fill(batch[: len(healthy)])
    for rid in healthy:
        assert torch.equal(_rows(got, rid), _rows(want, rid)), rid
    for fault, rid in faulty.items():
        state = pool.state(rid)
        assert state.status == "failed", (fault, state)
        assert _stop_only(deepseek, _rows(got, rid)), fault
    assert "injected fault in fill" in got.failures[faulty["fill"]]
    assert "injected fault in rollback" in got.failures[faulty["rollback"]]
    assert "grammar error" in got.failures[faulty["bad grammar"]]
    assert "outside the vocabulary" in got.failures[faulty["draft out of range"]]
    assert "add() it before its first step" in got.failures[unknown]
    assert faulty["illegal commit"] not in got.failures  # reported by its commit already


@pytest.mark.parametrize("crash", ["segv", "abort", "killed"])
def test_a_worker_dying_mid_fill_fails_only_its_requests(
    crash: str,
    process_pool: gm.MatcherPool,
    thread_pool: gm.MatcherPool,
    deepseek: gm.Vocabulary,
    cases: dict[str, tuple[gm.Grammar, list[int]]],
) -> None:
    """SIGSEGV, abort() or SIGKILL in the middle of a fill: the requests the worker held fail
    with the signal's name, everyone else's rows are exact, the worker comes back."""
    grammar, ids = cases["meeting"]
    host = process_pool.matchers
    fault = "faulty-hang" if crash == "killed" else f"faulty-{crash}"
    victim = _add([process_pool], grammar, [], fault)
    healthy: list[str] = []
    while (
        len(healthy) < 4
        or {_worker(process_pool, r) for r in healthy} == {0}
        or {_worker(process_pool, r) for r in healthy} == {1}
    ):
        healthy.append(_add([process_pool, thread_pool], grammar, ids[:4]))
    restarts = host.restarts
    if crash == "killed":
        pid = host.pids()[_worker(process_pool, victim)]
        threading.Timer(1.0, os.kill, (pid, signal.SIGKILL)).start()
    batch = [(rid, ids[4:7]) for rid in healthy] + [(victim, ids[:3])]
    got = process_pool.fill(batch)
    want = thread_pool.fill(batch[:-1])
    signame = {"segv": "SIGSEGV", "abort": "SIGABRT", "killed": "SIGKILL"}[crash]
    reason = f"worker process died ({signame}) while filling masks"
    assert got.failures[victim] == reason
    for rid in healthy:
        if _worker(process_pool, rid) == _worker(process_pool, victim):
            assert got.failures[rid] == reason and process_pool.state(rid).reason == reason
            assert _stop_only(deepseek, _rows(got, rid))
        else:
            assert rid not in got.failures
            assert torch.equal(_rows(got, rid), _rows(want, rid)), rid
            assert process_pool.commit(rid, ids[4:5]).status == "active"
    assert host.restarts == restarts + 1
    fresh = [_add([process_pool, thread_pool], grammar, ids[:2]) for _ in range(3)]
    later = [(rid, ids[2:4]) for rid in fresh]
    got, want = process_pool.fill(later), thread_pool.fill(later)
    assert got.failures == {} and torch.equal(got.bitmask, want.bitmask)


def _worker(pool: gm.MatcherPool, rid: str) -> int:
    """Which worker process holds a request (tests only: it is the pool's private detail)."""
    return pool.matchers.worker_of(rid)


def test_a_backend_crashing_while_compiling_fails_its_worker_only(
    process_pool: gm.MatcherPool, cases: dict[str, tuple[gm.Grammar, list[int]]]
) -> None:
    grammar, ids = cases["person"]
    victim = f"q{next(_ids)}"
    process_pool.add(victim, gm.Grammar.regex("[a-z]+"), backend="faulty-segv compile")
    state = process_pool.commit(victim, [])  # waits for the compilation, which kills it
    assert state.status == "failed"
    assert state.reason == "worker process died (SIGSEGV) while committing tokens"
    healthy = _add([process_pool], grammar, ids[:1])
    masks = process_pool.fill([(victim, []), (healthy, ids[1:3])])
    assert masks.failures == {} and masks.valid_rows == (1, 3)


@pytest.mark.parametrize("how", ["deadline_s", "wait timeout"])
def test_a_late_request_fails_alone(
    how: str,
    pool: gm.MatcherPool,
    thread_pool: gm.MatcherPool,
    deepseek: gm.Vocabulary,
    cases: dict[str, tuple[gm.Grammar, list[int]]],
) -> None:
    """A fill that hangs past the deadline fails its request ("mask deadline exceeded");
    the others get their masks, and later steps run normally for them."""
    grammar, ids = cases["function_call"]
    healthy = [_add([pool, thread_pool], grammar, ids[:k]) for k in range(3)]
    late = _add([pool], grammar, [], "faulty-hang")
    batch = [(late, [])] + [(rid, ids[3:5]) for rid in healthy]  # one fill: hangs HANG_S
    if how == "deadline_s":
        got = pool.fill(batch, deadline_s=0.5)
    else:
        got = pool.fill_async(batch).wait(timeout=0.5)
    want = thread_pool.fill(batch[1:])
    assert got.failures == {late: "mask deadline exceeded"}
    assert pool.state(late).reason == "mask deadline exceeded"
    assert pool.commit(late, [1]).status == "failed"  # answers at once, though it hangs
    assert _stop_only(deepseek, _rows(got, late))
    for rid in healthy:
        assert torch.equal(_rows(got, rid), _rows(want, rid)), rid
    # the late fill lands after HANG_S: it must not touch the masks of later steps, which
    # reuse the same slots (rows 0..2 were the late request's)
    layout = [(rid, ids[3:5]) for rid in healthy]
    steps = [pool.fill(layout, deadline_s=60), pool.fill(layout, deadline_s=60)]
    kept = [s.bitmask.clone() for s in steps]
    time.sleep(HANG_S + 0.5)
    expected = thread_pool.fill(layout).bitmask
    for masks, before in zip(steps, kept, strict=True):
        assert masks.failures == {}
        assert torch.equal(masks.bitmask, before) and torch.equal(before, expected)
    for rid in healthy:
        assert pool.commit(rid, ids[3:4]) == thread_pool.commit(rid, ids[3:4])


def test_a_hang_in_a_step_on_one_thread_holds_up_no_one(
    deepseek: gm.Vocabulary,
    cases: dict[str, tuple[gm.Grammar, list[int]]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A step the pool fills on one thread (the faster mode for its cheap steps) starts on
    one fill thread; when a matcher hangs in it, the other fill thread joins (after
    _WIDEN_AFTER_S) and fills the rest in time. The hung fill writes its rows when it comes
    back, into a buffer nobody reads any more: the step's masks keep its rows fail-closed."""
    grammar, ids = cases["person"]
    with gm.MatcherPool(deepseek, workers=2, backend_factory=faulty_backends) as pool:
        healthy = [_add([pool], grammar, ids[:k]) for k in range(3)]
        layout = [(rid, ids[3:5]) for rid in healthy]
        want = [pool.fill(layout).bitmask.clone() for _ in range(2)][-1]
        late = _add([pool], grammar, [], "faulty-hang")
        mode = pool.matchers.mode
        monkeypatch.setattr(mode, "alone", lambda requests: True)
        got = pool.fill_async([(late, []), *layout]).wait(timeout=1.0)
        assert got.failures == {late: "mask deadline exceeded"}
        assert torch.equal(got.bitmask[1:], want)
        time.sleep(HANG_S + 0.5)  # the hung fill comes back and writes
        assert _stop_only(deepseek, got.bitmask[:1])
        assert torch.equal(got.bitmask[1:], want)


def test_deadline_must_be_positive(thread_pool: gm.MatcherPool) -> None:
    with pytest.raises(ValueError, match="deadline_s must be positive"):
        thread_pool.fill([(None, [])], deadline_s=0)


def test_process_pool_refuses_a_compiler(deepseek: gm.Vocabulary) -> None:
    compiler = gm.GrammarCompiler(deepseek)
    with pytest.raises(ValueError, match="pass backend_factory"):
        gm.MatcherPool(deepseek, isolation="process", compiler=compiler)
    with pytest.raises(ValueError, match="isolation must be"):
        gm.MatcherPool(deepseek, isolation="fork")  # type: ignore[arg-type]
    compiler.close()


@pytest.mark.corpus
def test_corpus_schemas_through_a_process_pool(
    corpus_dir: Path,
    process_pool: gm.MatcherPool,
    thread_pool: gm.MatcherPool,
    deepseek_encode: Callable[[str], list[int]],
) -> None:
    """Real MaskBench schemas (GRAMMARMASK_PROCESS_SAMPLE of them, every 1 in N files), each
    replaying its first valid instance: whatever a backend does with them (refuse, time
    out, crash), the pool answers every step, a crash names its signal, and the requests
    that stay active have exactly the thread pool's masks."""
    files = sorted(corpus_dir.glob("*.json"))
    sample = int(os.environ.get("GRAMMARMASK_PROCESS_SAMPLE", "200"))
    outcomes: Counter[str] = Counter()
    for path in files[:: max(1, len(files) // sample)]:
        entry = json.loads(path.read_text(encoding="utf-8"))
        valid = [t["data"] for t in entry["tests"] if t["valid"]]
        try:
            grammar = gm.Grammar.json_schema(entry["schema"])
        except gm.GrammarError:
            outcomes["refused up front"] += 1
            continue
        ids = deepseek_encode(json.dumps(valid[0], separators=(",", ":"))) if valid else []
        rid = f"c{next(_ids)}"
        process_pool.add(rid, grammar)
        got = process_pool.fill([(rid, ids[:4])])
        state = process_pool.state(rid)
        if "worker process died" in (state.reason or ""):
            assert "(SIG" in (state.reason or ""), state
            outcomes["worker crash"] += 1
        elif state.status == "active":  # only now in this process: it did not crash there
            thread_pool.add(rid, grammar)
            want = thread_pool.fill([(rid, ids[:4])])
            assert torch.equal(got.bitmask, want.bitmask), path.name
            thread_pool.remove(rid)
            outcomes["active"] += 1
        else:
            assert state.reason, state
            outcomes["failed with a reason"] += 1
        process_pool.remove(rid)
    print(dict(outcomes))
    assert outcomes["active"] > 0


def test_hung_fills_do_not_use_up_the_fill_threads(
    thread_pool: gm.MatcherPool, cases: dict[str, tuple[gm.Grammar, list[int]]]
) -> None:
    """Three steps in a row each leave a fill hanging past its deadline, more than the
    pool's 2 fill threads: every later step still finds threads for its other requests."""
    grammar, ids = cases["person"]
    healthy = [_add([thread_pool], grammar, ids[:k]) for k in range(4)]
    for _ in range(3):
        late = _add([thread_pool], grammar, [], "faulty-hang")
        batch: list[tuple[str | None, list[int]]] = [(late, [])] + [
            (rid, ids[k : k + 2]) for k, rid in enumerate(healthy)
        ]
        got = thread_pool.fill(batch, deadline_s=1.0)
        assert got.failures == {late: "mask deadline exceeded"}
        assert got.valid_rows[1:] == (3, 3, 3, 3)
        thread_pool.remove(late)
    time.sleep(HANG_S)  # the stuck threads end on their own


def test_a_compiling_request_holds_no_fill_thread(
    deepseek: gm.Vocabulary, cases: dict[str, tuple[gm.Grammar, list[int]]]
) -> None:
    """With one fill thread, a request whose grammar takes 2 s to compile waits aside: the
    others are filled at once (a deadline fails only the compiling one), and without a
    deadline the step waits for it and serves it."""
    grammar, ids = cases["matrix"]
    with gm.MatcherPool(deepseek, workers=1, backend_factory=faulty_backends) as pool:
        healthy = [_add([pool], grammar, ids[:k]) for k in range(3)]
        slow = [f"slow-{next(_ids)}" for _ in range(2)]
        for index, rid in enumerate(slow):
            unique = gm.Grammar.regex(f"[a-z]{{{index + 1},40}}-{rid}")
            pool.add(rid, unique, backend="faulty-slow compile")
        batch: list[tuple[str | None, list[int]]] = [(slow[0], [])] + [
            (rid, ids[k : k + 2]) for k, rid in enumerate(healthy)
        ]
        started = time.monotonic()
        got = pool.fill(batch, deadline_s=1.0)
        assert time.monotonic() - started < 1.9  # not after the 2 s compile
        assert got.failures == {slow[0]: "mask deadline exceeded"}
        assert got.valid_rows[1:] == (3, 3, 3)
        served = pool.fill([(slow[1], []), *batch[1:]])
        assert served.failures == {} and served.valid_rows == (1, 3, 3, 3)
        assert pool.state(slow[1]).status == "active"


def test_a_compile_past_its_timeout_fails_its_request_on_time(
    deepseek: gm.Vocabulary, cases: dict[str, tuple[gm.Grammar, list[int]]]
) -> None:
    """A request waiting aside for a 2 s compilation fails when its 0.5 s compile timeout
    passes (the step does not wait for the compilation to end); the others are served."""
    grammar, ids = cases["matrix"]
    compiler = faulty_compiler(deepseek)
    compiler.compile(grammar)  # warm: only the slow one may miss the short timeout
    with gm.MatcherPool(deepseek, workers=1, compiler=compiler, compile_timeout_s=0.5) as pool:
        healthy = _add([pool], grammar, [])
        slow = f"slow-{next(_ids)}"
        pool.add(slow, gm.Grammar.regex(f"[a-z]+-{slow}"), backend="faulty-slow compile")
        started = time.monotonic()
        got = pool.fill([(slow, []), (healthy, ids[:2])])
        assert time.monotonic() - started < 1.9
        assert got.failures == {slow: "grammar compilation did not finish within 0.5 s"}
        assert got.valid_rows == (1, 3)
    compiler.close()


@pytest.mark.parametrize(
    ("tokens", "reason"),
    [
        ([2.5], "committed token 2.5 (float) is not an integer token id"),
        (["7"], "committed token '7' (str) is not an integer token id"),
        ("ab", "committed tokens must be a sequence of integer token ids, not 'ab'"),
    ],
)
def test_a_commit_of_non_integers_fails_the_request_alone(
    tokens: list[int],
    reason: str,
    pool: gm.MatcherPool,
    cases: dict[str, tuple[gm.Grammar, list[int]]],
) -> None:
    """Never truncated (int(2.5) would commit token 2), never raised: the request fails with
    the same reason in both isolation modes, and a neighbour is untouched."""
    grammar, ids = cases["person"]
    victim, neighbour = _add([pool], grammar, ids[:2]), _add([pool], grammar, ids[:2])
    state = pool.commit(victim, tokens)
    assert (state.status, state.reason, state.committed) == ("failed", reason, 2)
    assert pool.state(victim).reason == reason
    assert pool.commit(neighbour, ids[2:3]).committed == 3
    masks = pool.fill([(victim, []), (neighbour, [])])
    assert masks.failures == {} and masks.valid_rows == (1, 1)  # reported once, by commit


def test_unknown_ids_are_refused_every_step_and_never_recorded(pool: gm.MatcherPool) -> None:
    """An id never added fails on each step that names it (no record is made for it, so an
    engine that keeps sending unknown ids cannot grow the pool)."""
    for _ in range(2):
        masks = pool.fill([("never-added", [5])])
        assert masks.failures == {
            "never-added": "unknown request id 'never-added': add() it before its first step"
        }
        assert masks.valid_rows == (1,)
    assert pool.state("never-added").reason == "unknown request id 'never-added'"


def test_a_sampler_tensor_commits_like_a_list(
    pool: gm.MatcherPool, cases: dict[str, tuple[gm.Grammar, list[int]]]
) -> None:
    """Accepted tokens straight from a sampler (an int64 tensor) advance the request as the
    same ids in a list do, in both isolation modes."""
    grammar, ids = cases["person"]
    as_tensor, as_list = _add([pool], grammar, []), _add([pool], grammar, [])
    assert pool.commit(as_tensor, torch.tensor(ids[:3])).committed == 3
    assert pool.commit(as_list, ids[:3]).committed == 3
    masks = pool.fill([(as_tensor, ids[3:5]), (as_list, ids[3:5])])
    assert masks.valid_rows == (3, 3)
    assert torch.equal(_rows(masks, as_tensor), _rows(masks, as_list))


@pytest.mark.timeout(120)
def test_a_worker_that_cannot_restart_is_retired_and_new_requests_go_elsewhere(
    deepseek: gm.Vocabulary, deepseek_encode: Callable[[str], list[int]], tmp_path: Path
) -> None:
    """Worker 0 is killed once its replacement can no longer start: its requests fail with
    the signal, the request that lands on the replacement fails saying why it could not
    start, the requests on worker 1 carry on, and every later request goes to worker 1."""
    marker = tmp_path / "restarts-fail"
    factory = functools.partial(fails_once_marked_factory, str(marker))
    grammar = gm.Grammar.regex("[a-z]+")
    letters = deepseek_encode("abc")
    with gm.MatcherPool(deepseek, workers=2, isolation="process", backend_factory=factory) as pool:
        for name in ("a", "b", "c", "d"):
            pool.add(name, grammar)
        on = {name: pool.matchers.worker_of(name) for name in "abcd"}
        assert sorted(on.values()) == [0, 0, 1, 1]
        marker.touch()
        os.kill(pool.matchers.pids()[0], signal.SIGKILL)
        masks = pool.fill([(name, []) for name in "abcd"])
        assert {name for name in masks.failures} == {n for n in "abcd" if on[n] == 0}
        assert all("(SIGKILL)" in reason for reason in masks.failures.values())
        pool.add("probe", grammar)  # the replacement holds the fewest: it lands there
        probe = pool.state("probe")
        assert probe.status == "failed"
        assert probe.reason == (
            f"worker process could not restart: worker process could not start: "
            f"RuntimeError: {START_FAULT}"
        )
        for name in ("e", "f", "g"):
            assert pool.add(name, grammar).status == "active"
            assert pool.matchers.worker_of(name) == 1
        survivors = [n for n in "abcdefg" if on.get(n, 1) == 1]
        for name in survivors:
            assert pool.commit(name, letters).status == "active"
        masks = pool.fill([(name, []) for name in survivors])
        assert masks.failures == {}


@pytest.mark.timeout(120)
def test_readiness_says_compiling_ready_or_failed_and_wait_ready_is_bounded(
    pool: gm.MatcherPool,
) -> None:
    """A grammar that takes 2 s to compile is "compiling" until then (a wait of 0.2 s says
    so, within about that time), then "ready", with its backend; a grammar its backend
    refuses is "failed" with the reason before any step; so is an unknown id. In both
    isolation modes."""
    tag = next(_ids)
    slow, refused = f"slow{tag}", f"refused{tag}"
    pool.add(slow, gm.Grammar.regex(f"[a-z]{{{tag}}}"), backend="faulty-slow compile")
    bad = {"type": "object", "properties": {"a": False}, "required": ["a"]}
    pool.add(refused, gm.Grammar.json_schema(bad), backend="xgrammar")
    assert pool.state(slow).readiness == "compiling"
    started = time.monotonic()
    early = pool.wait_ready([slow, refused], timeout=0.2)
    assert time.monotonic() - started < 1.5
    assert early[slow].readiness == "compiling" and not early[slow].ready
    states = pool.wait_ready([slow, refused, "never-added"])
    assert states[slow].readiness == "ready" and states[slow].ready
    assert states[slow].backend == "faulty-slow compile"
    assert states[refused].readiness == "failed"
    assert "xgrammar cannot compile" in (states[refused].reason or "")
    assert states["never-added"].readiness == "failed"
    assert pool.wait_ready([], timeout=0) == {}
    for request_id in (slow, refused):
        pool.remove(request_id)
