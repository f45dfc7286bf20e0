"""The prepared GPU run: ceilings, an 8B step against tokens per step, achieved bandwidth at batch 1, the
synthetic-alpha gamma 4 curve from batch 1 to 256 beside the roofline, and compile with a budget of shapes;
with --lessons, it runs lesson notebooks instead and counts what Dynamo compiled in each.

    PYTHONPATH=. python3 scripts/gpu_bench.py --out results/h200                   # on the GPU
    PYTHONPATH=. python3 scripts/gpu_bench.py --out /tmp/x --small                 # the same code paths on a CPU
    PYTHONPATH=. python3 scripts/gpu_bench.py --out DIR --lessons lessons/01_*.ipynb --deadline 300

scripts/gpu_bench.sh runs the whole GPU check with both.
"""

import argparse
import json
import os
import re
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
COUNT_CELL = """import json as _json, sys as _sys
_utils = _sys.modules.get("torch._dynamo.utils")  # loaded only where something was compiled
print("MINISPEC_DYNAMO", _json.dumps({"graphs": _utils.counters["stats"]["unique_graphs"] if _utils else 0}))"""


def bench(args):
    """Sections 1-3 (module docstring); files under args.out as each section ends."""
    from minispec.course.models import SYNTHETIC_ALPHA
    from minispec.model.random import random_model
    from minispec.roofline import ModelShape, break_even_batch, compute_bound_batch, hardware, speculative_speedup
    from minispec.tools import bench
    from minispec.tools.steps import measure_step_time

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    device = "cuda" if torch.cuda.is_available() and not args.small else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    target_shape, draft_shape = ("tiny", "tiny-draft") if args.small else ("llama-8b", "llama-draft-2l")
    batches = (1, 2, 4) if args.small else (1, 8, 32, 64, 96, 128, 160, 192, 256)
    log = lambda *a: print(f"[{time.perf_counter() - start:6.1f}s]", *a, flush=True)  # noqa: E731

    hw = hardware.calibrate(device, dtype)
    log(f"{hw.name}: copy {hw.memory_bandwidth / 1e12:.3f} TB/s, matmul {hw.peak_flops / 1e12:.1f} TFLOP/s {dtype}, "
        f"ridge {hw.ridge:.0f} FLOP/byte")
    target = random_model(target_shape, device, dtype)
    draft = random_model(draft_shape, device, dtype, seed=1)
    shape, dshape = ModelShape.from_model(target), ModelShape.from_model(draft)
    preset = hardware.preset_for(device)  # the datasheet's ceilings, if this GPU has a preset
    log(f"target {target_shape}: {shape.params / 1e9:.2f}B params, draft {draft_shape}: {dshape.params / 1e9:.3f}B; "
        f"preset {preset.name if preset else None}")

    # 1. Step time of the target against tokens per step (batch 1 and 8), at 64 tokens of context. Eager.
    steps = []
    for B in (1,) if args.small else (1, 8):
        for T in (1, 2, 5) if args.small else (1, 2, 3, 4, 5, 8, 16, 32, 64):
            s = measure_step_time(target, B, T, context=64, repeats=10)
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
        "draft_step_ms_batch1": 1e3 * measure_step_time(draft, 1, 1, context=64, repeats=10),
        "torch": torch.__version__, "cuda": torch.version.cuda, "synthetic_alpha": SYNTHETIC_ALPHA,
    }
    summary["draft_cost_c_batch1"] = summary["draft_step_ms_batch1"] / summary["plain_decode_step_ms_batch1"]
    log(f"batch-1 decode reads the weights at {achieved / 1e12:.3f} TB/s = "
        f"{summary['achieved_fraction_of_copy_bandwidth']:.0%} of the measured copy bandwidth; "
        f"draft cost c = {summary['draft_cost_c_batch1']:.3f} (eager)")
    (out / "step_times.jsonl").write_text("".join(json.dumps(r) + "\n" for r in steps))

    # 2. Random weights never agree: the curve is timed at the course's stated synthetic alpha, gamma 4, eager.
    cfg = bench.BenchConfig(batches=batches, gammas=(4,), max_new_tokens=8 if args.small else 64,
                            prompt_len=16 if args.small else 64, repeats=1 if args.small else 2, warmup=1,
                            accept_rate=SYNTHETIC_ALPHA)
    rows_path = out / "sweep.jsonl"
    rows_path.unlink(missing_ok=True)
    rows = bench.sweep(target, draft, cfg, out=rows_path, progress=False)
    print(bench.format_table(rows), flush=True)
    ctx, a = cfg.prompt_len, SYNTHETIC_ALPHA  # each row's KV at the start; c follows from the draft's own shape
    modelled = {"measured ceilings": hw} | ({f"{preset.name} datasheet": preset} if preset else {})
    summary |= {
        "measured_break_even_batch": bench.break_even(rows),
        "modelled_break_even_batch": {k: break_even_batch(a, 4, hardware=h, model=shape, context=ctx, draft=dshape)
                                      for k, h in modelled.items()},
        "modelled_compute_bound_batch_measured_ceilings": compute_bound_batch(4, hw, shape, ctx),
        "modelled_speedup_by_batch": {k: {b: speculative_speedup(b, a, 4, hardware=h, model=shape, context=ctx,
                                                                  draft=dshape) for b in batches}
                                      for k, h in modelled.items()},
        "measured_speedup_by_batch": {r["batch_size"]: r["speedup"] for r in rows},
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    from minispec.course.plots import plot_speedup_vs_batch

    plot_speedup_vs_batch({f"roofline ({k})": list(v.items()) for k, v in summary["modelled_speedup_by_batch"].items()},
                          summary["modelled_compute_bound_batch_measured_ceilings"],
                          title=f"{target_shape}, synthetic alpha {a}, gamma 4, on {hw.name}",
                          measured={"measured": list(summary["measured_speedup_by_batch"].items())}
                          ).savefig(out / "speedup_vs_batch.png", dpi=120)
    log(f"break-even batch: measured {summary['measured_break_even_batch']}, modelled "
        f"{summary['modelled_break_even_batch']}")

    # 3. Compile with a budget of shapes: the draft, for the 2 step shapes timed here, counted by Dynamo; a third
    # shape must raise instead of running eagerly. On a CPU (--small) with Dynamo's eager backend: the same
    # tracing, guards and budget, without inductor's code generation.
    from torch._dynamo.exc import FailOnRecompileLimitHit
    from torch._dynamo.utils import counters

    eager_ms = {T: 1e3 * measure_step_time(draft, 1, T, context=64, repeats=10) for T in (1, 5)}
    graphs_before = counters["stats"]["unique_graphs"]
    draft.compile(recompile_limit=2, **(dict(mode=None, backend="eager") if device == "cpu" else {}))
    compiled_ms = {T: 1e3 * measure_step_time(draft, 1, T, context=64, repeats=10) for T in (1, 5)}
    compiled = {"backend": "eager" if device == "cpu" else "inductor, mode reduce-overhead (CUDA graphs)",
                "recompile_limit": 2, "graphs": counters["stats"]["unique_graphs"] - graphs_before,
                "eager_step_ms": eager_ms, "compiled_step_ms": compiled_ms}
    try:
        measure_step_time(draft, 1, 3, context=64, repeats=1)
        compiled["third_shape"] = "ran (the budget did not hold)"
    except FailOnRecompileLimitHit:
        compiled["third_shape"] = "refused: FailOnRecompileLimitHit"
    compiled["seconds"] = time.perf_counter() - start
    (out / "compile.json").write_text(json.dumps(compiled, indent=2) + "\n")
    log(f"compile: {compiled['graphs']} graphs for 2 shapes, third shape {compiled['third_shape']}; draft step "
        + ", ".join(f"T={T} eager {eager_ms[T]:.3f} ms, compiled {compiled_ms[T]:.3f} ms" for T in eager_ms))
    summary |= {"compile": compiled, "seconds": time.perf_counter() - start}
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    log("done")


def run_lesson(path: Path, out: Path, seconds: float) -> dict:
    """Execute one notebook (kernel cwd: its folder) within ``seconds``; the executed copy goes to out/NAME, saved
    after every cell, so a lesson cut short keeps the outputs it had. Counts what Dynamo compiled: graphs, from
    its counters (a cell appended to the lesson), and recompiles, from the TORCH_LOGS=recompiles lines."""
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellTimeoutError

    from minispec.course.site import kernel_manager_class

    nb = nbformat.read(path, as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell(COUNT_CELL))
    saved, end, t0 = out / path.name, time.monotonic() + seconds, time.perf_counter()
    client = NotebookClient(nb, kernel_name="python3", kernel_manager_class=kernel_manager_class(),
                            resources={"metadata": {"path": str(path.parent)}},
                            timeout_func=lambda cell: max(1, int(end - time.monotonic())),
                            on_cell_executed=lambda **_: nbformat.write(nb, saved))
    row = {"lesson": path.stem, "status": "ok"}
    try:
        client.execute()
    except Exception as e:  # the lesson's failure is this run's finding: record it, run the next lesson
        row["status"] = "timeout" if isinstance(e, CellTimeoutError) else "failed"
        row["error"] = f"{type(e).__name__}: {str(e)[-1500:]}"
    finally:
        nbformat.write(nb, saved)
    streams = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
               if o.get("output_type") == "stream"]
    text = "".join(o.get("text", "") for o in streams)
    found = re.search(r"MINISPEC_DYNAMO (\{.*\})", text)
    return row | {"seconds": round(time.perf_counter() - t0, 1),
                  "graphs_compiled": json.loads(found.group(1))["graphs"] if found else None,
                  "recompiles_logged": text.count("Recompiling function"),
                  "recompile_limit_hit": "hit config.recompile_limit" in text}


def lessons(args):
    """Each lesson in turn until the deadline; one JSON line per lesson in out/lessons.jsonl, as it ends."""
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    end = time.monotonic() + args.deadline
    for name in args.lessons:
        left = min(end - time.monotonic(), args.lesson_timeout)
        try:
            row = ({"lesson": Path(name).stem, "status": "skipped: no time left"} if left < 10 else
                   run_lesson(Path(name).resolve(), out, left))
        except Exception as e:  # no such notebook, no kernel: say so and go on
            row = {"lesson": Path(name).stem, "status": "failed", "error": f"{type(e).__name__}: {e}"}
        print(json.dumps(row), flush=True)
        with open(out / "lessons.jsonl", "a") as f:
            f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--small", action="store_true", help="tiny shapes on the CPU, to check the script")
    p.add_argument("--lessons", nargs="+", metavar="NOTEBOOK", help="run these notebooks instead of the benchmark")
    p.add_argument("--deadline", type=float, default=540, help="seconds for all the --lessons together")
    p.add_argument("--lesson-timeout", type=float, default=300, help="seconds for one lesson at most")
    args = p.parse_args()
    if args.lessons:
        lessons(args)
    else:
        bench(args)
