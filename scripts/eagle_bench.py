"""EAGLE feature drafts against the other drafts, measured on this CPU beside the H100 roofline (issue 18, item 5).

Greedy, gamma 4, float32, one intra-op thread; the same held-out prompts at every batch size; every
speculative run is checked token for token against plain decoding of the same batch.

1. The embedded code target (``tiny-code-target``, 8 layers of 192) with its small draft model
   (``tiny-code-draft``) and with the shipped EAGLE head (``tiny-code-eagle``), on prompts cut from the
   shipped held-out code (standard-library modules no model was trained on).
2. SmolLM2-135M-Instruct (``minispec fetch smollm2``) on held-out chat questions (none is a training
   prompt of the head) with prompt lookup, layer skip (the first 4 of 30 layers) and ``smollm2-135m-eagle``
   with its hot vocabulary and with the full vocabulary (the same trained layer, the target's whole LM head).
3. The hot vocabulary's acceptance ceiling: the target's probability mass inside the N hottest tokens
   (the head's ranking), teacher-forced on held-out text and on the target's own answers, beside the
   modelled c of the head with N rows on the H100 preset.

For each draft and batch size: acceptance per position (accepted at position i / drafts), mean acceptance
length (1 + accepted / drafts), alpha (accepted / tested), c measured (seconds per draft pass over seconds
per plain decode step, :func:`minispec.tools.steps.measured_draft_cost` summed over the batches), speedup
(median over rounds of speculative / plain tokens/s, the two runs of a round made one after the other), and
beside them the roofline's c and speedup on the H100 SXM preset for the measured alpha and the draft's
shape in bf16 (:func:`minispec.roofline.eagle_head_shape` for the heads; launch overheads are not in it).

Run from the repository root: ``python scripts/eagle_bench.py`` (about 20 minutes on two shared cores;
``--quick`` for a smoke run). Writes ``results/cpu/eagle.json`` and ``results/cpu/eagle.txt``, and the heads'
model card ``minispec/assets/EAGLE.md`` from their ``training.json`` and these results (``--card`` rewrites
the card alone from an existing ``eagle.json``). Part 1 includes the EAGLE-3 head (``tiny-code-eagle3``) and both
heads' per-position acceptance at gamma 8; ``scripts/eagle3_bench.py`` runs that part alone for the EAGLE-3 report.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

import minispec
from minispec import roofline
from minispec.drafts.eagle import EagleDraft
from minispec.drafts.eagle3 import Eagle3Draft
from minispec.model.load import ASSETS, sample_text
from minispec.roofline import ModelShape, eagle_head_shape
from minispec.roofline.hardware import H100_SXM
from minispec.tools import bench

ROOT = Path(__file__).resolve().parent.parent
GAMMA = 4
DEEP_GAMMA = 8  # the EAGLE heads' acceptance only, past the 4 positions EAGLE-3's training unrolls
SKIP_LAYERS = 4  # SmolLM2's layer-skip draft: its first 4 of 30 layers
HOT_SIZES = (1024, 2048, 4096, 8192, 16384, 32768)
QUESTIONS = (  # held out: no head was trained on these (see minispec.tools.train_eagle._TASKS, _SUBJECTS)
    "Why is the sky blue?", "How do airplanes stay in the air?", "What is the difference between weather and climate?",
    "Write a haiku about autumn leaves.", "Explain how a refrigerator works.", "What causes earthquakes?",
    "Give me three tips for learning a new language.", "What is a black hole?",
    "How does the immune system fight infections?", "Summarize the plot of Romeo and Juliet.",
    "What is machine learning?", "Why do cats purr?", "Explain what a Python dictionary is.",
    "How do I reverse a string in Python?", "What are the benefits of regular exercise?", "How do vaccines work?",
)


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def code_prompts(n: int, length: int = 64) -> list[list[int]]:
    """n prompts of ``length`` bytes, each from a line start spread over the shipped held-out code."""
    text = sample_text("code")
    starts = [i + 1 for i, c in enumerate(text) if c == ord("\n") and i + 1 + length < len(text)]
    return [list(text[s : s + length]) for s in starts[:: len(starts) // n][:n]]


def run_all(target, draft, prompts, batch, new_tokens, eos):
    """Decode ``prompts`` in batches of ``batch`` (plain when ``draft`` is None): (tokens, per-batch results, s)."""
    tokens, results, t0 = [], [], time.perf_counter()
    for i in range(0, len(prompts), batch):
        chunk = prompts[i : i + batch]
        r = (minispec.generate(target, chunk, new_tokens, eos_token_id=eos) if draft is None else
             minispec.speculative_generate(target, draft, chunk, gamma=GAMMA, max_new_tokens=new_tokens,
                                           eos_token_id=eos))
        tokens += r.tokens
        results.append(r)
    return tokens, results, time.perf_counter() - t0


def measure(target, drafts: dict, prompts, batch, new_tokens, eos, rounds: int, warmup: bool):
    """Plain and every draft over the same prompts at one batch size, ``rounds`` rounds (after an untimed one
    if ``warmup``): the figures per draft, and the plain tokens."""
    runs = {name: [] for name in ["plain", *drafts]}
    for r in range(rounds + warmup):
        for name in runs:
            out = run_all(target, drafts.get(name), prompts, batch, new_tokens, eos)
            if r >= warmup:
                runs[name].append(out)
    plain_tokens = runs["plain"][0][0]
    for name, rs in runs.items():
        if any(t != plain_tokens for t, _, _ in rs):
            raise RuntimeError(f"{name} at batch {batch}: tokens differ from plain greedy decoding")
    n_tokens = sum(len(t) for t in plain_tokens)
    plain_tps = [n_tokens / s for _, _, s in runs["plain"]]
    decode_step = statistics.median(sum(r.stats.phase_s["decode"] for r in res) / sum(r.stats.num_steps for r in res)
                                    for _, res, _ in runs["plain"])
    out = {"plain": {"tokens_per_s": statistics.median(plain_tps), "new_tokens": n_tokens,
                     "decode_s_per_step": decode_step}}
    for name in drafts:
        res = runs[name][-1][1]  # greedy: the same acceptance every round
        drafts_n = sum(r.stats.num_drafts for r in res)
        accepted, tested = sum(r.stats.accepted_tokens for r in res), sum(r.stats.tested_tokens for r in res)
        per_pos = [0] * GAMMA
        for r in res:
            for i, a in enumerate(r.stats.accepted_per_position):
                per_pos[i] += a
        draft_pass = statistics.median(sum(r.stats.phase_s["draft"] for r in rs) / sum(sum(r.stats.gamma_per_step)
                                                                                      for r in rs)
                                       for _, rs, _ in runs[name])
        tps = [n_tokens / s for _, _, s in runs[name]]
        out[name] = {"tokens_per_s": statistics.median(tps),
                     "speedup": statistics.median(a / b for a, b in zip(tps, plain_tps)),
                     "per_position_acceptance": [a / drafts_n for a in per_pos],
                     "acceptance_rate": accepted / sum(r.stats.draft_tokens for r in res),
                     "alpha": accepted / tested if tested else 0.0,
                     "mean_acceptance_length": 1 + accepted / drafts_n if drafts_n else 1.0,
                     "draft_cost_c": draft_pass / decode_step, "steps": sum(r.stats.num_steps for r in res),
                     "same_tokens_as_plain": True}
    return out, plain_tokens


def modelled(batch: int, alpha: float, target_shape: ModelShape, draft_shape: ModelShape | None) -> dict:
    """The H100 SXM roofline's c and speedup for the measured alpha (prompt lookup: no draft shape, c = 0)."""
    if draft_shape is None:
        return {"c_h100": 0.0, "speedup_h100": roofline.speculative_speedup(batch, alpha, GAMMA, 0.0, H100_SXM,
                                                                            target_shape)}
    return {"c_h100": roofline.modelled_draft_cost(batch, draft_shape, H100_SXM, target_shape),
            "speedup_h100": roofline.speculative_speedup(batch, alpha, GAMMA, hardware=H100_SXM, model=target_shape,
                                                         draft=draft_shape)}


@torch.inference_mode()
def hot_mass(target, ranking: torch.Tensor, sequences: list[list[int]], sizes) -> dict:
    """Mean over positions of the target's probability mass inside the first N of ``ranking``, teacher-forced."""
    p = torch.cat([target(torch.tensor([s]))[0].softmax(-1) for s in sequences])  # (positions, V)
    mass = {}
    for n in sizes:
        keep = torch.zeros(p.shape[-1], dtype=torch.bool)
        keep[ranking[:n]] = True
        mass[n] = p[:, keep].sum(-1).mean().item()
    return mass


def rows_of(results: dict) -> list[list[str]]:
    rows = [["batch", "draft", "per-position acceptance", "mean len", "alpha", "c", "tok/s", "speedup",
             "c H100", "speedup H100"]]
    for batch, by in results.items():
        pl = by["plain"]
        rows.append([str(batch), "none (plain)", "-", "1.00", "-", "-", f"{pl['tokens_per_s']:.3g}", "1.00x", "-", "-"])
        for name, r in by.items():
            if name != "plain":
                rows.append([str(batch), name, " ".join(f"{a:.2f}" for a in r["per_position_acceptance"]),
                             f"{r['mean_acceptance_length']:.2f}", f"{r['alpha']:.2f}", f"{r['draft_cost_c']:.3f}",
                             f"{r['tokens_per_s']:.3g}", f"{r['speedup']:.2f}x", f"{r['c_h100']:.3f}",
                             f"{r['speedup_h100']:.2f}x"])
    return rows


def write_card(result: dict) -> str:
    """The heads' model card (``minispec/assets/EAGLE.md``), every figure read from ``training.json`` and the bench."""
    heads = {"tiny-code-eagle": ("tiny-code-target", "code"),
             "smollm2-135m-eagle": ("smollm2-135m-instruct", "smollm2")}
    parts = ["# EAGLE heads: model card\n",
             "Feature drafts (`minispec.EagleDraft`, EAGLE-style) shipped with minispec: one decoder layer of the "
             "target's shape that reads the target's residual stream after its last layer, before its final norm, "
             "and the next token's embedding (the target's own, borrowed), each RMS-normalised and then fused by one "
             "matmul (the wiring of DeepSeek-V3's MTP module; SafeAILab's EAGLE-1 reads the final norm's output "
             "instead and fuses it with the raw embedding), with the target's LM head rows behind its own norm "
             "(EAGLE-3 trains a head of its own). Only the head's own weights are in `model.safetensors`; "
             "`config.json` holds its shape. Every figure below is written by `scripts/eagle_bench.py` from each "
             "head's `training.json` and `results/cpu/eagle.json`.\n"]
    for name, (target, key) in heads.items():
        rec = json.loads((ASSETS / name / "training.json").read_text())
        cfg, size = rec["train_config"], (ASSETS / name / "model.safetensors").stat().st_size
        runs = result[key]["by_batch"]
        b1 = runs.get(1) or runs.get("1")
        data = (f"{rec['windows']:,} windows of {cfg['seq_len']} tokens ({rec['tokens']:,} tokens)"
                + (f", {rec['self_distilled_answers']} of the documents the target's own answers to chat prompts "
                   f"(temperature 0.7, {cfg['distill_tokens']} new tokens each)" if rec["self_distilled_answers"]
                   else ""))
        parts.append(f"## `{name}` for `{target}`\n")
        parts.append(f"- **Shape**: {rec['parameters']:,} parameters of its own ({size / 1e6:.1f} MB of "
                     f"{cfg.get('save_dtype', 'float32')} safetensors), reading the target's layer "
                     f"{', '.join(map(str, rec['features']))}; "
                     + ("the full vocabulary" if cfg["hot_vocab"] is None else
                        f"a hot vocabulary of {cfg['hot_vocab']} tokens (the target's mass inside it on the held-out "
                        f"windows: {rec['heldout_hot_mass']:.3f})") + ".")
        parts.append(f"- **Data**: {data}; the target's features from one teacher-forced pass in "
                     f"{cfg['data_dtype']} ({rec['data_seconds'] / 60:.1f} min).")
        parts.append(f"- **Training**: {rec['steps']} steps of {cfg['batch_size']} windows, AdamW lr {cfg['lr']} "
                     f"(warm-up {cfg['warmup']}, cosine to 10 %), soft cross-entropy to the target's p plus "
                     f"{cfg['reg']} x the regression onto the target's next hidden state; training-time test: "
                     f"{cfg['ttt']} draft positions unrolled over the last {1 - cfg['ttt_from']:.0%} of the steps; "
                     f"seed {cfg['seed']}, {rec['threads']} thread; {rec['seconds'] / 60:.1f} min in all on 2 shared "
                     f"cores, peak RSS {rec['peak_rss_mb']} MB; Python {rec['python']}, torch {rec['torch']}.\n")
        curve = [["step", "min of training", "held-out loss per draft position",
                  "held-out greedy match per draft position"]]
        before = 0 if "train_seconds" in rec else rec["data_seconds"]  # older records timed the data pass too
        curve += [[str(c["step"]), f"{(c['seconds'] - before) / 60:.1f}",
                   " ".join(f"{x:.3f}" for x in c["heldout_loss"]),
                   " ".join(f"{x:.3f}" for x in c["heldout_greedy_match"])] for c in thinned(rec["curve"], 10)]
        parts.append("Loss curve on held-out windows (teacher-forced; draft position k > 1 reads the head's own "
                     "hidden states, as when drafting):\n\n" + md(curve) + "\n")
        acc = [["draft", "per-position acceptance", "mean acceptance length", "c (CPU)", "speedup (CPU)",
                "speedup, H100 roofline"]]
        acc += [[d, " ".join(f"{a:.2f}" for a in r["per_position_acceptance"]), f"{r['mean_acceptance_length']:.2f}",
                 f"{r['draft_cost_c']:.3f}", f"{r['speedup']:.2f}x", f"{r['speedup_h100']:.2f}x"]
                for d, r in b1.items() if d != "plain"]
        prompts = result[key]["prompts"]
        where = prompts if isinstance(prompts, str) else f"{len(prompts)} held-out chat questions"
        parts.append(f"Reproduce: `minispec.tools.train_eagle.train_eagle({target!r}, DIR, "
                     f"hot_vocab={cfg['hot_vocab']}, "
                     f"windows={rec['windows']}, steps={rec['steps']}, threads={rec['threads']}, "
                     "config=EagleTrainConfig(**train_config))` with this head's `training.json` train_config.\n")
        parts.append(f"Speculative decoding at batch 1 on {where}, greedy, gamma {GAMMA}, beside the other drafts "
                     "(all batch sizes: `results/cpu/eagle.txt`):\n\n" + md(acc) + "\n")
    parts.append("Train a head: `minispec train eagle --target NAME [--hot-vocab N] [--minutes M]` (Python: "
                 "`minispec.tools.train_eagle.train_eagle`). The budget is wall-clock, so how many windows and steps "
                 "fit depends on the machine; a record's `windows` and `steps` repeat its run.\n")
    card = "\n".join(parts)
    (ASSETS / "EAGLE.md").write_text(card)
    return card


def thinned(curve: list, n: int) -> list:
    """About n entries of a training curve, evenly spaced, the last one included."""
    step = max(1, len(curve) // n)
    return curve[::-1][::step][::-1]


def md(rows: list[list[str]]) -> str:
    return "\n".join("| " + " | ".join(r) + " |" for r in rows[:1] + [["---"] * len(rows[0])] + rows[1:])


def code_section(batches: list[int], new_tokens: int, rounds: int) -> dict:
    """Section 1: the embedded target with its small draft model, the EAGLE head and the EAGLE-3 head."""
    say("embedded code target: tiny-code-draft, tiny-code-eagle and tiny-code-eagle3")
    target, _ = minispec.load("tiny-code-target")
    small, _ = minispec.load("tiny-code-draft")
    drafts = {"tiny-code-draft": small, "tiny-code-eagle": EagleDraft.from_pretrained("tiny-code-eagle", target),
              "tiny-code-eagle3": Eagle3Draft.from_pretrained("tiny-code-eagle3", target)}
    shape = ModelShape.from_config(target.config, 2)
    shapes = {"tiny-code-draft": ModelShape.from_config(small.config, 2),
              "tiny-code-eagle": eagle_head_shape(target.config, bytes_per_param=2),
              "tiny-code-eagle3": eagle_head_shape(target.config, drafts["tiny-code-eagle3"].hot_vocab,
                                                   fusion="eagle3", bytes_per_param=2)}
    prompts = code_prompts(max(batches))
    section = {"prompts": f"{len(prompts)} x 64 bytes of held-out standard-library code",
               "new_tokens_per_prompt": new_tokens, "by_batch": {}}
    for i, b in enumerate(batches):
        say(f"  batch {b}")
        by, _ = measure(target, drafts, prompts, b, new_tokens, None, rounds, warmup=i == 0)
        for name in shapes:
            by[name] |= modelled(b, by[name]["alpha"], shape, shapes[name])
        section["by_batch"][b] = by
    section["deep"] = {"gamma": DEEP_GAMMA, "per_position_acceptance": {}}  # acceptance only, every prompt at once
    for name in ("tiny-code-eagle", "tiny-code-eagle3"):
        s = minispec.speculative_generate(target, drafts[name], prompts, gamma=DEEP_GAMMA,
                                          max_new_tokens=new_tokens).stats
        at = s.accepted_per_position + [0] * (DEEP_GAMMA - len(s.accepted_per_position))
        section["deep"]["per_position_acceptance"][name] = [a / s.num_drafts for a in at]
    return section


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--code-batches", default="1,4,16", help="batch sizes, code target (prompts: the largest)")
    ap.add_argument("--chat-batches", default="1,4,8", help="batch sizes for SmolLM2 (its prompts: the largest)")
    ap.add_argument("--code-tokens", type=int, default=64, help="greedy tokens per code prompt")
    ap.add_argument("--chat-tokens", type=int, default=32, help="greedy tokens per chat answer (fewer at EOS)")
    ap.add_argument("--rounds", type=int, default=2, help="timed rounds (medians)")
    ap.add_argument("--quick", action="store_true", help="a smoke run: batches 1 and 2, 4 tokens, 1 round")
    ap.add_argument("--out", default=str(ROOT / "results" / "cpu"), help="folder for eagle.json and eagle.txt")
    ap.add_argument("--card", action="store_true", help="only rewrite minispec/assets/EAGLE.md from OUT/eagle.json")
    args = ap.parse_args(argv)
    if args.card:
        print(write_card(json.loads((Path(args.out) / "eagle.json").read_text())))
        return 0
    code_batches, chat_batches = ([int(b) for b in a.split(",")] for a in (args.code_batches, args.chat_batches))
    code_tokens, chat_tokens, rounds = args.code_tokens, args.chat_tokens, args.rounds
    if args.quick:
        code_batches, chat_batches, code_tokens, chat_tokens, rounds = [1, 2], [1, 2], 4, 4, 1
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)  # before any work
    torch.set_num_threads(1)  # two threads fight over two shared cores (ENVIRONMENT.md)
    t_start = time.perf_counter()
    env = bench.environment(torch.device("cpu"), torch.float32) | {
        "threads": torch.get_num_threads(), "cores": os.cpu_count(), "load_average_at_start": os.getloadavg(),
        "note": "two cores shared with other engineers' jobs while this ran: tokens/s are noisy; each speedup is "
                "a median over rounds of two runs made one after the other"}
    result = {"environment": env, "gamma": GAMMA, "temperature": 0.0, "rounds": rounds,
              "training": {n: json.loads((ASSETS / n / "training.json").read_text())
                           for n in ("tiny-code-eagle", "smollm2-135m-eagle")}}
    for rec in result["training"].values():
        rec.pop("curve")

    # 1. The embedded code target.
    result["code"] = code_section(code_batches, code_tokens, rounds)

    # 2. SmolLM2-135M-Instruct.
    say("SmolLM2-135M-Instruct: prompt lookup, layer skip, EAGLE hot and full")
    target, tok = minispec.load(minispec.fetch("smollm2"))
    eos = tok.eos_token_id
    hot = EagleDraft.from_pretrained("smollm2-135m-eagle", target)
    full = EagleDraft.from_pretrained("smollm2-135m-eagle", target, hot_vocab=target.config.vocab_size)
    skip = minispec.LayerSkipDraft(target, SKIP_LAYERS)
    shape = ModelShape.from_config(target.config, 2)
    drafts = {"prompt lookup": minispec.PromptLookupDraft(), f"layer skip {SKIP_LAYERS}/30": skip,
              f"EAGLE, hot {hot.hot_vocab}": hot, "EAGLE, full vocabulary": full}
    shapes = {"prompt lookup": None,
              f"layer skip {SKIP_LAYERS}/30": ModelShape.from_config(replace(target.config,
                                                                             num_hidden_layers=SKIP_LAYERS), 2),
              f"EAGLE, hot {hot.hot_vocab}": eagle_head_shape(target.config, hot.hot_vocab, bytes_per_param=2),
              "EAGLE, full vocabulary": eagle_head_shape(target.config, bytes_per_param=2)}
    chats = [tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                     tokenize=True)["input_ids"] for q in QUESTIONS[: max(chat_batches)]]
    result["smollm2"] = {"prompts": list(QUESTIONS[: max(chat_batches)]), "new_tokens_per_prompt": chat_tokens,
                         "hot_vocab": hot.hot_vocab, "by_batch": {}}
    for i, b in enumerate(chat_batches):
        say(f"  batch {b}")
        by, answers = measure(target, drafts, chats, b, chat_tokens, eos, rounds, warmup=i == 0)
        for name in shapes:
            by[name] |= modelled(b, by[name]["alpha"], shape, shapes[name])
        result["smollm2"]["by_batch"][b] = by
    answers = [c + a for c, a in zip(chats, answers)]

    # 3. The hot vocabulary's ceiling, beside the modelled c of a head with N rows.
    say("hot vocabulary: the target's mass inside the N hottest tokens")
    held = [tok(sample_text(k).decode("utf-8"))["input_ids"][:1024] for k in ("prose", "code")]
    sizes = [n for n in HOT_SIZES if n < target.config.vocab_size] + [target.config.vocab_size]
    ranking = hot.model.ranking
    result["hot_vocabulary"] = {
        "sizes": sizes,
        "mass_heldout_prose": hot_mass(target, ranking, held[:1], sizes),
        "mass_heldout_code": hot_mass(target, ranking, held[1:], sizes),
        "mass_own_answers": hot_mass(target, ranking, answers, sizes),
        "c_h100_batch_1": {n: roofline.modelled_draft_cost(1, eagle_head_shape(target.config, n, bytes_per_param=2),
                                                           H100_SXM, shape) for n in sizes},
        "draft_cost_by_vocab_h100": roofline.draft_cost_by_vocab(1, H100_SXM)}
    result["seconds"] = round(time.perf_counter() - t_start, 1)

    hv = result["hot_vocabulary"]
    mass_rows = [["N hot tokens", "mass, held-out prose", "mass, held-out code", "mass, own answers", "c H100 (B=1)"]]
    mass_rows += [[str(n), f"{hv['mass_heldout_prose'][n]:.3f}", f"{hv['mass_heldout_code'][n]:.3f}",
                   f"{hv['mass_own_answers'][n]:.3f}", f"{hv['c_h100_batch_1'][n]:.3f}"] for n in sizes]
    vocab_rows = [["target", "vocab", "head share of draft", "c full", "c 32k", "c 25 %"]]
    vocab_rows += [[r["target"], str(r["vocab"]), f"{r['head_share']:.2f}", f"{r['c_full']:.3f}", f"{r['c_hot']:.3f}",
                    f"{r['c_fraction']:.3f}"] for r in hv["draft_cost_by_vocab_h100"]]
    train_rows = [["head", "target", "parameters", "hot vocab", "data tokens", "steps", "time", "peak RSS"]]
    for name, rec in result["training"].items():
        train_rows.append([name, rec["target"], f"{rec['parameters']:,}", str(rec["train_config"]["hot_vocab"]),
                           f"{rec['tokens']:,}", str(rec["steps"]), f"{rec['seconds'] / 60:.1f} min",
                           f"{rec['peak_rss_mb']} MB"])
    text = (f"EAGLE heads against the other drafts: greedy, gamma {GAMMA}, float32, CPU ({env['hardware']}), "
            f"{env['threads']} thread, medians of {rounds} rounds; torch {env['torch']}, git "
            f"{env['git_revision']}; shared machine (load average {env['load_average_at_start'][0]:.1f} on "
            f"{env['cores']} cores at start). Every speculative run gave the plain greedy tokens.\n"
            "per-position acceptance = accepted at position i / drafts; mean len = 1 + accepted / drafts; alpha = "
            "accepted / tested; c = seconds per draft pass / plain decode step (measured); speedup = speculative / "
            "plain tokens/s (median over rounds); c H100 and speedup H100: the roofline on the H100 SXM preset, bf16, "
            "for the measured alpha and the draft's shape (no launch overheads).\n\n"
            f"1. tiny-code-target on {result['code']['prompts']}, {code_tokens} new tokens each\n"
            + bench.text_table(rows_of(result["code"]["by_batch"]), left=1)
            + f"\n\n2. SmolLM2-135M-Instruct on {len(chats)} held-out chat questions, up to {chat_tokens} new tokens "
              "each\n" + bench.text_table(rows_of(result["smollm2"]["by_batch"]), left=1)
            + "\n\n3. The hot vocabulary's acceptance ceiling on SmolLM2: the target's mean probability mass inside "
              "the N hottest tokens of smollm2-135m-eagle's ranking (teacher-forced; 1024 tokens each of the "
              "shipped held-out prose and code, and the target's own greedy answers above), and the modelled c "
              "of a one-layer EAGLE head with N rows\n" + bench.text_table(mass_rows, left=1)
            + "\n\nThe roofline's c of a one-layer EAGLE head against the vocabulary (H100 SXM, batch 1)\n"
            + bench.text_table(vocab_rows, left=1)
            + "\n\nTraining (from each head's training.json)\n" + bench.text_table(train_rows, left=1)
            + f"\n\n{result['seconds']:.0f} s in all\n")
    print(text)
    (out_dir / "eagle.txt").write_text(text)
    (out_dir / "eagle.json").write_text(json.dumps(result, indent=1) + "\n")
    if not args.quick:
        write_card(json.loads(json.dumps(result)))  # the card reads batch sizes as JSON keys, as --card does
    return 0


if __name__ == "__main__":
    sys.exit(main())
