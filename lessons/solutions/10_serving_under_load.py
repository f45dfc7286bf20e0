"""Worked solutions to the exercises of lesson 10, serving under load.

Run from the repository root: ``python lessons/solutions/10_serving_under_load.py``.
Every number a solution claims is asserted. The simulator is pure arithmetic on the roofline: nothing is timed,
and the same seed gives the same numbers.
"""

import math
from dataclasses import dataclass, replace

from minispec import hardware, roofline, serving
from minispec.policy import RooflinePolicy

WORKLOAD = serving.Workload(duration_s=25)  # the lesson's traffic: 128-token prompts, 512..1536 output tokens
E = roofline.expected_tokens(0.8, 4)  # 3.36 tokens per row per speculative step


def capacity(steps, gamma: int, max_rows: int = 256) -> float:
    """Largest output rate in tokens/s at up to ``max_rows`` rows: rows x tokens per row per step / step time."""
    if gamma == 0:
        return max(B / steps.plain(B) for B in range(1, max_rows + 1))
    return max(B * E / steps.speculative(B, gamma) for B in range(1, max_rows + 1))


def exercise_1():
    """An H200: more bandwidth lifts plain decoding's capacity, not fixed gamma's."""
    print("Exercise 1: the same traffic on an H100 and an H200, fixed gamma 4")
    caps, keeps_up = {}, {}
    for hw in (hardware.H100_SXM, hardware.H200):
        steps = serving.RooflineSteps(hardware=hw)
        caps[hw.name] = (capacity(steps, 0), capacity(steps, 4))
        late = {}
        for rate in (36, 38, 40, 42):
            requests = serving.poisson_requests(replace(WORKLOAD, rate=rate))
            late[rate] = serving.simulate(requests, steps, 4).summary(0.0065)["ttft_p99_s"]
        keeps_up[hw.name] = max(r for r, t in late.items() if t < 0.1)
        print(f"  {hw.name}: capacity plain {caps[hw.name][0]:.0f}, gamma 4 {caps[hw.name][1]:.0f} tokens/s; gamma 4's "
              f"TTFT p99 by rate {', '.join(f'{r}: {t:.2f} s' for r, t in late.items())}")
    (p100, f100), (p200, f200) = caps["H100 SXM"], caps["H200"]
    assert p200 > 1.15 * p100 and abs(f200 / f100 - 1) < 0.01  # plain gains 15 %, fixed gamma 4 under 1 %
    assert keeps_up == {"H100 SXM": 36, "H200": 38}  # within one step of the rate grid: about 39-40 requests/s
    peak_bound = E * hardware.H100_SXM.peak_flops / (2 * 8e9 * (5 + 4 * 0.05))  # tokens/s, compute-bound limit
    print(f"  gamma 4's ceiling: E x peak / (2 params (gamma + 1 + gamma c)) = {peak_bound:.0f} tokens/s on both")
    assert f100 < peak_bound and math.isclose(f200, peak_bound)  # the H200 reaches it at 256 rows
    print("  No. Past the ridge a verify step is compute-bound, and both GPUs have the same 989 TFLOP/s, so fixed")
    print("  gamma 4 tops out near 40k tokens/s on either; the H200's bandwidth only speeds up memory-bound steps,")
    print("  which is why plain decoding gains and fixed gamma 4 falls behind at about the same 40 requests/s.")


def exercise_2():
    """The SLO decides which setting "wins" on goodput; a loose TPOT SLO hides the queue."""
    print("Exercise 2: goodput under three TPOT SLOs")
    settings = {"off": 0, "gamma 4": 4, "gated": RooflinePolicy(alpha0=0.8, gamma_max=4)}
    best = {}
    for rate in (30, 40):
        requests = serving.poisson_requests(replace(WORKLOAD, rate=rate))
        runs = {name: serving.simulate(requests, serving.RooflineSteps(), s) for name, s in settings.items()}
        for slo in (0.005, 0.0065, 0.010):
            good = {name: run.summary(slo)["goodput"] for name, run in runs.items()}
            best[(rate, slo)] = max(good, key=good.get)
            print(f"  {rate} requests/s, SLO {1e3 * slo:g} ms: " + ", ".join(f"{n} {g:.0f}" for n, g in good.items())
                  + f" tokens/s; best: {best[(rate, slo)]}")
        if rate == 40:
            loose = {name: run.summary(0.010) for name, run in runs.items()}
            assert loose["gamma 4"]["goodput"] > loose["off"]["goodput"]  # 10 ms: fixed gamma 4 "beats" plain ...
            assert loose["gamma 4"]["ttft_p99_s"] > 20 * loose["off"]["ttft_p99_s"]  # ... with a 1.6 s queue
        tight = runs["off"].summary(0.005)
        assert tight["goodput"] < 0.1 * tight["throughput"]  # 5 ms: plain decoding meets it for few requests
    assert all(best[k] == "gated" for k in best)
    print("  The gated policy has the best goodput under every SLO here, but the ranking of plain and fixed gamma")
    print("  flips with the SLO: at 10 ms fixed gamma 4 looks better than plain at 40 requests/s while its queue")
    print("  grows. Quote goodput with its SLO, and a TTFT percentile beside any TPOT-only figure.")


@dataclass(frozen=True)
class WithOverhead:
    """A step-time source: the roofline plus a fixed cost per forward pass (launches, scheduling, sampling)."""

    inner: serving.RooflineSteps = serving.RooflineSteps()
    per_pass_s: float = 0.5e-3  # s per forward pass

    def plain(self, batch):
        return self.inner.plain(batch) + self.per_pass_s

    def speculative(self, batch, gamma):
        return self.inner.speculative(batch, gamma) + (gamma + 1) * self.per_pass_s  # gamma drafts and one verify

    def prefill(self, batch, prompt_tokens, draft=False):
        return self.inner.prefill(batch, prompt_tokens, draft) + (2 if draft else 1) * self.per_pass_s

    def kv_budget(self, draft=False):
        return self.inner.kv_budget(draft)


def exercise_3():
    """A fixed cost per forward pass: the speculative step pays it gamma + 1 times, the plain step once."""
    print("Exercise 3: 0.5 ms per forward pass on top of the roofline")
    steps, ref = WithOverhead(), serving.RooflineSteps()
    o = steps.per_pass_s
    predicted = E * (ref.plain(1) + o) / (ref.speculative(1, 4) + 5 * o)  # at batch 1
    requests = serving.poisson_requests(replace(WORKLOAD, rate=2))
    off, fixed = (serving.simulate(requests, steps, g).summary(0.0065) for g in (0, 4))
    ratio = off["tpot_p50_s"] / fixed["tpot_p50_s"]
    print(f"  predicted at batch 1: 3.36 x (4.78 + 0.5) / (5.73 + 5 x 0.5) = {predicted:.2f}x (2.80x without); "
          f"simulated at 2 requests/s: {ratio:.2f}x")
    assert round(predicted, 2) == 2.15 and abs(ratio / predicted - 1) < 0.05
    caps = (capacity(steps, 0), capacity(steps, 4))
    print(f"  capacity with the overhead: plain {caps[0]:.0f}, gamma 4 {caps[1]:.0f} tokens/s "
          f"(without: {capacity(ref, 0):.0f}, {capacity(ref, 4):.0f})")
    assert caps[1] < capacity(ref, 4) and caps[0] < capacity(ref, 0)
    print("  The overhead costs a speculative step five times and a plain step once, so it cuts the low-load")
    print("  speedup from 2.80x to 2.15x: the reason engines capture the draft loop in CUDA graphs or fuse it.")


if __name__ == "__main__":
    exercise_1()
    exercise_2()
    exercise_3()
