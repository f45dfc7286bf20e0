"""The accept-rule grader: it must pass the library's rule and name each bug class seen in public
implementations; each buggy rule below is written the way a student (or a public implementation) gets it wrong.
"""

import math

import pytest
import torch

import minispec
from minispec.course import grader
from minispec.decoding.sampling import take
from minispec.speculative.rule import accept_reject

pytestmark = pytest.mark.usefixtures("one_thread")


def _at(x_dist, x):
    """x_dist (B, gamma, V) at the tokens x (B, gamma)."""
    return x_dist.gather(-1, x[..., None])[..., 0]


def _residual(p, q):
    """norm-free max(0, p - q) (B, gamma, V), p where it is all zero (p == q)."""
    r = (p[:, :-1] - q).clamp_min(0)
    return torch.where(r.sum(-1, keepdim=True) > 0, r, p[:, :-1])


def _accept(p, q, x, u):
    q_x = _at(q, x)  # (B, gamma)
    return ((u * q_x < _at(p[:, :-1], x)) & (q_x > 0)).cumprod(1).bool()  # (B, gamma) up to the first rejection


# --- buggy rules, one per bug class -----------------------------------------------------------------

def resample_from_p(p, q, x, u, draw):
    """After a rejection draws from p_i itself instead of norm(max(0, p_i - q_i))."""
    accepted = _accept(p, q, x, u)
    return accepted, draw(take(p, accepted.sum(1)))


def one_uniform(p, q, x, u, draw):
    """Draws one uniform per row and tests every position with it."""
    return accept_reject(p, q, x, u[:, :1].expand_as(u), draw)


def no_bonus(p, q, x, u, draw):
    """Forgets the bonus token: a fully accepted draft takes t from the last position's residual."""
    accepted = _accept(p, q, x, u)
    return accepted, draw(take(_residual(p, q), accepted.sum(1).clamp(max=q.shape[1] - 1)))


def no_stop(p, q, x, u, draw):
    """Tests every position on its own: a later draft token can be accepted after a rejection."""
    accepted = (u * _at(q, x) < _at(p[:, :-1], x)) & (_at(q, x) > 0)  # (B, gamma) no cumulative product
    n = torch.where(accepted.all(1), accepted.shape[1], (~accepted).int().argmax(1))
    return accepted, draw(take(torch.cat([_residual(p, q), p[:, -1:]], 1), n))


def inverted_ratio(p, q, x, u, draw):
    """Accepts with probability min(1, q(x) / p(x)) (gpt-fast's names swap p and q; easy to swap back wrongly)."""
    accepted = (u * _at(p[:, :-1], x) < _at(q, x)).cumprod(1).bool()
    return accepted, draw(take(torch.cat([_residual(p, q), p[:, -1:]], 1), accepted.sum(1)))


def nan_when_p_equals_q(p, q, x, u, draw):
    """Normalises max(0, p - q) everywhere (0/0 where p == q) and selects by multiplying (NaN * 0 = NaN)."""
    accepted = _accept(p, q, x, u)
    r = (p[:, :-1] - q).clamp_min(0)
    dist = torch.cat([r / r.sum(-1, keepdim=True), p[:, -1:]], 1)  # (B, gamma+1, V)
    pick = torch.nn.functional.one_hot(accepted.sum(1), dist.shape[1]).float()[..., None]  # (B, gamma+1, 1)
    return accepted, draw((dist * pick).sum(1))


def shared_uniform(p, q, x, u, draw):
    """Every row uses row 0's uniforms: one random stream for the whole batch."""
    return accept_reject(p, q, x, u[:1].expand_as(u), draw)


def divides_at_temperature_0(p, q, x, u, draw):
    """Writes max(0, p - q) as p (1 - min(1, q/p)): right wherever p > 0, 0 * NaN where p = q = 0 (one-hot)."""
    ratio = (p[:, :-1] / q).clamp(max=1).gather(-1, x[..., None])[..., 0]  # (B, gamma)
    accepted = ((u < ratio) & (_at(q, x) > 0)).cumprod(1).bool()
    residual = p[:, :-1] * (1 - (q / p[:, :-1]).clamp(max=1))
    return accepted, draw(take(torch.cat([residual, p[:, -1:]], 1), accepted.sum(1)))


def own_randomness(p, q, x, u, draw):
    """Right in distribution, but ignores u: a seeded run is no longer reproducible."""
    return accept_reject(p, q, x, torch.rand_like(u), draw)


def divides_by_q(p, q, x, u, draw):
    """The paper's u < p(x) / q(x) taken literally: where nothing was proposed, p / 0 = inf accepts the filler."""
    accepted = (u < _at(p[:, :-1], x) / _at(q, x)).cumprod(1).bool()  # (B, gamma)
    n = accepted.sum(1)
    return accepted, draw(take(torch.cat([_residual(p, q), p[:, -1:]], 1), n))


BUGS = [
    (resample_from_p, grader.RESAMPLE_FROM_P),
    (one_uniform, grader.REUSED_UNIFORM),
    (no_bonus, grader.NO_BONUS),
    (no_stop, grader.NO_STOP),
    (inverted_ratio, grader.INVERTED),
    (nan_when_p_equals_q, grader.NAN_P_EQ_Q),
    (shared_uniform, grader.SHARED_ROWS),
    (divides_at_temperature_0, grader.TEMPERATURE_0),
    (own_randomness, grader.OWN_RANDOMNESS),
    (divides_by_q, grader.NO_PROPOSAL),
]
NAMED = [message for _, message in BUGS]


def test_the_library_rule_is_correct():
    report = minispec.grade_accept_rule(accept_reject)
    assert report.passed and report.problems == ()
    assert report.tv < report.bound
    assert str(report).startswith("correct")
    # The stated bound: E[TV] <= 0.5 sqrt((cells - 1) / n) plus McDiarmid's deviation at delta = 1e-6.
    n, cells = grader.GRADE_ROWS, 4 + 16 + 64 + 256
    assert math.isclose(report.bound, 0.5 * math.sqrt((cells - 1) / n) + math.sqrt(math.log(1e6) / (2 * n)))


@pytest.mark.parametrize("rule, message", BUGS, ids=[rule.__name__ for rule, _ in BUGS])
def test_each_bug_class_is_named(rule, message):
    report = minispec.grade_accept_rule(rule)
    assert not report.passed
    assert any(p.startswith(message) for p in report.problems), report
    others = [m for m in NAMED if m != message and any(p.startswith(m) for p in report.problems)]
    assert not others, f"{rule.__name__} was also named {others}"
    assert message in str(report)


def test_a_wrong_distribution_no_probe_targets_fails_the_statistical_test():
    """Resampling from p only at the third draft position: no probe reaches it; the exact law does."""
    def late_resample(p, q, x, u, draw):
        accepted = _accept(p, q, x, u)
        n = accepted.sum(1)
        dist = torch.cat([_residual(p, q), p[:, -1:]], 1)  # (B, gamma+1, V)
        dist[:, 2] = p[:, 2]
        return accepted, draw(take(dist, n))

    report = minispec.grade_accept_rule(late_resample)
    assert report.tv > report.bound and not report.passed
    assert report.problems[-1].startswith("the emitted tokens do not follow the target")
    assert not any(p.startswith(m) for m in NAMED for p in report.problems)


def test_exceptions_and_shapes_are_reported_not_raised():
    def stub(p, q, x, u, draw):
        raise NotImplementedError("write your accept rule here")

    report = minispec.grade_accept_rule(stub)
    assert report.problems == ("raised NotImplementedError: write your accept rule here",) and math.isnan(report.tv)
    column = minispec.grade_accept_rule(lambda *a: (accept_reject(*a)[0], accept_reject(*a)[1][:, None]))
    assert column.problems[0].startswith("t must be an integer tensor of shape (B,)")
    ints = minispec.grade_accept_rule(lambda *a: (accept_reject(*a)[0].long(), accept_reject(*a)[1]))
    assert ints.problems[0].startswith("accepted must be a bool tensor of shape (B, gamma)")
    wrong_draw = minispec.grade_accept_rule(lambda p, q, x, u, draw: (accept_reject(p, q, x, u, draw)[0], draw(p)))
    assert "draw takes weights of shape (B, V)" in wrong_draw.problems[0]
    assert minispec.grade_accept_rule(lambda *a: None).problems[0].startswith("must return a pair")


def test_step_inputs_follow_q_and_depend_only_on_seed_and_row():
    q = torch.tensor([[0.1, 0.6, 0.3], [0.5, 0.0, 0.5]]).expand(100_000, 2, 3)
    x, u, draw = grader.step_inputs(q, seed=3)
    for i in range(2):
        freq = torch.bincount(x[:, i], minlength=3).double() / len(x)
        assert (freq - q[0, i].double()).abs().max() < 0.01
    assert 0.49 < u.double().mean() < 0.51 and u.min() > 0 and u.max() < 1
    x5, u5, _ = grader.step_inputs(q[:5], seed=3)
    assert torch.equal(x5, x[:5]) and torch.equal(u5, u[:5])  # row b's numbers do not depend on the batch


def test_row_helpers_match_a_loop_over_rows():
    """at_rows picks a[b, n[b]] and emitted writes x_1..x_n then t, row by row, as a loop would."""
    g = torch.Generator().manual_seed(0)
    B, G, V = 7, 3, 5
    dist = torch.rand(B, G + 1, V, generator=g)  # (B, gamma+1, V)
    x = torch.randint(0, V, (B, G), generator=g)  # (B, gamma)
    n = torch.tensor([0, 1, 2, 3, 3, 0, 2])  # (B,) every count, the full draft included
    t = torch.randint(0, V, (B,), generator=g)  # (B,)
    assert torch.equal(take(dist, n), torch.stack([dist[b, n[b]] for b in range(B)]))
    assert torch.equal(take(x, n.clamp(max=G - 1)), torch.stack([x[b, min(n[b], G - 1)] for b in range(B)]))
    new = grader.emitted(x, n, t)  # (B, gamma+1)
    for b in range(B):
        assert new[b, :n[b] + 1].tolist() == x[b, :n[b]].tolist() + [t[b].item()]
