"""How the engine groups its decoding rows for attention, measured: one group against groups of similar length.

    PYTHONPATH=. python scripts/engine_groups.py [--costs 1e15,262144,1048576,4194304] [--out FILE]
    PYTHONPATH=. python scripts/engine_groups.py --costs 262144 --attention gather,views \
        --out results/cpu/engine_views.txt

A group of decoding rows reads R x its longest row's slots of keys and values each layer
(:func:`minispec.engine.attention.by_length`), so one group of rows 64 and 600 tokens long pads the short ones to
600; more groups cost more kernel calls. Each cost (``GROUP_BYTES``: one more group's price in bytes of keys and
values read, :func:`minispec.engine.attention.group_cost`; 1e15: always one group) serves the same static batch
through the engine, rounds alternated in one process: SmolLM2-135M-Instruct (float32, the vs-vllm workload's
prompts of 64-512 tokens) at batch 32, the embedded pair plain at 32 and with its draft model at 8 (``--cases``
names others). Every run's tokens must equal the first's. One torch thread unless ``--threads``. Writes
results/cpu/engine_groups.txt. ``--attention`` crosses the costs with the engine's attention paths (``views``:
rows read in place where their blocks are one run; ``auto``: lone rows so), and the table adds the decoding
steps' seconds (steps with no prefill chunk), where attention's share is largest. ``--draft-copy once,every``
crosses them with how a draft model's forwards read its own pool within a step (:attr:`PagedDraft.keep
<minispec.engine.drafting.PagedDraft.keep>`: one copy a step, kept, or a fresh copy at every forward):

    PYTHONPATH=. python scripts/engine_groups.py --costs 262144 --attention auto --draft-copy once,every \
        --threads 2 --rounds 5 --cases pair:8:draft,pair:32:draft --out results/cpu/draft_copy.txt
"""

import argparse
import os
import statistics
import subprocess
import time
from dataclasses import replace
from pathlib import Path

import torch

import minispec.engine.attention as attention
from minispec.tools.vs_vllm import VsConfig, served_by_minispec
from minispec.tools.vs_vllm_workload import minispec_engines, static_jobs, workload

CASES = "smollm2:32:plain,pair:32:plain,pair:8:draft"  # workload:batch:setting


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--costs", default="1e15,262144,1048576,4194304")
    ap.add_argument("--attention", default="gather", help="attention paths, e.g. gather,views")
    ap.add_argument("--draft-copy", default="once",
                    help="once, every, or once,every: how a draft's forwards read its pool in a step")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cases", default=CASES, help="workload:batch:setting,... (settings: plain, ngram, draft); a "
                    "batch under 8 serves 8 requests in rounds of it")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default="results/cpu/engine_groups.txt")
    args = ap.parse_args()
    if Path(args.out).is_dir() or not Path(args.out).parent.is_dir():
        ap.error(f"--out must be a file in an existing folder, got {args.out!r}")  # before minutes of measuring
    cases = [(w, int(b), s) for w, b, s in (c.split(":") for c in args.cases.split(","))]
    torch.set_num_threads(args.threads)
    knobs = [(int(float(c)), a, d) for c in args.costs.split(",") for a in args.attention.split(",")
             for d in args.draft_copy.split(",")]
    if {d for *_, d in knobs} - {"once", "every"}:
        ap.error(f"--draft-copy takes once and every, got {args.draft_copy!r}")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    lines = [f"# engine attention groups: output tok/s of one static batch per cost (rounds alternated); torch "
             f"{torch.__version__}, {args.threads} thread(s), commit {commit}, load average before "
             f"{os.getloadavg()[0]:.1f}", "",
             "| workload | batch | setting | group bytes | attention | draft copy | tok/s per round | median "
             "| / first row | decoding steps s, median | / first row |", "| --- " * 11 + "|"]
    for name, B, setting in cases:
        cfg = VsConfig(engines=("minispec",), static_min=max(B, 8))
        w = workload(name)
        engine = minispec_engines(w, cfg, None)[setting]
        rounds = static_jobs(w["prompts"], w["outputs"], B, cfg, w["eos"])  # one batch, or 8 requests in rounds
        served_by_minispec(engine, [replace(j, max_new_tokens=8) for j in rounds[0][:4]], False)  # first calls
        first, rates, decoding = None, {k: [] for k in knobs}, {k: [] for k in knobs}
        for _ in range(args.rounds):
            for c, a, d in knobs:
                attention.GROUP_BYTES, engine.runner.attention = c, a
                if engine.runner.drafter is not None:
                    engine.runner.drafter.keep = d == "once"
                seconds, tokens, dec = 0.0, [], 0.0
                for batch in rounds:
                    t = time.perf_counter()
                    out, _ = served_by_minispec(engine, batch, False)
                    seconds += time.perf_counter() - t
                    tokens += [o.tokens for o in out]
                    st = engine.stats
                    dec += sum(s for s, p in zip(st.step_s, st.prefill_per_step) if p == 0)
                if first is not None and tokens != first:
                    raise RuntimeError(f"{name} {setting}: cost {c}, attention {a}, copy {d} changed the tokens")
                first = tokens
                rates[c, a, d].append(sum(map(len, tokens)) / seconds)
                decoding[c, a, d].append(dec)
        base, dbase = statistics.median(rates[knobs[0]]), statistics.median(decoding[knobs[0]])
        for c, a, d in knobs:
            med, dmed = statistics.median(rates[c, a, d]), statistics.median(decoding[c, a, d])
            per_round = ", ".join(f"{r:.0f}" for r in rates[c, a, d])
            lines.append(f"| {name} | {B} | {setting} | {c} | {a} | {d} | {per_round} | "
                         f"{med:.0f} | {med / base:.2f}x | {dmed:.2f} | {dmed / dbase:.2f}x |")
            print(lines[-1], flush=True)
    lines.append(f"\nload average after {os.getloadavg()[0]:.1f}")
    with open(args.out, "w") as fh:
        fh.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
