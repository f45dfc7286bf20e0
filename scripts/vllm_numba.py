"""vLLM's n-gram proposer and its numba threads: SmolLM2-135M's static batches through vLLM's CPU engine, plain and
with n-gram speculation under numba's default threading layer (OpenMP here) and under its ``workqueue`` layer.

    .venv-vllm/bin/python scripts/vllm_numba.py [--threads 2] [--rounds 2] [--batches 1,8,32]
        # writes results/cpu/vllm_numba.txt

vLLM's ``NgramProposer`` runs a numba function compiled with ``parallel=True`` in the worker's process. With numba's
OpenMP layer that starts a second pool of OpenMP threads beside torch's, bound ones; this measures what that costs
each step, and checks that the two layers give the same tokens and the same acceptance counters (only the threads
differ). The rounds alternate the settings, each engine started afresh, so that a change in the machine's load lands
on all of them. A benchmark, not a test: its figures are ratios within one run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

from minispec.tools import vs_vllm_workload as W
from minispec.tools.vllm_side import VllmServer, VllmSettings, available
from minispec.tools.vs_vllm import VsConfig

ROOT = Path(__file__).resolve().parents[1]

SETTINGS = (("plain", "workqueue"), ("ngram", "default"), ("ngram", "workqueue"))  # (vLLM setting, numba layer)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2, help="vLLM's worker threads")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--out", default=str(ROOT / "results" / "cpu" / "vllm_numba.txt"))
    args = ap.parse_args()
    if (why := available()) is not None:
        raise SystemExit(f"vLLM is not available here: {why}")
    batches = [int(b) for b in args.batches.split(",")]
    cfg = VsConfig(workloads=("smollm2",), static_batches=tuple(batches), k_table=None, threads=args.threads)
    w = W.workload("smollm2")
    jobs = {B: W.static_jobs(w["prompts"], w["outputs"], B, cfg, w["eos"]) for B in batches}
    rates, tokens, counters = {}, {}, {}
    load0, t0 = os.getloadavg()[0], time.perf_counter()
    for r in range(args.rounds):
        for setting, numba in SETTINGS:
            spec = W.vllm_spec(w, setting, cfg, None)
            with VllmServer(w["target"], spec, settings=VllmSettings(args.threads, numba=numba),
                            kv_tokens=cfg.kv_of("smollm2"), max_num_seqs=cfg.max_num_seqs,
                            max_num_batched_tokens=cfg.max_num_batched_tokens,
                            max_model_len=w["max_model_len"]) as server:
                server.serve(jobs[batches[0]][0])  # warm-up: the first request's shapes
                for B in batches:
                    start, before = time.perf_counter(), server.counters()
                    served = [server.serve(batch)[0] for batch in jobs[B]]
                    wall = time.perf_counter() - start
                    got = [s.tokens for round_ in served for s in round_]
                    rates.setdefault((setting, numba, B), []).append(sum(map(len, got)) / wall)
                    after = server.counters()
                    if setting == "ngram":
                        counters.setdefault((numba, B), []).append(
                            {k: after[k] - before[k] for k in ("num_drafts", "draft_tokens", "accepted_tokens")})
                    tokens.setdefault(B, got)
                    if got != tokens[B]:
                        raise SystemExit(f"batch {B}: {setting} with numba {numba} gave other tokens")
            print(f"round {r + 1}: {setting}, numba {numba} done", flush=True)
    for B in batches:
        seen = counters[("default", B)] + counters[("workqueue", B)]
        if any(c != seen[0] for c in seen):
            raise SystemExit(f"batch {B}: the acceptance counters differ between numba layers: {seen}")
    med = {k: statistics.median(v) for k, v in rates.items()}
    meta = W.metadata(cfg)
    lines = [f"# vLLM {meta['vllm']} on SmolLM2-135M float32, static batches, {args.threads} worker thread(s), "
             f"{args.rounds} rounds alternated; output tok/s (each round's) and medians",
             "", "| batch | plain | n-gram, numba default (OpenMP) | n-gram, numba workqueue | n-gram / plain, default "
             "| n-gram / plain, workqueue | default's time / workqueue's |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for B in batches:
        p, d, q = (med[(s, n, B)] for s, n in SETTINGS)
        fmt = lambda k: ", ".join(f"{x:.1f}" for x in rates[k]) + f" (median {med[k]:.1f})"  # noqa: E731
        lines.append(f"| {B} | {fmt(('plain', 'workqueue', B))} | {fmt(('ngram', 'default', B))} | "
                     f"{fmt(('ngram', 'workqueue', B))} | {d / p:.2f} | {q / p:.2f} | {q / d:.2f}x |")
    lines += ["", "The same tokens under every setting and the same acceptance counters under both numba layers, "
              "every round (the script stops otherwise).",
              f"Load average {load0:.1f} before, {os.getloadavg()[0]:.1f} after; {time.perf_counter() - t0:.0f} s.",
              f"Commit {meta['git_revision']}, {meta['cpu']}, {meta['cores']} cores, torch {meta['torch']}; "
              f"command: {' '.join(['scripts/vllm_numba.py'] + sys.argv[1:])}"]
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
