"""The cost of one draw at V = 131,072 and B = 64 on this machine: minispec's sampler before and after
the Philox/inverse-CDF change, against torch.multinomial and an exponential race on torch's generator.

    python scripts/sampler_bench.py [--before PACKAGE_ROOT] [--out results/cpu/sampler.json]

``--before`` points at a checkout of the previous sampler (``git worktree add /tmp/before 782791b``);
its ``sampling.py`` is loaded by path. Each figure is the median of 7 timed calls after 2 warm-up calls,
all in one run (so they share the machine's load). Half the weights are zero (as after top-p).
"""

import argparse
import importlib.util
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

from minispec.decoding import sampling


def median_ms(fn, repeats=7, warmup=2):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return 1e3 * statistics.median(times)


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
        spec = importlib.util.spec_from_file_location("before", Path(args.before) / "minispec" / "sampling.py")
        old = importlib.util.module_from_spec(spec)
        sys.modules["before"] = old  # dataclasses look their module up
        spec.loader.exec_module(old)
        old_keys = old.keys_at(old.row_keys(old.row_seeds(0, B), "cpu"), old.TARGET, pos)
        rows["minispec before (hash uniforms, float32 exponential race over V)"] = lambda: old.sample(w, old_keys)
    result = {"batch": B, "vocab": V, "threads": torch.get_num_threads(), "torch": torch.__version__,
              "machine": platform.processor() or platform.machine(),
              "ms_per_draw": {name: round(median_ms(fn), 2) for name, fn in rows.items()}}
    print(json.dumps(result, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
