"""The KV pool on transparent huge pages against 4 KiB pages, through the engine (``paged.pool_zeros``).

    python scripts/engine_hugepages.py [--batch 32] [--prompts 64,512] [--new 96] [--rounds 6] [--threads 2] [--plain]
                                       [--out results/cpu/engine_hugepages.txt]

SmolLM2-135M float32, decode_profile.py's static batch (``--batch`` chat prompts of ``--prompts`` tokens, ``--new``
greedy tokens each, EOS ignored) with prompt lookup as vs-vllm runs it (``--plain``: plain decoding), through two
engines in this process that differ only in their pool's pages (:data:`minispec.engine.paged.HUGE_PAGES`). Each round
runs both, the order swapped every round so that neither always runs first; per round the wall time of each run
(prefill steps included) and its median step. A benchmark: read the ratios within one run.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import decode_profile  # noqa: E402  (a script beside this one: its runner and prompts)

from minispec.engine import paged  # noqa: E402


def huge_kb() -> int:
    """This process's anonymous memory on huge pages, KiB (/proc/self/smaps_rollup)."""
    line = next(x for x in Path("/proc/self/smaps_rollup").read_text().splitlines() if x.startswith("AnonHugePages"))
    return int(line.split()[1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--prompts", default="64,512")
    ap.add_argument("--new", type=int, default=96)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--plain", action="store_true", help="plain decoding, not prompt lookup")
    ap.add_argument("--out", default="results/cpu/engine_hugepages.txt")
    args = ap.parse_args()
    lo, hi = map(int, args.prompts.split(","))
    from transformers import AutoTokenizer

    from minispec.model.load import resolve
    from minispec.tools.vs_vllm import VsConfig
    from minispec.tools.vs_vllm_workload import copy_prompts

    torch.set_num_threads(args.threads)
    prompts = copy_prompts(AutoTokenizer.from_pretrained(str(resolve("smollm2-135m-instruct"))), args.batch, (lo, hi),
                           seed=6)
    before = huge_kb()
    runs = {}
    for name, huge in (("4 KiB pages", False), ("huge pages", True)):
        paged.HUGE_PAGES = huge  # read when the engine allocates its pool, below
        runs[name] = decode_profile.minispec_runner(prompts, args.new, not args.plain, VsConfig())
    paged.HUGE_PAGES = True
    on_huge = huge_kb() - before
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    how = "plain decoding" if args.plain else "prompt lookup (K = 4)"
    lines = [f"# SmolLM2-135M float32, a static batch of {args.batch} prompts of {lo}-{hi} tokens, {args.new} greedy "
             f"tokens each, {how}: two engines in one process, one pool on 4 KiB pages and one on transparent huge "
             f"pages ({on_huge // 1024} MiB of huge pages appeared when they were built), alternated, the order "
             f"swapped each round (commit {commit}, {platform.machine()}, {args.threads} threads, torch "
             f"{torch.__version__}, load average before {os.getloadavg()[0]:.1f})"]
    for run in runs.values():
        run(8)  # first calls: allocators, caches
    ratios, tokens = [], {}
    for r in range(args.rounds):
        got = {}
        for name in (list(runs) if r % 2 == 0 else list(runs)[::-1]):
            t = time.perf_counter()
            step_s, tokens[name] = runs[name]()
            got[name] = (time.perf_counter() - t, 1e3 * statistics.median(step_s))
        (w4, m4), (wh, mh) = got["4 KiB pages"], got["huge pages"]
        ratios.append(wh / w4)
        first = "4 KiB first" if r % 2 == 0 else "huge first"
        lines.append(f"round {r + 1} ({first}): 4 KiB pages {w4:.2f} s (median step {m4:.0f} ms), huge pages "
                     f"{wh:.2f} s ({mh:.0f} ms): {wh / w4:.2f}x the time")
        print(lines[-1], flush=True)
    same = tokens["4 KiB pages"] == tokens["huge pages"]
    lines.append(f"huge pages / 4 KiB pages, the run's time: median {statistics.median(ratios):.2f}x, range "
                 f"{min(ratios):.2f}-{max(ratios):.2f}x; the same greedy tokens: {same}; load average after "
                 f"{os.getloadavg()[0]:.1f}")
    print("\n".join(lines))
    Path(args.out).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
