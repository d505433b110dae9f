#!/usr/bin/env bash
# Every test: the main suite in .venv/, then, in .venv-vllm/ (scripts/vllm-env.sh), the
# tests on the real vLLM engine and the backend suites again on the versions vLLM pins.
# Arguments go to the main suite's pytest. Exit status: non-zero if either part failed.
set -uo pipefail
cd "$(dirname "$0")/.."
VENV=${GRAMMARMASK_VENV:-.venv}
VLLM_VENV=${GRAMMARMASK_VLLM_VENV:-.venv-vllm}
for env in "$VENV" "$VLLM_VENV"; do
    if [ ! -x "$env/bin/python" ]; then
        echo "no environment at $env: see the README (On a fresh machine)" >&2
        exit 2
    fi
done

# The suites whose outcome depends on the grammar engines' versions: run again on the
# xgrammar, llguidance and transformers that vLLM pins.
PINNED_SUITES=(
    tests/test_backends.py tests/test_enforcement.py tests/test_auto.py
    tests/test_compiler.py tests/test_conformance.py tests/test_fuzz.py
    tests/test_grammars.py tests/test_bad_inputs.py tests/test_transformers.py
    tests/test_lowering.py tests/test_enforcement_matrix.py tests/test_json_escapes.py
)
# The worker start-up rows test grammarmask's process code, not the engines: main suite only.
PINNED_DESELECT="not (test_refused and workers)"

"$VENV/bin/python" -m pytest "$@"
main=$?
echo "=== on vLLM's pinned versions ($VLLM_VENV)"
"$VLLM_VENV/bin/python" -m pytest tests/vllm_engine "${PINNED_SUITES[@]}" -k "$PINNED_DESELECT"
pinned=$?
echo "main suite: exit $main; vLLM suite: exit $pinned"
[ "$main" -eq 0 ] && [ "$pinned" -eq 0 ]
