"""One decode step's target pass with this checkout's attention against another commit's ``attention.py``.

    git show 9aaf583:minispec/engine/attention.py > /tmp/old_attention.py
    python scripts/step_attention.py --other /tmp/old_attention.py [--setting plain] [--every 6] [--max 6] [--rounds 7]

SmolLM2-135M, vs-vllm's static batch of 32, greedy, through the engine (``--setting``: plain or ngram, prompt lookup
with K = 4). Every ``--every``-th decode-only step of 28 rows or more is captured, and its target pass run ``--rounds``
times through this checkout's :class:`~minispec.engine.attention.PagedStep` and through the other file's, alternated,
on the same groups, pool, positions and slots (the pass writes the same keys and values again, so the rounds repeat
one step). Prints each step's largest logit difference and best time of each, and the sum over the steps. A
benchmark: read the ratio within its run.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import platform
import subprocess
import time

import torch

from minispec.engine.attention import PagedStep
from minispec.tools.vs_vllm import VsConfig, served_by_minispec
from minispec.tools.vs_vllm_workload import minispec_engines, static_jobs, workload


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--other", required=True, help="another commit's minispec/engine/attention.py")
    ap.add_argument("--setting", choices=("plain", "ngram"), default="plain")
    ap.add_argument("--every", type=int, default=6)
    ap.add_argument("--max", type=int, default=6, help="steps measured at most")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    if not os.path.isfile(args.other):
        raise SystemExit(f"--other: no file {args.other}")
    if min(args.every, args.max, args.rounds, args.threads) < 1:
        raise SystemExit("--every, --max, --rounds and --threads must be >= 1")
    spec = importlib.util.spec_from_file_location("other_attention", args.other)
    other = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(other)
    torch.set_num_threads(args.threads)
    w, cfg = workload("smollm2"), VsConfig()
    engine = minispec_engines(w, cfg, None)[args.setting]
    batch = static_jobs(w["prompts"], w["outputs"], 32, cfg, w["eos"])[0]
    forward = engine.runner.target.forward
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    print(f"# one decode step's target pass, this checkout's attention (commit {commit}) against {args.other}'s; "
          f"SmolLM2-135M, static batch 32, {args.setting}; {platform.machine()}, {args.threads} threads, torch "
          f"{torch.__version__}, load average before {os.getloadavg()[0]:.1f}", flush=True)
    captured, seen = [], [0]

    def capture(tokens, step, **kw):
        if step.decoding == tokens.shape[1] >= 28 and len(captured) < args.max:
            seen[0] += 1
            if seen[0] % args.every == 0:
                captured.append((tokens.clone(), step, kw))
        return forward(tokens, step, **kw)

    engine.runner.target.forward = capture
    with torch.inference_mode():
        served_by_minispec(engine, batch, False)
        best = {"this": [], "other": []}
        for tokens, step, kw in captured:
            steps = {name: cls(step.pool, step.positions, step.slots, step.groups, step.attention)
                     for name, cls in (("this", PagedStep), ("other", other.PagedStep))}
            err = (forward(tokens, steps["this"], **kw) - forward(tokens, steps["other"], **kw)).abs().max().item()
            t = {name: [] for name in steps}
            for _ in range(args.rounds):
                for name, s in steps.items():
                    t0 = time.perf_counter()
                    forward(tokens, s, **kw)
                    t[name].append(time.perf_counter() - t0)
            a, b = min(t["this"]), min(t["other"])
            best["this"].append(a), best["other"].append(b)
            print(f"N {tokens.shape[1]}, {len(step.groups)} groups: logits differ by {err:.1e}; best {1e3 * a:.1f} ms "
                  f"against {1e3 * b:.1f} ({a / b:.3f}x)", flush=True)
    if captured:
        a, b = sum(best["this"]), sum(best["other"])
        print(f"sum over {len(captured)} steps: {a:.3f} s against {b:.3f} s ({a / b:.3f}x); load average after "
              f"{os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
