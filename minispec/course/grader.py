"""Grade an accept rule a student writes, against its exact law and with one probe per known bug class.

A student writes ``fn(p, q, x, u, draw) -> (accepted, t)`` with the contract of
:func:`minispec.speculative.rule.accept_reject`. The grader runs it on inputs whose exact output law is
known and on small probes, one per bug class seen in public implementations, and says in words what
is wrong. Everything is seeded, so a rule gets the same report every time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from minispec.decoding.sampling import ACCEPT, DRAFT, TARGET, row_keys, row_seeds, sample, take, uniforms

GRADE_ROWS = 200_000  # rows of the statistical test
GRADE_DELTA = 1e-6  # a correct rule fails a statistical check with probability below this, per check
PROBE_ROWS = 20_000  # rows of each targeted probe
# The statistical test's fixed per-position distributions (V = 4, gamma = 3); they do not depend on the
# prefix, so the exact law of a step is a product. p_1 is 0 where q_1 is not (a token the target's
# top-p would cut), q_2 is 0 where p_2 is not; no token has p = q = 0. Acceptance 0.7, 0.8, 0.7 by position.
GRADE_P = ((0.40, 0.30, 0.30, 0.00), (0.10, 0.20, 0.30, 0.40), (0.25, 0.25, 0.25, 0.25), (0.05, 0.15, 0.30, 0.50))
GRADE_Q = ((0.10, 0.30, 0.40, 0.20), (0.30, 0.00, 0.30, 0.40), (0.55, 0.15, 0.15, 0.15))

RESAMPLE_FROM_P = "resamples from p instead of norm(max(0, p - q)) after a rejection"
REUSED_UNIFORM = "reuses one uniform across positions (u[:, i] must be used at position i)"
NO_BONUS = "no bonus token: when every draft token is accepted, t must be drawn from p_{gamma+1}"
NO_STOP = "keeps accepting after a rejection (acceptance must stop at the first rejected position)"
INVERTED = "accepts with probability min(1, q/p) instead of min(1, p/q)"
NAN_P_EQ_Q = "divides by zero / returns NaN when p == q (max(0, p - q) is all zero)"
TEMPERATURE_0 = "divides by zero at temperature 0 (one-hot p and q)"
SHARED_ROWS = "rows share one random draw (row b must use its own u[b] and its own draws)"
NO_PROPOSAL = ("accepts a position where the draft proposed nothing (q all zero, a prompt-lookup row without "
               "a match): q(x) = 0 must be rejected, and t drawn from max(0, p - 0) = p there")
OWN_RANDOMNESS = ("uses random numbers of its own: the same u and draw must give the same output "
                  "(use u[:, i] at position i and draw(weights) for t, not torch.rand or torch.multinomial)")


def emitted(x: torch.Tensor, n: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """What a step appends to each row: x (B, gamma) draft tokens, n (B,) accepted, t (B,) -> (B, gamma+1)
    holding x_1..x_n, then t (entries after n + 1 are left over: a row gains n + 1 tokens)."""
    return torch.cat([x, t[:, None]], 1).scatter(1, n[:, None], t[:, None])  # (B, gamma+1)


@dataclass(frozen=True)
class GradeReport:
    """What :func:`grade_accept_rule` found. ``str(report)`` says "correct" or lists the problems."""

    passed: bool
    problems: tuple[str, ...]  # plain-words descriptions, the named bug classes first
    tv: float  # total variation between the emitted steps and their exact law (nan if the rule failed to run)
    bound: float  # what a correct rule stays below with probability >= 1 - GRADE_DELTA
    rows: int  # rows of the statistical test

    def __str__(self) -> str:
        test = (f"TV {self.tv:.4f} between the emitted steps and their exact law, bound {self.bound:.4f} "
                f"({self.rows:,} rows, V = 4, gamma = 3)")
        if self.passed:
            return f"correct: {test}; every probe passed."
        lines = [f"wrong ({len(self.problems)} problem{'s' * (len(self.problems) > 1)}):"]
        lines += [f"  - {p}" for p in self.problems]
        if self.tv <= self.bound:  # the distribution was right: say so
            lines.append(f"  (the statistical test passed: {test})")
        return "\n".join(lines)


class Draw:
    """``draw(weights (B, V)) -> (B,)``: one token per row from unnormalised weights, each call with fresh
    counter-based keys of its own row (so rows never share a draw). Notes weights that are not finite,
    negative or all zero in ``bad``, and raises ValueError on a wrong shape."""

    def __init__(self, keys: torch.Tensor, vocab: int):
        self.keys, self.vocab, self.calls, self.bad = keys, vocab, 0, []  # keys (B, 2)

    def __call__(self, weights: torch.Tensor) -> torch.Tensor:
        B = self.keys.shape[0]
        shape = tuple(weights.shape) if isinstance(weights, torch.Tensor) else type(weights).__name__
        if shape != (B, self.vocab):
            raise ValueError(f"draw takes weights of shape (B, V) = ({B}, {self.vocab}), got {shape}")
        w = weights.float()  # (B, V)
        if not torch.isfinite(w).all():
            self.bad.append("NaN or inf")
        elif (w < 0).any():
            self.bad.append("negative")
        elif (w.sum(-1) <= 0).any():
            self.bad.append("all zero")
        w = w.nan_to_num(0.0, 0.0, 0.0).clamp_min(0)  # (B, V) keep going, so the report can say more
        w = torch.where(w.sum(-1, keepdim=True) > 0, w, 1.0)  # (B, V) an all-zero row: any token
        position = torch.full((B,), self.calls, dtype=torch.long, device=self.keys.device)  # (B,)
        self.calls += 1
        return sample(w, uniforms(self.keys, TARGET, position, 1)[:, 0])  # (B,)


def step_inputs(q: torch.Tensor, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, Draw]:
    """Draft tokens and randomness for a rule, from the library's counter-based generator.

    For q (B, gamma, V): x (B, gamma) with x_i ~ q_i in each row, u (B, gamma) uniforms, and a
    :class:`Draw`. Row b's numbers depend only on (seed, b), as in :func:`minispec.speculative_generate`.
    """
    B, gamma, V = q.shape
    keys = row_keys(row_seeds(seed, B), q.device)  # (B, 2) row b's Philox key, from (seed, b)
    zero = torch.zeros(B, dtype=torch.long, device=q.device)  # (B,)
    x = sample(q, uniforms(keys, DRAFT, zero, gamma))  # (B, gamma)
    u = uniforms(keys, ACCEPT, zero, gamma)  # (B, gamma)
    return x, u, Draw(keys, V)


def grade_accept_rule(fn, rows: int = GRADE_ROWS, seed: int = 0) -> GradeReport:
    """Grade an accept rule ``fn(p, q, x, u, draw) -> (accepted, t)`` with the contract of
    :func:`minispec.speculative.rule.accept_reject`; returns a :class:`GradeReport`, never raises.

    1. The statistical test. Every row has the same p_i and q_i (``GRADE_P``, ``GRADE_Q``: V = 4,
       gamma = 3), x ~ q, so a correct rule emits a step of n + 1 tokens y_1..y_{n+1} with probability
       prod_{i<=n} min(p_i, q_i)(y_i) times max(0, p_{n+1} - q_{n+1})(y_{n+1}) if n < gamma, or
       p_{gamma+1}(y_{n+1}) if n = gamma: 340 cells. The emitted steps of ``rows`` rows must lie within
       total variation 0.5 sqrt((cells - 1) / rows) + sqrt(ln(1 / delta) / (2 rows)) of that law (the
       expected TV of an empirical distribution, plus McDiarmid's deviation: TV moves by at most 1/rows
       per row), with delta = ``GRADE_DELTA``. The token at each position i (over the rows that reach
       it: p_i) and the number of tokens a row gains are checked the same way, to say where it is off.
    2. Probes, one per bug class, each on ``PROBE_ROWS`` rows built so that the bug moves a count far
       past its sampling noise: resampling from p, one uniform for every position, no bonus token, no
       stop at the first rejection, the inverted ratio q/p, NaN when p == q, division by zero at
       temperature 0, rows sharing one random draw, random numbers of its own. Wrong shapes, dtypes and
       exceptions are reported, not raised.
    """
    problems: list[str] = []
    report = lambda tv=math.nan, bound=math.nan: GradeReport(  # noqa: E731
        not problems, tuple(dict.fromkeys(problems)), tv, bound, rows)
    P, Q = torch.tensor(GRADE_P), torch.tensor(GRADE_Q)  # (gamma+1, V), (gamma, V)
    G, V = Q.shape
    p, q = P.expand(rows, G + 1, V), Q.expand(rows, G, V)  # (rows, gamma+1, V), (rows, gamma, V)
    x, u, draw = step_inputs(q, seed)
    out, error = _run(fn, p, q, x, u, draw)
    if error:
        problems.append(error)
        return report()
    accepted, t = out  # (rows, gamma), (rows,)
    if (accepted != accepted.cummin(1).values).any():
        problems.append(NO_STOP)
    tv, bound, where = _statistical_test(P, Q, x, accepted, t)
    for probe in (_probe_rows_and_ratio, _probe_positions, _probe_bonus, _probe_resample, _probe_p_equals_q,
                  _probe_temperature_0, _probe_no_proposal):
        problems += probe(fn, seed, problems)
    if tv > bound or where:
        problems.append(f"the emitted tokens do not follow the target: TV {tv:.4f} from the exact law of a step, "
                        f"bound {bound:.4f}" + (f"; worst, {where}" if where else ""))
    return report(tv, bound)


def _run(fn, p, q, x, u, draw):
    """Call the rule on copies of its inputs; ((accepted, t), None) or (None, what went wrong)."""
    B, G, V = q.shape
    try:
        out = fn(p.clone(), q.clone(), x.clone(), u.clone(), draw)
    except Exception as e:  # the student's code: report it, never propagate
        return None, f"raised {type(e).__name__}: {str(e)[:300]}"
    if not isinstance(out, (tuple, list)) or len(out) != 2:
        return None, f"must return a pair (accepted, t), got {type(out).__name__}"
    accepted, t = out
    describe = lambda a: (f"{a.dtype} {tuple(a.shape)}" if isinstance(a, torch.Tensor)  # noqa: E731
                          else type(a).__name__)
    if not (isinstance(accepted, torch.Tensor) and accepted.dtype == torch.bool and accepted.shape == (B, G)):
        return None, f"accepted must be a bool tensor of shape (B, gamma) = ({B}, {G}), got {describe(accepted)}"
    if not (isinstance(t, torch.Tensor) and not t.is_floating_point() and t.dtype != torch.bool
            and t.shape == (B,)):
        return None, f"t must be an integer tensor of shape (B,) = ({B},), got {describe(t)}"
    if ((t < 0) | (t >= V)).any():
        return None, f"t must hold token ids in [0, {V}), got values from {int(t.min())} to {int(t.max())}"
    return (accepted, t.long()), None


def tv_bound(cells: int, n: int, delta: float = GRADE_DELTA) -> float:
    """TV(empirical of n samples, truth) over ``cells`` cells exceeds this with probability < delta.

    E[TV] <= 0.5 sqrt((cells - 1) / n) (Cauchy-Schwarz on the cells' standard deviations), and one
    sample moves TV by at most 1/n, so McDiarmid's inequality adds sqrt(ln(1 / delta) / (2 n)).
    """
    return 0.5 * math.sqrt((cells - 1) / n) + math.sqrt(math.log(1 / delta) / (2 * n))


def _statistical_test(P, Q, x, accepted, t):
    """TV of the emitted steps from their exact law, its bound, and the marginal furthest off its bound
    ('' when every marginal is inside its own)."""
    B, G = x.shape
    V = Q.shape[1]
    n = accepted.sum(1)  # (B,) as the loop reads it: the first n draft tokens are emitted, then t
    new = emitted(x, n, t)  # (B, gamma+1) x_1..x_n, t
    keep, reject = torch.minimum(P[:-1], Q), (P[:-1] - Q).clamp_min(0)  # (gamma, V) each
    law, index, offset, prefix = [], torch.zeros(B, dtype=torch.long), 0, torch.ones(1)
    for k in range(G + 1):  # steps of k accepted tokens and then t: V^(k+1) cells
        last = reject[k] if k < G else P[G]  # (V,)
        law.append(torch.outer(prefix, last).flatten())  # (V^(k+1),)
        prefix = torch.outer(prefix, keep[k]).flatten() if k < G else prefix
        code = sum(new[:, j] * V ** (k - j) for j in range(k + 1))  # (B,)
        index = torch.where(n == k, offset + code, index)
        offset += V ** (k + 1)
    law = torch.cat(law).double()  # (cells,)
    freq = torch.bincount(index, minlength=offset).double() / B
    tv, bound = 0.5 * (freq - law).abs().sum().item(), tv_bound(offset, B)
    off = []  # (TV / bound, description) of each marginal
    for i in range(G + 1):  # the token at position i, over the rows that reach it, must follow p_i
        reach = n >= i  # (B,)
        m = int(reach.sum())
        if m:
            f = torch.bincount(new[reach, i], minlength=V).double() / m
            d = 0.5 * (f - P[i].double()).abs().sum().item()
            off.append((d / tv_bound(V, m), f"the token at position {i + 1}: TV {d:.3f} from p_{i + 1} over the "
                                              f"{m:,} rows that reach it, bound {tv_bound(V, m):.3f}"))
    beta = keep.sum(1).double()  # (gamma,) acceptance probability at each position
    reach = torch.cat([torch.ones(1, dtype=torch.double), beta.cumprod(0)])  # (gamma+1,) P(n >= k)
    lengths = reach - torch.cat([reach[1:], torch.zeros(1, dtype=torch.double)])  # (gamma+1,) P(n = k)
    d = 0.5 * (torch.bincount(n, minlength=G + 1).double() / B - lengths).abs().sum().item()
    off.append((d / tv_bound(G + 1, B), f"the number of accepted tokens: TV {d:.3f} from its law "
                                          f"beta_1..beta_n (1 - beta_(n+1)), bound {tv_bound(G + 1, B):.3f}"))
    worst = max(off)
    return tv, bound, worst[1] if worst[0] > 1 else ""


def _probe_inputs(p_rows, q_rows, x=None, seed=0):
    """Probe inputs from per-row distributions p (B, gamma+1, V), q (B, gamma, V); x drawn from q unless given."""
    x_drawn, u, draw = step_inputs(q_rows, seed)
    return p_rows, q_rows, x_drawn if x is None else x, u, draw


def _call_probe(fn, what, inputs, problems):
    """Run the rule on a probe; (accepted, t, draw) or None after noting what went wrong."""
    out, error = _run(fn, *inputs)
    if error:
        problems.append(f"on {what}: {error}")
        return None
    return (*out, inputs[-1])


def _probe_rows_and_ratio(fn, seed, found):
    """Identical rows but for u, gamma = 1: x = 0 where p/q = 1/2 (even rows), x = 1 where p/q = 2 (odd rows).

    Accepts about half the even rows and every odd row; the inverted ratio the opposite. Rows that
    share u all decide alike; a rule with random numbers of its own changes on a second call.
    """
    B, problems = PROBE_ROWS, []
    p = torch.tensor([[0.25, 0.5, 0.125, 0.125], [0.25, 0.25, 0.25, 0.25]]).expand(B, 2, 4)  # (B, 2, V)
    q = torch.tensor([[0.5, 0.25, 0.25, 0.0]]).expand(B, 1, 4)  # (B, 1, V) residual: 0, 0.25, 0, 0.125 (norm)
    x = (torch.arange(B) % 2)[:, None]  # (B, 1) token 0 (p/q = 1/2) and token 1 (p/q = 2) in turn
    inputs = _probe_inputs(p, q, x, seed + 1)
    first = _call_probe(fn, "rows that differ only in u", inputs, problems)
    again = _call_probe(fn, "rows that differ only in u", (*inputs[:4], Draw(inputs[4].keys, 4)), problems)
    if first is None or again is None:
        return problems
    if not (torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])):
        problems.append(OWN_RANDOMNESS)
    accepted, t = first[0][:, 0], first[1]  # (B,), (B,)
    half, sure = accepted[0::2].double().mean().item(), accepted[1::2].double().mean().item()
    rejected_t = t[0::2][~accepted[0::2]]  # the residual's draws: tokens 1 and 3, 2 : 1
    alike = lambda a: bool(a.all() == a.any())  # noqa: E731  every row decided the same
    one_token = len(rejected_t) > 100 and bool((rejected_t == rejected_t[0]).all())
    if (alike(accepted[0::2]) and alike(accepted[1::2])) or one_token:
        problems.append(SHARED_ROWS)  # identical rows but for u decided alike, or drew the same token
    elif abs(half - 1.0) < 0.01 and abs(sure - 0.5) < 0.03:
        problems.append(INVERTED)
    elif abs(half - 0.5) > 0.03 or sure < 0.99:
        problems.append(f"accepts a draft token with probability {half:.2f} where p(x)/q(x) = 1/2 and {sure:.2f} "
                        "where p(x)/q(x) = 2; it must be min(1, p(x)/q(x)): 0.50 and 1.00")
    return problems


def _probe_positions(fn, seed, found):
    """gamma = 2 with p/q = 1/2 at both positions: position 2 is accepted in half the rows that accept position 1."""
    B, problems = PROBE_ROWS, []
    p = torch.tensor([0.25, 0.25, 0.25, 0.25]).expand(B, 3, 4)  # (B, 3, V)
    q = torch.tensor([0.5, 0.5, 0.0, 0.0]).expand(B, 2, 4)  # (B, 2, V)
    out = _call_probe(fn, "two positions with p(x)/q(x) = 1/2", _probe_inputs(p, q, seed=seed + 2), problems)
    if out is None or INVERTED in found or SHARED_ROWS in found:
        return problems
    accepted = out[0]  # (B, 2)
    first, both = accepted[:, 0].double().mean().item(), (accepted[:, 0] & accepted[:, 1]).double().mean().item()
    if abs(first - 0.5) < 0.03 and abs(both / first - 0.5) > 0.1:
        problems.append(REUSED_UNIFORM if both / first > 0.9 else
                        f"accepts position 2 in {both / first:.2f} of the rows that accept position 1, where "
                        "p/q = 1/2 expects 0.50: each position needs its own uniform u[:, i]")
    return problems


def _probe_bonus(fn, seed, found):
    """gamma = 2, acceptance 0.9 per position, residual all on token 2, p_3 all on token 3: after a fully
    accepted draft t is 3."""
    B, problems = PROBE_ROWS, []
    p = torch.tensor([[0.45, 0.45, 0.1, 0.0]] * 2 + [[0.0, 0.0, 0.0, 1.0]]).expand(B, 3, 4)  # (B, 3, V)
    q = torch.tensor([0.5, 0.5, 0.0, 0.0]).expand(B, 2, 4)  # (B, 2, V)
    out = _call_probe(fn, "a draft accepted in full", _probe_inputs(p, q, seed=seed + 3), problems)
    if out is None:
        return problems
    accepted, t, _ = out
    full = accepted.all(1)  # (B,)
    if full.sum() > 100 and (t[full] == 3).double().mean() < 0.99:
        problems.append(NO_BONUS)
    return problems


def _probe_resample(fn, seed, found):
    """gamma = 1, p = (1/2, 1/2, 0, 0), q = (1/2, 0, 1/2, 0): x = 2 is always rejected and
    norm(max(0, p - q)) is all on token 1; resampling from p gives token 0 half the time."""
    B, problems = PROBE_ROWS, []
    p = torch.tensor([[0.5, 0.5, 0.0, 0.0], [0.0, 0.0, 0.0, 1.0]]).expand(B, 2, 4)  # (B, 2, V)
    q = torch.tensor([[0.5, 0.0, 0.5, 0.0]]).expand(B, 1, 4)  # (B, 1, V)
    out = _call_probe(fn, "a rejection", _probe_inputs(p, q, seed=seed + 4), problems)
    if out is None:
        return problems
    accepted, t, _ = out
    rejected = ~accepted[:, 0]  # (B,)
    if rejected.sum() > 100:
        right, zero = (t[rejected] == 1).double().mean().item(), (t[rejected] == 0).double().mean().item()
        if right < 0.99:
            problems.append(RESAMPLE_FROM_P if abs(zero - 0.5) < 0.05 else
                            f"after a rejection t must be drawn from norm(max(0, p - q)), here token 1 always; "
                            f"it was token 1 in only {right:.0%} of the rejected rows")
    return problems


def _probe_p_equals_q(fn, seed, found):
    """p == q at every position (random distributions): every draft token is accepted, t ~ p_{gamma+1},
    and max(0, p - q) is all zero, so a rule that normalises it anywhere divides 0 by 0."""
    B, problems = PROBE_ROWS, []
    g = torch.Generator().manual_seed(seed)
    p = torch.randn(B, 4, 4, generator=g).softmax(-1)  # (B, gamma+1, V) gamma = 3
    inputs = _probe_inputs(p, p[:, :3].clone(), seed=seed + 5)
    out, error = _run(fn, *inputs)
    bad = inputs[-1].bad
    if error or bad:
        problems.append(NAN_P_EQ_Q + (f": {error}" if error else f": draw got {bad[0]} weights"))
    elif not out[0].all():
        problems.append("rejects draft tokens when p == q, where p(x)/q(x) = 1 must always accept")
    return problems


def _probe_temperature_0(fn, seed, found):
    """One-hot p and q (temperature 0), gamma = 3. First, a draft that disagrees with the target at every
    position: nothing is accepted and t is the target's argmax at position 1. Then agreement up to a random
    position: greedy verification, exactly."""
    B, G, problems = PROBE_ROWS, 3, []
    g = torch.Generator().manual_seed(seed + 6)
    a = torch.randint(0, 4, (B, G + 1), generator=g)  # (B, gamma+1) the target's argmax
    d = (a[:, :G] + torch.randint(1, 4, (B, G), generator=g)) % 4  # (B, gamma) the draft's: never a's
    onehot = lambda i: torch.nn.functional.one_hot(i, 4).float()  # noqa: E731
    inputs = _probe_inputs(onehot(a), onehot(d), d, seed + 6)
    out, error = _run(fn, *inputs)
    if error or inputs[-1].bad:
        return [TEMPERATURE_0 + (f": {error}" if error else f": draw got {inputs[-1].bad[0]} weights")]
    named = any(m in " ".join(found) for m in (RESAMPLE_FROM_P, REUSED_UNIFORM, NO_BONUS, NO_STOP, INVERTED,
                                                NAN_P_EQ_Q, SHARED_ROWS, OWN_RANDOMNESS))
    if named:
        return problems  # a wrong greedy output below would only be another symptom of a bug already named
    if out[0].any() or not torch.equal(out[1], a[:, 0]):
        return ["at temperature 0 (one-hot p and q) a draft token the target gives probability 0 must be "
                "rejected and t must be the target's argmax"]
    k = torch.randint(0, G + 1, (B,), generator=g)  # (B,) the draft agrees at positions < k
    d = torch.where(torch.arange(G) < k[:, None], a[:, :G], d)  # (B, gamma)
    inputs = _probe_inputs(onehot(a), onehot(d), d, seed + 7)
    out, error = _run(fn, *inputs)
    expected = take(a, k)  # (B,) the target's argmax where the draft first disagrees, or the bonus
    if error or inputs[-1].bad or not torch.equal(out[0].sum(1), k) or not torch.equal(out[1], expected):
        problems.append(TEMPERATURE_0 if error or inputs[-1].bad else
                        "at temperature 0 (one-hot p and q) the output must be greedy verification: accept while "
                        "the draft's token is the target's argmax, then the target's argmax")
    return problems


def _probe_no_proposal(fn, seed, found):
    """gamma = 2 and q all zero at both positions: the row proposed nothing (x is filler), so nothing is
    accepted and t ~ p_1 = (1/2, 1/2, 0, 0). A rule that divides p by q accepts the filler."""
    B, problems = PROBE_ROWS, []
    p = torch.tensor([[0.5, 0.5, 0.0, 0.0]] * 3).expand(B, 3, 4)  # (B, 3, V)
    q = torch.zeros(B, 2, 4)  # (B, 2, V) nothing proposed
    x = torch.zeros(B, 2, dtype=torch.long)  # (B, 2) filler, with p(x) = 1/2
    out = _call_probe(fn, "a row that proposed nothing", _probe_inputs(p, q, x, seed + 8), problems)
    if out is None:
        return problems
    accepted, t, draw = out
    if draw.bad and any(m in " ".join(found) for m in (NAN_P_EQ_Q, TEMPERATURE_0)):
        return problems  # NaN weights here are a symptom of a division already named
    zero = (t == 0).double().mean().item()
    if accepted.any() or draw.bad or (t > 1).any() or abs(zero - 0.5) > 0.03:
        problems.append(NO_PROPOSAL)
    return problems
