"""The engine's attention backends on this machine: the gather against the sparse matmuls and FlexAttention.

    python scripts/engine_attention.py [--threads 1] [--paths gather,flex] [--tokens 5] [--compile]
        [--out results/cpu/engine_attention.txt]

One layer of SmolLM2-135M's attention (9 query heads, 3 KV heads, head dim 64, float32) in an engine step: B decoding
rows of T tokens each (1: a plain step; 5: the root and 4 draft tokens) at a context of C tokens, their blocks
scattered over the pool. Each backend's time is the median of alternated rounds in one process, and its output is
checked against the gather's. ``--compile`` also times ``torch.compile(flex_attention)`` (minutes to compile on a
CPU); on a GPU the engine compiles it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import time

import torch

from minispec.engine.attention import PagedStep, group
from minispec.engine.paged import PagedPool
from minispec.model.llama import attention_masks

H, K, D, BS = 9, 3, 64, 16


def step(B: int, C: int, T: int, attention: str):
    """A PagedStep of B rows, each T queries at context C, over a pool with their blocks shuffled."""
    nb = -(-(C + T) // BS)
    pool = PagedPool(1, B * nb + 8, BS, K, D)
    pool.k.normal_(), pool.v.normal_()
    tables = torch.randperm(B * nb + 8)[: B * nb].view(B, nb)  # (B, nb)
    tables = torch.cat([tables, torch.full((B, 1), B * nb + 8)], 1)  # + the scratch column
    new = C + torch.arange(T).expand(B, T)  # (B, T) logical slots = positions
    _, masks = attention_masks(new, C + T, None, (None,))
    g = group(torch.arange(B * T).view(B, T), torch.ones(B, T, dtype=torch.bool), tables, masks, BS)
    slots = (tables.gather(1, new // BS) * BS + new % BS).flatten()  # (B T,)
    return PagedStep(pool, new.flatten()[None], slots, [g], attention)


def measure(B: int, C: int, T: int, paths: list[str], rounds: int, compile_: bool) -> tuple[dict[str, float], float]:
    """Median seconds of one layer's attention per backend, and the largest difference from the gather's output."""
    ref = step(B, C, T, "gather")
    steps = {"gather": ref} | {p: PagedStep(ref.pool, ref.positions, ref.slots, ref.groups, p, False)
                               for p in paths if p != "gather"}
    if compile_:
        steps["flex, compiled"] = PagedStep(ref.pool, ref.positions, ref.slots, ref.groups, "flex", True)
    q, k, v = torch.randn(1, H, B * T, D), torch.randn(1, K, B * T, D), torch.randn(1, K, B * T, D)
    out = {name: st.attend(0, q, k, v, None) for name, st in steps.items()}  # warm-up (and compile)
    diff = max((o - out["gather"]).abs().max().item() for o in out.values())
    times = {name: [] for name in steps}
    for _ in range(rounds):
        for name, st in steps.items():
            t = time.perf_counter()
            st.attend(0, q, k, v, None)
            times[name].append(time.perf_counter() - t)
    return {name: statistics.median(ts) for name, ts in times.items()}, diff


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--contexts", default="256,2048")
    ap.add_argument("--tokens", default="5", help="queries a row, e.g. 1,5")
    ap.add_argument("--paths", default="gather,flex", help="backends besides the gather, e.g. gather,sparse,flex")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--out", default="results/cpu/engine_attention.txt")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    paths = ["gather"] + [p for p in args.paths.split(",") if p != "gather"]
    names = paths + (["flex, compiled"] if args.compile else [])
    lines = [f"# engine attention, one layer of SmolLM2-135M's shape; torch {torch.__version__}, "
             f"{args.threads} thread(s), commit {commit}, load average before {os.getloadavg()[0]:.1f}", "",
             "| rows | tokens a row | context | " + " | ".join(names) + " | max abs difference |",
             "| --- | --- | --- | " + "--- | " * len(names) + "--- |"]
    with torch.inference_mode():
        for B in [int(b) for b in args.batches.split(",")]:
            for T in [int(t) for t in args.tokens.split(",")]:
                for C in [int(c) for c in args.contexts.split(",")]:
                    med, diff = measure(B, C, T, paths, args.rounds, args.compile)
                    cells = [f"{1e3 * med[n]:.2f} ms ({med[n] / med['gather']:.1f}x)" for n in names]
                    lines.append(f"| {B} | {T} | {C} | " + " | ".join(cells) + f" | {diff:.1e} |")
                    print(lines[-1], flush=True)
    lines.append(f"\nload average after {os.getloadavg()[0]:.1f}")
    with open(args.out, "w") as fh:
        fh.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
