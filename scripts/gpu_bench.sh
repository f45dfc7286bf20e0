#!/usr/bin/env bash
# The whole GPU check in one command, from the repository root: scripts/gpu_bench.sh [OUT]   (default results/h200)
# About 12 minutes on one H200, with no network and nothing installed (torch, transformers, pytest, nbclient and
# ipykernel already there). TORCH_LOGS=recompiles logs every recompilation, with its reason, into each part's output.
# Each part has its own time limit and writes its files as it goes, so a part that fails or runs out of time keeps
# what it had and the next part still runs:
#   1. gpu.txt                the GPU, driver, torch and transformers versions
#   2. scripts/gpu_bench.py   log.txt, step_times.jsonl, sweep.jsonl, summary.json, speedup_vs_batch.png, compile.json
#   3. the gpu-marked tests   gpu_tests.txt
#   3b. minispec serve-bench  engine_load.{jsonl,png,txt,log}: the engine (continuous batching, paged KV, speculation)
#                             under Poisson load on the 8B shape (random weights, bf16) with the 2-layer draft at a
#                             synthetic alpha 0.8: plain against gamma 4 and against vLLM's batch-size table measured
#                             there, TTFT/TPOT/goodput by arrival rate, the simulator on the engine's step times beside
#                             it. Eager only: the engine's batch and context change every step, so compiling it would
#                             need CUDA graphs per batch size and a paged-attention kernel (vLLM has both; this engine
#                             gathers KV through block tables in plain PyTorch), not torch.compile of fixed shapes.
#   4. every lesson           lessons/NN_*.ipynb (executed, with outputs), lessons.jsonl (per lesson: status, seconds,
#                             graphs Dynamo compiled, recompiles logged, whether the recompile limit was hit),
#                             lessons.txt (the same, as a table)
# The lessons run in four lanes at once, to fit the budget: lane A holds 01 (the lesson that compiles) and 04 (the
# batch sweep), lanes B and D the other GPU lessons (11 trees, 12 EAGLE heads among them), lane C those that run on
# the CPU here (random weights send 05 and 13 to the CPU trio; 09 times its 3M-parameter pair on the CPU; 08 runs
# no model).
# Their GPU timings share the GPU with the other lanes' work, which the lessons' asserts allow for; the clean step
# times are gpu_bench.py's, which runs alone.
# A lesson the budget cannot reach is recorded as skipped; one cut short keeps its outputs so far.
# On a machine without a GPU, GPU_BENCH_SMALL=1 GPU_BENCH_BUDGET=240 scripts/gpu_bench.sh /tmp/x runs the same steps
# with gpu_bench.py --small, to check this script.
set -uo pipefail
out=${1:-results/h200}
budget=${GPU_BENCH_BUDGET:-720}  # seconds for everything
small=${GPU_BENCH_SMALL:+--small}
mkdir -p "$out/lessons"
rm -f "$out/lessons.jsonl" "$out/lessons/lessons.jsonl"
export PYTHONPATH="$PWD" HF_HUB_OFFLINE=1 MPLBACKEND=Agg TORCH_LOGS=recompiles
left() { local s=$(( budget - SECONDS )); echo $(( s > 1 ? s : 1 )); }  # seconds left, at least 1

{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
  python3 -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, \
'transformers', transformers.__version__)"; } 2>&1 | tee "$out/gpu.txt"

timeout 150 python3 scripts/gpu_bench.py --out "$out" $small 2>&1 | tee "$out/log.txt"
echo "gpu_bench.py: exit ${PIPESTATUS[0]} after $SECONDS s" | tee -a "$out/log.txt"

if python3 -c "import pytest" 2>/dev/null; then
  timeout 75 python3 -m pytest -q -m gpu -p no:cacheprovider tests 2>&1 | tail -40 | tee "$out/gpu_tests.txt"
else
  echo "pytest is not installed here: gpu tests not run" | tee "$out/gpu_tests.txt"
fi

if [ -n "$small" ]; then  # the same command on tiny shapes on the CPU
  sb=(--target shape:tiny --draft shape:tiny-draft --device cpu --dtype float32 --rates 4,32 --requests 12,12
      --max-num-seqs 8 --lengths 16,16)
else
  sb=(--target shape:llama-8b --draft shape:llama-draft-2l --device cuda --rates 8,32,128 --requests 64,192
      --max-num-seqs 128 --lengths 128,128 --slo 1,40)
fi
timeout 180 python3 -m minispec serve-bench "${sb[@]}" --gamma 4,table --accept-rate 0.8 --out "$out/engine_load" \
  2>&1 | tail -40 | tee "$out/engine_load.log"
echo "serve-bench: exit ${PIPESTATUS[0]} after $SECONDS s" | tee -a "$out/engine_load.log"

if python3 -c "import nbclient, ipykernel" 2>/dev/null; then
  lane() {  # lane NAME NOTEBOOK...: the notebooks in turn, until the budget is spent
    local name=$1; shift
    timeout "$(left)" python3 scripts/gpu_bench.py --out "$out/lessons" --deadline "$(( $(left) - 10 ))" \
      --lesson-timeout 300 --lessons "$@" > "$out/lessons/lane_$name.log" 2>&1
  }
  lane a lessons/01_*.ipynb lessons/04_*.ipynb &
  lane b lessons/00_*.ipynb lessons/03_*.ipynb lessons/06_*.ipynb lessons/11_*.ipynb lessons/14_*.ipynb &
  lane c lessons/08_*.ipynb lessons/05_*.ipynb lessons/09_*.ipynb lessons/13_*.ipynb &
  lane d lessons/02_*.ipynb lessons/07_*.ipynb lessons/10_*.ipynb lessons/12_*.ipynb &
  wait
  cp "$out/lessons/lessons.jsonl" "$out/lessons.jsonl" 2>/dev/null
  python3 - "$out/lessons.jsonl" <<'EOF' | tee "$out/lessons.txt"
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])] if __import__("os").path.exists(sys.argv[1]) else []
print(f"{'lesson':40s} {'status':10s} {'seconds':>8s} {'graphs':>7s} {'recompiles':>11s} limit hit")
for r in sorted(rows, key=lambda r: r["lesson"]):
    print(f"{r['lesson']:40s} {r['status'][:10]:10s} {r.get('seconds', '-')!s:>8s} {r.get('graphs_compiled')!s:>7s} "
          f"{r.get('recompiles_logged')!s:>11s} {r.get('recompile_limit_hit')}")
for r in rows:
    if r.get("error"):
        print(f"\n{r['lesson']}: {r['error'][-800:]}")
EOF
else
  echo "nbclient or ipykernel is not installed here: lessons not run" | tee "$out/lessons.txt"
fi
echo "gpu_bench.sh: done in $SECONDS s" | tee -a "$out/lessons.txt"
