"""The engine measured under load on this machine, the simulator beside it: results/<machine>/engine_load.*.

    PYTHONPATH=. python scripts/engine_load.py [--rates 1,4,8,16,32,64] [--out results/cpu/engine_load]

``minispec serve-bench`` with every setting the issue compares, on the embedded pair and the shipped EAGLE head:
plain decoding, gamma 4 with the draft model, the roofline-gated policy (gamma "auto"), vLLM's batch-size table
from the engine's own step times, and gamma 4 with the EAGLE head. Then, from the same step times, where a
speculative step stops paying as the batch grows (the crossover), written to the .txt beside the sweep.
"""

import argparse
import os

import torch

import minispec
from minispec.model.load import sample_text
from minispec.roofline import expected_tokens
from minispec.tools.serve_bench import LoadConfig, engine_step_table, serve_bench


def crossover(target, draft, name, cfg, text, alpha) -> str:
    """Per batch, E(alpha, 4) tokens a row for one gamma-4 step against as many plain steps, through the engine."""
    steps = engine_step_table(target, draft, (1, 8, 16, 32, 48, 64, 96, 128), (0, 4), (cfg.prompt.mean,), text,
                              progress=lambda line: None)
    table = steps.tables[0]
    rows = [f"{name}, alpha {alpha:.2f} (E = {expected_tokens(alpha, 4):.2f} tokens a row a step), context "
            f"{cfg.prompt.mean}: batch, plain ms, gamma-4 ms, speedup"]
    for B in (1, 8, 16, 32, 48, 64, 96, 128):
        plain, spec = table.target(B), table.target(B, 5)
        rows.append(f"  {B:>4} {1e3 * plain:8.1f} {1e3 * spec:8.1f} {expected_tokens(alpha, 4) * plain / spec:6.2f}x")
    return "\n".join(rows)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rates", default="1,4,8,16,32,64")
    p.add_argument("--out", default="results/cpu/engine_load")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    target, _ = minispec.load("tiny-code-target")
    draft, _ = minispec.load("tiny-code-draft")
    eagle = minispec.EagleDraft.from_pretrained("tiny-code-eagle", target)
    text = list(sample_text("code"))
    cfg = LoadConfig(rates=tuple(float(r) for r in args.rates.split(",")), seconds=6.0, min_requests=32,
                     max_requests=192)
    settings = {"plain": {}, "gamma 4": dict(draft=draft, gamma=4), "auto": dict(draft=draft, gamma="auto"),
                "vLLM table": dict(draft=draft, gamma="table"), "EAGLE gamma 4": dict(draft=eagle, gamma=4)}
    load = os.getloadavg()[0]
    rows = serve_bench(target, settings, cfg, text, args.out)
    alpha = {n: next(r["alpha_estimate"] for r in rows if r["setting"] == n and r["source"] == "measured")
             for n in ("gamma 4", "EAGLE gamma 4")}
    cross = [crossover(target, d, n, cfg, text, alpha[n]) for n, d in (("gamma 4", draft), ("EAGLE gamma 4", eagle))]
    out = args.out + ".txt"
    with open(out, "a") as f:
        f.write(f"\nWhere a gamma-4 step stops paying, from step times measured through the engine just after the "
                f"sweep (load average {load:.1f} before it, {os.getloadavg()[0]:.1f} now):\n" + "\n".join(cross) + "\n")
    print(open(out).read())
