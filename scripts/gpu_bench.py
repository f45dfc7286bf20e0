"""The prepared GPU run: ceilings, an 8B step against tokens per step, achieved bandwidth at
batch 1, and the synthetic alpha = 0.8, gamma = 4 curve from batch 1 to 256 beside the roofline.

    PYTHONPATH=. python3 scripts/gpu_bench.py --out results/h200          # on the GPU
    PYTHONPATH=. python3 scripts/gpu_bench.py --out /tmp/x --small        # the same code paths on a CPU
"""

import argparse
import json
import time
from pathlib import Path

import torch

from minispec import bench, hardware
from minispec.roofline import ModelShape, break_even_batch, compute_bound_batch, speculative_speedup

p = argparse.ArgumentParser()
p.add_argument("--out", required=True)
p.add_argument("--small", action="store_true", help="tiny shapes on the CPU, to check the script")
args = p.parse_args()
out = Path(args.out)
out.mkdir(parents=True, exist_ok=True)
start = time.perf_counter()
device = "cuda" if torch.cuda.is_available() and not args.small else "cpu"
dtype = torch.bfloat16 if device == "cuda" else torch.float32
target_shape, draft_shape = ("tiny", "tiny-draft") if args.small else ("llama-8b", "llama-draft-2l")
batches = (1, 2, 4) if args.small else (1, 2, 4, 8, 16, 32, 64, 128, 192, 256)
log = lambda *a: print(f"[{time.perf_counter() - start:6.1f}s]", *a, flush=True)  # noqa: E731

hw = hardware.calibrate(device, dtype)
log(f"{hw.name}: copy {hw.memory_bandwidth / 1e12:.3f} TB/s, matmul {hw.peak_flops / 1e12:.1f} TFLOP/s {dtype}, "
    f"ridge {hw.ridge:.0f} FLOP/byte")
target = bench.random_model(target_shape, device, dtype)
draft = bench.random_model(draft_shape, device, dtype, seed=1)
shape, dshape = ModelShape.from_model(target), ModelShape.from_model(draft)
preset = hardware.preset_for(device)  # the datasheet's ceilings, if this GPU has a preset
log(f"target {target_shape}: {shape.params / 1e9:.2f}B params, draft {draft_shape}: {dshape.params / 1e9:.3f}B; "
    f"preset {preset.name if preset else None}")

# 1. Step time of the target against tokens per step (batch 1 and 8), at 64 tokens of context.
steps = []
for B in (1,) if args.small else (1, 8):
    for T in (1, 2, 5) if args.small else (1, 2, 3, 4, 5, 8, 16, 32, 64):
        s = bench.measure_step_time(target, B, T, context=64, repeats=10)
        steps.append({"batch_size": B, "tokens_per_row": T, "step_ms": 1e3 * s})
        log(f"target step B={B} T={T}: {1e3 * s:.3f} ms")
decode_s = next(r["step_ms"] for r in steps if r["batch_size"] == 1 and r["tokens_per_row"] == 1) / 1e3
achieved = shape.weight_bytes / decode_s
summary = {
    "hardware": hw.name, "measured_copy_bandwidth_Bps": hw.memory_bandwidth, "measured_matmul_flops": hw.peak_flops,
    "target": target_shape, "draft": draft_shape, "target_params": shape.params, "dtype": str(dtype),
    "plain_decode_step_ms_batch1": 1e3 * decode_s,
    "achieved_weight_bandwidth_Bps_batch1": achieved,
    "achieved_fraction_of_copy_bandwidth": achieved / hw.memory_bandwidth,
    "draft_step_ms_batch1": 1e3 * bench.measure_step_time(draft, 1, 1, context=64, repeats=10),
    "torch": torch.__version__, "cuda": torch.version.cuda,
}
summary["draft_cost_c_batch1"] = summary["draft_step_ms_batch1"] / summary["plain_decode_step_ms_batch1"]
log(f"batch-1 decode reads the weights at {achieved / 1e12:.3f} TB/s = "
    f"{summary['achieved_fraction_of_copy_bandwidth']:.0%} of the measured copy bandwidth; "
    f"draft cost c = {summary['draft_cost_c_batch1']:.3f}")
(out / "step_times.jsonl").write_text("".join(json.dumps(r) + "\n" for r in steps))

# 2. The synthetic alpha = 0.8, gamma = 4 curve, measured, beside the roofline for this device.
cfg = bench.BenchConfig(batches=batches, gammas=(4,), max_new_tokens=8 if args.small else 64,
                        prompt_len=16 if args.small else 64, repeats=1 if args.small else 2, warmup=1, accept_rate=0.8)
rows_path = out / "sweep.jsonl"
rows_path.unlink(missing_ok=True)
rows = bench.sweep(target, draft, cfg, out=rows_path, progress=False)
print(bench.format_table(rows), flush=True)
ctx = cfg.prompt_len  # each row's KV at the start; c follows from the draft's own shape at each batch
modelled = {"measured ceilings": hw} | ({f"{preset.name} datasheet": preset} if preset else {})
summary |= {
    "measured_break_even_batch": bench.break_even(rows),
    "modelled_break_even_batch": {k: break_even_batch(0.8, 4, hardware=h, model=shape, context=ctx, draft=dshape)
                                  for k, h in modelled.items()},
    "modelled_compute_bound_batch_measured_ceilings": compute_bound_batch(4, hw, shape, ctx),
    "modelled_speedup_by_batch": {k: {b: speculative_speedup(b, 0.8, 4, hardware=h, model=shape, context=ctx,
                                                              draft=dshape) for b in batches}
                                  for k, h in modelled.items()},
    "measured_speedup_by_batch": {r["batch_size"]: r["speedup"] for r in rows},
    "seconds": time.perf_counter() - start,
}
(out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
from minispec.plots import plot_speedup_vs_batch  # noqa: E402

plot_speedup_vs_batch({f"roofline ({k})": list(v.items()) for k, v in summary["modelled_speedup_by_batch"].items()},
                      summary["modelled_compute_bound_batch_measured_ceilings"],
                      title=f"{target_shape}, synthetic alpha 0.8, gamma 4, on {hw.name}",
                      measured={"measured": list(summary["measured_speedup_by_batch"].items())}
                      ).savefig(out / "speedup_vs_batch.png", dpi=120)
log(f"break-even batch: measured {summary['measured_break_even_batch']}, modelled "
    f"{summary['modelled_break_even_batch']}; done")
