"""Fault soak: 64 requests, random drafts, random faults, next to a fault-free twin.

Every step, both pools get the same batch; the faulty one also gets faults (matcher
exceptions, illegal commits, out-of-range draft ids, bad grammars, compile timeouts, a
request removed mid-step, fills hanging past the step's deadline, and in process mode
workers killed or crashing). Checked every step: the rows of every request without a fault
are bit-identical to the twin's, every fault fails its request with a reason, no exception
reaches the caller; at the end, the resident memory of the pool (and its workers) has not
grown without bound. Short by default; `GRAMMARMASK_SOAK_STEPS=10000 pytest -s
tests/test_soak.py` or `pytest -m slow -s tests/test_soak.py` is the long run.
"""

from __future__ import annotations

import faulthandler
import json
import os
import random
import signal
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
from conftest import bundled_examples, ids_in_row
from faults import HANG_S, faulty_backends

import grammarmask as gm

NAMES = ["person", "invoice", "function_call", "service_config", "matrix", "meeting"]
REQUESTS = 64
MAX_DRAFTS = 5
FAULT_RATE = 0.2  # per step; the long run uses 0.05 (restarting workers takes seconds)
DEADLINE_S = 2.0  # on steps with a hanging request (faults.HANG_S = 3 s)
COMPILE_TIMEOUT_S = 10.0  # "stuck compile" takes 12 s; a restarted worker compiles cold
BAD_SCHEMA = {"type": "object", "properties": {"a": False}, "required": ["a"]}
# fault -> weight; the kinds that cost a worker restart are rarer
FAULTS = {
    "fill": 1.0,
    "accept": 1.0,
    "rollback": 1.0,
    "illegal commit": 1.0,
    "out-of-range draft": 1.0,
    "bad grammar": 1.0,
    "compile timeout": 0.3,
    "remove mid-step": 1.0,
    "deadline": 0.3,
}
HOLDS_A_THREAD = {"deadline": HANG_S, "compile timeout": 12.0 + 10.0}
"""Faults that hold a thread for seconds, injected one at a time. A stuck compile (12 s)
holds a compile thread, and requests whose grammars compile behind it wait: a deadline
step then rightly fails them (their masks are not ready in time). A hung fill holds its
fill thread; the pool hands out fresh ones after the late step, so hangs need no spacing
for correctness, but keeping them apart bounds the threads stuck at once."""
NEW_REQUEST_FAULTS = (
    "fill",
    "accept",
    "rollback",
    "bad grammar",
    "compile timeout",
    "deadline",
    "worker segfault",
)
"""Faults that come with a new request (its backend or grammar); the others hit a live one."""
PROCESS_FAULTS = {"worker killed": 0.5, "worker segfault": 0.5}
# what each fault's reason must say
REASONS = {
    "fill": "injected fault in fill",
    "accept": "injected fault in accept",
    "rollback": "injected fault in rollback",
    "illegal commit": "is not allowed by the grammar",
    "out-of-range draft": "outside the vocabulary",
    "bad grammar": "grammar error",
    "compile timeout": "did not finish within",
    "deadline": "mask deadline exceeded",
    "worker segfault": "worker process died (SIGSEGV)",
}


@dataclass
class Slot:
    rid: str
    ids: list[int]
    fault: str | None = None
    position: int = 0


@dataclass
class Report:
    isolation: str
    steps: int = 0
    faults: Counter[str] = field(default_factory=Counter)
    reported: int = 0
    collateral: int = 0
    contamination: list[str] = field(default_factory=list)
    rss_mb_before: float = 0.0
    rss_mb_after: float = 0.0
    seconds: float = 0.0

    def table(self) -> str:
        lines = [
            f"soak ({self.isolation}): {self.steps} steps, {REQUESTS} requests, "
            f"{sum(self.faults.values())} faults injected, {self.reported} reported with a "
            f"reason, {self.collateral} requests failed alongside a dead worker, "
            f"{len(self.contamination)} contaminated, RSS {self.rss_mb_before:.0f} -> "
            f"{self.rss_mb_after:.0f} MB, {self.seconds:.0f} s",
        ]
        lines += [f"  {kind:<20} {count}" for kind, count in sorted(self.faults.items())]
        return "\n".join(lines)


def _rss_mb(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                total += int(line.split()[1])
    return total / 1024


class Soak:
    """The faulty pool and its twin, stepped in lockstep."""

    def __init__(
        self,
        faulty: gm.MatcherPool,
        twin: gm.MatcherPool,
        vocab: gm.Vocabulary,
        examples: dict[str, tuple[gm.Grammar, list[int]]],
        seed: int,
        fault_rate: float,
    ) -> None:
        self.faulty, self.twin, self.vocab = faulty, twin, vocab
        self.fault_rate = fault_rate
        self.examples = examples
        self.rng = random.Random(seed)
        self.report = Report(faulty.isolation)
        self.kinds = dict(FAULTS, **(PROCESS_FAULTS if faulty.isolation == "process" else {}))
        self.serial = 0
        self.held_until = 0.0
        self.slots = [self._new_slot(None) for _ in range(REQUESTS)]

    def _new_slot(self, fault: str | None) -> Slot:
        self.serial += 1
        rid = f"s{self.serial}"
        grammar, ids = self.examples[self.rng.choice(NAMES)]
        self.twin.add(rid, grammar)
        if fault == "bad grammar":
            self.faulty.add(rid, gm.Grammar.json_schema(BAD_SCHEMA))
        elif fault in ("fill", "accept", "rollback"):
            self.faulty.add(rid, grammar, backend=f"faulty-{fault}")
        elif fault == "compile timeout":  # a grammar of its own: a cache hit would not wait
            unique = gm.Grammar.json_schema(dict(json.loads(grammar.source), title=rid))
            self.faulty.add(rid, unique, backend="faulty-stuck compile")
        elif fault == "deadline":
            self.faulty.add(rid, grammar, backend="faulty-hang")
        elif fault == "worker segfault":
            self.faulty.add(rid, grammar, backend="faulty-segv")
        else:
            self.faulty.add(rid, grammar)
        return Slot(rid, ids, fault)

    def _replace(self, index: int, fault: str | None) -> None:
        old = self.slots[index]
        self.faulty.remove(old.rid)
        self.twin.remove(old.rid)
        self.slots[index] = self._new_slot(fault)

    def step(self) -> None:
        fault = None
        if self.rng.random() < self.fault_rate:
            fault = self.rng.choices(list(self.kinds), weights=list(self.kinds.values()))[0]
        if fault in HOLDS_A_THREAD and time.monotonic() < self.held_until:
            fault = None  # a hung fill, or one waiting for its compile, holds a fill thread
        if fault in HOLDS_A_THREAD:
            self.held_until = time.monotonic() + HOLDS_A_THREAD[fault] + 1.0
        if fault is not None:
            self.report.faults[fault] += 1
        target = self.rng.randrange(REQUESTS)
        if fault in NEW_REQUEST_FAULTS:
            self._replace(target, fault)
        elif fault in ("illegal commit", "out-of-range draft", "remove mid-step"):
            if self.slots[target].fault is not None:
                self._replace(target, None)
            self.slots[target].fault = fault

        batch = []
        for slot in self.slots:
            # a rollback happens only where drafts are tried: a one-row step has none
            count = self.rng.randint(int(slot.fault == "rollback"), MAX_DRAFTS)
            drafts = list(slot.ids[slot.position : slot.position + count])
            if drafts and self.rng.random() < 0.2:
                drafts[self.rng.randrange(len(drafts))] = self.rng.randrange(self.vocab.size)
            batch.append((slot.rid, drafts))
        faulty_batch = list(batch)
        target_slot = self.slots[target]
        if fault == "out-of-range draft":
            faulty_batch[target] = (target_slot.rid, [self.vocab.size + 7])
            batch[target] = (target_slot.rid, [0])
        deadline = DEADLINE_S if fault == "deadline" else None
        future = self.faulty.fill_async(faulty_batch, deadline_s=deadline)
        if fault == "remove mid-step":
            self.faulty.remove(target_slot.rid)
        if fault == "worker killed":
            pids = self.faulty.matchers.pids()
            os.kill(self.rng.choice(pids), signal.SIGKILL)
        got = future.wait()
        want = self.twin.fill(batch)
        self._check(got, want)
        self._commit(batch)
        self.report.steps += 1

    def _check(self, got: gm.StepMasks, want: gm.StepMasks) -> None:
        """Rows of requests without a fault equal the twin's; failed rows are fail-closed."""
        healthy: list[tuple[Slot, list[int]]] = []
        for index, slot in enumerate(self.slots):
            rows = list(got.rows[index])
            reason = got.failures.get(slot.rid)
            if reason is not None and slot.fault in (None, "remove mid-step"):
                self._collateral(slot, reason)
            if reason is None and slot.fault in (None, "remove mid-step"):
                healthy.append((slot, rows))
            elif reason is not None and any(
                ids_in_row(row, self.vocab.size) != set(self.vocab.stop_token_ids)
                for row in got.bitmask[rows]
            ):
                self.report.contamination.append(f"{slot.rid}: failed but not fail-closed")
        every = [row for _, rows in healthy for row in rows]
        if torch.equal(got.bitmask[every], want.bitmask[every]):
            return  # one comparison for the whole step; per request only to name a culprit
        for slot, rows in healthy:
            if not torch.equal(got.bitmask[rows], want.bitmask[rows]):
                self.report.contamination.append(f"step {self.report.steps}: {slot.rid}")

    def _collateral(self, slot: Slot, reason: str | None) -> None:
        """A request without a fault may only fail alongside a dead worker."""
        if "worker process died" in (reason or ""):
            self.report.collateral += 1
        else:
            self.report.contamination.append(f"{slot.rid} failed: {reason}")
        slot.fault = "collateral"

    def _commit(self, batch: list[tuple[str, list[int]]]) -> None:
        """The sampler accepts the drafts that follow the instance, plus one token."""
        for index, slot in enumerate(list(self.slots)):
            drafts = batch[index][1]
            accepted = 0
            while accepted < len(drafts) and drafts[accepted] == slot.ids[slot.position + accepted]:
                accepted += 1
            tokens = slot.ids[slot.position : slot.position + accepted + 1]
            tokens = tokens or [self.vocab.stop_token_ids[0]]
            if slot.fault == "illegal commit":
                tokens = [self.vocab.size - 1]
            mine = self.faulty.commit(slot.rid, tokens)
            theirs = self.twin.commit(slot.rid, tokens) if slot.fault is None else None
            slot.position += len(tokens)
            self._judge(index, slot, mine, theirs)

    def _judge(
        self, index: int, slot: Slot, mine: gm.RequestState, theirs: gm.RequestState | None
    ) -> None:
        if slot.fault is None and theirs is not None and mine.status == "failed":
            self._collateral(slot, mine.reason)
        elif slot.fault is None and theirs is not None:
            if (mine.status, mine.committed) != (theirs.status, theirs.committed):
                self.report.contamination.append(f"{slot.rid}: {mine} != {theirs}")
            if mine.status == "active":
                return
        elif slot.fault not in ("collateral", "remove mid-step"):
            if mine.status == "failed" and REASONS[slot.fault or ""] in (mine.reason or ""):
                self.report.reported += 1
            else:
                self.report.contamination.append(f"{slot.rid} ({slot.fault}): {mine}")
        self._replace(index, None)


def run_soak(
    vocab: gm.Vocabulary,
    examples: dict[str, tuple[gm.Grammar, list[int]]],
    isolation: str,
    steps: int,
    seed: int = 0,
    fault_rate: float = FAULT_RATE,
) -> Report:
    """Run the soak; a watchdog dumps every thread's stack and exits if it ever stalls."""
    faulthandler.dump_traceback_later(600, exit=True)
    faulty = gm.MatcherPool(
        vocab,
        workers=2,
        isolation=isolation,  # type: ignore[arg-type]
        backend_factory=faulty_backends,
        compile_timeout_s=COMPILE_TIMEOUT_S,
    )
    twin = gm.MatcherPool(vocab, workers=2, compile_timeout_s=600)
    try:
        _warm_up(faulty, examples)
        soak = Soak(faulty, twin, vocab, examples, seed, fault_rate)
        warmup = min(20, steps)
        for _ in range(warmup):
            soak.step()
            faulthandler.dump_traceback_later(600, exit=True)
        pids = [os.getpid()]
        if isolation == "process":
            pids += faulty.matchers.pids()
        soak.report.rss_mb_before = _rss_mb(pids)
        started = time.monotonic()
        for step in range(warmup, steps):
            soak.step()
            faulthandler.dump_traceback_later(600, exit=True)
            if (step + 1) % 1000 == 0:
                now = [os.getpid()]
                if isolation == "process":
                    now += faulty.matchers.pids()
                line = soak.report.table().splitlines()[0].split(", RSS")[0]
                print(f"{isolation} step {step + 1}: {line}, RSS now {_rss_mb(now):.0f} MB")
        soak.report.seconds = time.monotonic() - started
        if isolation == "process":
            pids = [os.getpid(), *faulty.matchers.pids()]
        soak.report.rss_mb_after = _rss_mb(pids)
        return soak.report
    finally:
        faulthandler.cancel_dump_traceback_later()
        faulty.close()
        twin.close()


def _warm_up(pool: gm.MatcherPool, examples: dict[str, tuple[gm.Grammar, list[int]]]) -> None:
    """Compile every schema in every worker before the soak: a cold compile on a loaded
    machine may exceed the soak's short compile timeout (a compilation past its timeout
    still lands in the cache, so retrying ends)."""
    limit = time.monotonic() + 300
    pending = [grammar for grammar, _ in examples.values() for _ in range(pool.workers)]
    while pending and time.monotonic() < limit:
        rids = [f"warm-{i}-{time.monotonic()}" for i in range(len(pending))]
        for rid, grammar in zip(rids, pending, strict=True):
            pool.add(rid, grammar)
        states = [pool.commit(rid, []) for rid in rids]
        pending = [g for g, s in zip(pending, states, strict=True) if s.status != "active"]
        for rid in rids:
            pool.remove(rid)


@pytest.fixture(scope="module")
def examples(
    deepseek_encode: Callable[[str], list[int]],
) -> dict[str, tuple[gm.Grammar, list[int]]]:
    return bundled_examples(NAMES, deepseek_encode)


def _check(report: Report, steps: int) -> None:
    print("\n" + report.table())
    assert report.steps == steps
    assert report.contamination == [], report.contamination[:10]
    assert report.reported > 0
    if report.isolation == "process":
        assert report.faults["worker killed"] + report.faults["worker segfault"] > 0
    assert report.rss_mb_after - report.rss_mb_before < 300


@pytest.mark.parametrize(("isolation", "steps"), [("thread", 80), ("process", 50)])
def test_soak(
    isolation: str,
    steps: int,
    deepseek: gm.Vocabulary,
    examples: dict[str, tuple[gm.Grammar, list[int]]],
) -> None:
    steps = int(os.environ.get("GRAMMARMASK_SOAK_STEPS", steps))
    _check(run_soak(deepseek, examples, isolation, steps, seed=steps), steps)


@pytest.mark.slow
@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_long_soak(
    isolation: str, deepseek: gm.Vocabulary, examples: dict[str, tuple[gm.Grammar, list[int]]]
) -> None:
    report = run_soak(deepseek, examples, isolation, 10_000, seed=7, fault_rate=0.05)
    _check(report, 10_000)
