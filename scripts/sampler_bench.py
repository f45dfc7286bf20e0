"""The cost of one draw at V = 131,072 and B = 64 on this machine: minispec's sampler before and after
the Philox/inverse-CDF change, against torch.multinomial and an exponential race on torch's generator.

    python scripts/sampler_bench.py [--before PACKAGE_ROOT] [--out results/cpu/sampler.json]

``--before`` points at a checkout of an earlier sampler (``git worktree add /tmp/before <commit>``); its
``minispec/decoding/sampling.py`` (or, before the layers, ``minispec/sampling.py``) is loaded by path: one with
Philox ``uniforms`` draws with the same uniforms as this one (commit 782791b's hash-and-race sampler is timed its
own way). Each figure is the median of 7 timed calls after 2 warm-up calls, all in one run, the calls taking
turns (so they share the machine's load). Half the weights are zero (as after top-p).
"""

import argparse
import importlib.util
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

from minispec.decoding import sampling


def median_ms(fns: dict, repeats=7, warmup=2) -> dict:
    """Median milliseconds per call of each function; the timed calls take turns (one of each per round), so a
    change in the machine's load falls on all of them alike."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t)
    return {name: round(1e3 * statistics.median(ts), 2) for name, ts in times.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", help="root of a checkout with the previous sampling.py")
    ap.add_argument("--out", help="write the JSON here too")
    args = ap.parse_args()
    B, V = 64, 131_072
    g = torch.Generator().manual_seed(0)
    w = torch.rand(B, V, generator=g)  # (B, V)
    w[:, V // 2:] = 0
    p = w / w.sum(-1, keepdim=True)  # (B, V)
    keys, pos = sampling.row_keys(list(range(B))), torch.zeros(B, dtype=torch.long)
    rows = {
        "minispec (Philox4x32-10 uniform per row, float64 inverse CDF)":
            lambda: sampling.sample(w, sampling.uniforms(keys, sampling.TARGET, pos, 1)[:, 0]),
        "torch.multinomial": lambda: torch.multinomial(p, 1, generator=g),
        "exponential race, torch generator (float32)":
            lambda: (p / torch.empty_like(p).exponential_(generator=g)).argmax(-1),
    }
    if args.before:
        root = Path(args.before) / "minispec"
        path = next(f for f in (root / "decoding" / "sampling.py", root / "sampling.py") if f.exists())
        spec = importlib.util.spec_from_file_location("before", path)
        old = importlib.util.module_from_spec(spec)
        sys.modules["before"] = old  # dataclasses look their module up
        spec.loader.exec_module(old)
        if hasattr(old, "uniforms"):
            rows[f"minispec before ({args.before})"] = \
                lambda: old.sample(w, old.uniforms(keys, old.TARGET, pos, 1)[:, 0])
        else:
            old_keys = old.keys_at(old.row_keys(old.row_seeds(0, B), "cpu"), old.TARGET, pos)
            rows["minispec before (hash uniforms, float32 exponential race over V)"] = lambda: old.sample(w, old_keys)
    result = {"batch": B, "vocab": V, "threads": torch.get_num_threads(), "torch": torch.__version__,
              "machine": platform.processor() or platform.machine(),
              "load_average": os.getloadavg()[0], "ms_per_draw": median_ms(rows)}
    print(json.dumps(result, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
