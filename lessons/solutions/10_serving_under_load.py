"""Worked solutions to the exercises of lesson 10, the simulator matched to an engine and asked about the H100.

Run from the repository root: ``python lessons/solutions/10_serving_under_load.py``.
Every number a solution claims is asserted. The simulator is arithmetic on the roofline with seeded coins: nothing
is timed, and the same seed gives the same numbers.
"""

import math
from dataclasses import replace

import numpy as np

from minispec import roofline, serving
from minispec.course import goodput
from minispec.roofline import LLAMA_1B, hardware
from minispec.serving import Lengths, incidents

FULL = serving.RooflineSteps(draft=LLAMA_1B)  # 8B target on an H100, 1B draft with its full KV, every KV read
# The lesson's traffic (prompts and outputs of 64-192 tokens) and steady-state window, SLOs and seeds
WORKLOAD = serving.Workload(mix=(serving.Traffic(prompt=Lengths(128, "uniform"), output=Lengths(128, "uniform")),))
STEADY, SEEDS = goodput.Window(warmup_s=2, measure_s=8, tail_s=2), range(5)
RATES, TTFT_SLO_S, TPOT_SLO_S = (40, 80, 120, 160), 1.0, 0.008


def exercise_1():
    """The gated policy drafts less as the batch grows, and stops where no gamma beats plain decoding."""
    print("Exercise 1: the gated policy's gamma against the rate")
    policy = FULL.policy(alpha0=0.8, gamma_max=4)
    mean = {}
    for rate in RATES:
        run = goodput.serve(rate, FULL, policy, WORKLOAD, STEADY)  # steady state, as in the lesson
        s = run.summary(TPOT_SLO_S, TTFT_SLO_S)
        mean[rate] = s["mean_gamma"]
        print(f"  {rate} requests/s: {s['mean_batch']:.0f} rows on average, mean gamma {s['mean_gamma']:.2f}")
    assert all(mean[a] > mean[b] for a, b in zip(RATES, RATES[1:]))  # falls with the rate
    fresh = FULL.policy(alpha0=0.8, gamma_max=4)
    at640 = min(fresh.choose(B, 640) for B in range(1, 2001, 7))
    zero = next(B for B in range(1, 2000) if fresh.choose(B, 192) == 0)  # rows of 192 tokens: where it stops
    be = {g: roofline.break_even_batch(0.8, g, draft=LLAMA_1B, context=192) for g in (1, 4)}
    print(f"  at 640 tokens of context the policy keeps drafting (gamma >= {at640}) up to 2,000 rows: a 1-token draft "
          f"never breaks even there ({roofline.break_even_batch(0.8, 1, draft=LLAMA_1B, context=640)})")
    print(f"  at 192 tokens it drafts nothing from {zero} rows; gamma 1 breaks even at {be[1]:.0f}, "
          f"gamma 4 at {be[4]:.0f}")
    assert at640 >= 1 and roofline.break_even_batch(0.8, 1, draft=LLAMA_1B, context=640) == math.inf
    assert be[4] < be[1] <= zero < be[1] + 25
    print("  The policy picks the gamma the roofline rates fastest at the running batch and context. As the batch")
    print("  grows, verification turns compute-bound and long drafts cost more than they yield, so it shortens them;")
    print("  it stops only where even one draft token costs more than it brings. With long contexts that never comes:")
    print("  the target's KV read grows with every row and keeps the step memory-bound (MagicDec's point).")


def exercise_2():
    """A fixed cost per forward pass: the speculative step pays it gamma + 1 times, the plain step once."""
    print("Exercise 2: a fixed cost per forward pass, for one request alone on the H100")
    alone = [serving.Request(0.0, 128, 1024)]
    ratio = lambda o: (serving.simulate(alone, replace(FULL, pass_overhead_s=o), 0).requests[0].tpot_s  # noqa: E731
                       / serving.simulate(alone, replace(FULL, pass_overhead_s=o), 4).requests[0].tpot_s)
    lo, hi = 0.0, 0.02
    for _ in range(16):  # off / gamma 4 falls as the overhead grows: bisect for 1 (to 0.3 us)
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if ratio(mid) > 1 else (lo, mid)
    print(f"  gamma 4 stops paying alone at {1e3 * lo:.1f} ms per pass (the roofline's plain step: "
          f"{1e3 * FULL.plain(np.array([700])):.1f} ms); at half that it is {ratio(lo / 2):.2f}x")
    assert ratio(0.8 * lo) > 1 > ratio(1.2 * lo) and 2e-3 < lo < 20e-3
    smol = incidents.replay("vllm#15025")
    fit, step = smol["fit: s per forward pass, 1 prompts"], smol["target's roofline step at 1 rows, s"]
    print(f"  vllm#15025 (SmolLM2-1.7B, 135M draft, K = 5): the replay fits {1e3 * fit:.1f} ms per pass for one prompt "
          f"to the published 30 % slowdown; the target's whole roofline step is {1e3 * step:.1f} ms")
    assert abs(smol["K=5 over no speculation"] - 0.7) < 0.01 and fit > 2 * step
    print("  A few ms per pass is all it takes, and a small model's pass is launch-bound: SmolLM2-135M's 30 layers")
    print("  launch more kernels than the 1.7B target's 24, so without CUDA graphs its c is near 1, not 0.08.")


def exercise_3():
    """The H200's bandwidth or its memory: which buys plain decoding its goodput here."""
    print("Exercise 3: the H200's bandwidth alone, its memory alone (plain decoding, TPOT <= 8 ms, TTFT <= 1 s,")
    print("  goodput bisected per seed in steady state, as in the lesson, over three of its five seeds)")
    h100, h200 = hardware.H100_SXM, hardware.H200
    variants = {"H100": h100, "H100 + H200's bandwidth": replace(h100, memory_bandwidth=h200.memory_bandwidth),
                "H100 + H200's memory": replace(h100, memory_bytes=h200.memory_bytes), "H200": h200}
    brackets = {"H100": (50, 100), "H100 + H200's bandwidth": (150, 190), "H100 + H200's memory": (50, 100),
                "H200": (150, 190)}
    found = {}
    for name, hw in variants.items():
        rates, seen = goodput.seeds_goodput(replace(FULL, hardware=hw), 0, WORKLOAD, STEADY, SEEDS[:3],
                                            *brackets[name], 5, TPOT_SLO_S, TTFT_SLO_S, workers=2)
        assert all(goodput.bracketed(s) for s in seen)
        found[name] = goodput.spread(rates)
        mean, low, high = found[name]
        print(f"  {name:>24}: goodput {mean:.0f} requests/s (3 seeds: {low:.0f}-{high:.0f})")
    busiest = goodput.serve(brackets["H100"][1], FULL, 0, WORKLOAD, STEADY)
    assert busiest.preemptions == 0  # the H100 past its goodput: blocks never ran out
    assert found["H100 + H200's bandwidth"] == found["H200"] and found["H100"] == found["H100 + H200's memory"]
    assert found["H200"][0] > 2 * found["H100"][0]
    print("  On this traffic the H100 never runs out of blocks (KV is allocated as rows grow), so more memory")
    print("  changes nothing; the bandwidth makes every step's weight and KV read cheaper, and that is all of it.")
    print("  Longer contexts or more rows would make memory matter: blocks run out, and the youngest request is")
    weights = roofline.LLAMA_8B.weight_bytes / 1e9
    print(f"  preempted and recomputed (lesson 13). The 8B's weights are {weights:.0f} GB of the H100's "
          f"{h100.memory_bytes / 1e9:.0f}.")
    assert math.isclose(h200.peak_flops, h100.peak_flops)


if __name__ == "__main__":
    exercise_1()
    exercise_2()
    exercise_3()
