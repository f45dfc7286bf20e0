"""Suffix decoding against prompt lookup on a repetitive workload, measured on this CPU (issue 35, item 2).

The workload is one task over many inputs: SmolLM2-135M-Instruct (``minispec fetch smollm2``) asked, through its
chat template, to "Add a docstring to this Python function. Reply with the function only." for N top-level
functions of standard-library modules (their docstrings removed), greedy, stopping at its end-of-turn token. A
135M model mostly writes the function back (sometimes changed) and sometimes explains it: its outputs copy their
prompt (what prompt lookup drafts from) and repeat one another's structure (what suffix decoding's global tree
adds). Every speculative output is checked token for token against plain greedy decoding of its prompt alone.

1. **Batch 1, one request after another** (suffix decoding's global tree learns each finished output): plain,
   prompt lookup, suffix decoding (a chain, vLLM's method), the same with no global tree (prompt and own output
   only), and Arctic's trees. Output tokens/s (all tokens over all seconds), the target's passes and the draft
   tokens it verified (counts, the same on any machine), acceptance rate (accepted / drafted),
   mean acceptance length (1 + accepted / drafts), per-position acceptance, and the share of the time spent
   drafting (suffix decoding's trees are Python on the host; Arctic's are C++).
2. **Static batches**: the same N requests in batches of B, a fresh draft for each B: tokens/s and the speedup
   over plain decoding at that B, to see where each draft stops paying as the batch grows.
3. **The engine under load** (``minispec.Engine``, Poisson arrivals at each rate, the N requests): TTFT p50,
   TPOT p50, output tokens/s, the mean decoding batch, acceptance.

Run from the repository root: ``python scripts/suffix_bench.py`` (``--quick`` for a smoke run). Writes
``results/cpu/suffix.jsonl`` (one row per run, with the revision, threads and load average) and
``results/cpu/suffix.txt``. One torch thread. On a shared machine the load average is printed beside each part:
its figures are then provisional.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import random
import statistics
import sys
import sysconfig
import time
from pathlib import Path

import torch

import minispec
from minispec.drafts.suffix import SuffixDraft
from minispec.tools.bench import environment

ROOT = Path(__file__).resolve().parent.parent
MODULES = ("fnmatch", "posixpath", "genericpath", "textwrap", "shlex", "glob", "colorsys", "bisect", "quopri", "shutil",
           "copy", "heapq", "base64", "calendar", "gettext", "string", "tokenize", "random", "ntpath", "mimetypes")
TASK = "Add a docstring to this Python function. Reply with the function only.\n\n```python\n{}\n```"


def functions(n: int) -> list[tuple[str, str]]:
    """n public top-level functions of 4 to 15 lines from MODULES, docstrings removed, in a fixed order."""
    lib, out = Path(sysconfig.get_paths()["stdlib"]), []
    for mod in MODULES:
        for node in ast.parse((lib / f"{mod}.py").read_text()).body:
            if isinstance(node, ast.FunctionDef) and not node.name.startswith("_"):
                if ast.get_docstring(node):
                    node.body = node.body[1:] or [ast.Pass()]
                code = ast.unparse(node)
                if 3 <= code.count("\n") <= 14:
                    out.append((f"{mod}.{node.name}", code))
    if len(out) < n:
        raise ValueError(f"only {len(out)} functions of 4 to 15 lines in {', '.join(MODULES)}; asked for {n}")
    return out[:n]


def prompts_for(tok, funcs) -> list[list[int]]:
    ids = [tok.apply_chat_template([{"role": "user", "content": TASK.format(code)}], add_generation_prompt=True)
           for _, code in funcs]
    return [list(i if isinstance(i, list) else i["input_ids"]) for i in ids]


def drafts(gamma: int) -> dict:
    """Each draft by name, built fresh (a SuffixDraft remembers: each run starts from empty trees)."""
    return {"plain": lambda: None, "prompt lookup": minispec.PromptLookupDraft,
            "suffix": SuffixDraft, "suffix, no global tree": lambda: SuffixDraft(max_cached_requests=0),
            "suffix tree": lambda: SuffixDraft(use_tree_spec=True)}


def counts(stats) -> dict:
    """Acceptance counters of a Stats or EngineStats (vLLM's names)."""
    return {k: getattr(stats, k) for k in ("num_drafts", "draft_tokens", "accepted_tokens")} | {
        "accepted_per_position": list(stats.accepted_per_position or [])}


def add(total: dict, more: dict) -> dict:
    out = {k: total.get(k, 0) + more[k] for k in ("num_drafts", "draft_tokens", "accepted_tokens")}
    a, b = total.get("accepted_per_position", []), more["accepted_per_position"]
    out["accepted_per_position"] = [x + y for x, y in zip(a + [0] * (len(b) - len(a)), b + [0] * (len(a) - len(b)))]
    return out


def rates_of(c: dict) -> dict:
    d = c.get("num_drafts", 0)
    return {"acceptance_rate": c["accepted_tokens"] / c["draft_tokens"] if c.get("draft_tokens") else None,
            "mean_acceptance_length": 1 + c["accepted_tokens"] / d if d else None,
            "per_position": [round(a / d, 3) for a in c.get("accepted_per_position", [])] if d else []}


def run_static(target, make, prompts, batch, gamma, max_new, eos, want) -> dict:
    """The prompts in batches of ``batch`` through one fresh draft (None: plain decoding); every output checked."""
    draft, total, tokens, wall, draft_s, passes = make(), {}, 0, 0.0, 0.0, 0
    for i in range(0, len(prompts), batch):
        rows = prompts[i : i + batch]
        t0 = time.perf_counter()
        if draft is None:
            out = minispec.generate(target, rows, max_new_tokens=max_new, eos_token_id=eos)
        else:
            out = minispec.speculative_generate(target, draft, rows, gamma=gamma, max_new_tokens=max_new,
                                                eos_token_id=eos)
            total = add(total, counts(out.stats))
            draft_s += out.stats.phase_s.get("draft", 0.0)
            passes += len(out.stats.gamma_per_step)
        wall += time.perf_counter() - t0
        if out.tokens != want[i : i + batch]:
            raise AssertionError(f"batch {batch}, rows {i}..: the tokens differ from plain greedy decoding's")
        tokens += sum(map(len, out.tokens))
        if draft is None:
            passes += max(map(len, out.tokens)) - 1  # every token after the prefill's is a pass of the batch
    return {"tokens": tokens, "wall_s": wall, "tok_s": tokens / wall, "draft_share": draft_s / wall,
            "target_passes": passes} | total | rates_of(total)


def run_engine(target, make, prompts, rate, gamma, max_new, eos, want, seed=0) -> dict:
    rng, t = random.Random(seed), 0.0
    arrivals = []
    for _ in prompts:
        t += rng.expovariate(rate)
        arrivals.append(t)
    draft = make()
    engine = minispec.Engine(target, draft, gamma=gamma, max_num_seqs=len(prompts)) if draft is not None else \
        minispec.Engine(target, None, max_num_seqs=len(prompts))
    outs = engine.run([minispec.Request(p, max_new, arrival_s=a, eos_token_id=eos) for p, a in zip(prompts, arrivals)])
    if [o.tokens for o in outs] != want:
        raise AssertionError(f"engine at {rate} req/s: the tokens differ from plain greedy decoding's")
    s, tokens = engine.stats, sum(len(o.tokens) for o in outs)
    tpot = [o.tpot_s for o in outs if o.tpot_s == o.tpot_s]
    busy = [b for b in s.batch_per_step if b]
    return {"tokens": tokens, "wall_s": s.wall_s, "tok_s": tokens / s.wall_s,
            "ttft_p50_s": statistics.median(o.ttft_s for o in outs), "tpot_p50_s": statistics.median(tpot),
            "mean_batch": sum(busy) / len(busy), "draft_share": s.phase_s.get("draft", 0.0) / s.wall_s} | \
        counts(s) | rates_of(counts(s))


def rounds_of(runs: list[dict], base: list[dict] | None) -> dict:
    """One draft's runs over the rounds: the last run's counts (greedy: the same every round), the median tok/s,
    and the median of each round's speedup over ``base`` (plain decoding's run of the same round)."""
    out = dict(runs[-1])
    out["tok_s"] = statistics.median(r["tok_s"] for r in runs)
    out["tok_s_rounds"] = [round(r["tok_s"], 3) for r in runs]
    if base is not None:
        out["speedup"] = statistics.median(r["tok_s"] / b["tok_s"] for r, b in zip(runs, base))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--gamma", type=int, default=8, help="the most a step drafts (vLLM's num_speculative_tokens)")
    ap.add_argument("--batches", default="1,4,16")
    ap.add_argument("--rates", default="0.25,1,4", help="Poisson arrival rates (requests/s) for the engine")
    ap.add_argument("--rounds", type=int, default=2, help="runs of every draft, one after the other; medians kept")
    ap.add_argument("--out", default=str(ROOT / "results" / "cpu"))
    ap.add_argument("--quick", action="store_true", help="4 requests, 24 tokens, batches 1,4, one rate, one round")
    args = ap.parse_args()
    if args.quick:
        args.requests, args.max_new_tokens, args.batches, args.rates, args.rounds = 4, 24, "1,4", "2", 1
    command = "python scripts/suffix_bench.py " + " ".join(sys.argv[1:])
    batches = [int(b) for b in args.batches.split(",")]
    rates = [float(r) for r in args.rates.split(",")]
    torch.set_num_threads(1)
    target, tok = minispec.load(args.model)
    funcs = functions(args.requests)
    prompts, eos = prompts_for(tok, funcs), tok.eos_token_id
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    env = environment(target.device, target.dtype) | {"threads": torch.get_num_threads(), "model": args.model,
                                                      "requests": args.requests, "max_new_tokens": args.max_new_tokens,
                                                      "gamma": args.gamma, "rounds": args.rounds, "command": command}
    minispec.generate(target, prompts[:1], max_new_tokens=4)  # warm-up: one-off costs out of the first timing
    want = [minispec.generate(target, [p], max_new_tokens=args.max_new_tokens, eos_token_id=eos).tokens[0]
            for p in prompts]
    rows, lines, load0 = [], [], os.getloadavg()[0]

    def record(part, name, setting, r):
        row = {"part": part, "draft": name, **setting, **r, "load_avg": os.getloadavg()[0], **env}
        rows.append(row)
        print(json.dumps({k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()
                          if k not in env}), flush=True)
        return row

    def measure(names, run) -> dict:
        """Every draft in ``names`` once per round, one after the other; medians over the rounds."""
        runs = {name: [] for name in names}
        for _ in range(args.rounds):
            for name in names:
                runs[name].append(run(makers[name]))
        return {name: rounds_of(runs[name], runs["plain"]) for name in names}

    makers = drafts(args.gamma)
    ar_ml = lambda r: (f"{r['acceptance_rate']:.2f} | {r['mean_acceptance_length']:.2f}"  # noqa: E731
                       if r.get("acceptance_rate") is not None else " | ")
    lines.append(f"# Suffix decoding vs prompt lookup: {args.model}, {args.requests} requests (stdlib functions, "
                 f"'add a docstring'), greedy, up to {args.max_new_tokens} new tokens, gamma {args.gamma}, float32, "
                 f"{env['hardware']}, revision {env['git_revision']}")
    lines.append(f"# {command}; every output equals plain greedy decoding's; tok/s: median of {args.rounds} "
                 f"rounds, speedup: median of the rounds' ratios; load average {load0:.1f} at the start")
    lines += ["", "## 1. Batch 1, one request after another", "",
              "| draft | tok/s | speedup | target passes | draft tokens | acceptance rate | mean acceptance length | "
              "per position (first 8) | drafting share of time |", "|" + " --- |" * 9]
    got = measure(list(makers), lambda make: run_static(target, make, prompts, 1, args.gamma, args.max_new_tokens,
                                                         eos, want))
    for name, r in got.items():
        record("batch1", name, {"batch": 1}, r)
        lines.append(f"| {name} | {r['tok_s']:.1f} | {r['speedup']:.2f}x | {r['target_passes']} | "
                     f"{r.get('draft_tokens', 0)} | {ar_ml(r)} | "
                     f"{' '.join(f'{p:.2f}' for p in r['per_position'][:8])} | {r['draft_share']:.1%} |")
    lines += ["", "## 2. Static batches (a fresh draft per batch size and round)", "",
              "| batch | plain tok/s | prompt lookup tok/s (speedup) | suffix tok/s (speedup) | prompt lookup: "
              "acceptance, mean length | suffix: acceptance, mean length |", "| --- | --- | --- | --- | --- | --- |"]
    for b in batches:
        got = measure(["plain", "prompt lookup", "suffix"],
                      lambda make, b=b: run_static(target, make, prompts, b, args.gamma, args.max_new_tokens, eos,
                                                   want))
        for name, r in got.items():
            record("static", name, {"batch": b}, r)
        pl, sx = got["prompt lookup"], got["suffix"]
        lines.append(f"| {b} | {got['plain']['tok_s']:.1f} | {pl['tok_s']:.1f} ({pl['speedup']:.2f}x) | "
                     f"{sx['tok_s']:.1f} ({sx['speedup']:.2f}x) | {ar_ml(pl).replace(' |', ',')} | "
                     f"{ar_ml(sx).replace(' |', ',')} |")
    lines += ["", f"## 3. The engine under Poisson load ({args.requests} requests)", "",
              "| rate req/s | draft | TTFT p50 s | TPOT p50 ms | tok/s | speedup | mean batch | acceptance | "
              "mean length |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for rate in rates:
        got = measure(["plain", "prompt lookup", "suffix"],
                      lambda make, rate=rate: run_engine(target, make, prompts, rate, args.gamma, args.max_new_tokens,
                                                         eos, want))
        for name, r in got.items():
            record("engine", name, {"rate": rate}, r)
            lines.append(f"| {rate:g} | {name} | {r['ttft_p50_s']:.2f} | {1000 * r['tpot_p50_s']:.0f} | "
                         f"{r['tok_s']:.1f} | {r['speedup']:.2f}x | {r['mean_batch']:.1f} | {ar_ml(r)} |")
    lines.append(f"\n# load average at the end {os.getloadavg()[0]:.1f}")
    (out_dir / "suffix.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (out_dir / "suffix.txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
