"""Crashes with bystanders inside vLLM's engine (SmolLM2, stepped by hand so the fault lands
mid-stream). Two worker processes, grammar requests on both: a worker killed from outside
(SIGKILL) or one that segfaults inside a backend call ends only the requests it held;
every grammar request on the other worker finishes valid, and the restarted worker serves
the next ones. With threads, a Python exception inside one matcher ends that request alone.

The faulty backend (`faults.MarkedFaultBackend`) is real xgrammar whose matchers for
grammars marked "crash" fault at their fourth fill; it reaches the engine's pool through
`backend_factory`, which the test adds where the plugin builds its pool.
"""

from __future__ import annotations

import os
import re
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import faults
import pytest
from vllm import LLM, SamplingParams

import grammarmask as gm
from grammarmask.integrations.vllm import _plugin, xargs
from vllm_engine.engines import PLUGIN, engine_args, shutdown
from vllm_engine.prefixes import PrefixChecker

LETTERS = 24
REQUESTS = 8


def pattern(index: int, marked: bool = False) -> str:
    word = faults.MARKED if marked else "item"
    return f"{word}{index:02d}=[a-z]{{{LETTERS}}}"


class Engine:
    """A vLLM engine whose grammarmask pool has `factory`'s backends, and that pool."""

    def __init__(self, model_dir: Path, isolation: str, factory: Callable[..., Any]) -> None:
        pools: list[gm.MatcherPool] = []
        build = _plugin.MatcherPool

        def recording(*args: Any, **kwargs: Any) -> gm.MatcherPool:
            pool = build(*args, backend_factory=factory, **kwargs)
            pools.append(pool)
            return pool

        settings = {"grammarmask": {"isolation": isolation, "workers": 2}}
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(_plugin, "MatcherPool", recording)
            self.llm = LLM(
                **engine_args(model_dir, logits_processors=[PLUGIN], additional_config=settings)
            )
        assert pools, "the plugin built no pool"
        self.pool = pools[-1]

    def run(
        self,
        patterns: dict[str, str],
        *,
        after_step: int = 0,
        fault: Callable[[], None] | None = None,
    ) -> dict[str, Any]:
        """Each request id's finished completion; `fault` runs after step `after_step`."""
        engine = self.llm.llm_engine
        for request_id, regex in patterns.items():
            params = SamplingParams(
                temperature=0.0,
                max_tokens=80,
                extra_args=xargs(gm.Grammar.regex(regex), backend="xgrammar"),
            )
            engine.add_request(request_id, {"prompt": f"Write the tag {request_id}:"}, params)
        done: dict[str, Any] = {}
        steps = 0
        while engine.has_unfinished_requests():
            for output in engine.step():
                if output.finished:
                    done[output.request_id] = output.outputs[0]
            steps += 1
            if fault is not None and steps == after_step:
                fault()
        assert set(done) == set(patterns)
        return done


@pytest.fixture(scope="module")
def processes(model_dir: Path) -> Iterator[Engine]:
    engine = Engine(model_dir, "process", faults.segv_when_marked)
    yield engine
    shutdown(engine.llm)


@pytest.fixture(scope="module")
def prefixes(smollm2: gm.Vocabulary) -> Iterator[PrefixChecker]:
    checker = PrefixChecker(smollm2)
    yield checker
    checker.close()


def ended(plugin_log: list[str], request_id: str) -> list[str]:
    """The plugin's failure lines for `request_id` (vLLM may add a suffix to the id)."""
    return [m for m in plugin_log if re.search(rf"request {request_id}\S* failed: ", m)]


def check_outcome(
    patterns: dict[str, str],
    done: dict[str, Any],
    plugin_log: list[str],
    prefixes: PrefixChecker,
    reason: str,
) -> set[str]:
    """The requests that ended with `reason`: each ended early, on a valid prefix; every
    other one finished, matching its grammar in full."""
    victims = set()
    for request_id, regex in patterns.items():
        completion, lines = done[request_id], ended(plugin_log, request_id)
        if lines:
            assert len(lines) == 1 and reason in lines[0], lines
            victims.add(request_id)
            assert not re.fullmatch(regex, completion.text), (request_id, completion.text)
            verdict = prefixes.tokens(gm.Grammar.regex(regex), completion.token_ids)
            assert verdict == "valid", (request_id, verdict, completion.text)
        else:
            assert completion.finish_reason == "stop", (request_id, completion.text)
            assert re.fullmatch(regex, completion.text), (request_id, completion.text)
    return victims


def served_after(engine: Engine, plugin_log: list[str], tag: str) -> None:
    """Two new requests (one per worker) finish valid, and nothing more fails."""
    before = len(plugin_log)
    patterns = {f"{tag}-next-{i}": pattern(90 + i) for i in range(2)}
    done = engine.run(patterns)
    for request_id, regex in patterns.items():
        assert re.fullmatch(regex, done[request_id].text), (request_id, done[request_id].text)
    assert plugin_log[before:] == []


def test_a_killed_worker_ends_only_its_requests(
    processes: Engine, plugin_log: list[str], prefixes: PrefixChecker
) -> None:
    patterns = {f"kill-{i}": pattern(i) for i in range(REQUESTS)}
    victim = processes.pool.matchers.pids()[0]

    done = processes.run(patterns, after_step=3, fault=lambda: os.kill(victim, signal.SIGKILL))
    victims = check_outcome(patterns, done, plugin_log, prefixes, "worker process died (SIGKILL)")
    assert len(victims) == REQUESTS // 2, victims  # the requests of one of the two workers
    assert victim not in processes.pool.matchers.pids()
    served_after(processes, plugin_log, "kill")


def test_a_segfault_inside_a_backend_call_ends_only_that_workers_requests(
    processes: Engine, plugin_log: list[str], prefixes: PrefixChecker
) -> None:
    patterns = {f"segv-{i}": pattern(i, marked=i == 2) for i in range(REQUESTS)}
    pids = set(processes.pool.matchers.pids())
    done = processes.run(patterns)
    victims = check_outcome(patterns, done, plugin_log, prefixes, "worker process died (SIGSEGV)")
    assert "segv-2" in victims and len(victims) == REQUESTS // 2, victims
    assert len(pids - set(processes.pool.matchers.pids())) == 1  # one worker replaced
    served_after(processes, plugin_log, "segv")


def test_an_exception_inside_a_matcher_ends_that_request_alone(
    model_dir: Path, plugin_log: list[str], prefixes: PrefixChecker
) -> None:
    engine = Engine(model_dir, "thread", faults.raise_when_marked)
    try:
        patterns = {f"raise-{i}": pattern(i, marked=i == 5) for i in range(REQUESTS)}
        done = engine.run(patterns)
        victims = check_outcome(patterns, done, plugin_log, prefixes, "injected fault in fill")
        assert victims == {"raise-5"}
        served_after(engine, plugin_log, "raise")
    finally:
        shutdown(engine.llm)
