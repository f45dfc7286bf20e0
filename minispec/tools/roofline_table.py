"""``minispec roofline``: its flags (the defaults are the reference, an 8B target on an H100) and its table: the
roofline model's speedup by batch, the memory limit, the compute-bound and break-even batches, or vLLM's config."""

from __future__ import annotations

import dataclasses
import json
import math

from minispec.course.plots import plot_or_skip, plot_skipped, plot_speedup_vs_batch


def add_arguments(parser) -> None:
    """Flags of ``minispec roofline``; the defaults are the reference model."""
    from minispec.roofline import MODEL_SHAPES
    from minispec.roofline.hardware import HARDWARE

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


def from_args(args) -> None:
    """Print the speedup table, memory limit, compute-bound and break-even batches; or vLLM's config."""
    from minispec.roofline import (
        MODEL_SHAPES,
        break_even_batch,
        compute_bound_batch,
        expected_tokens,
        max_batch,
        quantized,
        speculative_speedup,
        speedup_table,
        vllm_speculative_config,
    )
    from minispec.roofline.hardware import HARDWARE

    plot = None if args.vllm else plot_or_skip(args.plot)
    hw = HARDWARE[args.hardware]
    model = MODEL_SHAPES[args.target_shape]
    model = dataclasses.replace(model if args.weight_bits == 16 else quantized(model, args.weight_bits),
                                params=args.params or model.params, bytes_per_kv=args.kv_bits / 8)
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
    plot_skipped(args.plot, plot)
    if plot:
        grid = [2 ** (i / 8) for i in range(8 * math.ceil(math.log2(max(batches))) + 1)]
        curve = [(B, speculative_speedup(B, **kw)) for B in grid]
        label = f"alpha {args.alpha}, gamma {args.gamma}, {drafter}, context {args.context}"
        fig = plot_speedup_vs_batch({label: curve}, cb, title=f"{model.name} on {hw.name}", max_batch=fits)
        fig.savefig(plot, dpi=150)
        print(f"saved {plot}")
