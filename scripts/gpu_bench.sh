#!/usr/bin/env bash
# The prepared GPU run, one command (about 8 minutes on one H200, no network), from the repository root:
#   1. scripts/gpu_bench.py: ceilings, an 8B step against tokens per step, the synthetic alpha 0.8 curve;
#   2. the gpu-marked tests; 3. every lesson under nbmake.
# Writes results/<out>/: gpu.txt, log.txt, summary.json, step_times.jsonl, sweep.jsonl, speedup_vs_batch.png,
# gpu_tests.txt, lessons.txt. Each part has its own time limit, and a failing part does not stop the next.
set -uo pipefail
out=${1:-results/h200}
mkdir -p "$out"
export PYTHONPATH=. HF_HUB_OFFLINE=1 MPLBACKEND=Agg
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/gpu.txt" || true
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" \
  | tee -a "$out/gpu.txt"
timeout 330 python3 scripts/gpu_bench.py --out "$out" 2>&1 | tee "$out/log.txt"
if python3 -c "import pytest" 2>/dev/null; then
  timeout 90 python3 -m pytest -q -m gpu -p no:cacheprovider tests 2>&1 | tail -30 | tee "$out/gpu_tests.txt"
  if python3 -c "import nbmake" 2>/dev/null; then
    timeout 240 python3 -m pytest -q --nbmake --nbmake-timeout=120 -p no:cacheprovider lessons --durations=0 2>&1 \
      | tail -40 | tee "$out/lessons.txt"
  else
    echo "nbmake is not installed here: lessons not run" | tee "$out/lessons.txt"
  fi
else
  echo "pytest is not installed here: gpu tests and lessons not run" | tee "$out/gpu_tests.txt"
fi
