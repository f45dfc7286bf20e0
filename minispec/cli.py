"""The ``minispec`` command: demo, generate, bench, roofline, train."""

from __future__ import annotations

import argparse
import dataclasses
import math
import statistics
import sys


def _demo(args) -> None:
    """Plain against speculative decoding on the embedded pair, then a short batch sweep."""
    import torch

    import minispec
    from minispec.bench import BenchConfig, bench_point, break_even, calibrate, draft_cost, prompts_for
    from minispec.roofline import leviathan_speedup
    from minispec.train import sample_text

    torch.manual_seed(0)
    target, tok = minispec.load("tiny-code-target", device=args.device)
    draft, _ = minispec.load("tiny-code-draft", device=args.device)
    code = sample_text("code")
    prompt = tok.encode(args.prompt) if args.prompt else list(code[: args.prompt_len])
    kw = dict(max_new_tokens=args.max_new_tokens, temperature=args.temperature, seed=0)
    runs = []
    for i in range(1 + args.repeats):  # the first pair of runs warms up
        pair = (minispec.generate(target, [prompt], **kw),
                minispec.speculative_generate(target, draft, [prompt], gamma=args.gamma, **kw))
        runs += [pair] if i else []
    plain, spec = runs[-1]
    if args.temperature == 0:
        assert plain.tokens == spec.tokens, "greedy speculative output must equal plain output"

    med = lambda j, f: statistics.median(f(r[j].stats) for r in runs)  # noqa: E731
    print(f"minispec demo: {target.config.num_parameters / 1e6:.2f}M-parameter target, "
          f"{draft.config.num_parameters / 1e6:.2f}M draft, batch 1, gamma {args.gamma}, "
          f"temperature {args.temperature}, {args.max_new_tokens} new tokens, {target.device}, "
          f"median of {args.repeats} runs\n")
    rows = [("output tokens/s", lambda s: s.output_throughput, "{:.0f}"),
            ("TTFT ms", lambda s: 1e3 * s.ttft_s, "{:.2f}"),
            ("TPOT p50 ms", lambda s: 1e3 * s.tpot_p50_s, "{:.2f}"),
            ("TPOT p99 ms", lambda s: 1e3 * s.tpot_p99_s, "{:.2f}")]
    print(f"{'':24}{'plain':>12}{'speculative':>14}")
    for name, f, fmt in rows:
        print(f"{name:24}{fmt.format(med(0, f)):>12}{fmt.format(med(1, f)):>14}")
    s = spec.stats
    print(f"{'acceptance rate':24}{'':>12}{s.acceptance_rate:>14.2f}")
    print(f"{'mean acceptance length':24}{'':>12}{s.mean_acceptance_length:>14.2f}")
    print(f"{'per-position acceptance':24}{'':>12}  " + " ".join(f"{r:.2f}" for r in s.per_position_acceptance_rates))
    for phase in ("prefill", "draft_prefill", "decode", "draft", "verify", "accept"):
        p = [r[0].stats.phase_s.get(phase) for r in runs], [r[1].stats.phase_s.get(phase) for r in runs]
        cells = [f"{1e3 * statistics.median(v):.1f}" if v[0] is not None else "" for v in p]
        print(f"{'time in ' + phase + ' ms':24}{cells[0]:>12}{cells[1]:>14}")

    speedup = med(1, lambda s: s.output_throughput) / med(0, lambda s: s.output_throughput)
    c = statistics.median(draft_cost(p.stats, q.stats) for p, q in runs)
    alpha = s.alpha_estimate
    predicted = leviathan_speedup(alpha, args.gamma, c)
    print(f"\nmeasured speedup: {speedup:.2f}x")
    print(f"Leviathan et al.: (1 - alpha^(gamma+1)) / ((1 - alpha)(gamma c + 1)) with measured alpha = {alpha:.2f}"
          f" and c = {c:.3f} (draft pass / plain decode step, both timed in the loops) predicts {predicted:.2f}x;"
          f" measured / predicted = {speedup / predicted:.2f}")

    print("\ngenerated text (accepted draft tokens " + ("in green" if sys.stdout.isatty() else "between «»") + "):\n")
    print(tok.decode(prompt), end="")
    print(_marked(tok, spec.tokens[0], spec.accepted[0], sys.stdout.isatty()) + "\n")

    if args.batches:
        batches = tuple(int(b) for b in args.batches.split(","))
        cfg = BenchConfig(batches=batches, gammas=(args.gamma,), max_new_tokens=min(48, args.max_new_tokens),
                          prompt_len=args.prompt_len, repeats=1, warmup=1)
        hw = calibrate(str(target.device), target.dtype)
        print(f"batch sweep (greedy, {cfg.max_new_tokens} new tokens per row): where speculation stops paying here")
        print(f"{'batch':>6}{'plain tok/s':>13}{'spec tok/s':>12}{'speedup':>9}{'c':>7}{'verify/decode':>15}")
        rows = []
        for b in batches:
            r = bench_point(target, draft, prompts_for(b, cfg.prompt_len, 256, code), args.gamma, 0.0, cfg, hw)
            rows.append(r)
            print(f"{b:>6}{r['plain_output_throughput']:>13.0f}{r['output_throughput']:>12.0f}{r['speedup']:>8.2f}x"
                  f"{r['draft_cost_c']:>7.3f}{r['verify_to_decode_step_ratio']:>15.2f}")
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

    target, tok = minispec.load(args.model, device=args.device)
    if tok is None:
        raise SystemExit(f"{args.model} has no tokenizer files; cannot encode a text prompt")
    kw = dict(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
              seed=args.seed, eos_token_id=tok.eos_token_id)
    prompt = tok.encode(args.prompt)
    if args.draft:
        draft, _ = minispec.load(args.draft, device=args.device, dtype=target.dtype)
        res = minispec.speculative_generate(target, draft, [prompt], gamma=args.gamma, **kw)
    else:
        res = minispec.generate(target, [prompt], **kw)
    print(args.prompt + tok.decode(res.tokens[0]))
    print(res.stats.to_dict(), file=sys.stderr)


# --- roofline ---------------------------------------------------------------------------------

def _roofline_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``minispec roofline``; the defaults are the reference model."""
    from minispec.hardware import HARDWARE
    from minispec.roofline import LLAMA_8B

    parser.add_argument("--hardware", choices=sorted(HARDWARE), default="h100", help="accelerator (default h100)")
    parser.add_argument("--params", type=float, default=LLAMA_8B.params, help="target parameters (default 8e9)")
    parser.add_argument("--bytes-per-param", type=float, default=2, help="2 = BF16 (default)")
    parser.add_argument("--kv-bytes-per-token", type=float, default=LLAMA_8B.kv_bytes_per_token,
                        help="KV-cache bytes per token, all layers (default 131072, Llama-3-8B in BF16)")
    parser.add_argument("--alpha", type=float, default=0.8, help="acceptance rate (default 0.8)")
    parser.add_argument("--gamma", type=int, default=4, help="draft tokens per step (default 4)")
    parser.add_argument("--c", type=float, default=0.05, help="draft step cost / target step cost (default 0.05)")
    parser.add_argument("--context", type=int, default=0, help="tokens in each row's KV cache (default 0)")
    parser.add_argument("--batches", default="1,2,4,8,16,32,64,128,256", help="comma-separated batch sizes")
    parser.add_argument("--plot", metavar="FILE", help="also save speedup against batch to FILE (e.g. .png)")


def _roofline(args: argparse.Namespace) -> None:
    """Print the speedup table, compute-bound and break-even batches; optionally save a plot."""
    from minispec.hardware import HARDWARE
    from minispec.roofline import (
        ModelShape,
        break_even_batch,
        compute_bound_batch,
        expected_tokens,
        speculative_speedup,
        speedup_table,
    )

    hw = HARDWARE[args.hardware]
    model = ModelShape.from_params(args.params, args.bytes_per_param)
    model = dataclasses.replace(model, kv_bytes_per_token=args.kv_bytes_per_token)
    kw = dict(alpha=args.alpha, gamma=args.gamma, draft_cost=args.c, hardware=hw, model=model, context=args.context)
    batches = [int(b) for b in args.batches.split(",")]
    print(f"{hw.name}: {hw.memory_bandwidth / 1e12:.3g} TB/s, {hw.peak_flops / 1e12:.4g} TFLOP/s, "
          f"ridge {hw.ridge:.0f} FLOP/byte; target {model.params / 1e9:.3g}B params x {model.bytes_per_param:g} B; "
          f"alpha {args.alpha}, gamma {args.gamma}, c {args.c}, context {args.context}; "
          f"E = {expected_tokens(args.alpha, args.gamma):.2f} tokens/row/step")
    print(f"{'batch':>6} {'plain ms':>9} {'spec ms':>9} {'tokens/step':>12} {'speedup':>8}")
    for row in speedup_table(batches, **kw):
        print(f"{row['batch']:>6} {row['plain_ms']:>9.3f} {row['speculative_ms']:>9.3f} "
              f"{row['tokens_per_step']:>12.1f} {row['speedup']:>7.2f}x")
    cb = compute_bound_batch(args.gamma, hw, model, args.context)
    print(f"verification ({args.gamma + 1} tokens/row) turns compute-bound at batch {cb:.1f}")
    print(f"break-even (speedup 1.0) at batch {break_even_batch(**kw):.1f}")
    if args.plot:
        from minispec.plots import plot_speedup_vs_batch

        grid = [2 ** (i / 8) for i in range(8 * math.ceil(math.log2(max(batches))) + 1)]
        curve = [(B, speculative_speedup(B, **kw)) for B in grid]
        label = f"alpha {args.alpha}, gamma {args.gamma}, c {args.c}, context {args.context}"
        plot_speedup_vs_batch({label: curve}, cb, title=f"{model.name} on {hw.name}").savefig(args.plot, dpi=150)
        print(f"saved {args.plot}")


def _train(args) -> None:
    from minispec.train import train

    record = train(args.name, args.out, prose_file=args.prose_file, stop_after=args.stop_after)
    print(f"{args.name}: held-out loss {record['heldout_loss']:.4f} nats/byte after {record['steps']} steps "
          f"({record['seconds']:.0f} s); checkpoint in {args.out}")


def build_parser() -> argparse.ArgumentParser:
    from minispec import bench

    parser = argparse.ArgumentParser(prog="minispec", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("demo", help="plain vs speculative decoding on the embedded pair, and a batch sweep")
    p.add_argument("--gamma", type=int, default=4)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--prompt", default=None, help="text to continue (default: held-out standard-library code)")
    p.add_argument("--prompt-len", type=int, default=64, help="bytes of held-out code used as the prompt")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--batches", default="1,2,4,8,16,32,64", help="the sweep's batch sizes ('' to skip it)")
    p.add_argument("--device", default="cpu")
    p.set_defaults(func=_demo)

    p = sub.add_parser("generate", help="continue a prompt, plainly or speculatively")
    p.add_argument("prompt")
    p.add_argument("--model", default="tiny-code-target")
    p.add_argument("--draft", default=None, help="a draft model for speculative decoding")
    p.add_argument("--gamma", default=4, type=lambda s: s if s == "auto" else int(s))
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--device", default="cpu")
    p.set_defaults(func=_generate)

    p = sub.add_parser("bench", help="measured vs modelled speedup across batch sizes (JSONL rows)")
    bench.add_cli_arguments(p)
    p.set_defaults(func=bench.cli_main)

    p = sub.add_parser("roofline", help="the roofline model's speedup table (reference: 8B on an H100)")
    _roofline_arguments(p)
    p.set_defaults(func=_roofline)

    p = sub.add_parser("train", help="train an embedded byte-level model from offline corpora")
    p.add_argument("name", help="tiny-code-target, tiny-code-draft or tiny-prose-draft")
    p.add_argument("--out", required=True, help="checkpoint directory to write")
    p.add_argument("--prose-file", default=None, help="output of: bible -f 'Gen1:1-Rev22:21' (Debian's bible-kjv)")
    p.add_argument("--stop-after", type=int, default=None, help="stop at this step, keeping the full schedule")
    p.set_defaults(func=_train)
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
