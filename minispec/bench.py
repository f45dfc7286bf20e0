"""Measured, not only modelled: speculative against plain decoding across batch sizes.

For each (batch size, gamma, temperature) the sweep runs plain and speculative decoding on the
same prompts, with warm-up and repeats, and reports medians beside what the roofline predicts
for this device (its ceilings measured here, by :func:`calibrate`). One JSONL row per point.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from minispec.decode import generate
from minispec.hardware import Hardware, calibrate, device_hardware, median_time
from minispec.model import Model, ModelConfig
from minispec.roofline import ModelShape, leviathan_speedup, speculative_speedup
from minispec.speculative import speculative_generate

# Random-weight shapes for systems measurements without a download (Hugging Face config names).
SHAPES = {
    # meta-llama/Meta-Llama-3-8B config.json
    "llama-8b": dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                     num_attention_heads=32, num_key_value_heads=8, head_dim=128, rope_theta=500000.0,
                     max_position_embeddings=8192),
    # meta-llama/Llama-3.2-1B config.json
    "llama-1b": dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                     num_attention_heads=32, num_key_value_heads=8, head_dim=64, rope_theta=500000.0,
                     max_position_embeddings=8192, tie_word_embeddings=True),
    # Two layers of Llama-3.2-1B with its tied embedding: about 5 % of llama-8b's weight bytes.
    "llama-draft-2l": dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=2,
                           num_attention_heads=32, num_key_value_heads=8, head_dim=64, rope_theta=500000.0,
                           max_position_embeddings=8192, tie_word_embeddings=True),
    # Small shapes of the same family, for running this file's code paths on a CPU.
    "tiny": dict(vocab_size=256, hidden_size=256, intermediate_size=688, num_hidden_layers=8, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=64, max_position_embeddings=1024),
    "tiny-draft": dict(vocab_size=256, hidden_size=64, intermediate_size=172, num_hidden_layers=1,
                       num_attention_heads=2, num_key_value_heads=1, head_dim=32, max_position_embeddings=1024),
}


def random_model(shape: str, device="cpu", dtype=torch.float32, seed: int = 0) -> Model:
    """A randomly initialised model of a named shape (see SHAPES), built directly on the device."""
    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}; shapes: {', '.join(SHAPES)}")
    torch.manual_seed(seed)
    with torch.device(device):
        model = Model(ModelConfig(**SHAPES[shape]))
    return model.to(dtype).eval().requires_grad_(False)


# --- measured step times -----------------------------------------------------------------------

def step_time(model: Model, batch: int, tokens_per_row: int = 1, context: int = 64, repeats: int = 5) -> float:
    """Median seconds of one cached forward pass of tokens_per_row tokens for each of batch rows
    at ``context`` tokens of history."""
    cache = model.new_cache(batch, context + tokens_per_row)
    x = torch.randint(0, model.config.vocab_size, (batch, tokens_per_row), device=model.device)
    lengths = torch.full((batch,), context, device=model.device)

    def run():
        cache.rollback(lengths)
        model(x, cache)

    cache.trim(context)
    with torch.inference_mode():
        return median_time(run, model.device, repeats)


def step_time_table(target: Model, draft: Model, batches, gamma_max: int, context: int = 64, repeats: int = 5):
    """Measured target steps {(batch, tokens_per_row): s} for 1..gamma_max+1 tokens and draft steps {batch: s}."""
    target_s = {(b, t): step_time(target, b, t, context, repeats) for b in batches for t in range(1, gamma_max + 2)}
    draft_s = {b: step_time(draft, b, 1, context, repeats) for b in batches}
    return target_s, draft_s


def measured_policy(target: Model, draft: Model, batches=(1, 2, 4, 8, 16, 32, 64), gamma_max: int = 8,
                    context: int = 64, **kw):
    """A :class:`~minispec.policy.MeasuredPolicy` from step times measured on this device."""
    from minispec.policy import MeasuredPolicy

    return MeasuredPolicy(*step_time_table(target, draft, batches, gamma_max, context), gamma_max=gamma_max, **kw)


def draft_cost(plain, spec) -> float:
    """c measured inside the loops: seconds per draft pass of a speculative run (its "draft" phase
    over the gammas it drafted, sampling included) over seconds per plain decode step (the
    "decode" phase of a plain run over its steps). Arguments: the ``.stats`` of the two runs."""
    per_draft = spec.phase_s["draft"] / sum(spec.gamma_per_step)
    return per_draft / (plain.phase_s["decode"] / plain.num_steps)


# --- the sweep ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class BenchConfig:
    batches: tuple[int, ...] = (1, 2, 4, 8, 16, 32)  # batch sizes to sweep
    gammas: tuple[int, ...] = (4,)  # draft lengths
    temperatures: tuple[float, ...] = (0.0,)
    max_new_tokens: int = 64  # per row
    prompt_len: int = 64  # tokens per prompt
    repeats: int = 3  # timed runs per point (medians reported)
    warmup: int = 1  # untimed runs per point
    accept_rate: float | None = None  # synthetic acceptance (Bernoulli draws), None = the real test
    seed: int = 0


def environment(device: torch.device, dtype: torch.dtype) -> dict:
    """What a result row needs to be reproduced: hardware, dtype, versions, git revision."""
    try:
        rev = subprocess.run(["git", "describe", "--always", "--dirty"], capture_output=True, text=True,
                             cwd=Path(__file__).parent, timeout=5).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        rev = None
    return {"hardware": device_hardware(device, dtype).name, "device": str(device),
            "dtype": str(dtype).removeprefix("torch."), "torch": torch.__version__,
            "cuda": torch.version.cuda, "python": platform.python_version(), "git_revision": rev}


def bench_point(target: Model, draft: Model, prompts: list[list[int]], gamma: int, temperature: float,
                cfg: BenchConfig, hardware: Hardware) -> dict:
    """Plain and speculative decoding of the same prompts: medians of cfg.repeats runs, one JSONL row."""
    kw = dict(max_new_tokens=cfg.max_new_tokens, temperature=temperature, seed=cfg.seed)
    runs = {"plain": [], "spec": []}
    for i in range(cfg.warmup + cfg.repeats):
        plain = generate(target, prompts, **kw)
        spec = speculative_generate(target, draft, prompts, gamma=gamma, accept_rate=cfg.accept_rate, **kw)
        if i >= cfg.warmup:
            runs["plain"].append(plain)
            runs["spec"].append(spec)
    if temperature == 0 and cfg.accept_rate is None and spec.tokens != plain.tokens:
        raise RuntimeError("greedy speculative tokens differ from plain decoding")
    med = lambda k, f: statistics.median(f(r.stats) for r in runs[k])  # noqa: E731
    B = len(prompts)
    s = runs["spec"][-1].stats
    alpha = s.alpha_estimate
    c = statistics.median(draft_cost(p.stats, q.stats) for p, q in zip(runs["plain"], runs["spec"]))
    verify_ratio = step_time(target, B, gamma + 1, cfg.prompt_len) / step_time(target, B, 1, cfg.prompt_len)
    shape = ModelShape.from_model(target)
    return {
        "batch_size": B, "gamma": gamma, "temperature": temperature, "synthetic": cfg.accept_rate is not None,
        "speedup": med("spec", lambda st: st.output_throughput) / med("plain", lambda st: st.output_throughput),
        "modelled_speedup": speculative_speedup(B, alpha, gamma, c, hardware, shape, cfg.prompt_len),
        "leviathan_speedup": leviathan_speedup(alpha, gamma, c),
        "output_throughput": med("spec", lambda st: st.output_throughput),
        "plain_output_throughput": med("plain", lambda st: st.output_throughput),
        "median_tpot_ms": 1e3 * med("spec", lambda st: st.tpot_p50_s),
        "p99_tpot_ms": 1e3 * med("spec", lambda st: st.tpot_p99_s),
        "plain_median_tpot_ms": 1e3 * med("plain", lambda st: st.tpot_p50_s),
        "plain_p99_tpot_ms": 1e3 * med("plain", lambda st: st.tpot_p99_s),
        "mean_ttft_ms": 1e3 * med("spec", lambda st: st.ttft_s),
        "plain_mean_ttft_ms": 1e3 * med("plain", lambda st: st.ttft_s),
        "acceptance_rate": s.acceptance_rate, "alpha_estimate": alpha,
        "mean_acceptance_length": s.mean_acceptance_length,
        "per_position_acceptance_rates": s.per_position_acceptance_rates,
        "num_drafts": s.num_drafts, "draft_tokens": s.draft_tokens, "accepted_tokens": s.accepted_tokens,
        "draft_cost_c": c, "verify_to_decode_step_ratio": verify_ratio,
        "phase_s": {k: statistics.median(r.stats.phase_s.get(k, 0.0) for r in runs["spec"]) for k in s.phase_s},
        "max_new_tokens": cfg.max_new_tokens, "prompt_len": cfg.prompt_len, "repeats": cfg.repeats,
        "seed": cfg.seed,
    }


def prompts_for(batch: int, length: int, vocab_size: int, text: bytes | None = None, seed: int = 0) -> list[list[int]]:
    """``batch`` prompts of ``length`` tokens: consecutive slices of ``text`` (bytes) or random ids."""
    if text is not None:
        stride = max(1, (len(text) - length) // max(1, batch))
        return [list(text[(i * stride) % (len(text) - length):][:length]) for i in range(batch)]
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab_size, (batch, length), generator=g).tolist()


def sweep(target: Model, draft: Model, cfg: BenchConfig, text: bytes | None = None, out=None,
          progress: bool = True) -> list[dict]:
    """Every (batch, gamma, temperature) point of cfg; rows are appended to ``out`` (a path) as they come."""
    from tqdm.auto import tqdm

    hardware = calibrate(str(target.device), target.dtype)
    env = environment(target.device, target.dtype)
    points = [(b, g, t) for t in cfg.temperatures for g in cfg.gammas for b in cfg.batches]
    rows = []
    for b, g, t in tqdm(points, desc="bench", disable=not progress):
        prompts = prompts_for(b, cfg.prompt_len, target.config.vocab_size, text, cfg.seed)
        row = bench_point(target, draft, prompts, g, t, cfg, hardware) | env
        rows.append(row)
        if out is not None:
            with open(out, "a") as f:
                f.write(json.dumps(row) + "\n")
    return rows


def break_even(rows: list[dict], key: str = "speedup") -> float | None:
    """The batch where ``key`` crosses 1.0 (log-linear interpolation between measured points), or None."""
    import math

    pts = sorted((r["batch_size"], r[key]) for r in rows)
    for (b0, s0), (b1, s1) in zip(pts, pts[1:]):
        if s0 >= 1 > s1:
            x0, x1 = math.log2(b0), math.log2(b1)
            return 2 ** (x0 + (s0 - 1) * (x1 - x0) / (s0 - s1))
    return None


def format_table(rows: list[dict]) -> str:
    """An aligned text table of the sweep."""
    cols = [("batch", "batch_size", "{:d}"), ("gamma", "gamma", "{:d}"), ("temp", "temperature", "{:.1f}"),
            ("plain tok/s", "plain_output_throughput", "{:.0f}"), ("spec tok/s", "output_throughput", "{:.0f}"),
            ("speedup", "speedup", "{:.2f}x"), ("modelled", "modelled_speedup", "{:.2f}x"),
            ("alpha", "alpha_estimate", "{:.2f}"), ("c", "draft_cost_c", "{:.3f}"),
            ("verify/decode", "verify_to_decode_step_ratio", "{:.2f}"),
            ("TPOT p50 ms", "median_tpot_ms", "{:.1f}"), ("TPOT p99 ms", "p99_tpot_ms", "{:.1f}")]
    cells = [[h for h, _, _ in cols]] + [[f.format(r[k]) if r.get(k) is not None else "-" for _, k, f in cols]
                                         for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(cols))]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in cells)


# --- Hugging Face assisted generation, the baseline a user would pick instead --------------------

def hf_assisted_baseline(target_dir, draft_dir, prompt: list[int], max_new_tokens: int = 128, gamma: int = 4,
                         repeats: int = 3) -> dict:
    """transformers' ``generate(assistant_model=...)`` (greedy, batch 1, constant gamma) against
    minispec on the same checkpoints and prompt: tokens compared, tokens/s ratio."""
    from transformers import AutoModelForCausalLM, GenerationConfig

    from minispec.load import load

    hf_t = AutoModelForCausalLM.from_pretrained(str(target_dir), dtype=torch.float32).eval()
    hf_d = AutoModelForCausalLM.from_pretrained(str(draft_dir), dtype=torch.float32).eval()
    # A fixed draft length and no early stop on the draft's confidence, as minispec does.
    hf_d.generation_config.update(num_assistant_tokens=gamma, num_assistant_tokens_schedule="constant",
                                  assistant_confidence_threshold=0.0)
    ids = torch.tensor([prompt])
    gen_cfg = GenerationConfig(max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens, do_sample=False,
                               pad_token_id=0)
    ms_t, _ = load(target_dir)
    ms_d, _ = load(draft_dir)

    def hf_run():
        with torch.inference_mode():
            return hf_t.generate(ids, generation_config=gen_cfg, assistant_model=hf_d)[0, len(prompt):].tolist()

    def ms_run():
        return speculative_generate(ms_t, ms_d, [prompt], gamma=gamma, max_new_tokens=max_new_tokens).tokens[0]

    hf_tokens, ms_tokens = hf_run(), ms_run()  # warm-up, and the tokens to compare
    hf_s = median_time(hf_run, torch.device("cpu"), repeats, warmup=0)
    ms_s = median_time(ms_run, torch.device("cpu"), repeats, warmup=0)
    return {"hf_tokens_per_s": max_new_tokens / hf_s, "minispec_tokens_per_s": max_new_tokens / ms_s,
            "minispec_over_hf": hf_s / ms_s, "identical_greedy_tokens": hf_tokens == ms_tokens, "gamma": gamma,
            "max_new_tokens": max_new_tokens, "prompt_len": len(prompt)}


# --- torch.compile ------------------------------------------------------------------------------

def compile_model(model: Model, mode: str = "reduce-overhead") -> Model:
    """torch.compile the forward pass for fixed shapes: caches become static (every call attends
    over all S slots), so the decode and verify steps keep one shape per batch size."""
    model.static_cache = True
    model.forward = torch.compile(model.forward, mode=mode, dynamic=False, fullgraph=True)
    return model


# --- CLI ----------------------------------------------------------------------------------------

def add_cli_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", default="tiny-code-target",
                   help="embedded name, checkpoint directory, or shape:NAME for random weights (shapes: "
                        + ", ".join(SHAPES) + ")")
    p.add_argument("--draft", default="tiny-code-draft")
    p.add_argument("--batches", default="1,2,4,8,16,32", help="comma-separated batch sizes")
    p.add_argument("--gammas", default="4")
    p.add_argument("--temperatures", default="0")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--accept-rate", type=float, default=None, help="synthetic acceptance: Bernoulli(ALPHA) draws")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default=None, help="float32, bfloat16, float16 (default: the checkpoint's / bf16 on GPU)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="append JSONL rows to this file")
    p.add_argument("--plot", default=None, help="draw measured and modelled speedup against batch to this file")
    p.add_argument("--compile", action="store_true", help="torch.compile decode and verify with static shapes")
    p.add_argument("--hf-baseline", action="store_true",
                   help="also time Hugging Face assisted generation at batch 1 on the same (embedded or local) pair")


def load_model(source: str, device, dtype):
    """A model from an embedded name, a directory, or shape:NAME (random weights)."""
    if source.startswith("shape:"):
        return random_model(source.removeprefix("shape:"), device, dtype or torch.bfloat16), None
    from minispec.load import load

    return load(source, device=device, dtype=dtype)


def cli_main(args: argparse.Namespace) -> None:
    ints = lambda s: tuple(int(x) for x in s.split(","))  # noqa: E731
    cfg = BenchConfig(batches=ints(args.batches), gammas=ints(args.gammas),
                      temperatures=tuple(float(x) for x in args.temperatures.split(",")),
                      max_new_tokens=args.max_new_tokens, prompt_len=args.prompt_len, repeats=args.repeats,
                      warmup=args.warmup, accept_rate=args.accept_rate, seed=args.seed)
    if cfg.accept_rate is not None and not 0 <= cfg.accept_rate <= 1:
        raise SystemExit(f"--accept-rate must be in [0, 1], got {cfg.accept_rate}")
    dtype = getattr(torch, args.dtype) if args.dtype else None
    target, tok = load_model(args.target, args.device, dtype)
    draft, _ = load_model(args.draft, args.device, target.dtype)
    if args.compile:
        compile_model(target), compile_model(draft)
    text = None
    if tok is not None and tok.__class__.__name__ == "ByteTokenizer":
        from minispec.train import sample_text

        text = sample_text("code")
    hw = calibrate(str(target.device), target.dtype)
    print(f"device: {hw.name}: {hw.memory_bandwidth / 1e9:.1f} GB/s copy, {hw.peak_flops / 1e12:.2f} TFLOP/s matmul "
          f"({target.dtype}), ridge {hw.ridge:.1f} FLOP/byte", file=sys.stderr)
    rows = sweep(target, draft, cfg, text, args.out)
    print(format_table(rows))
    summary = {"hardware": hw.name, "memory_bandwidth_Bps": hw.memory_bandwidth, "peak_flops": hw.peak_flops,
               "target": args.target, "draft": args.draft, "break_even": []}
    for (g, t) in sorted({(r["gamma"], r["temperature"]) for r in rows}):
        sel = [r for r in rows if r["gamma"] == g and r["temperature"] == t]
        measured, modelled = break_even(sel), break_even(sel, "modelled_speedup")
        summary["break_even"].append({"gamma": g, "temperature": t, "measured_batch": measured,
                                      "modelled_batch": modelled})
        print(f"gamma {g}, temperature {t}: break-even batch measured {_fmt(measured)}, modelled {_fmt(modelled)}")
    if args.out:
        Path(args.out).with_name("summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    if args.plot:
        from minispec.plots import plot_speedup_vs_batch

        curves, measured = {}, {}
        for r in rows:
            key = f"gamma {r['gamma']}, temperature {r['temperature']:g}"
            curves.setdefault(key, []).append((r["batch_size"], r["modelled_speedup"]))
            measured.setdefault(key, []).append((r["batch_size"], r["speedup"]))
        plot_speedup_vs_batch(curves, title=f"{args.target} / {args.draft} on {hw.name}",
                              measured=measured).savefig(args.plot, dpi=120)
    if args.hf_baseline:
        from minispec.load import _resolve

        res = hf_assisted_baseline(_resolve(args.target), _resolve(args.draft),
                                   prompts_for(1, cfg.prompt_len, 256, text)[0], cfg.max_new_tokens, max(cfg.gammas))
        print(json.dumps(res))
        if args.out:
            with open(Path(args.out).with_name("hf_baseline.json"), "w") as f:
                json.dump(res | environment(target.device, target.dtype), f, indent=2)


def _fmt(x):
    return "none in range" if x is None else f"{x:.1f}"


def course_models(device=None) -> dict:
    """What a lesson runs on, chosen from the environment.

    The embedded trio (``tiny-code-target``, ``tiny-code-draft``, ``tiny-prose-draft``) and the
    shipped held-out samples, on ``device`` (default: CUDA when available). Set
    ``MINISPEC_TARGET`` and ``MINISPEC_DRAFT`` to local Hugging Face checkpoint directories
    sharing a tokenizer to run the lessons on real models instead (the prose draft then stays
    the embedded one, and only where the vocabularies match).
    """
    import os

    from minispec.load import load
    from minispec.train import sample_text

    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    name = os.environ.get("MINISPEC_TARGET", "tiny-code-target")
    target, tok = load(name, device=device)
    if tok is None:
        raise ValueError(f"{name} has no tokenizer files (tokenizer.json or "
                         "tokenizer_config.json); the lessons need one to encode text")
    draft, _ = load(os.environ.get("MINISPEC_DRAFT", "tiny-code-draft"), device=device, dtype=target.dtype)
    prose_draft, _ = load("tiny-prose-draft", device=device, dtype=target.dtype)
    return {"target": target, "draft": draft, "prose_draft": prose_draft, "tokenizer": tok, "device": device,
            "code": sample_text("code").decode("utf-8", "replace"), "prose": sample_text("prose").decode(),
            "embedded": "MINISPEC_TARGET" not in os.environ}
