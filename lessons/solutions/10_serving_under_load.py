"""Worked solutions to the exercises of lesson 10, serving under load.

Run from the repository root: ``python lessons/solutions/10_serving_under_load.py``.
Every number a solution claims is asserted. The simulator is pure arithmetic on the roofline: nothing is timed,
and the same seed gives the same numbers.
"""

import math
from dataclasses import replace

import numpy as np

from minispec import roofline, serving
from minispec.roofline import LLAMA_1B, LLAMA_8B, hardware

WORKLOAD = serving.Workload(duration_s=25)  # the lesson's traffic: 128-token prompts, 512..1536 output tokens
FULL = serving.RooflineSteps(draft=LLAMA_1B)  # 8B target, 1B draft with its full KV, every KV read counted
E = roofline.expected_tokens(0.8, 4)  # 3.36 tokens per row per speculative step


def queue_limit(steps, rates) -> float:
    """The highest of ``rates`` at which fixed gamma 4's p99 TTFT stays under 1 s."""
    ok = [r for r in rates if serving.simulate(serving.poisson_requests(replace(WORKLOAD, rate=r)), steps, 4)
          .summary(math.inf)["ttft_p99_s"] < 1.0]
    return max(ok)


def exercise_1():
    """An H200 on the whole model: more bandwidth speeds every step, more memory holds more rows."""
    print("Exercise 1: fixed gamma 4, 1B draft with its KV, on an H100 and an H200")
    h100, h200 = hardware.H100_SXM, hardware.H200
    variants = {"H100": h100, "H100 + H200's bandwidth": replace(h100, memory_bandwidth=h200.memory_bandwidth),
                "H100 + H200's memory": replace(h100, memory_bytes=h200.memory_bytes), "H200": h200}
    rates = [22, 24, 26, 28, 30, 32, 34, 36, 38, 40, 42, 44]  # requests/s
    limit, rows = {}, {}
    for name, hw in variants.items():
        steps = replace(FULL, hardware=hw)
        rows[name] = steps.kv_budget(draft=True) / (128 + 1024)  # rows whose reservations fit
        limit[name] = queue_limit(steps, rates)
        print(f"  {name:>24}: {rows[name]:4.0f} rows fit; p99 TTFT under 1 s up to {limit[name]} requests/s")
    gain = limit["H200"] / limit["H100"]
    assert gain >= 1.4 and rows["H200"] > 2 * rows["H100"]
    assert limit["H100"] < limit["H100 + H200's bandwidth"] < limit["H100 + H200's memory"] < limit["H200"]
    print("  Both help, memory more: the bandwidth shortens every step (weights and KV alike), but the memory lets")
    print(f"  the batch grow past the {rows['H100']:.0f} rows whose reservations fit in an H100, and the queue forms")
    print(f"  where the rows run out. Reading KV keeps even large batches memory-bound, so the H200 serves {gain:.2f}x")
    print("  the rate here: bandwidth and memory each buy part of it, and neither alone buys all.")


def exercise_2():
    """A window of draft KV: break-even at 640 and 2,048 tokens, and the rows that fit, by window."""
    print("Exercise 2: the draft's KV window")
    h100, out = hardware.H100_SXM, {}
    for window in (None, 64, 128, 256, 512, 1024, 2048):
        be = [roofline.break_even_batch(0.8, 4, draft=LLAMA_1B, context=n, draft_kv_window=window) for n in (640, 2048)]
        fit = roofline.max_batch(h100, LLAMA_8B, 128 + 1024, LLAMA_1B, draft_kv_window=window)  # rows of this traffic
        out[window] = (*be, fit)
        print(f"  window {str(window):>4}: break-even at 640 tokens {be[0]:5.0f}, at 2,048 {be[1]:5.0f}; "
              f"{fit} rows fit")
    assert out[None][0] < math.inf and all(out[w][0] == math.inf for w in (64, 128, 256, 512))
    assert out[1024][0] < math.inf  # a window longer than the context is the full KV
    assert out[512][2] > 1.1 * out[None][2] and out[None][1] == math.inf
    windowed = [out[w][2] for w in (64, 128, 256, 512)]
    kv_share = LLAMA_1B.kv_bytes_per_token / LLAMA_8B.kv_bytes_per_token  # the draft's KV per token, over the target's
    assert min(windowed) > out[None][2] and kv_share == 0.25
    print("  Any window up to 512 tokens removes break-even at 640 tokens of context, and gives back rows:")
    print(f"  {min(windowed)} to {max(windowed)} where the full draft KV ({kv_share:.0%} of the target's bytes per "
          f"token) leaves {out[None][2]}.")
    print("  At 2,048 tokens the target's own KV read dominates and even the full draft never breaks even. What a")
    print("  window costs is acceptance: a draft that forgets its context proposes worse tokens (not modelled here).")


def exercise_3():
    """A fixed cost per forward pass: the speculative step pays it gamma + 1 times, the plain step once."""
    print("Exercise 3: 0.5 ms per forward pass on top of the roofline")
    o, context = 0.5e-3, np.array([700])  # s per pass; one row with this traffic's typical KV
    plain, spec = FULL.plain(context), FULL.speculative(context, 4)
    predicted = E * (plain + o) / (spec + 5 * o)  # at batch 1
    steps = replace(FULL, pass_overhead_s=o)
    requests = serving.poisson_requests(replace(WORKLOAD, rate=2))
    off, fixed = (serving.simulate(requests, steps, g).summary(math.inf) for g in (0, 4))
    ratio = off["tpot_p50_s"] / fixed["tpot_p50_s"]
    print(f"  predicted at batch 1: {E:.2f} x ({1e3 * plain:.2f} + 0.5) / ({1e3 * spec:.2f} + 5 x 0.5) = "
          f"{predicted:.2f}x ({E * plain / spec:.2f}x without); simulated at 2 requests/s: {ratio:.2f}x")
    assert abs(ratio / predicted - 1) < 0.1
    stop = (E * plain - spec) / (5 - E)  # s: E (plain + o) = spec + 5 o
    alone = [serving.Request(0.0, 128, 1024)]
    tpot = lambda g, x: serving.simulate(alone, replace(FULL, pass_overhead_s=x), g).requests[0].tpot_s
    below, above = (tpot(0, f * stop) / tpot(4, f * stop) for f in (0.8, 1.2))
    print(f"  gamma 4 stops paying alone at {1e3 * stop:.1f} ms per pass: simulated off / gamma 4 at 0.8x and "
          f"1.2x that cost: {below:.2f}x, {above:.2f}x")
    assert below > 1 > above
    print("  The overhead costs a speculative step five times and a plain step once. A few ms per pass, which a")
    print("  deep draft run without CUDA graphs pays in launches, is all it takes (vllm#15025 in the lesson).")


if __name__ == "__main__":
    exercise_1()
    exercise_2()
    exercise_3()
