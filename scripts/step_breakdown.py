"""Where a batch-1 step of the embedded pair goes: the engine beside speculative_generate, and one draft forward.

    python scripts/step_breakdown.py [--rounds 3] [--threads 2] [--out results/cpu/step_breakdown.txt]

One prompt of vs-vllm's pair workload, 96 new tokens, greedy, gamma 4 with the draft model, and plain decoding through
the engine; the rounds alternate the three in one process. Per step: each phase's seconds (the engine's and the
loop's own timers) over its steps. Then one engine run under ``torch.profiler``: the draft model's forwards, their
CPU time each and the operators inside them (the profiler's overhead included: read the shares, not the times).
Last, a compiled draft: a fresh copy of the draft model through ``Model.compile(mode=None)`` (``torch.compile``;
Inductor's C++ on a CPU; a static cache, one graph per shape) in ``speculative_generate``, its compile time, its
tokens against the eager draft's, and rounds of the two alternated. The engine's draft reads a paged view whose
length changes every step, which ``Model.compile``'s fixed shapes do not cover; the loop measures what compiling
would give.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import time
from collections import Counter

import torch
from torch.profiler import profile, record_function

import minispec
from minispec.engine import Engine, Request
from minispec.tools.vs_vllm_workload import workload


def per_step(phases: dict, steps: int) -> str:
    return ", ".join(f"{k} {v * 1e3 / steps:.2f}" for k, v in phases.items())


def compiled_draft(t, d, fresh, prompt: list[int], eager: list[list[int]], rounds: int) -> list[str]:
    """``speculative_generate`` with the eager draft ``d`` and with ``fresh`` (a copy of it) compiled: compile time,
    its tokens against ``eager`` (the eager draft's, from the rounds above), and per-step phases in alternated
    rounds."""
    def run(draft):
        return minispec.speculative_generate(t, draft, [prompt], gamma=4, max_new_tokens=96)

    start = time.perf_counter()
    first = run(fresh.compile(mode=None))  # compiles each shape the loop meets
    same = "the same as" if first.tokens == eager else "DIFFERENT from"
    lines = [f"compiled draft (Model.compile(mode=None), speculative_generate): first call "
             f"{time.perf_counter() - start:.1f} s with compiling, tokens {same} the eager draft's"]
    for r in range(rounds):
        for name, draft in (("eager draft", d), ("compiled draft", fresh)):
            st = run(draft).stats
            lines.append(f"round {r}: speculative_generate, {name}: {st.wall_s * 1e3 / st.num_steps:.2f} ms a step "
                         f"({per_step(st.phase_s, st.num_steps)})")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="results/cpu/step_breakdown.txt")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    w = workload("pair")
    prompt, (t, d) = list(w["prompts"][0]), (w["target_model"], w["draft_model"])
    spec, plain = Engine(t, d, gamma=4, num_blocks=512), Engine(t, num_blocks=512)  # both prepack (in place)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    lines = [f"# a batch-1 step of the embedded pair, ms per step (commit {commit}, {platform.machine()}, "
             f"{args.threads} threads, torch {torch.__version__}, load average before {os.getloadavg()[0]:.1f})"]
    for r in range(args.rounds):
        out = minispec.speculative_generate(t, d, [prompt], gamma=4, max_new_tokens=96)
        st = out.stats
        for name, eng in (("engine, draft model", spec), ("engine, plain", plain)):
            eng.run([Request(prompt, 96)])
            s = eng.stats
            lines.append(f"round {r}: {name}: {s.steps} steps, {s.wall_s * 1e3 / s.steps:.2f} ms a step "
                         f"({per_step(s.phase_s, s.steps)})")
        lines.append(f"round {r}: speculative_generate, draft model: {st.num_steps} steps after the prefill, "
                     f"{st.wall_s * 1e3 / st.num_steps:.2f} ms a step, prefill in "
                     f"({per_step(st.phase_s, st.num_steps)})")
    forward = d.forward

    def traced(*a, **kw):
        with record_function("draft forward"):
            return forward(*a, **kw)

    d.forward = traced
    try:
        with profile() as prof:
            spec.run([Request(prompt, 96)])
    finally:
        d.forward = forward
    ev = [e for e in prof.events() if e.name == "draft forward"]
    inside, calls = Counter(), Counter()
    for e in ev:
        for c in e.cpu_children:
            inside[c.name] += c.cpu_time_total
            calls[c.name] += 1
    total = sum(e.cpu_time_total for e in ev) / len(ev)
    lines.append(f"profiled: {len(ev)} draft forwards, {total:.0f} us CPU each; the operators they call directly, "
                 f"{sum(inside.values()) / len(ev):.0f} us of it (the rest is Python in the model's forward):")
    for name, us in inside.most_common(12):
        lines.append(f"  {name:<40} {us / len(ev):7.1f} us a forward, {calls[name] / len(ev):4.1f} calls")
    lines += compiled_draft(t, d, minispec.load(w["draft"])[0], prompt, out.tokens, args.rounds)
    lines.append(f"load average after {os.getloadavg()[0]:.1f}")
    text = "\n".join(lines) + "\n"
    print(text, end="")
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
