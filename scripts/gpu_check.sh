#!/usr/bin/env bash
# On a GPU machine that can fetch nothing, with .gpukit/ from scripts/gpu_kit.sh beside
# the checkout: install the kit and this project into /tmp/site, then run the CUDA tests,
# the cuda bench scenario and the CPU fill, apply and overlap scenarios (on that machine's
# cores). Under $OUT (else ./out), at most 5 files: gpu_check.log, one JSON per bench run
# and plots.tgz. About 5 minutes on the H200 machine; `--full` adds the whole fill grid
# (another ~6 minutes). Exits 1 if any part failed, 2 if it could not install.
set -uo pipefail
cd "$(dirname "$0")/.."

out="${OUT:-out}"
mkdir -p "$out"
if [ ! -d .gpukit/wheels ]; then
    echo "gpu_check: no .gpukit/ here: run scripts/gpu_kit.sh where pip can fetch" >&2
    exit 2
fi
site=/tmp/grammarmask-site
python3 -m pip install --quiet --upgrade --no-index --no-deps --no-compile --no-cache-dir \
    --target "$site" .gpukit/wheels/*.whl || exit 2
python3 -m pip install --quiet --upgrade --no-index --no-deps --no-build-isolation --no-cache-dir \
    --target "$site" . || exit 2
export PYTHONPATH="$site" PYTHONUNBUFFERED=1 GRAMMARMASK_CORPUS="$PWD/.gpukit/corpus"
# -P: the installed package (with its compiled kernel), not the source tree in this folder
run=(python3 -P)

failed=0
log="$out/gpu_check.log"
: > "$log"
step() {  # one part: its output appended to the log, its end printed
    local name=$1 part
    shift
    part=$(mktemp)
    echo "== $name: $*" | tee -a "$log"
    "$@" 2>&1 | tr '\r' '\n' > "$part" || { failed=1; echo "   FAILED: $name" | tee -a "$log"; }
    cat "$part" >> "$log"
    grep -v 's/step\]\|step/s\]' "$part" | tail -n 30  # not the progress bars
    rm -f "$part"
}
step machine sh -c "nvidia-smi -L; nproc; python3 -c 'import torch; print(torch.__version__, torch.cuda.is_available())'"
step pytest_cuda "${run[@]}" -m pytest -m cuda -q tests/test_cuda.py
step bench_cuda "${run[@]}" -m grammarmask.tools.cli bench cuda --device cuda --repeats 20 \
    --json "$out/bench_cuda.json"
step bench_cpu "${run[@]}" -m grammarmask.tools.cli bench fill isolation apply overlap --repeats 10 \
    --json "$out/bench_cpu.json" --plot /tmp/grammarmask-plots
# Model Runner V2: vLLM's CUDA wheel does not travel to the lent machine (FACTS.md), so this
# part runs only where vLLM is importable; otherwise the log says it was not run.
if "${run[@]}" -c "import vllm.v1.worker.gpu.sample.logits_processor" 2>/dev/null; then
    step pytest_vllm_v2 "${run[@]}" -m pytest -q tests/vllm_engine/test_processor_v2.py
else
    echo "== pytest_vllm_v2: NOT RUN: vLLM is not importable on this machine" | tee -a "$log"
fi
tar czf "$out/plots.tgz" -C /tmp/grammarmask-plots . 2>/dev/null || true
if [ "${1:-}" = "--full" ]; then
    step bench_fill_full "${run[@]}" -m grammarmask.tools.cli bench fill --full --repeats 10 \
        --json "$out/bench_fill_full.json"
fi
exit "$failed"
