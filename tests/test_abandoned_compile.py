"""A compile that nobody waits for any more ends, and so does one past its memory bound.

The slow grammar is a real one: a string of up to 1,000 free characters, whose
outlines-core index takes over a minute and gigabytes on the DeepSeek vocabulary (the same
shape as a schema string with maxLength 1000). Its build runs in a child process; each test
finds that child among this process's descendants and checks that it is gone.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import psutil
import pytest

import grammarmask as gm
from grammarmask.pool.process_matchers import ProcessMatchers

SLOW = gm.Grammar.regex('"[^"\\\\]{0,1000}"')
QUICK = gm.Grammar.regex("[0-9]{3}")
SETTLE_S = 10.0
"""How long a killed build may take to disappear (a loaded 2-core machine)."""


EARLIER: set[int] = set()
"""Index build processes that were there before the test (idle ones of other tests'
long-lived compilers): not this test's."""


def index_builds() -> list[psutil.Process]:
    """The outlines index build processes under this process (also under its workers)
    that the running test started."""
    found = []
    for child in psutil.Process().children(recursive=True):
        try:
            if child.pid not in EARLIER and any(
                part.endswith("_index_child.py") for part in child.cmdline()
            ):
                found.append(child)
        except psutil.NoSuchProcess:
            continue
    return found


def building(builds: list[psutil.Process]) -> list[psutil.Process]:
    """The builds among `builds` that are running (not exited, not a zombie)."""
    alive = []
    for build in builds:
        try:
            if build.status() != psutil.STATUS_ZOMBIE:
                alive.append(build)
        except psutil.NoSuchProcess:
            continue
    return alive


def wait_until(condition: object, limit_s: float = SETTLE_S) -> bool:
    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        if callable(condition) and condition():
            return True
        time.sleep(0.1)
    return bool(callable(condition) and condition())


def first_build() -> list[psutil.Process]:
    assert wait_until(lambda: building(index_builds())), "no index build process started"
    return building(index_builds())


@pytest.fixture
def no_builds_left() -> Iterator[None]:
    EARLIER.clear()
    EARLIER.update(build.pid for build in index_builds())
    yield
    assert wait_until(lambda: not building(index_builds())), "an index build outlived its test"


@pytest.mark.usefixtures("no_builds_left")
def test_a_build_ends_at_the_compile_timeout(deepseek: gm.Vocabulary) -> None:
    compiler = gm.GrammarCompiler(deepseek, timeout_s=2.0)
    with pytest.raises(gm.CompileTimeoutError, match="took longer than 2 s"):
        compiler.compile(SLOW, "outlines")
    builds = index_builds()
    assert wait_until(lambda: not building(builds)), "the build ran on past its timeout"
    # the same grammar under the same timeout fails at once: the retry would burn 2 s again
    again = compiler.submit(SLOW, "outlines", timeout_s=2.0)
    assert wait_until(again.done, 5.0), "a build ended at its timeout was not kept"
    assert isinstance(again.exception(), gm.CompileTimeoutError)
    # a longer timeout tries anew
    longer = compiler.submit(SLOW, "outlines", timeout_s=30.0)
    assert not longer.done()
    compiler.release(longer)
    compiler.close()


@pytest.mark.usefixtures("no_builds_left")
def test_a_build_ends_when_its_last_request_leaves(deepseek: gm.Vocabulary) -> None:
    with gm.MatcherPool(deepseek, "outlines", workers=1, compile_timeout_s=300) as pool:
        pool.add("a", SLOW)
        pool.add("b", SLOW)  # the same grammar: one build for both
        builds = first_build()
        assert len(builds) == 1
        pool.remove("a")
        time.sleep(1.0)
        assert building(builds), "ended while request b still waits for it"
        pool.remove("b")
        assert wait_until(lambda: not building(builds)), "the build outlived its requests"
        # the next request for it compiles anew (nothing cached for an abandoned build),
        # and other grammars compile as before
        pool.add("c", QUICK)
        masks = pool.fill_async([("c", ())]).wait()
        assert masks.failures == {}
        assert pool.state("c").ready
        pool.add("d", SLOW)
        assert first_build(), "an abandoned build was cached as a failure"
        pool.remove("d")


@pytest.mark.usefixtures("no_builds_left")
def test_a_build_past_its_memory_bound_fails_that_request_alone(
    deepseek: gm.Vocabulary,
) -> None:
    bound = 200 << 20
    with gm.MatcherPool(
        deepseek, "outlines", workers=1, compile_timeout_s=300, compile_memory_bytes=bound
    ) as pool:
        pool.add("hungry", SLOW)
        builds = first_build()  # the hungry build alone: the next one stays, idle, for reuse
        pool.add("small", QUICK)
        assert wait_until(lambda: pool.state("hungry").status == "failed", 120.0)
        reason = pool.state("hungry").reason or ""
        assert "compile memory bound (200 MiB, compile_memory_bytes)" in reason
        assert not building(builds)
        masks = pool.fill_async([("small", ()), ("hungry", ())]).wait()
        assert list(masks.failures) == []  # hungry's failure was reported by state() above
        assert pool.state("small").status == "active"


@pytest.mark.usefixtures("no_builds_left")
def test_auto_does_not_spend_a_short_timeout_on_an_index_build(deepseek: gm.Vocabulary) -> None:
    """The case of a real-world schema: llguidance refuses uniqueItems; under flexible
    whitespace xgrammar leaves out one keyword more than outlines, so auto tries outlines
    first, and its index for a 1,000-character string takes minutes. It gets half the time;
    then xgrammar serves the request, declaring what it leaves out."""
    schema = {"type": "array", "uniqueItems": True, "items": {"type": "string", "maxLength": 1000}}
    grammar = gm.Grammar.json_schema(schema, whitespace="flexible")
    compiler = gm.GrammarCompiler(deepseek, timeout_s=6.0)
    assert len(compiler.backend("outlines").unenforced(grammar, grammar.lower())) < len(
        compiler.backend("xgrammar").unenforced(grammar, grammar.lower())
    )
    compiled = compiler.compile(grammar, "auto", allow_unenforced=True)
    assert compiled.backend == "xgrammar"
    assert {item.keyword for item in compiled.unenforced} == {"uniqueItems", "maxLength"}
    assert not building(index_builds())
    compiler.close()


@pytest.mark.usefixtures("no_builds_left")
def test_process_isolation_the_build_ends_and_the_worker_serves_on(
    deepseek: gm.Vocabulary,
) -> None:
    with gm.MatcherPool(
        deepseek,
        "outlines",
        workers=1,
        isolation="process",
        compile_timeout_s=3.0,
    ) as pool:
        pool.add("slow", SLOW)
        builds = first_build()
        assert wait_until(lambda: pool.state("slow").status == "failed", 30.0)
        assert "did not finish" in (pool.state("slow").reason or "")
        assert wait_until(lambda: not building(builds)), "the build ran on in the worker"
        pool.add("next", QUICK)
        masks = pool.fill_async([("next", ())]).wait()
        assert masks.failures == {}
        assert pool.state("next").status == "active"


@pytest.mark.usefixtures("no_builds_left")
def test_a_killed_worker_takes_its_index_build_with_it(deepseek: gm.Vocabulary) -> None:
    with gm.MatcherPool(
        deepseek, "outlines", workers=1, isolation="process", compile_timeout_s=300
    ) as pool:
        pool.add("slow", SLOW)
        builds = first_build()
        host = pool.matchers
        assert isinstance(host, ProcessMatchers)
        (worker,) = host.pids()
        psutil.Process(worker).kill()
        assert wait_until(lambda: not building(builds)), "the build outlived its worker"


@pytest.mark.usefixtures("no_builds_left")
def test_a_child_grown_by_a_big_build_is_not_kept_idle(smollm2: gm.Vocabulary) -> None:
    """A build's heap stays with its process: the child is not kept for reuse then."""
    compiler = gm.GrammarCompiler(smollm2, timeout_s=120)
    compiler.compile(QUICK, "outlines")
    (idle,) = building(index_builds())  # kept for the next build
    compiler.compile(gm.Grammar.regex('"[^"\\\\]{0,200}"'), "outlines")  # ~4x its memory
    assert wait_until(lambda: idle not in building(index_builds())), "the grown child was kept"
    compiler.compile(gm.Grammar.regex("[a-z]{3}"), "outlines")  # a fresh child serves on
    assert building(index_builds()) and idle not in building(index_builds())
    compiler.close()
