"""Tree speculation measured on the embedded pair, on this CPU, beside the cost model (issue 17, item 7).

    python scripts/tree_bench.py [--quick] [--out results/cpu]

1. **The pair's acceptance profile**, teacher-forced: plain greedy continuations of prompts cut from the shipped
   held-out code (offsets apart from the timed prompts'), then one target and one draft pass over each; at every
   generated position, the rank of the target's greedy token in the draft's order is the rank of the child a greedy
   tree step accepts there (Sequoia's positional acceptance vector). Made non-increasing in rank by a running
   minimum (``roofline.best_tree`` needs that; it only trims the noisy tail), one profile for every depth.
2. **Measured**: for each batch and node budget, the best tree for that profile (``roofline.best_tree``) as
   ``TreeDraft(draft, paths=...)``, the dynamic tree ``TreeDraft(draft, budget=n, depth=that tree's depth,
   topk=min(n, 4))``, and, where the best tree is a chain, the plain chain (``gamma=n``). Greedy, float32, one
   intra-op thread; every run's tokens must equal plain greedy decoding (else it stops). Each batch B decodes
   max(B, 8) prompts in groups of B, so every point sees at least 8 rows. In a round every configuration runs
   right after a plain run of the same prompts; a point's speedup is the median over rounds of (plain decode
   seconds) / (its decode seconds), decode = wall - time to first token, the same tokens on both sides.
3. **Modelled** beside each point: tokens per step from the profile (``tree_expected_tokens``; the dynamic tree is
   credited with the best static tree of its budget), and the speedup on this CPU's calibrated ceilings
   (``hardware.calibrate``) with the pair's shapes (``ModelShape.from_model``), at context prompt + half the new
   tokens. Then the batch at which the best tree falls back to a chain, measured and modelled, and the same on
   the H100 and H200 presets for the 8B reference (``best_tree_budget`` via ``tree_speedup_table``).

Writes ``trees.jsonl`` (one row per profile, point and table), ``trees.txt`` (the tables) and ``trees.png``
(speedup against budget, one line per batch) into ``--out``; ``--replot`` redraws the last two from the first.
The committed run took 18 minutes of wall time and 11 of CPU on two cores shared with other work; ``--quick`` is
a smoke run of every code path (under a minute).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

import minispec
from minispec import TreeDraft, roofline
from minispec.model.load import sample_text
from minispec.roofline import ModelShape, hardware
from minispec.tools import bench

PROMPT_LEN = 64  # tokens per prompt
MIN_ROWS = 8  # rows decoded per point at every batch (batch 1: eight prompts one after another)
TOPK = 4  # the dynamic tree's top-k (TreeDraft's default)
REFERENCE_BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256)


@torch.inference_mode()
def rank_profile(target, draft, prompts: list[list[int]], max_new_tokens: int, ranks: int = 64) -> dict:
    """Teacher-forced ranks of the target's greedy tokens in the draft's order, on the target's own continuations."""
    plain = minispec.generate(target, prompts, max_new_tokens=max_new_tokens).tokens
    seqs = torch.tensor([p + o for p, o in zip(prompts, plain)])  # (B, P + N)
    P = len(prompts[0])
    greedy = seqs[:, P:]  # (B, N) the tokens a greedy tree step must accept
    assert (target(seqs)[:, P - 1:-1].argmax(-1) == greedy).all(), "teacher forcing must give the greedy tokens"
    order = draft(seqs)[:, P - 1:-1].argsort(-1, descending=True)  # (B, N, V) the draft's tokens, likeliest first
    rank = (order == greedy[..., None]).int().argmax(-1)  # (B, N)
    counts = torch.bincount(rank.flatten(), minlength=ranks)[:ranks].tolist()
    raw = [c / rank.numel() for c in counts]
    first = rank == 0  # (B, N)
    after = lambda prev: float((first[:, 1:] & prev).sum() / prev.sum())  # noqa: E731 P(rank 0 | previous)
    row = lambda prev: list(itertools.accumulate(  # noqa: E731 the profile of the positions after ``prev`` ones
        (torch.bincount(rank[:, 1:][prev], minlength=ranks)[:ranks] / prev.sum()).tolist(), min))
    return {"row": "profile", "positions": rank.numel(), "raw": raw, "profile": list(itertools.accumulate(raw, min)),
            "p_rank0_after_rank0": after(first[:, :-1]), "p_rank0_after_other": after(~first[:, :-1]),
            "after_rank0": row(first[:, :-1]), "after_other": row(~first[:, :-1]),
            "positions_after_rank0": int(first[:, :-1].sum()), "positions_after_other": int((~first[:, :-1]).sum())}


def configurations(draft, budgets, profile) -> list[dict]:
    """Per budget: the best static tree, the dynamic tree of that budget, and the chain where the best tree is one."""
    out = []
    for n in budgets:
        tree = roofline.best_tree(n, profile=profile)
        k = min(n, TOPK)
        out.append({"kind": "static", "budget": n, "draft": TreeDraft(draft, paths=list(tree.paths)),
                    "gamma": tree.depth, "tree": tree, "passes": tree.expanded})
        if tree.is_chain:
            out.append({"kind": "chain", "budget": n, "draft": draft, "gamma": n, "tree": tree,
                        "passes": tree.expanded})
        if n > 1:  # budget 1: the dynamic tree is the chain of one
            out.append({"kind": "dynamic", "budget": n, "draft": TreeDraft(draft, budget=n, depth=tree.depth, topk=k),
                        "gamma": tree.depth, "tree": tree, "passes": (1,) + (k,) * (tree.depth - 1)})
    return out


def summed(a: list[int], b: list[int]) -> list[int]:
    """Two count lists added position by position, the shorter padded with zeros."""
    n = max(len(a), len(b))
    return [x + y for x, y in zip(a + [0] * (n - len(a)), b + [0] * (n - len(b)))]


def decode(target, cfg: dict | None, groups, max_new_tokens: int, plain_tokens=None) -> dict:
    """One run of a configuration (None: plain decoding) over every group of prompts; summed stats."""
    total = {"decode_s": 0.0, "steps": 0, "drafts": 0, "accepted": 0, "offered": 0, "avg_row_steps": 0.0,
             "by_rank": [], "by_depth": [], "tokens": [], "phase_s": {}}
    for prompts in groups:
        if cfg is None:
            out = minispec.generate(target, prompts, max_new_tokens=max_new_tokens)
        else:
            out = minispec.speculative_generate(target, cfg["draft"], prompts, gamma=cfg["gamma"],
                                                max_new_tokens=max_new_tokens)
        s = out.stats
        total["decode_s"] += s.wall_s - s.ttft_s
        total["steps"] += s.num_steps
        total["tokens"] += out.tokens
        total["phase_s"] = {k: total["phase_s"].get(k, 0.0) + v for k, v in s.phase_s.items()}
        if cfg is not None:
            total["drafts"] += s.num_drafts
            total["accepted"] += s.accepted_tokens
            total["offered"] += s.draft_tokens
            total["avg_row_steps"] += s.num_drafts / len(prompts)
            total["by_rank"] = summed(total["by_rank"], s.accepted_per_rank or [s.accepted_tokens])  # chain: rank 0
            total["by_depth"] = summed(total["by_depth"], s.accepted_per_position)
    if plain_tokens is not None and total["tokens"] != plain_tokens:
        raise RuntimeError(f"{cfg['draft']!r} at batch {len(groups[0])}: greedy tokens differ from plain decoding")
    return total


def modelled(cfg: dict, batch: int, profile, hw, shapes, context: float) -> dict:
    """Tokens per step from the profile and the speedup on ``hw`` for one configuration at ``batch``."""
    target, draft = shapes
    E = roofline.tree_expected_tokens(cfg["tree"], profile=profile)
    plain = roofline.step_time(batch, 1, hw, target, context)
    step = roofline.tree_step_time(batch, cfg["budget"], hw, target, context) + sum(
        roofline.step_time(batch, w, hw, draft, context) for w in cfg["passes"])
    return {"modelled_tokens_per_step": E, "modelled_speedup": E * plain / step}


def measure_batch(target, configs, batch: int, prompts, rounds: int, max_new_tokens: int) -> list[dict]:
    """Every configuration at one batch: alternating with plain decoding, medians of per-round ratios."""
    groups = [prompts[i:i + batch] for i in range(0, len(prompts), batch)]
    plain_tokens = decode(target, None, groups, max_new_tokens)["tokens"]  # also the warm-up
    runs: dict[int, list[dict]] = {i: [] for i in range(len(configs))}
    ratios: dict[int, list[float]] = {i: [] for i in range(len(configs))}
    for r in range(rounds):
        for i in list(range(len(configs)))[:: 1 if r % 2 == 0 else -1]:  # reversed every other round
            plain_s = decode(target, None, groups, max_new_tokens)["decode_s"]  # right before: the same load
            runs[i].append(decode(target, configs[i], groups, max_new_tokens, plain_tokens))
            ratios[i].append(plain_s / runs[i][-1]["decode_s"])
    rows = []
    for i, cfg in enumerate(configs):
        last = runs[i][-1]
        assert all(r["accepted"] == last["accepted"] for r in runs[i]), "greedy acceptance is deterministic"
        rows.append({"row": "point", "batch": batch, "kind": cfg["kind"], "budget": cfg["budget"],
                     "draft": repr(cfg["draft"]), "depth": cfg["tree"].depth, "chain": cfg["tree"].is_chain,
                     "best_tree_paths": [list(p) for p in cfg["tree"].paths],
                     "tokens_per_step": 1 + last["accepted"] / last["drafts"],
                     "nodes_per_step": last["offered"] / last["drafts"],
                     "lag": last["steps"] / last["avg_row_steps"], "accepted_per_rank": last["by_rank"],
                     "accepted_per_position": last["by_depth"], "speedup": statistics.median(ratios[i]),
                     "speedup_rounds": ratios[i], "decode_s": statistics.median(r["decode_s"] for r in runs[i]),
                     "phase_s": {k: statistics.median(r["phase_s"][k] for r in runs[i]) for k in last["phase_s"]},
                     "rows": len(prompts), "same_tokens_as_plain": True})
    return rows


def first_fallback(rows: list[dict]) -> int | None:
    """The first batch whose best configuration is a chain or plain decoding (rows of tree_speedup_table)."""
    return next((r["batch"] for r in rows if r["budget"] == 0 or r["chain"]), None)


def measured_best(points: list[dict], batch: int) -> dict:
    """The fastest measured configuration at ``batch``: kind, budget, speedup, and what it is (tree, chain, plain)."""
    best = max((p for p in points if p["batch"] == batch), key=lambda p: p["speedup"])
    chain = best["chain"] or best["kind"] == "chain"
    what = "plain" if best["speedup"] <= 1 else ("chain" if chain and best["kind"] != "dynamic" else "tree")
    return {"kind": best["kind"], "budget": best["budget"], "speedup": best["speedup"], "is": what}


def reference_tables() -> list[dict]:
    """``tree_speedup_table`` for the 8B reference (alpha 0.8, c 0.05) on the H100 and H200, with the fall-back."""
    out = []
    for hw in (hardware.H100_SXM, hardware.H200):
        table = roofline.tree_speedup_table(REFERENCE_BATCHES, hardware=hw)
        scan = roofline.tree_speedup_table(range(1, 513), hardware=hw)
        out.append({"row": "reference", "hardware": hw.name, "model": "llama-8b", "alpha": 0.8, "draft_cost": 0.05,
                    "table": [{k: v for k, v in r.items() if k != "tree"} for r in table],
                    "chain_from_batch": first_fallback(scan),
                    "off_from_batch": next(r["batch"] for r in scan if r["budget"] == 0),
                    "sglang": roofline.sglang_speculative_config(hardware=hw)["server_args_per_batch_size"],
                    "vllm": roofline.vllm_speculative_config(hardware=hw)["num_speculative_tokens_per_batch_size"]})
    return out


def format_report(header: str, profile: dict, points: list[dict], fallback: dict, references: list[dict]) -> str:
    lines = [header, "",
             f"Acceptance profile (teacher-forced on {profile['positions']} greedy positions of held-out code): P(the "
             f"accepted child has draft rank k) = " + ", ".join(f"{p:.3f}" for p in profile["profile"][:6])
             + f", ...; P(rank 0 | previous rank 0) = {profile['p_rank0_after_rank0']:.2f}, "
             f"P(rank 0 | previous not) = {profile['p_rank0_after_other']:.2f}", "",
             "tokens/step = 1 + accepted / drafts (measured; model: tree_expected_tokens of the profile, a dynamic "
             "tree credited with the best static tree of its budget); speedup = median over rounds of plain / tree "
             "decode seconds (model: the roofline on this CPU's ceilings with the pair's shapes); lag = the batch's "
             "steps / its average row's steps (the model has no lag; model/lag divides by it)",
             f"{'batch':>5} {'kind':>7} {'nodes':>5} {'depth':>5} {'tok/step':>8} {'model':>6} {'speedup':>8} "
             f"{'model':>6} {'lag':>5} {'model/lag':>9}"]
    for p in points:
        lines.append(f"{p['batch']:>5} {p['kind']:>7} {p['budget']:>5} {p['depth']:>5} {p['tokens_per_step']:>8.2f} "
                     f"{p['modelled_tokens_per_step']:>6.2f} {p['speedup']:>7.2f}x {p['modelled_speedup']:>5.2f}x "
                     f"{p['lag']:>5.2f} {p['modelled_speedup'] / p['lag']:>8.2f}x")
    lines += ["", "Best configuration per batch, measured (every kind) and modelled (the best static trees of the "
              "measured budgets; then any budget 0..64 and depth cap 1..12, tree_speedup_table):"]
    for b in fallback["batches"]:
        m, md, full = b["measured"], b["modelled"], b["modelled_any"]
        lines.append(f"  batch {b['batch']:>2}: measured {m['is']} ({m['kind']} {m['budget']}, {m['speedup']:.2f}x); "
                     f"modelled {md['is']} ({md['budget']}, {md['speedup']:.2f}x); any budget: {full['budget']} "
                     f"nodes, depth {full['depth']}, {full['speedup']:.2f}x")
    lines.append(f"Falls back to a chain (or plain) from batch: measured {fallback['measured']} (of "
                 f"{fallback['grid']}), modelled {fallback['modelled']} on the same grid, {fallback['modelled_scan']} "
                 f"scanning every batch 1..256 (plain decoding from {fallback['modelled_off'] or 'beyond 256'})")
    for ref in references:
        lines += ["", f"{ref['hardware']}, 8B reference (alpha 0.8, c 0.05): the best tree per batch "
                  f"(best_tree_budget); a chain from batch {ref['chain_from_batch']}, plain decoding from "
                  f"{ref['off_from_batch']}",
                  f"{'batch':>5} {'budget':>6} {'depth':>5} {'branching':>26} {'tok/step':>8} {'speedup':>8}"]
        for r in ref["table"]:
            lines.append(f"{r['batch']:>5} {r['budget']:>6} {r['depth']:>5} {str(tuple(r['branching'])):>26} "
                         f"{r['tokens_per_step']:>8.2f} {r['speedup']:>7.2f}x")
    return "\n".join(lines) + "\n"


def plot(points: list[dict], path: Path, title: str) -> None:
    """Left: tokens per step against the budget at batch 1. Right: speedup against the budget, a colour per batch."""
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

    fig = Figure(figsize=(11, 4.5), layout="constrained")
    left, right = fig.subplots(1, 2)
    styles = {"static": dict(marker="o", linestyle="-"), "dynamic": dict(marker="s", linestyle=":"),
              "chain": dict(marker="x", linestyle="none", markersize=8)}
    names = {"static": "best tree", "dynamic": "dynamic tree", "chain": "chain (gamma = nodes)"}
    batches = sorted({p["batch"] for p in points})
    series = lambda B, kind, *keys: sorted(tuple(p[k] for k in ("budget", *keys)) for p in points  # noqa: E731
                                           if p["batch"] == B and p["kind"] == kind)
    for i, B in enumerate(batches):
        for kind, style in styles.items():
            if pts := series(B, kind, "speedup", "modelled_speedup"):
                n, measured, modelled = zip(*pts)
                right.plot(n, measured, color=f"C{i}", **style)
                if kind == "static":
                    right.plot(n, modelled, color=f"C{i}", linestyle="--", alpha=0.5)
    for kind in ("static", "dynamic"):
        n, measured, modelled = zip(*series(batches[0], kind, "tokens_per_step", "modelled_tokens_per_step"))
        left.plot(n, measured, label=f"{names[kind]}, measured", **styles[kind])
        if kind == "static":
            left.plot(n, modelled, "k--", label="modelled from the profile")
    left.legend(fontsize=8, title=f"batch {batches[0]}", title_fontsize=8)
    right.axhline(1.0, color="gray", linewidth=1)
    right.set_yscale("log", base=2)
    right.legend(handles=[Line2D([], [], color=f"C{i}", label=f"batch {B}") for i, B in enumerate(batches)]
                 + [Line2D([], [], color="k", label=f"{names[k]}, measured", **st) for k, st in styles.items()]
                 + [Line2D([], [], color="k", linestyle="--", alpha=0.5, label="best tree, modelled")], fontsize=7)
    budgets = sorted({p["budget"] for p in points})
    for ax, ylabel in ((left, "tokens per step per row"), (right, "speedup over plain decoding (x, log scale)")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(budgets, [str(n) for n in budgets])
        ax.set(xlabel="draft nodes per row (budget; 1 = a chain of one)", ylabel=ylabel)
        ax.grid(True, which="both", alpha=0.3)
    right.set_yticks([0.0625, 0.125, 0.25, 0.5, 1, 2], ["1/16", "1/8", "1/4", "1/2", "1", "2"])
    fig.suptitle(title, fontsize=9)
    fig.savefig(path, dpi=120)


def write(out: Path, rows: list[dict]) -> str:
    """trees.txt and trees.png from a run's rows (those of trees.jsonl); returns the text."""
    kind = lambda name: [r for r in rows if r["row"] == name]  # noqa: E731
    run, points = kind("run")[0], kind("point")
    report = format_report(run["header"], kind("profile")[0], points, kind("fallback")[0], kind("reference"))
    (out / "trees.txt").write_text(report)
    plot(points, out / "trees.png", f"tiny-code pair on {run['hardware']}, greedy, {run['max_new_tokens']} new "
                                   "tokens: measured (markers) and modelled on this CPU's ceilings (dashed)")
    return report


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="results/cpu", help="folder for trees.jsonl, trees.txt and trees.png")
    ap.add_argument("--quick", action="store_true", help="a smoke run of every code path (about a minute)")
    ap.add_argument("--rounds", type=int, default=None, help="timed rounds per batch (default 3; --quick 1)")
    ap.add_argument("--replot", action="store_true",
                    help="redraw trees.txt and trees.png from the trees.jsonl in --out; measure nothing")
    ap.add_argument("--profile", action="store_true",
                    help="measure the acceptance profile alone (by the parent's rank too) into --out/rank_profile.json")
    args = ap.parse_args(argv)
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise SystemExit(f"--out {out} is a file; give a folder")
    if args.replot:
        if not (out / "trees.jsonl").is_file():
            raise SystemExit(f"--replot: no {out / 'trees.jsonl'} to redraw from")
        print(write(out, [json.loads(line) for line in (out / "trees.jsonl").read_text().splitlines()]))
        return
    rounds = (1 if args.quick else 3) if args.rounds is None else args.rounds
    if rounds < 1:
        raise SystemExit(f"--rounds must be >= 1, got {rounds}")
    # max_new_tokens past the deepest best tree (16 deep at budget 64): speculative_generate drafts at most
    # max_new_tokens - 1 deep a step, so a shallower call would cut the tree and verify fewer nodes than its budget
    batches, budgets, max_new = ((1, 4), (1, 4, 16), 17) if args.quick else ((1, 4, 16, 64), (1, 2, 4, 8, 16, 32, 64),
                                                                             32)
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)  # a tiny model on a shared machine times more steadily on one thread
    t0, load = time.perf_counter(), os.getloadavg()[0]
    target, tok = minispec.load("tiny-code-target")
    draft, _ = minispec.load("tiny-code-draft")
    code = tok.encode(sample_text("code").decode("utf-8", "replace"))
    stride = (len(code) - PROMPT_LEN) // 64
    profile_prompts = [code[i * stride + stride // 2:][:PROMPT_LEN] for i in range(8 if args.quick else 64)]
    profile = rank_profile(target, draft, profile_prompts, 16 if args.quick else 64)
    prof = profile["profile"]
    if args.profile:
        profile |= {"pair": "tiny-code-target / tiny-code-draft", "quick": args.quick,
                    "git_revision": bench.environment(target.device, target.dtype)["git_revision"]}
        (out / "rank_profile.json").write_text(json.dumps(profile, indent=1) + "\n")
        print(json.dumps({k: v[:8] if isinstance(v, list) else v for k, v in profile.items()}, indent=1))
        return
    hw = hardware.calibrate()
    shapes = (ModelShape.from_model(target), ModelShape.from_model(draft))
    context = PROMPT_LEN + max_new / 2
    configs = configurations(draft, budgets, prof)

    points = []
    for B in batches:
        prompts = bench.prompts_for(max(B, MIN_ROWS), PROMPT_LEN, target.config.vocab_size, code)
        for cfg, row in zip(configs, measure_batch(target, configs, B, prompts, rounds, max_new)):
            points.append(row | modelled(cfg, B, prof, hw, shapes, context))
            p = points[-1]
            print(f"batch {B:>2} {p['kind']:>7} {p['budget']:>2} nodes: {p['tokens_per_step']:.2f} tok/step (model "
                  f"{p['modelled_tokens_per_step']:.2f}), {p['speedup']:.2f}x (model {p['modelled_speedup']:.2f}x)",
                  file=sys.stderr)

    kw = dict(profile=prof, hardware=hw, model=shapes[0], draft=shapes[1], context=context)
    grid_table = {B: max((p for p in points if p["batch"] == B and p["kind"] != "dynamic"),
                         key=lambda p: p["modelled_speedup"]) for B in batches}
    any_table = roofline.tree_speedup_table(batches, budgets=range(65), **kw)
    scan = roofline.tree_speedup_table(range(1, 257), budgets=range(65), **kw)
    per_batch = []
    for B, full in zip(batches, any_table):
        g = grid_table[B]
        g_is = "plain" if g["modelled_speedup"] <= 1 else ("chain" if g["chain"] else "tree")
        per_batch.append({"batch": B, "measured": measured_best(points, B),
                          "modelled": {"budget": g["budget"] if g_is != "plain" else 0, "is": g_is,
                                       "speedup": max(g["modelled_speedup"], 1.0)},
                          "modelled_any": {k: v for k, v in full.items() if k != "tree"}})
    first = lambda key: next((b["batch"] for b in per_batch if b[key]["is"] != "tree"), None)  # noqa: E731
    fallback = {"row": "fallback", "grid": list(batches), "batches": per_batch, "measured": first("measured"),
                "modelled": first("modelled"), "modelled_scan": first_fallback(scan),
                "modelled_off": next((r["batch"] for r in scan if r["budget"] == 0), None)}
    references = reference_tables()

    env = bench.environment(target.device, target.dtype)
    header = (f"tiny-code-target / tiny-code-draft, float32, {hw.name}: {hw.memory_bandwidth / 1e9:.1f} GB/s copy, "
              f"{hw.peak_flops / 1e9:.1f} GFLOP/s matmul, ridge {hw.ridge:.1f} FLOP/byte; {torch.get_num_threads()} "
              f"thread, greedy, prompts of {PROMPT_LEN} tokens of held-out code, {max_new} new tokens, at least "
              f"{MIN_ROWS} rows per point, {rounds} round(s); every run gave plain greedy's tokens. Shared machine: "
              f"load average {load:.1f} on {os.cpu_count()} cores at the start; torch {torch.__version__}, git "
              f"{env['git_revision']}; {time.perf_counter() - t0:.0f} s" + (" (--quick)" if args.quick else ""))
    meta = {"row": "run", "header": header, "quick": args.quick, "rounds": rounds, "batches": list(batches),
            "budgets": list(budgets), "max_new_tokens": max_new, "prompt_len": PROMPT_LEN, "context": context,
            "memory_bandwidth_Bps": hw.memory_bandwidth, "peak_flops": hw.peak_flops, "load_average": load,
            "machine": platform.processor() or platform.machine()} | env
    rows = [meta, profile, *points, fallback, *references]
    with open(out / "trees.jsonl", "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    print(write(out, rows))


if __name__ == "__main__":
    main()
