"""The compiled engine at two commits, alternated in separate processes: static batches' tokens a second.

    python scripts/engine_commits.py --base REV [--cases pair:1:plain,pair:1:draft,...] [--rounds 3] [--out FILE]

A change that Dynamo reads when it traces (a module constant, a rule in a layer) cannot be A/B-tested in one
process: the second setting re-traces or reads the first's graphs. So each round runs one process at ``--base`` (a
git worktree of it in a temporary folder) and one at this checkout, in an order that swaps each round. Each process
builds ``Engine(compile=True)`` per case (``workload:batch:setting``: the embedded pair or SmolLM2-135M, a static
batch of max(batch, 8) prompts of vs-vllm's code text, 64 greedy tokens each, ``plain`` or with its ``draft`` model,
gamma 4), serves them once to warm up, then three times, and prints its best tokens a second. The table gives each
round's figures and this checkout's over the base's per case (the machine's speed drifts between processes: read
the ratios of the rounds, not one). A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CASES = "pair:1:plain,pair:1:draft,pair:8:plain,pair:8:draft,pair:32:plain,pair:32:draft"


def child(cases: list[str], threads: int) -> None:
    """In a checkout's own process: each case's best tokens a second, one JSON line."""
    import torch

    from minispec.drafts.model import ModelDraft
    from minispec.engine import Engine, Request
    from minispec.model.load import load, resolve, sample_text

    torch.set_num_threads(threads)
    names = {"pair": ("tiny-code-target", "tiny-code-draft"), "smollm2": ("smollm2-135m-instruct", None)}
    text, rng, out = sample_text("code"), random.Random(0), {}
    spans = [(rng.randrange(0, len(text) - 320), rng.randrange(64, 320)) for _ in range(32)]
    models = {}
    for case in cases:
        work, batch, setting = case.split(":")
        if work not in models:
            models[work] = [None if n is None else load(resolve(n), dtype=torch.float32)[0] for n in names[work]]
        target, draft = models[work]
        if work == "pair":
            prompts = [list(text[a: a + n]) for a, n in spans]
        else:  # token ids of the same lengths: SmolLM2's vocabulary, not bytes
            prompts = [[rng.randrange(100, 40000) for _ in range(n)] for _, n in spans]
        engine = Engine(target, ModelDraft(draft) if setting == "draft" else None, gamma=4,
                        max_num_seqs=int(batch), max_num_batched_tokens=2048, num_blocks=1024, compile=True)
        jobs = prompts[: max(int(batch), 8)]
        engine.run([Request(p, 8) for p in jobs])  # warm-up
        best = 0.0
        for _ in range(3):
            t = time.perf_counter()
            outs = engine.run([Request(p, 64) for p in jobs])
            best = max(best, sum(len(o.tokens) for o in outs) / (time.perf_counter() - t))
        out[case] = best
    print(json.dumps(out))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", required=True, help="the commit to measure this checkout against")
    ap.add_argument("--cases", default=CASES)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    cases = args.cases.split(",")
    if args.child:
        return child(cases, args.threads)
    git = lambda *a: subprocess.run(["git", *a], cwd=ROOT, check=True, capture_output=True, text=True).stdout.strip()  # noqa: E731
    base, head = git("rev-parse", "--short", args.base), git("rev-parse", "--short", "HEAD")
    dirty = " with uncommitted changes" if git("status", "--porcelain", "--untracked-files=no") else ""
    lines = [f"# the compiled engine at {base} (base) and at {head}{dirty} (this checkout), alternated in separate "
             f"processes: best tokens a second of each case; {platform.machine()}, {args.threads} threads, load "
             f"average before {os.getloadavg()[0]:.1f}"]
    figures = {"base": [], "this": []}
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "base"
        git("worktree", "add", "--detach", str(tree), base)
        try:
            for r in range(args.rounds):
                for who in (("base", "this") if r % 2 == 0 else ("this", "base")):
                    where = tree if who == "base" else ROOT
                    run = subprocess.run([sys.executable, str(ROOT / "scripts" / "engine_commits.py"), "--child",
                                          "--base", base, "--cases", args.cases, "--threads", str(args.threads)],
                                         cwd=where, env={**os.environ, "PYTHONPATH": str(where)}, check=True,
                                         capture_output=True, text=True)
                    figures[who].append(json.loads(run.stdout.strip().splitlines()[-1]))
                    lines.append(f"round {r} {who}: " + ", ".join(f"{c} {v:.0f}" for c, v in figures[who][-1].items()))
                    print(lines[-1], flush=True)
        finally:
            git("worktree", "remove", "--force", str(tree))
    lines.append("this checkout / base, round by round:")
    for c in cases:
        ratios = [t[c] / b[c] for t, b in zip(figures["this"], figures["base"])]
        lines.append(f"  {c}: " + ", ".join(f"{x:.2f}" for x in ratios))
    lines.append(f"load average after {os.getloadavg()[0]:.1f}")
    print("\n".join(lines[-len(cases) - 2:]))
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
