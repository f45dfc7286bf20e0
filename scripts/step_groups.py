"""One speculative step's target pass two ways: this checkout's runner (or attention) against another commit's.

    git show 66d7cc6:minispec/engine/runner.py > /tmp/old_runner.py
    python scripts/step_groups.py --other /tmp/old_runner.py [--every 3] [--max 8] [--rounds 5] [--threads 2]
    git show 6d5f894:minispec/engine/attention.py > /tmp/old_attention.py
    python scripts/step_groups.py --attention /tmp/old_attention.py [...]

SmolLM2-135M, vs-vllm's static batch of 32 with prompt lookup (K = 4), greedy, through the engine. At every
``--every``-th decode-only step of 28 rows or more, the step is captured and its target pass run ``--rounds`` times
with each runner's attention groups (``_Decoding.groups`` of this checkout and of the other file, called on the same
step), alternated, on the same pool, positions and slots: the pass writes the same keys and values again, so the
rounds repeat one step. ``--attention``: the same groups each time, attended by this checkout's ``PagedStep`` and by
the other file's. Prints each step's best time of each grouping and the sum over the steps. A benchmark:
read the ratio within its run.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import platform
import subprocess
import sys
import time

import torch

from minispec.engine import attention, runner
from minispec.tools.vs_vllm import VsConfig, served_by_minispec
from minispec.tools.vs_vllm_workload import minispec_engines, static_jobs, workload


def other_module(path: str, name: str):
    """The module in file ``path`` (another commit's ``minispec/engine/runner.py`` or ``attention.py``)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--other", help="another commit's minispec/engine/runner.py")
    ap.add_argument("--attention", help="another commit's minispec/engine/attention.py (instead of --other)")
    ap.add_argument("--every", type=int, default=3)
    ap.add_argument("--max", type=int, default=8, help="steps measured at most")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    path = args.other or args.attention
    if (args.other is None) == (args.attention is None) or not os.path.isfile(path):
        raise SystemExit(f"give one of --other and --attention, the path of a file (got {path!r})")
    other = other_module(path, "other_runner" if args.other else "other_attention")
    steps = {"this": attention.PagedStep, "other": attention.PagedStep if args.other else other.PagedStep}
    torch.set_num_threads(args.threads)
    w, cfg = workload("smollm2"), VsConfig()
    engine = minispec_engines(w, cfg, None)["ngram"]
    batch = static_jobs(w["prompts"], w["outputs"], 32, cfg, w["eos"])[0]
    model, forward = engine.runner.target, engine.runner.target.forward
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    what = "runner's groups" if args.other else "attention"
    print(f"# one step's target pass, this {what} (commit {commit}) against {path}'s; SmolLM2-135M, "
          f"static batch 32, prompt lookup; {platform.machine()}, {args.threads} threads, torch {torch.__version__}, "
          f"load average before {os.getloadavg()[0]:.1f}", flush=True)
    decs, seen, best, plans = [], [0], {"this": [], "other": []}, []
    flatten, execute = runner.ModelRunner._flatten, engine.runner.execute

    def record(self, d, pre):  # the step's decoding rows, kept for the groups
        decs[:] = d
        return flatten(self, d, pre)

    def planned(plan):  # the step's plan: an older runner's groups read each row's draft slots k from its rows
        plans[:] = [plan]
        return execute(plan)

    def timed(tokens, step, **kw):
        one = len(decs) == 1 and decs[0].proposal is not None and len(decs[0].rows) >= 28
        if step.decoding == tokens.shape[1] and one and len(best["this"]) < args.max:
            seen[0] += 1
            if seen[0] % args.every == 0:
                d, bs = decs[0], step.pool.block_size
                d.k = plans[0].k  # one group of decoding rows: the plan's rows, in its order
                groups = {"this": step.groups,
                          "other": other._Decoding.groups(d, bs, model.windows) if args.other else step.groups}
                t = {k: [] for k in groups}
                for _ in range(args.rounds):
                    for k, g in groups.items():
                        s = steps[k](step.pool, step.positions, step.slots, g, step.attention)
                        t0 = time.perf_counter()
                        forward(tokens, s, **kw)
                        t[k].append(time.perf_counter() - t0)
                for k in t:
                    best[k].append(min(t[k]))
                a, b = min(t["this"]), min(t["other"])
                print(f"N {tokens.shape[1]}, {len(d.rows)} rows, {d.fed.count(0)} without draft tokens: "
                      f"{len(groups['this'])} groups against {len(groups['other'])}, best {1e3 * a:.0f} ms against "
                      f"{1e3 * b:.0f} ({a / b:.2f}x)", flush=True)
        return forward(tokens, step, **kw)

    runner.ModelRunner._flatten, model.forward, engine.runner.execute = record, timed, planned
    with torch.inference_mode():
        served_by_minispec(engine, batch, False)
    if best["this"]:
        print(f"sum over {len(best['this'])} steps: {sum(best['this']):.3f} s against {sum(best['other']):.3f} s "
              f"({sum(best['this']) / sum(best['other']):.3f}x); load average after {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
