"""Where a static batch's time goes in each engine: its prefill, then its decode-only steps, from the step events.

    . .venv-vllm/bin/activate   # vLLM and minispec
    python scripts/decode_phase.py [--batch 32] [--repeat 2] [--threads 2] [--out results/cpu/decode_phase.txt]

SmolLM2-135M, vs-vllm's static batch (its prompts and lengths, greedy), plain and with prompt lookup (K = 4), through
minispec's engine and vLLM's, alternated, the same settings as ``minispec vs-vllm --threads T --vllm-threads T``.
From each request's step events: when the last prompt got its first token (the prefill ends; chunked, so some
decoding happened beside it), the output tokens after that over the time after it (the decode phase's tok/s), and
the decode-only steps that gave tokens to at least 7/8 of the batch: their mean time and tokens a step. A
benchmark: read the ratios within one run.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import time
from collections import defaultdict
from dataclasses import replace

import torch

from minispec.tools.vllm_side import VllmServer, VllmSettings
from minispec.tools.vs_vllm import VsConfig, served_by_minispec, vllm_spec
from minispec.tools.vs_vllm_workload import minispec_engines, static_jobs, workload


def phases(served, full: int) -> dict:
    """The prefill's end, the decode phase's tok/s, and the decode steps with at least ``full`` rows."""
    prefilled = max(s.first_token_s for s in served)
    end = max(s.finish_s for s in served)
    steps = defaultdict(lambda: [0, 0])  # step end -> [rows given tokens, tokens]
    for s in served:
        for t, n in s.events:
            steps[t][0] += 1
            steps[t][1] += n
    ends = sorted(steps)
    full_steps = [(b - a, steps[b][1]) for a, b in zip(ends, ends[1:]) if b > prefilled and steps[b][0] >= full]
    after = sum(n for s in served for t, n in s.events if t > prefilled)
    return {"prefill_s": prefilled, "decode_tok_s": after / (end - prefilled), "steps": len(full_steps),
            "step_ms": 1e3 * sum(d for d, _ in full_steps) / max(len(full_steps), 1),
            "tokens_per_step": sum(n for _, n in full_steps) / max(len(full_steps), 1),
            "tok_s": sum(len(s.tokens) for s in served) / end}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="results/cpu/decode_phase.txt")
    args = ap.parse_args()
    if args.batch < 8 or args.repeat < 1 or args.threads < 1:
        raise SystemExit("--batch must be >= 8, --repeat and --threads >= 1")
    torch.set_num_threads(args.threads)
    cfg = VsConfig(threads=args.threads, vllm=VllmSettings(threads=args.threads), k_table=None)
    w = workload("smollm2")
    engines = minispec_engines(w, cfg, None)
    batch = static_jobs(w["prompts"], w["outputs"], args.batch, cfg, w["eos"])[0]
    warm = [replace(j, max_new_tokens=8) for j in batch[:4]]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    lines = [f"# SmolLM2-135M, static batch of {args.batch}: prefill, then decode (commit {commit}, "
             f"{platform.machine()}, {args.threads} threads each, torch {torch.__version__}, load average before "
             f"{os.getloadavg()[0]:.1f})",
             "", "| setting | engine | run | tok/s | prefill ends s | decode tok/s | full steps | ms a full step | "
             "tokens a full step |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for setting in ("plain", "ngram"):
        server = VllmServer(w["target"], vllm_spec(w, setting, cfg, None), settings=cfg.vllm,
                            kv_tokens=cfg.kv_of("smollm2"), max_num_seqs=cfg.max_num_seqs,
                            max_num_batched_tokens=cfg.max_num_batched_tokens, max_model_len=w["max_model_len"],
                            tokenizer=True)
        try:
            serve = {"minispec": lambda b, s=setting: served_by_minispec(engines[s], b, False)[0],
                     "vllm": lambda b, v=server: v.serve(b)[0]}
            for fn in serve.values():
                fn(warm)
            for r in range(args.repeat):
                for name, fn in serve.items():
                    torch.set_num_threads(args.threads)
                    time.sleep(1.5)  # vLLM's idle worker polls its queue for about a second after a run
                    p = phases(fn(batch), args.batch * 7 // 8)
                    lines.append(f"| {setting} | {name} | {r} | {p['tok_s']:.1f} | {p['prefill_s']:.2f} | "
                                 f"{p['decode_tok_s']:.1f} | {p['steps']} | {p['step_ms']:.0f} | "
                                 f"{p['tokens_per_step']:.1f} |")
                    print(lines[-1], flush=True)
        finally:
            server.close()
    lines.append(f"\nload average after {os.getloadavg()[0]:.1f}")
    with open(args.out, "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
