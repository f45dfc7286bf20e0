"""Gamma policies: off above break-even, shorter drafts at larger batch, a running alpha that follows traffic."""

import math

import pytest

from minispec.roofline import (
    LLAMA_1B,
    LLAMA_8B,
    best_gamma,
    break_even_batch,
    expected_tokens,
    speculative_speedup,
    step_time,
    vllm_config_from_speedup,
    vllm_speculative_config,
)
from minispec.roofline.hardware import H100_SXM, H200
from minispec.roofline.policy import FixedPolicy, MeasuredPolicy, RooflinePolicy, auto_policy


def test_off_above_the_largest_break_even_batch():
    policy = RooflinePolicy(alpha0=0.8, draft_cost=0.05)
    # Shorter drafts break even later; past the latest of them (gamma 1, batch 258) nothing pays.
    last = max(break_even_batch(0.8, g, 0.05) for g in range(1, 9))
    assert round(last) == 258
    assert policy.choose(math.floor(last)) == 1 and policy.choose(math.ceil(last)) == 0
    assert policy.choose(1024) == 0


def test_gamma_shrinks_as_the_batch_grows():
    policy = RooflinePolicy(gamma_max=8)
    chosen = [policy.choose(b) for b in range(1, 400)]
    assert chosen == sorted(chosen, reverse=True)
    assert chosen[0] == 8 > policy.choose(64) == 4 > policy.choose(128) > 0


def test_on_at_small_batch_with_high_acceptance():
    policy = RooflinePolicy(alpha0=0.5)
    for _ in range(50):
        policy.observe(accepted=90, tested=100)
    assert policy.alpha > 0.85 and policy.choose(1) == 8 and policy.choose(32) == 8


def test_low_acceptance_and_a_costly_draft():
    # gamma 4 at alpha 0.3, c 0.25 is a slowdown (0.71x); the policy shortens the draft to 1
    # (1.3 / 1.25 = 1.04x) and turns speculation off once alpha <= c (1.2 / 1.25 = 0.96x).
    assert speculative_speedup(1, 0.3, 4, 0.25) < 1
    assert RooflinePolicy(alpha0=0.3, draft_cost=0.25).choose(1) == 1
    assert RooflinePolicy(alpha0=0.2, draft_cost=0.25).choose(1) == 0
    assert RooflinePolicy(alpha0=0.3, draft_cost=0.35).choose(1) == 0


def test_running_alpha_follows_observed_acceptance():
    policy = RooflinePolicy(alpha0=0.8, prior_tokens=16, half_life_tokens=math.inf)
    assert policy.alpha == 0.8
    policy.observe(accepted=30, tested=100)
    assert policy.alpha == pytest.approx((30 + 0.8 * 16) / (100 + 16))  # 0.369: the prior weighs 16 tokens
    for _ in range(100):
        policy.observe(30, 100)
    assert policy.alpha == pytest.approx(0.3, abs=0.001)

    tracking = RooflinePolicy(alpha0=0.8, half_life_tokens=1000)
    for _ in range(100):
        tracking.observe(30, 100)  # 10,000 tokens of "creative" traffic
    assert tracking.alpha == pytest.approx(0.3, abs=0.01)
    for _ in range(100):
        tracking.observe(90, 100)  # then code, say: ten half-lives later the old traffic is forgotten
    assert tracking.alpha == pytest.approx(0.9, abs=0.01)


def test_measured_policy_agrees_with_the_roofline_when_fed_its_times():
    batches = range(1, 400)
    target = {(b, t): step_time(b, t) for b in batches for t in range(1, 10)}  # seconds
    draft = {b: 0.05 * step_time(b) for b in batches}
    for alpha in (0.3, 0.6, 0.8, 0.95):
        measured, model = MeasuredPolicy(target, draft, alpha0=alpha), RooflinePolicy(alpha0=alpha)
        assert [measured.choose(b) for b in batches] == [model.choose(b) for b in batches]
    sparse = MeasuredPolicy({k: v for k, v in target.items() if k[0] in (1, 64, 128, 256)}, draft)
    assert sparse.choose(300) == RooflinePolicy().choose(300) == 0  # extrapolated along the last segment


def test_measured_policy_only_considers_measured_draft_lengths():
    target = {(b, t): step_time(b, t) for b in (1, 64, 256) for t in (1, 3, 5)}  # gamma 0, 2 and 4
    policy = MeasuredPolicy(target, {1: 0.0002, 256: 0.0004})
    assert policy.gammas() == [0, 2, 4]
    # Batch 1: gamma 8 would be best (best_gamma), but 4 is the longest measured.
    assert best_gamma(1) == 8 and policy.choose(1) == 4
    # Batch 100, between the measured 64 and 256: interpolation is exact for gamma 4 (compute-bound at
    # both ends: 5.18 -> 20.71 ms gives 8.09 ms) but not for gamma 2 (4.78 -> 12.43 ms gives 6.21 ms,
    # the model 4.85 ms), so the sparse table picks 4 where the model picks 2.
    draft_s = 0.0002 + 0.0002 * (100 - 1) / (256 - 1)  # interpolated draft step, s
    assert policy.speedup(100, 4) == pytest.approx(speculative_speedup(100, 0.8, 4, draft_s / step_time(100)))
    assert policy.choose(100) == 4 and best_gamma(100) == 2 and policy.choose(150) == 2
    # Batch 256: only gamma 1 still pays (best_gamma), and it was not measured, so speculation goes off.
    assert best_gamma(256) == 1 and policy.choose(256) == 0
    with pytest.raises(ValueError, match="no target steps with tokens_per_row = 2 were measured"):
        policy.speedup(256, 1)


def test_measured_step_times_make_the_same_vllm_table_as_the_model():
    batches = range(1, 261)
    target = {(b, t): step_time(b, t) for b in batches for t in range(1, 10)}  # the roofline's own times
    measured = MeasuredPolicy(target, {b: 0.05 * step_time(b) for b in batches}, alpha0=0.8)
    assert vllm_config_from_speedup(measured.speedup, 259, 8) == vllm_speculative_config(alpha=0.8, gamma_max=8)
    table = vllm_config_from_speedup(lambda B, g: measured.speedup(B, g, alpha=0.3), 259, 8)
    assert table["num_speculative_tokens"] < 8  # at alpha 0.3 a long draft never pays


def test_start_forgets_the_running_estimate_unless_carry():
    for carry in (False, True):
        policy = RooflinePolicy(alpha0=0.8, carry=carry, margin=0.1)
        policy.observe(accepted=10, tested=100)
        policy.choose(1)
        before = (policy.alpha, policy.last_gamma)
        policy.start()
        assert (policy.alpha, policy.last_gamma) == (before if carry else (0.8, None))
        assert before[0] < 0.8


def test_roofline_policy_with_a_draft_shape():
    kw = dict(context=4096, draft=LLAMA_1B, draft_kv_window=512)
    policy = RooflinePolicy(alpha0=0.8, **kw)
    assert [policy.choose(B) for B in (1, 32, 96)] == [best_gamma(B, 0.8, 8, **kw) for B in (1, 32, 96)] == [5, 6, 4]
    with pytest.raises(ValueError, match="draft_kv_window"):
        RooflinePolicy(draft_kv_window=0, draft=LLAMA_1B)


def test_auto_policy_takes_shapes_and_hardware():
    policy = auto_policy(LLAMA_8B, LLAMA_1B, H200, gamma_max=6, context=4096)
    assert (policy.gamma_max, policy.hardware, policy.draft, policy.context) == (6, H200, LLAMA_1B, 4096)
    assert policy.choose(1) == best_gamma(1, 0.8, 6, hardware=H200, context=4096, draft=LLAMA_1B)
    # At batch 1 and context 0 the draft shape's c is its weight-byte ratio, 2.48e9 / 16e9 = 0.155.
    paired = auto_policy(LLAMA_8B, LLAMA_1B, H100_SXM)
    assert paired.speedup(1, 4) == pytest.approx(speculative_speedup(1, 0.8, 4, 0.155))
    lookup = auto_policy(LLAMA_8B, None, H100_SXM)  # prompt lookup: a draft that costs nothing, c = 0
    assert lookup.draft_cost == 0 and lookup.speedup(1, 4) == pytest.approx(expected_tokens(0.8, 4))


def test_fixed_policy_and_hysteresis():
    fixed = FixedPolicy(3)
    assert fixed.choose(1) == fixed.choose(1000) == 3 and fixed.gamma_max == 3
    fixed.observe(1, 4)
    assert fixed.alpha < 0.8
    sticky = RooflinePolicy(margin=0.5)
    assert sticky.choose(1) == 8 and sticky.choose(64) == 8  # 4 is faster, but not by 50 %
    assert RooflinePolicy().choose(64) == 4


def test_bad_input_raises_value_error():
    policy = RooflinePolicy()
    with pytest.raises(ValueError, match="accepted"):
        policy.observe(accepted=5, tested=3)
    with pytest.raises(ValueError, match="batch"):
        policy.choose(0)
    with pytest.raises(ValueError, match="alpha"):
        RooflinePolicy(alpha0=1.5)
    with pytest.raises(ValueError, match="gamma"):
        FixedPolicy(-1)
    with pytest.raises(ValueError, match="tokens_per_row = 1"):
        MeasuredPolicy({(1, 5): 0.01}, {1: 0.001})
    with pytest.raises(ValueError, match="batch"):
        MeasuredPolicy({(1, 1): 0.01}, {1: 0.001}).choose(0)
