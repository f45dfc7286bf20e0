"""The EAGLE-3 head beside the EAGLE head (issue 35): measured on this CPU beside the H100 roofline, and an ablation.

1. ``python scripts/eagle3_bench.py``: part 1 of ``scripts/eagle_bench.py`` alone (the embedded code target with
   ``tiny-code-draft``, ``tiny-code-eagle`` and ``tiny-code-eagle3``, greedy, gamma 4, batches 1, 4 and 16, every
   run checked token for token against plain decoding; per-position acceptance, mean acceptance length, alpha, c,
   speedup, and the roofline's c and speedup on the H100 SXM preset; both heads' per-position acceptance at gamma
   8). Writes ``results/cpu/eagle3.txt`` and ``.json`` and the card ``minispec/assets/EAGLE3.md`` (``--card``
   rewrites the card alone from an existing ``eagle3.json``). About 1.5 minutes on two quiet cores (15 on loaded ones).
2. ``python scripts/eagle3_bench.py --ablation``: what the fused layers and the training-time test each buy. Four
   heads trained the same number of steps with the same data, seed and schedule (:mod:`minispec.tools.train_eagle3`),
   differing in the layers read (vLLM's default 2, 4, 5, or the last layer 8 alone) and the positions unrolled in
   training (4, or 1: teacher-forced only). Each is measured on the held-out code prompts,
   greedy, at gamma 4 and 8 (acceptance only). Writes ``results/cpu/eagle3_ablation.txt`` and ``.json``. About an
   hour on two loaded cores.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch
from eagle_bench import DEEP_GAMMA, GAMMA, ROOT, code_prompts, code_section, md, rows_of, say, thinned

import minispec
from minispec.model.load import ASSETS, sample_text
from minispec.tools import bench
from minispec.tools.train_eagle import unroll
from minispec.tools.train_eagle3 import Eagle3TrainConfig, train_eagle3

ABLATION = {  # name: (layers read, positions unrolled)
    "layers 2, 4, 5 (vLLM's default); TTT 4": ((2, 4, 5), 4),
    "layers 2, 4, 5; no TTT": ((2, 4, 5), 1),
    "last layer 8 alone; TTT 4": ((8,), 4),
    "last layer 8 alone; no TTT": ((8,), 1),
}


def eagle3_report(result: dict, out_dir: Path, new_tokens: int, quick: bool, t_start: float) -> int:
    """Section 1 alone, as results/cpu/eagle3.txt and .json, and the EAGLE-3 card."""
    result["training"] = {n: {k: v for k, v in json.loads((ASSETS / n / "training.json").read_text()).items()
                              if k != "curve"} for n in ("tiny-code-eagle", "tiny-code-eagle3")}
    result["seconds"] = round(time.perf_counter() - t_start, 1)
    env, deep = result["environment"], result["code"]["deep"]
    deep_rows = [["draft"] + [f"pos {i + 1}" for i in range(DEEP_GAMMA)]]
    deep_rows += [[n] + [f"{a:.2f}" for a in r] for n, r in deep["per_position_acceptance"].items()]
    b1 = result["code"]["by_batch"].get(1) or result["code"]["by_batch"].get("1") or {}
    fmt = lambda xs: " ".join(f"{x:.2f}" for x in xs)  # noqa: E731
    tf_rows = [["head", "held-out match", "greedy-output match", "replayed acceptance", "measured acceptance"]]
    tf_rows += [[n, fmt(r["heldout_match"]), fmt(r["greedy_output_match"]), fmt(r["replayed_per_position_acceptance"]),
                 fmt(b1[n]["per_position_acceptance"]) if n in b1 else "-"]
                for n, r in result["code"].get("teacher_forced", {}).items()]
    text = (f"The EAGLE-3 head beside the EAGLE head and the small draft model on tiny-code-target: greedy, gamma "
            f"{GAMMA}, float32, CPU ({env['hardware']}), {env['threads']} thread, medians of {result['rounds']} "
            f"rounds; torch {env['torch']}, git {env['git_revision']}; shared machine (load average "
            f"{env['load_average_at_start'][0]:.1f} on {env['cores']} cores at start"
            + ("): provisional, the tokens/s are noisy." if env['load_average_at_start'][0] >= 2 else ").")
            + " Every speculative run gave the plain greedy tokens.\n"
            "Columns as in eagle.txt; c H100 and speedup H100: the roofline on the H100 SXM preset, bf16, for the "
            "measured alpha and each draft's shape (EAGLE-3: fc 3C -> C, 2C-wide QKV, its 128-row head).\n\n"
            f"{result['code']['prompts']}, {new_tokens} new tokens each\n"
            + bench.text_table(rows_of(result["code"]["by_batch"]), left=1)
            + f"\n\nDeeper drafts: per-position acceptance at gamma {DEEP_GAMMA} (accepted at position i / drafts), "
              "all prompts in one batch\n" + bench.text_table(deep_rows, left=1)
            + "\n\nTeacher-forced (fed the true tokens; position k reads the head's own state from k - 1, as when "
              "drafting): greedy match per position on the 8 held-out windows the EAGLE-3 training evaluates, and "
              "on the greedy outputs above; then the gamma-4 chain replayed from the latter's predictions, beside the "
              "measured per-position acceptance at batch 1\n" + bench.text_table(tf_rows, left=1)
            + f"\n\n{result['seconds']:.0f} s in all\n")
    print(text)
    (out_dir / "eagle3.txt").write_text(text)
    (out_dir / "eagle3.json").write_text(json.dumps(result, indent=1) + "\n")
    if not quick:
        write_eagle3_card(json.loads(json.dumps(result)))
    return 0


def write_eagle3_card(result: dict) -> str:
    """The EAGLE-3 head's card (``minispec/assets/EAGLE3.md``) from its ``training.json`` and this script's results."""
    name = "tiny-code-eagle3"
    rec = json.loads((ASSETS / name / "training.json").read_text())
    cfg, size = rec["train_config"], (ASSETS / name / "model.safetensors").stat().st_size
    by = result["code"]["by_batch"]
    b1 = by.get(1) or by.get("1")
    curve = [["step", "min of training", "held-out loss per draft position", "held-out greedy match per position"]]
    curve += [[str(c["step"]), f"{c['seconds'] / 60:.1f}", " ".join(f"{x:.3f}" for x in c["heldout_loss"]),
               " ".join(f"{x:.3f}" for x in c["heldout_greedy_match"])] for c in thinned(rec["curve"], 10)]
    acc = [["draft", "per-position acceptance", "mean acceptance length", "c (CPU)", "speedup (CPU)",
            "speedup, H100 roofline"]]
    acc += [[d, " ".join(f"{a:.2f}" for a in r["per_position_acceptance"]), f"{r['mean_acceptance_length']:.2f}",
             f"{r['draft_cost_c']:.3f}", f"{r['speedup']:.2f}x", f"{r['speedup_h100']:.2f}x"]
            for d, r in b1.items() if d != "plain"]
    deep, load = result["code"]["deep"], result["environment"]["load_average_at_start"][0]
    deep_rows = [["head"] + [str(i + 1) for i in range(deep["gamma"])]]
    deep_rows += [[n] + [f"{a:.2f}" for a in r] for n, r in deep["per_position_acceptance"].items()]
    card = "\n".join([
        "# EAGLE-3 head: model card\n",
        "`tiny-code-eagle3` (`minispec.Eagle3Draft.from_pretrained(\"tiny-code-eagle3\", target)`) is an EAGLE-3 head "
        "(Li et al. 2025) for `tiny-code-target`: the residual stream entering the target's layers "
        f"{', '.join(map(str, rec['features']))} (vLLM's default low, middle and high layers for 8 layers: 2, L // 2, "
        "L - 3) concatenated and fused by `fc` (3C -> C); one decoder layer whose Q, K and V read "
        "[input_layernorm(embedding), hidden_norm(fused)] side by side; its own LM head over a draft vocabulary of "
        f"{rec['draft_vocab']} of the 256 byte values (draft id i is target id i + d2t[i]). It is saved in vLLM's "
        "layout (`LlamaForCausalLMEagle3`, `midlayer.*`, `fc`, `d2t`, `t2d`), so vLLM serves the same folder with "
        "`speculative_config={\"method\": \"eagle3\", \"model\": <this folder>, \"num_speculative_tokens\": K}`; "
        "`tests/vllm/test_eagle3_vllm.py` checks that vLLM's CPU build and minispec accept the same tokens at each "
        "position. Every figure below is written by `python scripts/eagle3_bench.py` from `training.json` "
        "and `results/cpu/eagle3.json`.\n",
        f"- **Shape**: {rec['parameters']:,} parameters of its own ({size / 1e6:.2f} MB of {cfg['save_dtype']} "
        f"safetensors); the embedding is the target's (vLLM shares it too). The target's probability mass inside the "
        f"draft vocabulary on the held-out windows: {rec['heldout_draft_vocab_mass']:.4f}.",
        f"- **Data**: {rec['data']}; {rec['tokens_read']:,} tokens read in all, each step through the frozen target "
        "(its p and its features, " + (f"under {cfg['autocast']} autocast)." if cfg["autocast"] else "in float32)."),
        f"- **Training**: {rec['steps']} steps, AdamW lr {cfg['lr']} (warm-up {cfg['warmup']}, cosine to 10 %); "
        f"training-time test: {cfg['ttt']} draft positions unrolled at every step, position k reading the head's "
        f"own hidden state from position k - 1; loss: soft cross-entropy to the target's p restricted to the draft "
        f"vocabulary, over the positions whose target argmax is in it, position k weighted {cfg['decay']}^(k-1); no "
        "feature regression; LM head and final norm started from the target's rows and norm, fc from the identity on "
        "the highest layer's block" + (" with each layer's block divided by that layer's rms" if cfg.get("scaled_init")
                                       else " (unscaled: the residual stream's rms, 5 to 8 at these layers, kept)")
        + f"; seed {cfg['seed']}, {rec['threads']} thread; {rec['seconds'] / 60:.1f} min in all on "
        f"a shared 2-core machine, peak RSS {rec['peak_rss_mb']} MB; Python {rec['python']}, "
        f"torch {rec['torch']}.\n",
        "Loss curve on 8 held-out windows (teacher-forced; position k > 1 reads the head's own states, as when "
        "drafting):\n\n" + md(curve) + "\n",
        f"Reproduce: `minispec.tools.train_eagle3.train_eagle3('tiny-code-target', DIR, steps={rec['steps']}, "
        f"threads={rec['threads']}, config=Eagle3TrainConfig(**train_config))` with this head's train_config; "
        "`minispec train eagle3 --target tiny-code-target --hot-vocab 128 --minutes M --out DIR` trains one for a "
        "wall-clock budget.\n",
        f"Speculative decoding at batch 1 on {result['code']['prompts']}, greedy, gamma {GAMMA}, beside the EAGLE "
        "head and the small draft model (all batch sizes: `results/cpu/eagle3.txt`; "
        + (f"load average {load:.1f} on the 2 cores at the start)" if load < 2 else
           f"measured on a loaded machine, load average {load:.1f} at the start: provisional)")
        + ":\n\n" + md(acc) + "\n",
        f"Per-position acceptance at gamma {deep['gamma']} (accepted at position i / drafts; the head was unrolled "
        f"over {cfg['ttt']} positions in training):\n\n" + md(deep_rows) + "\n",
        "Why the numbers look as they do, and what an ablation says: `docs/EAGLE3.md`.\n"])
    (ASSETS / "EAGLE3.md").write_text(card)
    return card


@torch.no_grad()
def teacher_forced(target, draft, x: torch.Tensor, first: int, gamma: int = GAMMA) -> tuple[list[float], list]:
    """The head fed x's true tokens (B, T), position k reading its own state from position k - 1 as when drafting
    (:func:`minispec.tools.train_eagle.unroll`): per position k, the share of slots whose prediction is the target's
    argmax, over the tokens from index ``first`` + 1 on; and the predictions, gamma x (B, T - 1) target ids (slot j
    predicts x_{j+2}), beside the target's argmax (B, T)."""
    logits, f = target(x, features=draft.features)  # (B, T, V), (B, T, F)
    best = logits.argmax(-1)  # (B, T)
    pred = [draft.model.logits(h, draft.head).argmax(-1) for h in unroll(draft.model, target.embed(x[:, 1:]),
                                                                          f[:, :-1], gamma)]  # gamma x (B, T - 1)
    pred = [p if draft.hot is None else draft.hot[p] for p in pred]
    j0 = [max(k, first - 1) for k in range(gamma)]  # position k + 1 has a history from slot k; drafts from first - 1
    return [(p[:, j:] == best[:, j + 1:]).float().mean().item() for p, j in zip(pred, j0)], (pred, best)


def replay(pred: list, best: torch.Tensor, first: int, new_tokens: int) -> list[float]:
    """Greedy speculative decoding replayed from teacher-forced predictions: each row's drafts start after its
    prompt's first token (index ``first``) and after each step's bonus token; the share of drafts accepted at each
    position (what speculative_generate reports, if the head drafts as it was unrolled)."""
    gamma, drafts, at = len(pred), 0, [0] * len(pred)
    for b in range(len(best)):
        t = first  # the last token the row has: the root's
        while t < first + new_tokens - 1:
            drafts, n = drafts + 1, 0
            while n < gamma and t + n < best.shape[1] - 1 and pred[n][b, t - 1 + n] == best[b, t + n]:
                at[n], n = at[n] + 1, n + 1
            t += n + 1
    return [a / drafts for a in at]


def teacher_forced_section(n_prompts: int, new_tokens: int) -> dict:
    """Each head teacher-forced on the 8 held-out windows the EAGLE-3 training evaluates (256 bytes each) and on the
    greedy outputs of the benchmark's prompts, and the chain replayed from the latter (beside the measured shares)."""
    target, _ = minispec.load("tiny-code-target")
    prompts = code_prompts(n_prompts)
    plain = minispec.generate(target, prompts, new_tokens).tokens
    heads = {"tiny-code-eagle": minispec.EagleDraft.from_pretrained("tiny-code-eagle", target),
             "tiny-code-eagle3": minispec.Eagle3Draft.from_pretrained("tiny-code-eagle3", target)}
    text = sample_text("code")
    held = torch.tensor(list(text[: 8 * 256])).view(8, 256)  # (8, 256) the training's held-out windows
    seqs = torch.tensor([p + o for p, o in zip(prompts, plain)])  # (B, P + new) the greedy outputs
    P, new = len(prompts[0]), len(plain[0])
    out = {}
    for name, h in heads.items():
        held_match, _ = teacher_forced(target, h, held, 0)
        greedy_match, (pred, best) = teacher_forced(target, h, seqs, P)
        out[name] = {"heldout_match": held_match, "greedy_output_match": greedy_match,
                     "replayed_per_position_acceptance": replay(pred, best, P, new)}
    return out


def autocasts(result: dict) -> str:
    """How the ablation's heads trained: "float32", or the autocast dtype (train_eagle3's "auto" picks bfloat16 where
    the CPU computes it natively, as on AVX-512 BF16 and AMX)."""
    kinds = {r["autocast"] or "float32" for r in result["heads"].values()}
    return " / ".join(sorted(kinds)) + ("" if kinds == {"float32"} else " autocast")


def ablation(out_dir: Path, steps: int, seq_len: int, new_tokens: int) -> int:
    """Train the heads of :data:`ABLATION` for ``steps`` steps each and measure them (see the module docstring)."""
    t_start = time.perf_counter()
    env = bench.environment(torch.device("cpu"), torch.float32) | {
        "threads": 1, "cores": os.cpu_count(), "load_average_at_start": os.getloadavg()}
    target, _ = minispec.load("tiny-code-target")
    prompts = code_prompts(16)
    result = {"environment": env, "steps": steps, "seq_len": seq_len, "prompts": f"{len(prompts)} x 64 bytes of "
              "held-out standard-library code", "new_tokens_per_prompt": new_tokens, "heads": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for name, (features, ttt) in ABLATION.items():
            say(f"ablation: {name}")
            cfg = Eagle3TrainConfig(features=features, ttt=ttt, draft_vocab=128, seq_len=seq_len)
            rec = train_eagle3("tiny-code-target", Path(tmp) / str(len(result["heads"])), steps=steps, threads=1,
                               config=cfg, progress=False)
            head = minispec.Eagle3Draft.from_pretrained(Path(tmp) / str(len(result["heads"])), target)
            row = {"features": list(features), "ttt": ttt, "train_seconds": rec["train_seconds"],
                   "autocast": rec["train_config"]["autocast"],
                   "heldout_greedy_match": rec["curve"][-1]["heldout_greedy_match"]}
            for gamma in (GAMMA, DEEP_GAMMA):
                s = minispec.speculative_generate(target, head, prompts, gamma=gamma, max_new_tokens=new_tokens).stats
                at = s.accepted_per_position + [0] * (gamma - len(s.accepted_per_position))
                row[f"gamma_{gamma}"] = {"per_position_acceptance": [a / s.num_drafts for a in at],
                                         "mean_acceptance_length": s.mean_acceptance_length}
            result["heads"][name] = row
    result["seconds"] = round(time.perf_counter() - t_start, 1)
    rows = [["head", "train s", "held-out match 1-4", f"acceptance at gamma {GAMMA}", "mean len",
             f"acceptance at gamma {DEEP_GAMMA}", "mean len"]]
    for name, r in result["heads"].items():
        a, b = r[f"gamma_{GAMMA}"], r[f"gamma_{DEEP_GAMMA}"]
        rows.append([name, f"{r['train_seconds']:.0f}", " ".join(f"{x:.2f}" for x in r["heldout_greedy_match"]),
                     " ".join(f"{x:.2f}" for x in a["per_position_acceptance"]), f"{a['mean_acceptance_length']:.2f}",
                     " ".join(f"{x:.2f}" for x in b["per_position_acceptance"]), f"{b['mean_acceptance_length']:.2f}"])
    text = (f"EAGLE-3 ablation on tiny-code-target: {len(ABLATION)} heads, {steps} steps each of 8 windows of "
            f"{seq_len} tokens, the same data, seed and schedule, differing only in the layers read and the "
            f"positions unrolled in training; greedy acceptance on {result['prompts']}, {new_tokens} new tokens "
            f"each (accepted at position i / drafts). CPU ({bench.processor()}), 1 thread, "
            f"training under {autocasts(result)}, torch {env['torch']}, git "
            f"{env['git_revision']}; load average {env['load_average_at_start'][0]:.1f} on {env['cores']} cores at "
            "start (train seconds are noisy).\n\n"
            + bench.text_table(rows, left=1) + f"\n\n{result['seconds']:.0f} s in all\n")
    print(text)
    (out_dir / "eagle3_ablation.txt").write_text(text)
    (out_dir / "eagle3_ablation.json").write_text(json.dumps(result, indent=1) + "\n")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batches", default="1,4,16", help="batch sizes (prompts: the largest)")
    ap.add_argument("--tokens", type=int, default=64, help="greedy tokens per prompt")
    ap.add_argument("--rounds", type=int, default=2, help="timed rounds (medians)")
    ap.add_argument("--quick", action="store_true", help="a smoke run: batches 1 and 2, 4 tokens, 1 round, no card")
    ap.add_argument("--out", default=str(ROOT / "results" / "cpu"), help="folder for the results")
    ap.add_argument("--card", action="store_true", help="only rewrite minispec/assets/EAGLE3.md from OUT/eagle3.json")
    ap.add_argument("--ablation", action="store_true", help="train and measure the ablation's heads instead")
    ap.add_argument("--steps", type=int, default=200, help="ablation: training steps per head")
    ap.add_argument("--seq-len", type=int, default=128, help="ablation: tokens per training window")
    args = ap.parse_args(argv)
    out_dir = Path(args.out)
    if args.card:
        print(write_eagle3_card(json.loads((out_dir / "eagle3.json").read_text())))
        return 0
    batches = [int(b) for b in args.batches.split(",")]
    if min(batches) < 1 or args.tokens < 1 or args.rounds < 1 or args.steps < 1:
        raise SystemExit("batches, tokens, rounds and steps must be >= 1")
    out_dir.mkdir(parents=True, exist_ok=True)  # before any work
    torch.set_num_threads(1)  # two threads fight over two shared cores (ENVIRONMENT.md)
    if args.ablation:
        return ablation(out_dir, args.steps, args.seq_len, args.tokens)
    tokens, rounds = args.tokens, args.rounds
    if args.quick:
        batches, tokens, rounds = [1, 2], 4, 1
    t_start = time.perf_counter()
    env = bench.environment(torch.device("cpu"), torch.float32) | {
        "threads": torch.get_num_threads(), "cores": os.cpu_count(), "load_average_at_start": os.getloadavg(),
        "note": "two cores shared with other engineers' jobs: tokens/s are noisy where the load average is high; "
                "each speedup is a median over rounds of two runs made one after the other"}
    result = {"environment": env, "gamma": GAMMA, "temperature": 0.0, "rounds": rounds,
              "code": code_section(batches, tokens, rounds)}
    result["code"]["teacher_forced"] = teacher_forced_section(max(batches), tokens)
    return eagle3_report(result, out_dir, tokens, args.quick, t_start)


if __name__ == "__main__":
    sys.exit(main())
