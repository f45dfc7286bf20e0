"""How often a seeded request's tokens in the engine differ from its tokens alone (batch invariance, measured).

    python scripts/batch_invariance.py [--requests 48] [--threads 1] [--out results/cpu/batch_invariance.txt]

Each request has its own seed, so its random numbers depend on nothing else (decoding/sampling.py). Its tokens are
its run alone wherever its logits are too; in the engine's flattened pass the matmuls' row count and attention's
padded length change with whatever else runs, and recomputation after a preemption changes them again, so its
logits can differ in the last bits, and a token flips where a uniform (or a greedy near-tie) falls within that
difference of a boundary. This script measures the share of requests whose tokens differ from their run alone, on
the embedded pair (plain, and the draft model at gamma 4), at temperatures 0, 0.7 and 1, with a roomy cache and with
one small enough to preempt, and the largest logit difference seen between a request's first step in a batch and
alone.
"""

from __future__ import annotations

import argparse
import os
import subprocess

import torch

import minispec
from minispec import Engine, Request
from minispec.model.load import sample_text


def requests(prompts, temperature: float, rate: float):
    return [Request(p, 48, temperature=temperature, seed=1000 + i, arrival_s=i / rate) for i, p in enumerate(prompts)]


def share(target, draft, prompts, temperature: float, num_blocks: int | None) -> tuple[int, int, int]:
    """(requests whose tokens differ from alone, requests, preemptions) for one configuration."""
    together = Engine(target, draft, gamma=4, num_blocks=num_blocks, max_num_seqs=32)
    outs = together.run(requests(prompts, temperature, rate=200.0))
    alone = Engine(target, draft, gamma=4)
    differ = sum(alone.run([r])[0].tokens != o.tokens for r, o in zip(requests(prompts, temperature, 200.0), outs))
    return differ, len(prompts), together.stats.preemptions


def logit_gap(target, prompts) -> float:
    """The largest |logit difference| between each prompt's last position in one flattened prefill of all of them
    (the engine's pass) and run alone."""
    engine = Engine(target, None, max_num_seqs=len(prompts), max_num_batched_tokens=sum(map(len, prompts)))  # one pass
    seen = []
    hook = target.register_forward_hook(lambda m, a, out: seen.append(out.detach().clone()))
    try:
        engine.run([Request(p, 1) for p in prompts])
    finally:
        hook.remove()
    batched = seen[0][0]  # (M, V): every prompt's last position, in admission order
    with torch.inference_mode():
        alone = torch.stack([target(torch.tensor([p]))[0, -1] for p in prompts])  # (M, V)
    return (batched - alone).abs().max().item()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=48)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default="results/cpu/batch_invariance.txt")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    target, _ = minispec.load("tiny-code-target")
    draft, _ = minispec.load("tiny-code-draft")
    text = sample_text("code")
    prompts = [list(text[211 * i: 211 * i + 16 + (37 * i) % 64]) for i in range(args.requests)]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    lines = [f"# batch invariance in the engine: the embedded pair, {args.requests} seeded requests of 48 tokens "
             f"arriving at 200/s, max_num_seqs 32; commit {commit}, {args.threads} thread(s), float32, load average "
             f"{os.getloadavg()[0]:.1f}", "",
             f"largest |logit difference|, one flattened prefill of every prompt against each alone: "
             f"{logit_gap(target, prompts):.2e}", "",
             "| draft | temperature | cache | requests whose tokens differ from alone | preemptions |",
             "| --- | --- | --- | --- | --- |"]
    for name, d in (("plain", None), ("draft model, gamma 4", draft)):
        for t in (0.0, 0.7, 1.0):
            for cache, blocks in (("roomy", None), ("small (preempts)", 24)):
                differ, n, pre = share(target, d, prompts, t, blocks)
                lines.append(f"| {name} | {t} | {cache} | {differ} of {n} | {pre} |")
                print(lines[-1], flush=True)
    with open(args.out, "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
