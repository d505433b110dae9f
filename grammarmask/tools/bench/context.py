"""What the scenarios of one run share: options, the progress bar, loaded vocabularies,
compilers and picked instances (loaded once, whatever the number of scenarios using them)."""

from __future__ import annotations

import random
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from ...compiler import GrammarCompiler
from ...vocabulary import Vocabulary
from ..known_vocabs import load_encoder, load_vocabulary
from .report import Row
from .workload import Instance, Replay, pick_instances, pinned_names, replays


@dataclass(frozen=True)
class BenchConfig:
    """`size` is "tiny" (smoke tests), "quick" (the default, minutes) or "full" (the grid)."""

    size: str = "quick"
    repeats: int = 20
    corpus: Path | None = None
    seed: int = 0
    cold_caches: bool = False
    """Stream twice the last-level cache before every timed fill, as an engine's forward
    would between steps: the variants then start equally cold (otherwise the raw variants,
    which share one set of matchers, warm each other's caches and each pool only its own)."""

    def pick(self, tiny: Any, quick: Any, full: Any) -> Any:
        """The value of a knob for this run's size."""
        return {"tiny": tiny, "quick": quick, "full": full}[self.size]


@dataclass
class Outcome:
    """What a scenario returns: its rows, and timeline spans (step, lane, start s, end s)
    for the scenarios that draw one."""

    rows: list[Row]
    timeline: list[tuple[int, str, float, float]] = field(default_factory=list)


class Bench:
    """One run's shared state."""

    def __init__(self, config: BenchConfig, *, progress: bool = True) -> None:
        self.config = config
        self.rng = random.Random(config.seed)
        self._bar = tqdm(total=0, unit="step", file=sys.stderr, disable=not progress)
        self._label = ""
        self._vocabs: dict[str, Vocabulary] = {}
        self._compilers: dict[str, GrammarCompiler] = {}
        self._instances: dict[str, list[Instance]] = {}
        self._flush_buffer: torch.Tensor | None = None

    def plan(self, ticks: int, what: str) -> None:
        """Announce `ticks` more units of work, labelled `what`."""
        self._label = what
        self._bar.set_description(what)
        self._bar.total = (self._bar.total or 0) + ticks
        self._bar.refresh()

    def tick(self) -> None:
        self._bar.update(1)

    def flush_caches(self) -> None:
        """Evict the CPU caches (see BenchConfig.cold_caches)."""
        if self._flush_buffer is None:
            self._flush_buffer = torch.ones(2 * _last_level_cache_bytes() // 4)
        self._flush_buffer.mul_(1.0)

    def vocab(self, name: str) -> Vocabulary:
        if name not in self._vocabs:
            self._vocabs[name] = load_vocabulary(name)
        return self._vocabs[name]

    def compiler(self, name: str) -> GrammarCompiler:
        if name not in self._compilers:
            self._compilers[name] = GrammarCompiler(self.vocab(name), timeout_s=60)
        return self._compilers[name]

    def instances(self, name: str) -> list[Instance]:
        """Corpus schemas (bundled ones without a corpus) with a valid instance: 3 tiny,
        16 quick, 64 full; requests cycle over them."""
        if name not in self._instances:
            count = self.config.pick(3, 16, 64)
            self._bar.set_description(f"compiling {count} schemas for {name}")
            self._instances[name] = pick_instances(
                self.config.corpus,
                count,
                self.compiler(name),
                load_encoder(name),
                random.Random(self.config.seed),
                names=pinned_names(),
            )
            self._bar.set_description(self._label)
        return self._instances[name]

    def replays(self, vocab: str, requests: int, drafts: int) -> list[Replay]:
        """One point's requests, drawn from a generator of that point's own (seeded by the
        run's seed and the point): the same draws whatever else the run did before, and in
        every scenario that measures that point."""
        rng = random.Random(f"{self.config.seed}/{vocab}/{requests}/{drafts}")
        return replays(self.instances(vocab), requests, drafts, rng)

    def close(self) -> None:
        self._bar.close()
        for compiler in self._compilers.values():
            compiler.close()


_CACHE_FALLBACK_BYTES = 32 << 20


def _last_level_cache_bytes() -> int:
    """The largest CPU cache Linux reports (its size file, e.g. "32768K"); 32 MiB where none
    is reported."""
    sizes = []
    for path in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        text = path.read_text().strip()
        scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        digits = text.rstrip("KMG")
        if digits.isdigit():
            sizes.append(int(digits) * scale)
    return max(sizes, default=_CACHE_FALLBACK_BYTES)
