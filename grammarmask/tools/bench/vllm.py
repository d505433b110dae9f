"""Scenario `vllm`: grammarmask inside vLLM next to vLLM's own structured outputs, on one
model, with the same prompts and schemas, interleaved round by round.

vLLM serves one structured-output backend per engine, so the run holds six engines in this
process at once: grammarmask named as logits processor with vLLM's structured outputs on
xgrammar, and on guidance; one without grammarmask (its entry point switched off);
grammarmask as the structured-output backend; and, with ngram speculative decoding (3
drafts), vLLM's xgrammar backend and grammarmask's. Each timed round runs every variant
once, in a random order, on a batch of every request, each generating exactly SPEED_TOKENS
tokens (equal work). Per variant: output tokens/s, ms per engine step, the share of the
engine's thread spent in the logits processor (`update_state` and `apply`, whose wait is
what the forward did not hide) and in vLLM's structured-output manager (the bitmask fill,
accepting tokens, validating drafts), and the longest `apply`. Then one untimed run per
variant with room to finish says how many finished outputs validate against their schema.
vLLM needs its own environment (`scripts/vllm-env.sh`); run this there.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...grammars import Grammar
from ..demo import DemoCase, chat_prompt, validate
from .context import Bench, Outcome
from .report import Row, Target

TARGETS = {
    "plugin loaded, no grammar": Target(">=", 0.99),
    "grammarmask auto": Target(">=", 1.0),
    "grammarmask xgrammar": Target(">=", 1.0),
    "grammarmask backend": Target(">=", 1.0),
    "grammarmask backend, ngram": Target(">=", 1.0),
}

NGRAM = {
    "method": "ngram",
    "num_speculative_tokens": 3,
    "prompt_lookup_max": 3,
    "prompt_lookup_min": 1,
}

SPEED_TOKENS = 24
"""Tokens per request in the timed rounds: fewer than any bundled schema's shortest answer
(28), so that every variant generates exactly as many tokens in steps of the same shapes
(a variant whose requests finished sooner would run smaller batches)."""
CHECK_TOKENS = 256
"""Tokens per request in the one untimed run per variant whose finished outputs are
validated against their schemas (a third of it on the tiny size: some still finish)."""

POINT = "SmolLM2-135M, {requests} requests, bundled schemas"

BUILTIN = "builtin"


@dataclass(frozen=True)
class Variant:
    """How a variant's requests ask for their schema, on which engine, compared to what."""

    engine: str
    """A key of ENGINES."""
    grammar: str | None
    """None: no constraint; BUILTIN: vLLM's structured outputs (on the engine's backend);
    else the backend grammarmask's logits processor uses."""
    baseline: str = "vLLM xgrammar"

    @property
    def by_grammarmask(self) -> bool:
        """grammarmask serves its grammars (as logits processor or as backend)."""
        return self.grammar not in (None, BUILTIN) or self.engine.startswith("grammarmask")


VARIANTS = {
    "no plugin, no grammar": Variant("plain", None, "no plugin, no grammar"),
    "plugin loaded, no grammar": Variant("xgrammar", None, "no plugin, no grammar"),
    "vLLM xgrammar": Variant("xgrammar", BUILTIN),
    "vLLM guidance": Variant("guidance", BUILTIN),
    "grammarmask auto": Variant("xgrammar", "auto"),
    "grammarmask xgrammar": Variant("xgrammar", "xgrammar"),
    "grammarmask backend": Variant("grammarmask", BUILTIN),
    "vLLM xgrammar, ngram": Variant("xgrammar-ngram", BUILTIN, "vLLM xgrammar, ngram"),
    "grammarmask backend, ngram": Variant("grammarmask-ngram", BUILTIN, "vLLM xgrammar, ngram"),
}


def _engines(plugin: list[str]) -> dict[str, dict[str, Any]]:
    """Each engine's `vllm.LLM` arguments beyond the common ones."""
    return {
        "xgrammar": {
            "logits_processors": plugin,
            "structured_outputs_config": {"backend": "xgrammar"},
        },
        "guidance": {
            "logits_processors": plugin,
            "structured_outputs_config": {"backend": "guidance"},
        },
        "plain": {"additional_config": {"grammarmask": {"autoload": False}}},
        "grammarmask": {"structured_outputs_config": {"backend": "grammarmask"}},
        "xgrammar-ngram": {
            "structured_outputs_config": {"backend": "xgrammar"},
            "speculative_config": NGRAM,
        },
        "grammarmask-ngram": {
            "structured_outputs_config": {"backend": "grammarmask"},
            "speculative_config": NGRAM,
        },
    }


@dataclass
class _Run:
    seconds: float
    tokens: int
    steps: int
    plugin_seconds: float
    structured_seconds: float
    applies: list[float]
    completions: list[Any]
    finished: int = 0
    valid: int = 0
    broken_enforced: int = 0


@dataclass
class _PluginTimer:
    """Seconds inside the logits processor's `update_state` and `apply`, and inside vLLM's
    structured-output manager (wrapped on the classes: the engines run in this process)."""

    total: float = 0.0
    structured: float = 0.0
    applies: list[float] = field(default_factory=list)
    updates: dict[int, int] = field(default_factory=dict)
    """Calls of `update_state` per processor: the engine's model steps (vLLM calls it
    before each forward; an engine can hold a second, idle instance)."""
    schedules: int = 0
    """Steps with structured-output requests (`grammar_bitmask` calls)."""

    def reset(self) -> None:
        self.total, self.structured, self.applies, self.updates = 0.0, 0.0, [], {}
        self.schedules = 0

    @contextmanager
    def installed(self) -> Iterator[None]:
        from vllm.v1.structured_output import StructuredOutputManager

        from ...integrations.vllm import GrammarLogitsProcessor

        manager_methods = ("grammar_bitmask", "accept_tokens", "validate_tokens")
        manager_originals = {
            name: getattr(StructuredOutputManager, name) for name in manager_methods
        }

        def manager_timed(name: str) -> Callable[..., Any]:
            method = manager_originals[name]

            def wrapper(manager: Any, *args: Any) -> Any:
                self.schedules += name == "grammar_bitmask"
                started = time.perf_counter()
                try:
                    return method(manager, *args)
                finally:
                    self.structured += time.perf_counter() - started

            return wrapper

        for name in manager_methods:
            setattr(StructuredOutputManager, name, manager_timed(name))
        originals = GrammarLogitsProcessor.update_state, GrammarLogitsProcessor.apply

        def timed(method: Callable[..., Any], is_apply: bool) -> Callable[..., Any]:
            def wrapper(processor: Any, *args: Any) -> Any:
                if not is_apply:
                    self.updates[id(processor)] = self.updates.get(id(processor), 0) + 1
                started = time.perf_counter()
                try:
                    return method(processor, *args)
                finally:
                    spent = time.perf_counter() - started
                    self.total += spent
                    if is_apply:
                        self.applies.append(spent)

            return wrapper

        GrammarLogitsProcessor.update_state = timed(originals[0], False)  # type: ignore[method-assign]
        GrammarLogitsProcessor.apply = timed(originals[1], True)  # type: ignore[method-assign]
        try:
            yield
        finally:
            GrammarLogitsProcessor.update_state, GrammarLogitsProcessor.apply = originals  # type: ignore[method-assign]
            for name, method in manager_originals.items():
                setattr(StructuredOutputManager, name, method)


def cpu_dtype() -> str:
    """The dtype vLLM's CPU build runs a model fastest in here: bfloat16 where the CPU
    computes it (AVX512-BF16 or AMX), else float32, which a CPU without them computes
    several times faster than emulated bfloat16."""
    try:
        flags = Path("/proc/cpuinfo").read_text(encoding="ascii", errors="replace")
    except OSError:
        return "float32"
    return "bfloat16" if "avx512_bf16" in flags or "amx_bf16" in flags else "float32"


def smollm2_engine_args(model_dir: Path, **overrides: Any) -> dict[str, Any]:
    """`vllm.LLM` arguments for SmolLM2 on a small CPU machine: `cpu_dtype()`, a 1 GiB KV
    cache (vLLM's CPU build otherwise reserves most of the memory), the worker in the
    caller's process, and no prefix cache, so that two runs of one batch take steps of the
    same shapes."""
    return {
        "model": str(model_dir),
        "dtype": cpu_dtype(),
        "max_model_len": 2048,
        "enforce_eager": True,
        "max_num_seqs": 16,
        "kv_cache_memory_bytes": 1 << 30,
        "distributed_executor_backend": "uni",
        "enable_prefix_caching": False,
        "seed": 0,
        **overrides,
    }


def run_vllm(bench: Bench) -> Outcome:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # engines in this process
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # the table, not vLLM's start-up log
    try:
        import vllm
    except ImportError:
        reason = "needs vLLM: run it in the vLLM environment (scripts/vllm-env.sh)"
        return Outcome([Row("vllm", POINT, name, "", unavailable=reason) for name in VARIANTS])
    from vllm.sampling_params import StructuredOutputsParams

    from ...compiler import GrammarCompiler
    from ...integrations.transformers import smollm2_checkpoint
    from ...integrations.vllm import PROCESSOR_PATH, xargs
    from ...integrations.vllm.structured_outputs import OPTIONS_KEY, register
    from ...resources import bundled_schema_path
    from ...vocabulary import Vocabulary
    from ..demo import bundled_cases

    config = bench.config
    rounds = config.pick(1, 3, 6)
    copies = config.pick(1, 2, 2)
    check_tokens = config.pick(CHECK_TOKENS // 3, CHECK_TOKENS, CHECK_TOKENS)
    register()  # vLLM's general plugins load after LLM() has read its arguments
    engine_arguments = _engines([PROCESSOR_PATH])
    bench.plan(
        len(engine_arguments) + (rounds + 1) * len(VARIANTS),
        f"vllm (starting {len(engine_arguments)} engines)",
    )
    common = smollm2_engine_args(smollm2_checkpoint(), seed=config.seed)
    engines: dict[str, Any] = {}
    try:
        for name, arguments in engine_arguments.items():
            _answer_vllms_kernel_scan()
            engines[name] = vllm.LLM(**common, **arguments)
            bench.tick()
        tokenizer = engines["plain"].get_tokenizer()
        cases = bundled_cases(bundled_schema_path("person.json").parent) * copies
        prompts = [{"prompt_token_ids": chat_prompt(tokenizer, case)} for case in cases]
        compiler = GrammarCompiler(Vocabulary.from_transformers(tokenizer))
        enforced = [  # what the plugin's auto serves fully: its outputs must all validate
            not compiler.compile(
                Grammar.json_schema(c.schema), "auto", allow_unenforced=True
            ).unenforced
            for c in cases
        ]
        compiler.close()

        def batch(variant: Variant, max_tokens: int) -> list[Any]:
            extra: dict[str, Any] = {"temperature": 0.0, "max_tokens": max_tokens}
            made = []
            for case in cases:
                if variant.grammar == BUILTIN:
                    extra["structured_outputs"] = StructuredOutputsParams(json=case.schema)
                    if variant.by_grammarmask:  # as the logits processor's requests
                        extra["extra_args"] = {OPTIONS_KEY: {"allow_unenforced": True}}
                elif variant.grammar is not None:
                    grammar = Grammar.json_schema(case.schema)
                    extra["extra_args"] = xargs(
                        grammar, backend=variant.grammar, allow_unenforced=True
                    )
                made.append(vllm.SamplingParams(**extra))
            return made

        timer = _PluginTimer()
        runs: dict[str, list[_Run]] = {name: [] for name in VARIANTS}
        checks: dict[str, _Run] = {}
        with timer.installed():
            for _ in range(rounds):
                for name in bench.rng.sample(list(VARIANTS), len(VARIANTS)):
                    variant = VARIANTS[name]
                    run = _timed(
                        engines[variant.engine], prompts, batch(variant, SPEED_TOKENS), timer
                    )
                    runs[name].append(run)
                    bench.tick()
            for name, variant in VARIANTS.items():
                run = _timed(engines[variant.engine], prompts, batch(variant, check_tokens), timer)
                if variant.grammar is not None:
                    _check(run, variant, cases, enforced)
                checks[name] = run
                bench.tick()
    finally:
        for llm in engines.values():
            llm.llm_engine.engine_core.shutdown()
    return Outcome(_rows(runs, checks, len(cases)))


def _answer_vllms_kernel_scan() -> None:
    """vLLM's CPU worker reads `vars(obj)` of every module-level object when it starts (its
    Triton kernel overrides); llvmlite's library wrapper, which numba brings in with vLLM's
    ngram proposer, has slots and answers `__dict__` with a lazily bound C function, so the
    next engine of the process fails to start ("'_lib_fn_wrapper' object has no attribute
    'get'"). An empty entry under that name answers the scan; llvmlite has no such
    function."""
    ffi = sys.modules.get("llvmlite.binding.ffi")
    if ffi is not None:
        ffi.lib._fntab.setdefault("__dict__", {})


def _timed(llm: Any, prompts: list[dict[str, Any]], batch: list[Any], timer: _PluginTimer) -> _Run:
    timer.reset()
    started = time.perf_counter()
    outputs = llm.generate(prompts, batch, use_tqdm=False)
    seconds = time.perf_counter() - started
    completions = [output.outputs[0] for output in outputs]
    return _Run(
        seconds,
        sum(len(c.token_ids) for c in completions),
        max(max(timer.updates.values(), default=0), timer.schedules),
        timer.total,
        timer.structured,
        list(timer.applies),
        completions,
    )


def _check(run: _Run, variant: Variant, cases: list[DemoCase], enforced: list[bool]) -> None:
    for case, completion, full in zip(cases, run.completions, enforced, strict=True):
        if completion.finish_reason != "stop":
            continue
        run.finished += 1
        if validate(completion.text, case.schema) == "valid":
            run.valid += 1
        elif full and variant.by_grammarmask:
            run.broken_enforced += 1


def _rows(runs: dict[str, list[_Run]], checks: dict[str, _Run], requests: int) -> list[Row]:
    rate = {name: [r.tokens / r.seconds for r in done] for name, done in runs.items()}
    rows = []
    for name, done in runs.items():
        variant = VARIANTS[name]
        baseline = variant.baseline
        p50, base = statistics.median(rate[name]), statistics.median(rate[baseline])
        applies = [a for r in [*done, checks[name]] for a in r.applies]
        extra = {
            "ms_per_step": statistics.median(r.seconds / max(r.steps, 1) for r in done) * 1e3,
            "plugin_share": statistics.median(r.plugin_seconds / r.seconds for r in done),
            "structured_share": statistics.median(r.structured_seconds / r.seconds for r in done),
            "same_work": float(all(r.tokens == requests * SPEED_TOKENS for r in done)),
        }
        if applies:
            extra["apply_ms_p50"] = statistics.median(applies) * 1e3
            extra["apply_ms_max"] = max(applies) * 1e3
        if variant.grammar is not None:
            check = checks[name]
            extra["finished"] = check.finished
            extra["valid"] = check.valid
            extra["valid_per_100"] = 100 * check.valid / requests
            if variant.by_grammarmask:
                extra["broken_enforced"] = check.broken_enforced
        point = POINT.format(requests=requests) + ("" if variant.grammar else ", no grammar")
        rows.append(
            Row(
                "vllm",
                point,
                name,
                baseline,
                "tok/s",
                p50,
                None,
                p50 / base,
                None,
                TARGETS.get(name),
                len(done),
                extra=extra,
            )
        )
    return rows
