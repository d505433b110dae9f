"""The plugin's engine-wide settings, from `--additional-config '{"grammarmask": {...}}'`."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, Literal

from ...backends import AUTO, backend_names
from ...errors import SettingsError

PROCESSOR_PATH = "grammarmask.integrations.vllm:GrammarLogitsProcessor"
"""What `--logits-processors` (or `LLM(logits_processors=[...])`) names to turn the plugin on."""

CONFIG_KEY = "grammarmask"
"""The key of vLLM's `additional_config` that holds these settings."""


@dataclass(frozen=True)
class PluginSettings:
    """How the engine's matcher pool runs. Each field is a key of the config object."""

    autoload: bool = True
    """False: the instance that grammarmask's `vllm.logits_processors` entry point loads
    into every engine of the environment serves no grammar; it ends each request that asks
    for one (never lets it run unconstrained). Naming the processor with
    --logits-processors still turns grammarmask on."""
    backend: str = AUTO
    """The backend of requests that name none: `auto` picks, per grammar, one that enforces
    all of it."""
    allow_unenforced: bool = False
    """Serve grammars no backend enforces fully (what is loose is logged per request)."""
    workers: int = 0
    """Fill threads or processes; 0: half the CPUs the engine can use, at least 1, at most 4
    (vLLM's own threads need the rest)."""
    isolation: Literal["thread", "process"] = "thread"
    """"process": matchers in worker processes, so a crashing backend ends only its own
    requests."""
    compile_timeout_s: float = 10.0
    """A grammar that takes longer to compile fails its request. The batch waits for a
    compile that its prefill did not hide, so this bounds what one request can cost the
    others."""
    compile_memory_mb: int = 0
    """A compile that runs in a process of its own (outlines' index builds) and takes more
    memory than this fails its request and is ended; 0: an eighth of the machine's memory,
    between 1 and 16 GiB."""
    step_timeout_s: float = 30.0
    """A request whose mask is not ready this long after the forward ends fails alone (a
    hung matcher must not hang the engine). At least compile_timeout_s."""

    @classmethod
    def from_additional_config(cls, additional_config: Mapping[str, Any] | None) -> PluginSettings:
        raw = (additional_config or {}).get(CONFIG_KEY, {})
        if not isinstance(raw, Mapping):
            raise SettingsError(
                f'additional_config["{CONFIG_KEY}"] must be an object, not {type(raw).__name__}'
            )
        known = {f.name: f for f in fields(cls)}
        unknown = sorted(set(raw) - set(known))
        if unknown:
            raise SettingsError(
                f'unknown key {unknown[0]!r} in additional_config["{CONFIG_KEY}"]; '
                f"known: {', '.join(known)}"
            )
        for key, value in raw.items():
            expected = type(getattr(cls, key))
            ok = isinstance(value, expected) and not (
                expected is not bool and isinstance(value, bool)
            )
            if expected is float:
                ok = isinstance(value, (int, float)) and not isinstance(value, bool)
            if not ok:
                raise SettingsError(
                    f'additional_config["{CONFIG_KEY}"]["{key}"] must be a '
                    f"{expected.__name__}, not {value!r}"
                )
        settings = cls(**raw)
        settings._check()
        return settings

    def _check(self) -> None:
        if self.backend not in (*backend_names(), AUTO):
            raise SettingsError(
                f"unknown backend {self.backend!r}; choose from "
                f"{', '.join((*backend_names(), AUTO))}"
            )
        if self.isolation not in ("thread", "process"):
            raise SettingsError(f"isolation must be 'thread' or 'process', not {self.isolation!r}")
        if self.workers < 0:
            raise SettingsError(f"workers must be 0 (automatic) or more, not {self.workers}")
        if self.compile_timeout_s <= 0:
            raise SettingsError(f"compile_timeout_s must be positive, not {self.compile_timeout_s}")
        if self.compile_memory_mb < 0:
            raise SettingsError(
                f"compile_memory_mb must be 0 (automatic) or more, not {self.compile_memory_mb}"
            )
        if self.step_timeout_s < self.compile_timeout_s:
            raise SettingsError(
                f"step_timeout_s ({self.step_timeout_s}) must be at least compile_timeout_s "
                f"({self.compile_timeout_s})"
            )

    @property
    def compile_memory_bytes(self) -> int | None:
        """`compile_memory_mb` in bytes; None: the machine's default."""
        return self.compile_memory_mb << 20 if self.compile_memory_mb else None

    @property
    def fill_workers(self) -> int:
        """`workers`, with 0 resolved for this process."""
        if self.workers:
            return self.workers
        try:
            cpus = len(os.sched_getaffinity(0))
        except AttributeError:  # not on Linux
            cpus = os.cpu_count() or 1
        return max(1, min(4, cpus // 2))
