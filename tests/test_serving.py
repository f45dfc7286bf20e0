"""The serving simulator: its event loop worked by hand, its parts, the busy-endpoint mistake on the H100 roofline."""

import math
from dataclasses import dataclass, field

import pytest

from minispec import roofline
from minispec.hardware import H100_SXM
from minispec.policy import FixedPolicy, MeasuredPolicy, RooflinePolicy
from minispec.roofline import LLAMA_1B, LLAMA_8B, break_even_batch, speculative_speedup
from minispec.serving import (
    MIX,
    Lengths,
    MeasuredSteps,
    Request,
    RooflineSteps,
    Scheduler,
    Traffic,
    Workload,
    poisson_requests,
    simulate,
    sweep,
)


@dataclass(frozen=True)
class ConstantSteps:
    """Every step takes the same time, whatever the batch: easy arithmetic."""

    plain_s: float = 1.0
    speculative_s: float = 2.0
    prefill_s: float = 0.5

    def plain(self, batch):
        return self.plain_s

    def speculative(self, batch, gamma):
        return self.speculative_s

    def prefill(self, batch, prompt_tokens, draft=False):
        return self.prefill_s

    def kv_budget(self, draft=False):
        return None


@dataclass
class RecordingPolicy(FixedPolicy):
    """A fixed gamma that remembers what it observed."""

    seen: list = field(default_factory=list)

    def observe(self, accepted, tested):
        self.seen.append((accepted, tested))
        super().observe(accepted, tested)


def two_requests():
    """A arrives at 0.0 s, B at 1.2 s; each has a 4-token prompt and wants 3 output tokens."""
    return [Request(0.0, 4, 3, alpha=1.0, kind="A"), Request(1.2, 4, 3, alpha=1.0, kind="B")]


# --- the event loop, by hand (prefill 0.5 s, plain step 1 s, speculative step 2 s) ---------------

def test_plain_decoding_by_hand():
    """0.0 A admitted, prefill -> 0.5 (A's first token); decode, batch 1 -> 1.5 (A has 2).
    1.5 B (arrived at 1.2) admitted, prefill -> 2.0 (B's first token); decode, batch 2 -> 3.0
    (A has 3: done; B has 2). Decode, batch 1 -> 4.0 (B done).
    A: TTFT 0.5, TPOT (3.0 - 0.5) / 2 = 1.25. B: TTFT 2.0 - 1.2 = 0.8, TPOT (4.0 - 2.0) / 2 = 1.0.
    6 tokens over 4.0 s = 1.5 tokens/s; with a 1.1 s SLO only B's 3 count: 0.75 tokens/s.
    Mean batch over the decode steps (1 s each): (1 + 2 + 1) / 3."""
    run = simulate(two_requests(), ConstantSteps(), speculation=0)
    a, b = run.requests
    assert (a.ttft_s, a.tpot_s, a.finish_s) == (0.5, 1.25, 3.0)
    assert (b.ttft_s, b.tpot_s, b.finish_s) == (pytest.approx(0.8), 1.0, 4.0)
    assert [(s.kind, s.end_s, s.batch) for s in run.steps] == [
        ("prefill", 0.5, 1), ("decode", 1.5, 1), ("prefill", 2.0, 1), ("decode", 3.0, 2), ("decode", 4.0, 1)]
    summary = run.summary(tpot_slo_s=1.1)
    assert summary["throughput"] == 1.5 and summary["goodput"] == 0.75 and summary["slo_met"] == 0.5
    assert summary["mean_batch"] == pytest.approx(4 / 3) and summary["tpot_p50_s"] == pytest.approx(1.125)
    with pytest.raises(ValueError, match="gamma >= 0"):
        simulate(two_requests(), ConstantSteps(), speculation=-1)


def test_speculation_by_hand_all_accepted():
    """alpha 1, gamma 4: a step offers 5 tokens, and each request needs 2 after its first.
    0.0 A prefill -> 0.5; speculative step -> 2.5, A done (TTFT 0.5, TPOT (2.5 - 0.5) / 2 = 1.0).
    B arrived at 1.2 but waits for the step in flight: prefill -> 3.0, step -> 5.0
    (TTFT 3.0 - 1.2 = 1.8, TPOT 1.0). Speculation made B's first token later, not sooner.
    Each step tested 4 draft tokens and accepted all 4."""
    run = simulate(two_requests(), ConstantSteps(), speculation=RecordingPolicy(gamma=4))
    a, b = run.requests
    assert (a.ttft_s, a.tpot_s, b.tpot_s, b.finish_s) == (0.5, 1.0, 1.0, 5.0)
    assert b.ttft_s == pytest.approx(1.8)
    assert run.policy.seen == [(4, 4), (4, 4)]


def test_speculation_by_hand_all_rejected():
    """alpha 0: a 2 s speculative step yields one token per row.
    A prefill -> 0.5; step -> 2.5 (A has 2); B prefill -> 3.0; step, batch 2 -> 5.0 (A done, B has 2);
    step -> 7.0 (B done). A: TPOT (5.0 - 0.5) / 2 = 2.25; B: TTFT 1.8, TPOT (7.0 - 3.0) / 2 = 2.0.
    Each row tests one draft token (its first is rejected): tested 1, 2, 1 over the three steps."""
    requests = [Request(r.arrival_s, r.prompt_tokens, r.output_tokens, alpha=0.0) for r in two_requests()]
    run = simulate(requests, ConstantSteps(), speculation=RecordingPolicy(gamma=4))
    a, b = run.requests
    assert (a.tpot_s, a.finish_s, b.tpot_s, b.finish_s) == (2.25, 5.0, 2.0, 7.0)
    assert run.policy.seen == [(0, 1), (0, 2), (0, 1)]
    assert requests[0].finish_s != requests[0].finish_s  # the caller's requests are left alone (nan)


def test_memory_limit_queues_requests():
    """A and B both arrive at 0.0, each reserving 4 + 3 = 7 KV tokens. Room for one row (or for
    7 KV tokens): A prefill -> 0.5, decode -> 1.5, 2.5 (done); then B prefill -> 3.0, done at 5.0.
    Room for both: one prefill of two rows -> 0.5, both done at 2.5."""
    both = [Request(0.0, 4, 3), Request(0.0, 4, 3)]
    for scheduler in (Scheduler(max_rows=1), Scheduler(kv_tokens=13)):
        a, b = simulate(both, ConstantSteps(), scheduler=scheduler).requests
        assert (a.finish_s, b.ttft_s, b.finish_s) == (2.5, 3.0, 5.0)
    run = simulate(both, ConstantSteps(), scheduler=Scheduler(kv_tokens=14))
    assert [r.finish_s for r in run.requests] == [2.5, 2.5] and run.steps[0].batch == 2
    with pytest.raises(ValueError, match="KV tokens"):
        simulate(both, ConstantSteps(), scheduler=Scheduler(kv_tokens=6))


def test_each_request_accepts_at_its_own_alpha():
    """In one batch an alpha-1 row gains 5 tokens a step and an alpha-0 row 1: with 6 tokens
    each (5 after the prefill), one step finishes the first (0.5 + 2 = 2.5 s), five the second (10.5 s)."""
    run = simulate([Request(0.0, 4, 6, alpha=1.0), Request(0.0, 4, 6, alpha=0.0)], ConstantSteps(), speculation=4)
    assert [r.finish_s for r in run.requests] == [2.5, 10.5]


# --- traffic and step times ----------------------------------------------------------------------

def test_lengths():
    import random

    rng = random.Random(0)
    assert {Lengths(7).sample(rng) for _ in range(10)} == {7}
    uniform = [Lengths(100, "uniform").sample(rng) for _ in range(20_000)]
    assert min(uniform) == 50 and max(uniform) == 150 and sum(uniform) / len(uniform) == pytest.approx(100, rel=0.01)
    geometric = [Lengths(100, "geometric").sample(rng) for _ in range(20_000)]
    assert min(geometric) == 1 and sum(geometric) / len(geometric) == pytest.approx(100, rel=0.03)
    with pytest.raises(ValueError):
        Lengths(0)
    with pytest.raises(ValueError):
        Lengths(10, "normal")


def test_poisson_arrivals_and_the_traffic_mix():
    slow = poisson_requests(Workload(rate=50, duration_s=100, mix=MIX))
    fast = poisson_requests(Workload(rate=100, duration_s=100, mix=MIX))
    assert len(slow) == pytest.approx(5000, rel=0.05) and len(fast) == pytest.approx(10_000, rel=0.05)
    # The same seed at twice the rate: the same requests, arriving twice as fast.
    for s, f in zip(slow, fast):
        assert f.arrival_s == pytest.approx(s.arrival_s / 2) and (f.kind, f.output_tokens) == (s.kind, s.output_tokens)
    for traffic in MIX:
        mine = [r for r in slow if r.kind == traffic.name]
        assert len(mine) / len(slow) == pytest.approx(traffic.share, abs=0.02)
        assert {r.alpha for r in mine} == {traffic.alpha}


def test_roofline_steps_are_the_reference_model():
    steps = RooflineSteps()  # H100 SXM, 8B in BF16, c = 0.05, weights only
    assert steps.plain(1) == pytest.approx(16e9 / 3.35e12)  # 4.78 ms: the weight read
    assert 3.36 * steps.plain(32) / steps.speculative(32, 4) == pytest.approx(speculative_speedup(32), rel=1e-3)
    assert steps.prefill(1, 128) == steps.plain(1)  # 128 tokens: still memory-bound
    assert steps.prefill(8, 128) == pytest.approx(2 * 8e9 * 1024 / 989e12)  # 1024 tokens: compute-bound
    assert steps.prefill(8, 128, draft=True) == pytest.approx(1.05 * steps.prefill(8, 128))
    # KV tokens beside the weights in 90 % of 80 GB: (72 - 16) GB / 131,072 bytes per token.
    assert steps.kv_budget() == math.floor(56e9 / 131_072)
    assert RooflineSteps(draft=LLAMA_1B).kv_budget(draft=True) < steps.kv_budget()


def test_measured_steps_interpolate_the_table():
    target = {(1, 1): 0.010, (4, 1): 0.016, (1, 5): 0.012, (4, 5): 0.040}  # s
    draft = {1: 0.002, 4: 0.004}  # s
    steps = MeasuredSteps(target, draft)
    assert steps.plain(2) == pytest.approx(0.012)  # a third of the way from batch 1 to 4
    assert steps.speculative(2, 4) == pytest.approx(0.012 + 0.028 / 3 + 4 * (0.002 + 0.002 / 3))
    # Prefill at the table's best throughput, 0.040 s / 20 tokens = 2 ms a token, at least a plain step.
    assert steps.prefill(2, 10) == pytest.approx(0.002 * 20) and steps.prefill(1, 2) == pytest.approx(0.010)
    assert steps.prefill(2, 10, draft=True) == pytest.approx(0.04 * (1 + (0.002 + 0.002 / 3) / 0.012))
    with pytest.raises(ValueError, match="tokens_per_row = 3"):
        steps.speculative(2, 2)
    # The same table gates speculation in the simulator.
    run = simulate(poisson_requests(Workload(rate=20, duration_s=1, mix=(Traffic(output=Lengths(20)),))), steps,
                   MeasuredPolicy(target, draft, gamma_max=4))
    assert all(r.finish_s > r.first_token_s for r in run.requests) and run.summary(0.01)["mean_gamma"] > 0


# --- the busy-endpoint mistake, on the H100 roofline ----------------------------------------------
#
# The reference setting: an 8B target in BF16 on an H100 SXM, alpha 0.8, gamma 4, c = 0.05, weights only
# (context 0). Traffic: 128-token prompts, outputs uniform in 512..1536 tokens, Poisson arrivals for 25 s;
# at most 256 running rows (vLLM's max_num_seqs), KV room for 427k tokens (never the limit here).

STEPS = RooflineSteps()
SETTINGS = {"off": 0, "gamma 4": 4, "gated": RooflinePolicy(alpha0=0.8, gamma_max=4, draft_cost=0.05)}
TPOT_SLO_S = 0.0065  # between plain's TPOT at high load (5.7-5.9 ms) and gamma 4's at batch 256 (21.7 / 3.36 ms)


def by_setting(rate):
    return {r["setting"]: r for r in sweep([rate], SETTINGS, STEPS, TPOT_SLO_S, Workload(duration_s=25))}


def test_at_low_load_speculation_cuts_tpot_by_the_batch_1_factor():
    """2 requests/s: about 10 rows running, where the model's speedup is 2.80x at every batch."""
    rows = by_setting(2.0)
    ratio = rows["off"]["tpot_p50_s"] / rows["gamma 4"]["tpot_p50_s"]  # 4.82 ms / 1.73 ms
    assert ratio == pytest.approx(speculative_speedup(1), rel=0.05)
    assert rows["gated"]["tpot_p50_s"] <= 1.01 * rows["gamma 4"]["tpot_p50_s"]  # it keeps gamma 4 on


def test_at_high_load_fixed_gamma_hurts_and_gating_recovers():
    """40 requests/s. Plain decoding keeps 210-256 rows running once the load has ramped up, above
    break-even (187 rows), where a gamma-4 step (21.7 ms for 3.36 tokens a row) yields fewer tokens
    per second than plain steps (4.8 ms for 1) do. So fixed gamma 4 has less capacity than the
    traffic needs: its queue grows (TTFT p99 1.6 s against 56 ms), its p99 TPOT is 31 % worse
    (7.70 against 5.89 ms), and half its requests miss the 6.5 ms SLO (goodput 17.0k against 32.4k
    tokens/s). The gated policy drafts 1-2 tokens at the batch it then runs (~110 rows), which the
    model says pays, and beats both (p99 3.49 ms, goodput 37.1k tokens/s). Seeds 0-3 give the same
    picture: fixed/plain p99 1.30-1.32, goodput 0.44-0.53; gated within 0.59-0.71 and 1.14-1.16 of the better."""
    rows = by_setting(40.0)
    off, fixed, gated = rows["off"], rows["gamma 4"], rows["gated"]
    plain = simulate(poisson_requests(Workload(rate=40.0, duration_s=25)), STEPS, 0)
    steady = [s.batch for s in plain.steps if s.kind == "decode" and 10 <= s.end_s <= 25]  # after the ramp
    assert min(steady) > break_even_batch(0.8, 4, 0.05) == pytest.approx(187, abs=1)

    assert fixed["tpot_p99_s"] > 1.2 * off["tpot_p99_s"]
    assert fixed["goodput"] < 0.75 * off["goodput"]
    assert fixed["ttft_p99_s"] > 3 * off["ttft_p99_s"]  # plain is near its own capacity too: 17-440 ms over seeds
    tolerance = 0.05  # gated within 5 % of the better of the two
    assert gated["tpot_p99_s"] <= (1 + tolerance) * min(off["tpot_p99_s"], fixed["tpot_p99_s"])
    assert gated["goodput"] >= (1 - tolerance) * max(off["goodput"], fixed["goodput"])


def test_with_kv_reads_speculation_pays_again_at_high_load():
    """Counting each row's KV read at this traffic's mean context (128 + 512 tokens while decoding)
    keeps even large-batch decode memory-bound (MagicDec): break-even moves to infinity, and at a
    load that fills plain decoding with ~180 rows, gamma 4 beats it on p99 TPOT."""
    assert break_even_batch(0.8, 4, 0.05, context=640) == math.inf
    steps = RooflineSteps(context=640)
    requests = poisson_requests(Workload(rate=25.0, duration_s=25))
    off, fixed = (simulate(requests, steps, gamma).summary(0.015) for gamma in (0, 4))
    assert off["mean_batch"] > 150 and fixed["tpot_p99_s"] < 0.5 * off["tpot_p99_s"]


def test_sweep_rows_and_plot():
    rows = sweep([1.0, 2.0], {"off": 0, "gamma 4": 4}, STEPS, TPOT_SLO_S, Workload(duration_s=5))
    assert [(r["rate"], r["setting"]) for r in rows] == [(1.0, "off"), (1.0, "gamma 4"), (2.0, "off"), (2.0, "gamma 4")]
    assert rows[0]["requests"] == rows[1]["requests"]  # each setting serves the same requests
    pytest.importorskip("matplotlib")
    from minispec.plots import plot_serving

    fig = plot_serving(rows, TPOT_SLO_S, title="H100, 8B, alpha 0.8")
    assert len(fig.axes) == 2 and len(fig.axes[1].lines) == 4


def test_a_draft_shape_costs_its_own_steps():
    """With a draft shape the speculative step is the roofline's, draft costed from its weights and KV."""
    steps = RooflineSteps(draft=LLAMA_1B, context=4096)
    for batch in (1, 64):
        assert steps.speculative(batch, 4) == roofline.speculative_step_time(
            batch, 4, hardware=H100_SXM, model=LLAMA_8B, context=4096, draft=LLAMA_1B)
    c = (steps.speculative(1, 4) - roofline.step_time(1, 5, H100_SXM, LLAMA_8B, 4096)) / 4 / steps.plain(1)
    assert 0.1 < c < 0.2  # a 1B draft's weight bytes are about 15 % of the 8B target's
    assert steps.prefill(2, 128, draft=True) == pytest.approx(
        roofline.step_time(2, 128, H100_SXM, LLAMA_8B) + roofline.step_time(2, 128, H100_SXM, LLAMA_1B))
