"""minispec.course.multidraft: one draft, k drafts by the multi-step rule, and the optimum, on small vocabularies."""

import itertools

import numpy as np
import pytest

from minispec.course import multidraft as md


def _pairs(n=20, V=6, seed=0):
    rng = np.random.default_rng(seed)
    return [(rng.dirichlet(np.full(V, 0.5)), rng.dirichlet(np.full(V, 0.5))) for _ in range(n)]


def test_one_draft_is_one_minus_total_variation_everywhere():
    for p, q in _pairs():
        tv = np.abs(p - q).sum() / 2
        assert md.single(p, q) == pytest.approx(1 - tv)
        assert md.recursive(p, q, 1) == pytest.approx(1 - tv) and md.optimal(p, q, 1) == pytest.approx(1 - tv)


def test_more_drafts_never_hurt_and_the_rule_stays_under_the_optimum():
    for p, q in _pairs():
        rec = [md.recursive(p, q, k) for k in (1, 2, 3, 4)]
        opt = [md.optimal(p, q, k) for k in (1, 2, 3, 4)]
        assert all(a <= b + 1e-12 for a, b in zip(rec, rec[1:])) and all(a <= b + 1e-12 for a, b in zip(opt, opt[1:]))
        assert all(r <= o + 1e-12 for r, o in zip(rec, opt))


def test_the_optimum_by_brute_force_on_two_tokens():
    """V = 2, k = 2: the set S is {0}, {1} or {0, 1}; the best coupling puts Y in S whenever it can."""
    for p0, q0 in itertools.product((0.1, 0.5, 0.8), (0.2, 0.6, 0.9)):
        p, q = np.array([p0, 1 - p0]), np.array([q0, 1 - q0])
        only0, only1 = q0 ** 2, (1 - q0) ** 2  # P(S = {0}), P(S = {1}); else both
        best = 1 - max(0.0, p0 - (1 - only1), (1 - p0) - (1 - only0))  # Y = 0 needs 0 in S: at most 1 - P(S = {1})
        assert md.optimal(p, q, 2) == pytest.approx(best)


def test_the_multi_step_rule_outputs_p():
    p, q = np.array([0.5, 0.3, 0.2, 0.0]), np.array([0.1, 0.2, 0.3, 0.4])
    emp, hit = md.recursive_sample(p, q, 2, 40_000)
    assert np.abs(emp - p).sum() / 2 < 0.015 and abs(hit - md.recursive(p, q, 2)) < 0.015
    with pytest.raises(ValueError):
        md.single(p, q[:3])
    with pytest.raises(ValueError):
        md.optimal(np.full(21, 1 / 21), np.full(21, 1 / 21), 2)
