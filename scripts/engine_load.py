"""The engine measured under load on this machine, the simulator beside it: results/<machine>/engine_load.*.

    PYTHONPATH=. python scripts/engine_load.py [--rates 1,4,8,16,32,64] [--out results/cpu/engine_load]

``minispec serve-bench`` with every setting the issues compare, on the embedded pair and the shipped heads:
plain decoding, gamma 4 with the draft model, the roofline-gated policy (gamma "auto"), vLLM's batch-size table
from the engine's own step times, and gamma 4 with the EAGLE head and with the EAGLE-3 head (issue 35: does a
better draft move the knee?); and, asked for with ``--settings``, the drafts that cost no model pass: prompt lookup
and suffix decoding (gamma 8, vLLM's ``suffix`` defaults), e.g.

    PYTHONPATH=. python scripts/engine_load.py --settings "plain,prompt lookup,suffix" --out results/cpu/load_free

Where a speculative step stops paying as the batch grows: scripts/engine_crossover.py.
"""

import argparse

import torch

import minispec
from minispec.model.load import sample_text
from minispec.tools.serve_bench import LoadConfig, serve_bench

SETTINGS = ("plain", "gamma 4", "auto", "vLLM table", "EAGLE gamma 4", "EAGLE-3 gamma 4", "prompt lookup", "suffix")

if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rates", default="1,4,8,16,32,64")
    p.add_argument("--out", default="results/cpu/engine_load")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--settings", default=",".join(SETTINGS[:6]), help="comma-separated, of: " + ", ".join(SETTINGS))
    args = p.parse_args()
    chosen = args.settings.split(",")
    if unknown := [c for c in chosen if c not in SETTINGS]:  # before any model loads
        p.error(f"unknown settings {unknown}: choose from {list(SETTINGS)}")
    torch.set_num_threads(args.threads)
    target, _ = minispec.load("tiny-code-target")
    draft, _ = minispec.load("tiny-code-draft")
    eagle = minispec.EagleDraft.from_pretrained("tiny-code-eagle", target)
    eagle3 = minispec.Eagle3Draft.from_pretrained("tiny-code-eagle3", target)
    text = list(sample_text("code"))
    cfg = LoadConfig(rates=tuple(float(r) for r in args.rates.split(",")), seconds=6.0, min_requests=32,
                     max_requests=192)
    settings = {"plain": {}, "gamma 4": dict(draft=draft, gamma=4), "auto": dict(draft=draft, gamma="auto"),
                "vLLM table": dict(draft=draft, gamma="table"), "EAGLE gamma 4": dict(draft=eagle, gamma=4),
                "EAGLE-3 gamma 4": dict(draft=eagle3, gamma=4),
                "prompt lookup": dict(draft=minispec.PromptLookupDraft(), gamma=8),
                "suffix": dict(draft=minispec.SuffixDraft(), gamma=8)}
    assert list(settings) == list(SETTINGS)
    serve_bench(target, {c: settings[c] for c in chosen}, cfg, text, args.out)
    print(open(args.out + ".txt").read())
