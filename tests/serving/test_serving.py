"""The serving simulator: its event loop worked by hand, its parts, and where a busy endpoint stops paying on the
H100 roofline, weights only and with each row's KV read at its own context."""

import math
from dataclasses import dataclass, field, replace

import numpy as np
import pytest

from minispec import roofline
from minispec.roofline import LLAMA_1B, LLAMA_8B, LLAMA_70B, break_even_batch, speculative_speedup
from minispec.roofline.hardware import H100_SXM
from minispec.roofline.policy import BatchTablePolicy, FixedPolicy, MeasuredPolicy, RooflinePolicy
from minispec.serving import (
    MIX,
    NVLINK_BANDWIDTH,
    Lengths,
    MeasuredSteps,
    Request,
    RooflineSteps,
    Scheduler,
    Traffic,
    Workload,
    acceptance,
    conditional,
    expected_tokens,
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

    def plain(self, context):
        return self.plain_s

    def speculative(self, context, gamma):
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
    """The engine's scheduler (minispec.engine): decoding rows first, then prompts, in one step.
    0.0 A prefill -> 0.5 (A's first token); decode, batch 1 -> 1.5 (A has 2). 1.5: B (arrived at 1.2) is
    prefilled in the same step as A's decode: 1 + 0.5 -> 3.0 (A has 3: done; B's first token). B decodes alone
    -> 4.0, 5.0 (done). A: TTFT 0.5, TPOT (3.0 - 0.5) / 2 = 1.25. B: TTFT 3.0 - 1.2 = 1.8, TPOT (5.0 - 3.0) / 2 =
    1.0. 6 tokens over 5.0 s = 1.2 tokens/s; with a 1.1 s SLO only B's 3 count: 0.6 tokens/s."""
    run = simulate(two_requests(), ConstantSteps(), speculation=0)
    a, b = run.requests
    assert (a.ttft_s, a.tpot_s, a.finish_s) == (0.5, 1.25, 3.0)
    assert (b.ttft_s, b.tpot_s, b.finish_s) == (pytest.approx(1.8), 1.0, 5.0)
    assert [(s.kind, s.end_s, s.batch, s.prefill_tokens) for s in run.steps] == [
        ("prefill", 0.5, 1, 4), ("decode", 1.5, 1, 0), ("decode", 3.0, 1, 4), ("decode", 4.0, 1, 0),
        ("decode", 5.0, 1, 0)]
    summary = run.summary(tpot_slo_s=1.1)
    assert summary["throughput"] == 1.2 and summary["goodput"] == 0.6 and summary["slo_met"] == 0.5
    assert summary["mean_batch"] == 1 and summary["tpot_p50_s"] == pytest.approx(1.125)
    with pytest.raises(ValueError, match="gamma >= 0"):
        simulate(two_requests(), ConstantSteps(), speculation=-1)


def test_speculation_by_hand_all_accepted():
    """alpha 1, gamma 4: a step offers 5 tokens, and each request needs 2 after its first.
    0.0 A prefill -> 0.5; speculative step -> 2.5, A done (TTFT 0.5, TPOT (2.5 - 0.5) / 2 = 1.0).
    B arrived at 1.2 but waits for the step in flight: prefill -> 3.0, step -> 5.0
    (TTFT 3.0 - 1.2 = 1.8, TPOT 1.0). Speculation made B's first token later, not sooner.
    A chain drafts at most max_new_tokens - 1 = 2 tokens (what a step can emit; the engine's and the loop's cap), so
    each step tested 2 draft tokens and accepted both."""
    run = simulate(two_requests(), ConstantSteps(), speculation=RecordingPolicy(gamma=4))
    a, b = run.requests
    assert (a.ttft_s, a.tpot_s, b.tpot_s, b.finish_s) == (0.5, 1.0, 1.0, 5.0)
    assert b.ttft_s == pytest.approx(1.8)
    assert run.policy.seen == [(2, 2), (2, 2)]


def test_speculation_by_hand_all_rejected():
    """alpha 0: a 2 s speculative step yields one token per row.
    A prefill -> 0.5; step -> 2.5 (A has 2); A's step and B's prefill -> 5.0 (A done, B's first token); B's steps
    -> 7.0, 9.0 (B done). A: TPOT (5.0 - 0.5) / 2 = 2.25; B: TTFT 5.0 - 1.2 = 3.8, TPOT (9.0 - 5.0) / 2 = 2.0.
    Each row tests one draft token (its first is rejected), one row a step."""
    requests = [Request(r.arrival_s, r.prompt_tokens, r.output_tokens, alpha=0.0) for r in two_requests()]
    run = simulate(requests, ConstantSteps(), speculation=RecordingPolicy(gamma=4))
    a, b = run.requests
    assert (a.tpot_s, a.finish_s, b.ttft_s, b.tpot_s, b.finish_s) == (2.25, 5.0, pytest.approx(3.8), 2.0, 9.0)
    assert run.policy.seen == [(0, 1)] * 4
    assert requests[0].finish_s != requests[0].finish_s  # the caller's requests are left alone (nan)


def test_memory_limit_queues_and_preempts_requests():
    """A and B both arrive at 0.0: 4-token prompts, 3 output tokens, so at most 4 + 3 - 1 = 6 KV slots each.
    One row at a time: A prefill -> 0.5, decode -> 1.5, 2.5 (done); then B prefill -> 3.0, done at 5.0.
    8 slots (blocks of 1): both prompts fit (on-demand, nothing reserved) and get their first tokens at 0.5; then A
    needs a 5th slot, so B, the younger, is preempted; A decodes -> 1.5, 2.5 (done); B recomputes its 4 slots
    (its first token kept) -> 3.0 and decodes -> 4.0, 5.0. 12 slots: both decode together, done at 2.5, where
    reserving prompt + output at admission would have needed 14."""
    both = [Request(0.0, 4, 3), Request(0.0, 4, 3)]
    a, b = simulate(both, ConstantSteps(), scheduler=Scheduler(max_rows=1)).requests
    assert (a.finish_s, b.ttft_s, b.finish_s) == (2.5, 3.0, 5.0)
    run = simulate(both, ConstantSteps(), scheduler=Scheduler(kv_tokens=8, block_size=1))
    a, b = run.requests
    assert (a.finish_s, b.ttft_s, b.finish_s, run.preemptions) == (2.5, 0.5, 5.0, 1)
    assert [(s.kind, s.end_s, s.batch) for s in run.steps] == [
        ("prefill", 0.5, 2), ("decode", 1.5, 1), ("decode", 2.5, 1), ("prefill", 3.0, 1), ("decode", 4.0, 1),
        ("decode", 5.0, 1)]
    run = simulate(both, ConstantSteps(), scheduler=Scheduler(kv_tokens=12, block_size=1))
    assert [r.finish_s for r in run.requests] == [2.5, 2.5] and run.steps[1].batch == 2 and not run.preemptions
    with pytest.raises(ValueError, match="KV tokens"):
        simulate(both, ConstantSteps(), scheduler=Scheduler(kv_tokens=5, block_size=1))


def test_each_request_accepts_at_its_own_alpha():
    """In one batch an alpha-1 row gains 5 tokens a step and an alpha-0 row 1: with 6 tokens
    each (5 after the prefill), one step finishes the first (0.5 + 2 = 2.5 s), five the second (10.5 s)."""
    run = simulate([Request(0.0, 4, 6, alpha=1.0), Request(0.0, 4, 6, alpha=0.0)], ConstantSteps(), speculation=4)
    assert [r.finish_s for r in run.requests] == [2.5, 10.5]


def test_per_position_acceptance_by_hand():
    """Position 1 always accepted, position 2 never: every gamma-4 step gains exactly 2 tokens a row.
    A request owing 6 tokens after its first takes 3 steps: 0.5 + 3 x 2 = 6.5 s; each step tests 2 tokens."""
    run = simulate([Request(0.0, 4, 7, alpha=(1.0, 0.0))], ConstantSteps(), speculation=RecordingPolicy(gamma=4))
    assert run.requests[0].finish_s == 6.5 and run.policy.seen == [(1, 2)] * 3
    assert list(acceptance((0.9, 0.5), 4)) == [0.9, 0.5, 0.5, 0.5]  # the last rate repeats
    assert expected_tokens((1.0, 0.0), 4) == 2 and expected_tokens(0.5, 2) == pytest.approx(1.75)
    with pytest.raises(ValueError, match="alpha"):
        simulate([Request(0.0, 4, 7, alpha=(0.5, 1.2))], ConstantSteps(), speculation=4)


def test_vllm_per_position_rates_become_conditional_ones():
    """vLLM's per-position rate i is the share of drafts accepted through i; E = 1 + their sum either way."""
    shares = (0.844, 0.599, 0.385, 0.271)  # eugr/spark-vllm-docker#343, K = 4
    rates = conditional(shares)
    assert rates[0] == 0.844 and rates[1] == pytest.approx(0.599 / 0.844)
    assert expected_tokens(rates, 4) == pytest.approx(1 + sum(shares))
    assert expected_tokens(sum(shares) / 4, 4) < expected_tokens(rates, 4) - 1  # one alpha at the mean rate: far off
    with pytest.raises(ValueError, match="must not rise"):
        conditional((0.5, 0.6))


def test_goodput_counts_both_slos():
    """A (TTFT 0.5, TPOT 1.25) and B (TTFT 1.8, TPOT 1.0), 3 tokens each over 5.0 s. TPOT <= 1.25: both count,
    1.2 tokens/s; add TTFT <= 0.6 s and only A counts: 0.6 tokens/s."""
    run = simulate(two_requests(), ConstantSteps(), speculation=0)
    assert run.goodput(1.25) == 1.2 and run.goodput(1.25, ttft_slo_s=0.6) == 0.6
    assert run.summary(1.25, 0.6)["slo_met"] == 0.5 and run.meets(1.1, 0.6) == [False, False]


def test_each_step_is_charged_at_the_rows_own_context():
    """A 4-token and a 10-token prompt, 3 tokens each: the decode steps read 4 and 10 KV tokens (all but the last
    token, as speculative_generate counts it), then 5 and 11: means 7 and 8."""
    requests = [Request(0.0, 4, 3), Request(0.0, 10, 3)]
    run = simulate(requests, ConstantSteps(), speculation=0)
    assert [s.context for s in run.steps if s.kind == "decode"] == [7.0, 8.0]
    steps = RooflineSteps()
    assert steps.plain(np.array([5, 11])) == roofline.step_time(2, 1, H100_SXM, LLAMA_8B, 8.0)
    assert RooflineSteps(kv=False).plain(np.array([5, 11])) == roofline.step_time(2, 1, H100_SXM, LLAMA_8B, 0)


def test_a_roofline_policy_is_told_the_rows_context():
    """Before each choice the policy reads the rows' mean context: 100 and 300 KV tokens (the prompts), then 3
    more each (gamma 2, all accepted). Weights-only step times leave it alone."""
    class Recording(RooflinePolicy):
        def choose(self, batch_size, context=None):
            self.seen = getattr(self, "seen", []) + [context]
            return super().choose(batch_size, context)

    requests = [Request(0.0, 100, 6, alpha=1.0), Request(0.0, 300, 6, alpha=1.0)]
    steps = RooflineSteps(draft=LLAMA_1B)
    run = simulate(requests, steps, Recording(hardware=steps.device, model=steps.model, draft=LLAMA_1B, gamma_max=2))
    decode = [s for s in run.steps if s.kind == "decode"]
    assert [s.context for s in decode] == [200.0, 203.0] and run.policy.seen == [200.0, 203.0]
    run = simulate(requests, RooflineSteps(kv=False), Recording(gamma_max=2))
    assert run.policy.seen == [None, None]  # the weights-only bound plans at the policy's own context, 0


def test_a_step_reads_up_to_max_batched_tokens_and_chunks_prompts():
    """Three 6-token prompts at once, 10 tokens a step: A's 6 and the first 4 of B's (a chunk) -> 0.5, A's first
    token; then A's decode (1 token), B's last 2 and C's 6 -> 2.0, A done, B's and C's first tokens; then B and C
    decode together -> 3.0. A 20-token prompt takes two steps of 10. gamma 4 needs 1 + 4 tokens a row."""
    requests = [Request(0.0, 6, 2), Request(0.0, 6, 2), Request(0.0, 6, 2)]
    run = simulate(requests, ConstantSteps(), scheduler=Scheduler(max_batched_tokens=10))
    assert [(s.kind, s.end_s, s.batch, s.prefill_tokens) for s in run.steps] == [
        ("prefill", 0.5, 2, 10), ("decode", 2.0, 1, 8), ("decode", 3.0, 2, 0)]
    run = simulate([Request(0.0, 20, 2)], ConstantSteps(), scheduler=Scheduler(max_batched_tokens=10))
    assert [(s.kind, s.prefill_tokens) for s in run.steps] == [("prefill", 10), ("prefill", 10), ("decode", 0)]
    with pytest.raises(ValueError, match="max_batched_tokens"):
        Scheduler(max_batched_tokens=0)
    with pytest.raises(ValueError, match="max_batched_tokens"):
        simulate(requests, ConstantSteps(), 4, Scheduler(max_batched_tokens=4))


def test_the_batch_table_runs_as_a_policy():
    """[[1, 1, 4], [2, 8, 0]], 4 tokens each at alpha 0 (a step gains 1). A alone: prefill -> 0.5, a gamma-4 step
    -> 2.5; another beside B's prefill (B arrived at 1.2) -> 5.0; batch 2 runs a plain step -> 6.0 (A done); B
    alone drafts 4 again -> 8.0, 10.0. vLLM's lookup rules: a gap takes the K before it, past the last range the
    last K."""
    table = BatchTablePolicy(ranges=[[1, 1, 4], [2, 8, 0]])
    requests = [Request(0.0, 4, 4, alpha=0.0), Request(1.2, 4, 4, alpha=0.0)]
    run = simulate(requests, ConstantSteps(), speculation=table)
    assert [(s.batch, s.gamma, s.end_s) for s in run.steps if s.kind == "decode"] == [
        (1, 4, 2.5), (1, 4, 5.0), (2, 0, 6.0), (1, 4, 8.0), (1, 4, 10.0)]
    gaps = BatchTablePolicy(ranges=[[1, 16, 3], [32, 128, 2], [256, 2048, 0]])  # vLLM's own test table
    assert [gaps.choose(b) for b in (16, 17, 31, 32, 255, 256, 4096)] == [3, 3, 3, 2, 2, 0, 0]
    config = roofline.vllm_speculative_config(0.8, 4, draft=LLAMA_1B, context=192)
    from_model = BatchTablePolicy.from_config(config)
    assert from_model.choose(1) == 4 and from_model.choose(1024) == 0
    for bad in ([[2, 8, 1]], [[1, 8, 1], [8, 9, 0]], [[1, 8, -1]], []):
        with pytest.raises(ValueError, match="ranges"):
            BatchTablePolicy(ranges=bad)


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


def test_roofline_steps_weights_only_are_the_reference_model():
    steps = RooflineSteps(kv=False)  # H100 SXM, 8B in BF16, c = 0.05, weights only
    one, rows = np.array([700]), np.full(32, 700)
    assert steps.plain(one) == pytest.approx(16e9 / 3.35e12)  # 4.78 ms: the weight read, whatever the context
    assert 3.36 * steps.plain(rows) / steps.speculative(rows, 4) == pytest.approx(speculative_speedup(32), rel=1e-3)
    assert steps.prefill(1, 128) == steps.plain(one)  # 128 tokens: still memory-bound
    assert steps.prefill(8, 128) == pytest.approx(2 * 8e9 * 1024 / 989e12)  # 1024 tokens: compute-bound
    assert steps.prefill(8, 128, draft=True) == pytest.approx(1.05 * steps.prefill(8, 128))
    # KV tokens beside the weights in 90 % of 80 GB: (72 - 16) GB / 131,072 bytes per token.
    assert steps.kv_budget() == math.floor(56e9 / 131_072)
    assert RooflineSteps(draft=LLAMA_1B).kv_budget(draft=True) < steps.kv_budget()
    window = RooflineSteps(draft=LLAMA_1B, draft_kv_window=256)  # the window's KV is left out of the budget
    assert RooflineSteps(draft=LLAMA_1B).kv_budget(True) < window.kv_budget(True) < steps.kv_budget()


def test_a_draft_shape_reads_its_own_kv_or_a_window_of_it():
    context = np.array([400, 1200])  # (2,) mean 800; through a 256-token window, 256 each
    full, windowed = RooflineSteps(draft=LLAMA_1B), RooflineSteps(draft=LLAMA_1B, draft_kv_window=256)
    assert full.speculative(context, 4) == roofline.speculative_step_time(2, 4, hardware=H100_SXM, model=LLAMA_8B,
                                                                          context=800, draft=LLAMA_1B)
    assert windowed.draft_step(context) == roofline.step_time(2, 1, H100_SXM, LLAMA_1B, 256)
    assert windowed.draft_step(np.array([100, 300])) == roofline.step_time(2, 1, H100_SXM, LLAMA_1B, 178)
    assert full.prefill(2, 128, draft=True) == pytest.approx(
        roofline.step_time(2, 128, H100_SXM, LLAMA_8B) + roofline.step_time(2, 128, H100_SXM, LLAMA_1B))
    with pytest.raises(ValueError, match="draft_kv_window"):
        RooflineSteps(draft_kv_window=256)


def test_tensor_parallelism_and_overheads():
    """4 GPUs: 4x bandwidth, FLOP/s and memory, plus 2 all-reduces a layer, each 10 us + 1.5 x the activations
    over NVLink. A pass overhead is paid by every forward pass (gamma + 1 in a speculative step, none by prompt
    lookup's draft); a step overhead once a step."""
    steps, context = RooflineSteps(model=LLAMA_70B, tensor_parallel=4), np.array([100, 300])
    assert steps.device.memory_bandwidth == 4 * 3.35e12 and steps.device.memory_bytes == 320e9
    allreduce = 2 * 80 * (10e-6 + 1.5 * 2 * 8192 * 2 / NVLINK_BANDWIDTH)  # s: 2 rows of hidden 8,192 in BF16
    assert steps.plain(context) == pytest.approx(roofline.step_time(2, 1, steps.device, LLAMA_70B, 200) + allreduce)
    base, o = RooflineSteps(draft_cost=0.0), 1e-3
    assert replace(base, pass_overhead_s=o).speculative(context, 4) == pytest.approx(base.speculative(context, 4) + o)
    drafted = RooflineSteps(draft=LLAMA_1B)
    assert replace(drafted, pass_overhead_s=o, step_overhead_s=o).speculative(context, 4) == pytest.approx(
        drafted.speculative(context, 4) + 6 * o)
    with pytest.raises(ValueError, match="tensor_parallel"):
        RooflineSteps(tensor_parallel=0)


def test_measured_steps_interpolate_the_table():
    target = {(1, 1): 0.010, (4, 1): 0.016, (1, 5): 0.012, (4, 5): 0.040}  # s
    draft = {1: 0.002, 4: 0.004}  # s
    steps = MeasuredSteps(target, draft)
    assert steps.plain(np.zeros(2)) == pytest.approx(0.012)  # a third of the way from batch 1 to 4
    assert steps.speculative(np.zeros(2), 4) == pytest.approx(0.012 + 0.028 / 3 + 4 * (0.002 + 0.002 / 3))
    # Prefill at the table's best throughput, 0.040 s / 20 tokens = 2 ms a token, at least a plain step.
    assert steps.prefill(2, 10) == pytest.approx(0.002 * 20) and steps.prefill(1, 2) == pytest.approx(0.010)
    assert steps.prefill(2, 10, draft=True) == pytest.approx(0.04 * (1 + (0.002 + 0.002 / 3) / 0.012))
    with pytest.raises(ValueError, match="tokens_per_row = 3"):
        steps.speculative(np.zeros(2), 2)
    assert steps.plain(np.zeros(2)) == steps.plain(np.full(2, 4096))  # measured at one context: it reads none
    # The same table gates speculation in the simulator.
    run = simulate(poisson_requests(Workload(rate=20, duration_s=1, mix=(Traffic(output=Lengths(20)),))), steps,
                   MeasuredPolicy(target, draft, gamma_max=4))
    assert all(r.finish_s > r.first_token_s for r in run.requests) and run.summary(0.01)["mean_gamma"] > 0


# --- the busy-endpoint mistake, weights only: the bound the old headline stood on -------------------
#
# An 8B target in BF16 on an H100 SXM, alpha 0.8, gamma 4, c = 0.05, weights only (every KV read left out).
# Traffic: 128-token prompts, outputs uniform in 512..1536 tokens, Poisson arrivals for 25 s; at most 256
# running rows (what lesson 10 used to call vLLM's default), KV room for 427k tokens (never the limit here).

BOUND = RooflineSteps(kv=False)
OLD_SCHEDULER = Scheduler(max_rows=256)
SETTINGS = {"off": 0, "gamma 4": 4, "gated": RooflinePolicy(alpha0=0.8, gamma_max=4, draft_cost=0.05)}
TPOT_SLO_S = 0.0065  # between plain's TPOT at high load (5.7-5.9 ms) and gamma 4's at batch 256 (21.7 / 3.36 ms)


LONG = Workload(duration_s=25)


def by_setting(rate, steps=BOUND, settings=SETTINGS, scheduler=OLD_SCHEDULER, workload=LONG, slo=TPOT_SLO_S):
    return {r["setting"]: r for r in sweep([rate], settings, steps, slo, workload, scheduler)}


def test_at_low_load_speculation_cuts_tpot_by_the_batch_1_factor():
    """2 requests/s: about 10 rows running, where the model's speedup is 2.80x at every batch."""
    rows = by_setting(2.0)
    ratio = rows["off"]["tpot_p50_s"] / rows["gamma 4"]["tpot_p50_s"]  # 4.82 ms / 1.73 ms
    assert ratio == pytest.approx(speculative_speedup(1), rel=0.05)
    assert rows["gated"]["tpot_p50_s"] <= 1.01 * rows["gamma 4"]["tpot_p50_s"]  # it keeps gamma 4 on


def test_weights_only_at_high_load_fixed_gamma_hurts_and_gating_recovers():
    """40 requests/s. Plain decoding keeps 210-256 rows running once the load has ramped up, above
    break-even (187 rows), where a gamma-4 step (21.7 ms for 3.36 tokens a row) yields fewer tokens
    per second than plain steps (4.8 ms for 1) do. So fixed gamma 4 has less capacity than the
    traffic needs: its queue grows (TTFT p99 1.6 s against 56 ms), its p99 TPOT is 31 % worse
    (7.70 against 5.89 ms), and half its requests miss the 6.5 ms SLO (goodput 17.0k against 32.4k
    tokens/s). The gated policy drafts 1-2 tokens at the batch it then runs (~110 rows), which the
    model says pays, and beats both (p99 3.49 ms, goodput 37.1k tokens/s)."""
    rows = by_setting(40.0)
    off, fixed, gated = rows["off"], rows["gamma 4"], rows["gated"]
    plain = simulate(poisson_requests(Workload(rate=40.0, duration_s=25)), BOUND, 0, OLD_SCHEDULER)
    steady = [s.batch for s in plain.steps if s.kind == "decode" and 10 <= s.end_s <= 25]  # after the ramp
    assert min(steady) > break_even_batch(0.8, 4, 0.05) == pytest.approx(187, abs=1)

    assert fixed["tpot_p99_s"] > 1.2 * off["tpot_p99_s"]
    assert fixed["goodput"] < 0.75 * off["goodput"]
    assert fixed["ttft_p99_s"] > 3 * off["ttft_p99_s"]  # plain is near its own capacity too
    tolerance = 0.05  # gated within 5 % of the better of the two
    assert gated["tpot_p99_s"] <= (1 + tolerance) * min(off["tpot_p99_s"], fixed["tpot_p99_s"])
    assert gated["goodput"] >= (1 - tolerance) * max(off["goodput"], fixed["goodput"])


# --- the whole cost model: each row's KV at its own context, a real draft with its own KV ------------
#
# The same target, traffic and H100; the draft is Llama-3.2-1B with its full KV (or a 256-token window of it),
# and the scheduler is vLLM's default on an H100 (1,024 rows, 8,192 prompt tokens a prefill step).

DRAFT = RooflineSteps(draft=LLAMA_1B)


def test_break_even_comes_back_with_the_drafts_own_kv():
    """c = 0.05 and the target's KV at 640 tokens: never. A 1B draft reading its own full KV: near 280 rows, about
    where this traffic's reservations fill the H100 (the KV budget over 128 + 1,024 tokens a request). A draft
    that keeps 256 tokens of KV: never again."""
    assert break_even_batch(0.8, 4, 0.05, context=640) == math.inf
    full = break_even_batch(0.8, 4, draft=LLAMA_1B, context=640)
    assert break_even_batch(0.8, 4, 0.05) < full < math.inf
    rows_that_fit = DRAFT.kv_budget(draft=True) / (128 + 1024)
    assert abs(full / rows_that_fit - 1) < 0.05
    assert break_even_batch(0.8, 4, draft=LLAMA_1B, context=640, draft_kv_window=256) == math.inf
    assert break_even_batch(0.8, 4, draft=LLAMA_1B, context=192) < 0.7 * full  # short contexts bring it down


def test_whole_model_at_high_load_the_draft_pays_and_its_memory_shows_in_the_queue():
    """25 requests/s: plain decoding runs ~195 rows whose 12 ms steps miss an 8 ms TPOT SLO; gamma 4 with the 1B
    draft is faster but, at ~165 rows, misses it for most requests too; the gated policy drafts ~2 tokens at
    ~135 rows and meets it. 35 requests/s: KV is allocated as rows grow, so plain decoding holds ~340 rows (more
    than the ~284 whose prompt + output reservations would fit beside both models) and nobody's queue need grow;
    but gamma 4's draft keeps its own full KV, so its rows run out of blocks, are preempted and recomputed, and
    its queue grows past a second, while a 256-token window of draft KV fits every row."""
    windowed = RooflineSteps(draft=LLAMA_1B, draft_kv_window=256)
    settings = {"off": 0, "gamma 4": 4, "gated": DRAFT.policy(alpha0=0.8, gamma_max=4)}
    requests = {rate: poisson_requests(Workload(rate=rate, duration_s=25)) for rate in (25.0, 35.0)}
    runs = {(rate, name): simulate(requests[rate], DRAFT, s) for rate in requests for name, s in settings.items()}
    runs |= {(rate, "window"): simulate(requests[rate], windowed, 4) for rate in requests}
    good = {k: run.goodput(0.008, ttft_slo_s=1.0) for k, run in runs.items()}
    assert good[(25.0, "gated")] > 3 * good[(25.0, "gamma 4")] > 3 * good[(25.0, "off")]
    high = {name: runs[(35.0, name)].summary(0.008, 1.0) for name in ("off", "gamma 4", "gated", "window")}
    assert high["off"]["mean_batch"] > DRAFT.kv_budget(draft=True) / (128 + 1024)
    assert runs[(35.0, "gamma 4")].preemptions > 0 == runs[(35.0, "off")].preemptions == runs[
        (35.0, "window")].preemptions
    assert high["gamma 4"]["ttft_p99_s"] > 1.0 > max(high["off"]["ttft_p99_s"], high["window"]["ttft_p99_s"])
    assert high["window"]["throughput"] > 1.1 * high["off"]["throughput"]


SHORT = Workload(duration_s=10, mix=(Traffic("short chat", 0.8, prompt=Lengths(128), output=Lengths(128, "uniform")),))


def test_short_contexts_at_high_load_fixed_gamma_hurts_and_the_table_recovers():
    """128-token prompts and 64-192 output tokens: about 190 tokens of context, break-even near 185 rows, and
    vLLM's 1,024 rows let a busy endpoint pass it. At 200 requests/s fixed gamma 4 doubles the median TPOT and
    its queue grows; the batch-size table vLLM would get from the model drafts ~0 at that batch, as does the
    gated policy."""
    table = BatchTablePolicy.from_config(roofline.vllm_speculative_config(0.8, 4, draft=LLAMA_1B, context=192))
    settings = {"off": 0, "gamma 4": 4, "table": table, "gated": DRAFT.policy(alpha0=0.8, gamma_max=4)}
    rows = by_setting(200.0, DRAFT, settings, Scheduler(), SHORT, slo=0.025)
    off, fixed = rows["off"], rows["gamma 4"]
    assert off["mean_batch"] > break_even_batch(0.8, 4, draft=LLAMA_1B, context=192)
    assert fixed["tpot_p50_s"] > 1.5 * off["tpot_p50_s"] and fixed["ttft_p99_s"] > 5 * off["ttft_p99_s"]
    for name in ("table", "gated"):
        assert rows[name]["tpot_p50_s"] < 0.7 * fixed["tpot_p50_s"] and rows[name]["mean_gamma"] < 1
        assert rows[name]["goodput"] > 2 * fixed["goodput"]


def test_sweep_rows_and_plot():
    rows = sweep([1.0, 2.0], {"off": 0, "gamma 4": 4}, DRAFT, 0.0065, Workload(duration_s=5), ttft_slo_s=1.0)
    assert [(r["rate"], r["setting"]) for r in rows] == [(1.0, "off"), (1.0, "gamma 4"), (2.0, "off"), (2.0, "gamma 4")]
    assert rows[0]["requests"] == rows[1]["requests"]  # each setting serves the same requests
    pytest.importorskip("matplotlib")
    from minispec.course.plots import plot_serving

    fig = plot_serving(rows, 0.0065, title="H100, 8B, alpha 0.8")
    assert len(fig.axes) == 2 and len(fig.axes[1].lines) == 4
