"""Gamma policies: off above break-even, shorter drafts at larger batch, a running alpha that follows traffic."""

import math

import pytest

from minispec.policy import FixedPolicy, MeasuredPolicy, RooflinePolicy
from minispec.roofline import break_even_batch, speculative_speedup, step_time


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
    assert policy.choose(1) == 4 and policy.choose(100) in (0, 2, 4)


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
