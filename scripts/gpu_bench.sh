#!/usr/bin/env bash
# One prepared GPU run (about 8 minutes on one H200, no network): run from the repository root.
# Writes results/<out>/: summary.json, step_times.jsonl, sweep.jsonl, speedup_vs_batch.png, log.txt.
set -euo pipefail
out=${1:-results/h200}
mkdir -p "$out"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/gpu.txt" || true
PYTHONPATH=. python3 scripts/gpu_bench.py --out "$out" 2>&1 | tee "$out/log.txt"
