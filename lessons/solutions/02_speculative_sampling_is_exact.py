"""Lesson 02, worked solutions to the exercises. Run from the repository root:

    python lessons/solutions/02_speculative_sampling_is_exact.py

Every assert is a sampling bound (stated as in the lesson, delta = 1e-4) or a grader's verdict.
"""

import math

import torch

import minispec
from minispec.course import grader
from minispec.course.grader import step_inputs
from minispec.course.models import course_models
from minispec.decoding.sampling import SamplingParams, probabilities
from minispec.speculative.rule import accept_reject

P = torch.tensor([0.35, 0.25, 0.15, 0.12, 0.08, 0.05])  # (V,) the lesson's hand-made target
N_TOY = 200_000


def tv(a, b):
    return 0.5 * (a - b).abs().sum().item()


def tv_bound(n, k, delta=1e-4):
    return 0.5 * math.sqrt((k - 1) / n) + math.sqrt(math.log(1 / delta) / (2 * n))


def exercise_1():
    """A draft that always proposes token 5. Acceptance is sum min(p, q) = p(5) = 0.05: token 5 is kept
    with probability min(1, p(5)/1) = 0.05 and every other row draws from the residual max(0, p - q),
    which is p with token 5 removed. The output is still exactly p; the draft only wastes the step."""
    print("exercise 1: a useless draft")
    q = torch.zeros(6).index_fill(0, torch.tensor([5]), 1.0)  # (V,) all mass on token 5
    Pn, Qn = P.expand(N_TOY, 2, 6), q.expand(N_TOY, 1, 6)  # gamma = 1
    x, u, draw = step_inputs(Qn, seed=1)
    accepted, t = accept_reject(Pn, Qn, x, u, draw)
    out = torch.where(accepted[:, 0], x[:, 0], t)
    freq = torch.bincount(out, minlength=6) / N_TOY
    rate = accepted.float().mean().item()
    print(f"  acceptance {rate:.4f} (predicted sum min(p, q) = {torch.minimum(P, q).sum():.2f}); "
          f"TV(output, p) = {tv(freq, P):.4f}, bound {tv_bound(N_TOY, 6):.4f}")
    assert abs(rate - 0.05) < math.sqrt(math.log(2e4) / (2 * N_TOY))  # Hoeffding, delta = 1e-4
    assert tv(freq, P) < tv_bound(N_TOY, 6)
    return rate


def my_accept_reject(p, q, x, u, draw):
    """A correct rule, written from the lesson's description (not copied from the library)."""
    gamma = q.shape[1]
    p_x = p[:, :gamma].gather(-1, x[..., None])[..., 0]  # (B, gamma) p_i(x_i)
    q_x = q.gather(-1, x[..., None])[..., 0]  # (B, gamma) q_i(x_i): 0 only where nothing was proposed
    accepted = ((u < p_x / q_x) & (q_x > 0)).cumprod(1).bool()  # (B, gamma) u_i < p/q, every earlier one accepted
    n = accepted.sum(1)  # (B,) accepted tokens = the position of the first rejection (or gamma)
    residual = (p[:, :gamma] - q).clamp_min(0)  # (B, gamma, V) max(0, p - q)
    empty = residual.sum(-1, keepdim=True) == 0  # p == q at that position: never rejected, but avoid 0/0
    residual = torch.where(empty, p[:, :gamma], residual)
    choices = torch.cat([residual, p[:, gamma:]], 1)  # (B, gamma + 1, V): corrections, then the bonus p
    weights = choices[torch.arange(len(n)), n]  # (B, V) the row's own: residual at n, or p_{gamma+1}
    return accepted, draw(weights)


def my_first_try(p, q, x, u, draw):
    """The classic bug: one uniform per row, reused at every position."""
    return my_accept_reject(p, q, x, u[:, :1].expand_as(u), draw)


def exercise_2():
    """The correct rule passes the grader; the first try is named for what it is."""
    print("exercise 2: write the rule")
    good, bad = minispec.grade_accept_rule(my_accept_reject), minispec.grade_accept_rule(my_first_try)
    print("  my_accept_reject:", good)
    print("  my_first_try:    ", str(bad).replace("\n", "\n  "))
    assert good.passed and good.tv < good.bound
    assert not bad.passed and grader.REUSED_UNIFORM in bad.problems
    return good, bad


def exercise_3(n=2000):
    """Check 3 at temperature 0.7, top_p 0.9. The output follows the warped p (temperature, then top-p,
    applied to the target and the draft alike); against the plain softmax the same histogram is many
    bounds off, so a test that forgot the warping would fail a correct decoder."""
    print("exercise 3: the exact distribution under temperature 0.7 and top_p 0.9")
    m = course_models()
    target, draft, tok = m["target"], m["draft"], m["tokenizer"]
    prompt = tok.encode("    def ") if tok else [1, 2, 3, 4]
    warp = SamplingParams(0.7, top_p=0.9)
    chunk = min(n, 2**30 // (4 * 5 * target.config.vocab_size))  # rows per call, as in the lesson
    tokens = [t for i in range(0, n, chunk) for t in minispec.speculative_generate(
        target, draft, [prompt] * min(chunk, n - i), gamma=1, max_new_tokens=2, temperature=0.7, top_p=0.9,
        seed=list(range(i, min(i + chunk, n)))).tokens]
    first, second = torch.tensor([r[0] for r in tokens]), torch.tensor([r[1] for r in tokens])
    firsts, which = first.unique(return_inverse=True)
    share = torch.bincount(which, minlength=len(firsts)).float() / n  # (K,)
    rows = torch.tensor([prompt + [f] for f in firsts.tolist()], device=target.device)  # (K, T+1)
    exact = {}
    with torch.inference_mode():
        for name, params in (("warped", warp), ("unwarped", SamplingParams(1.0))):
            exact[name] = sum(w @ probabilities(target(c)[:, -1], params).cpu()
                              for c, w in zip(rows.split(chunk), share.split(chunk)))  # (V,)
    top = exact["warped"].argsort(descending=True)[:8]
    pooled = lambda d: torch.cat([d[top], (1 - d[top].sum()).reshape(1)])  # noqa: E731
    emp = torch.bincount(second, minlength=target.config.vocab_size) / n
    dist = {name: tv(pooled(emp), pooled(d)) for name, d in exact.items()}
    bound = tv_bound(n, 9)
    print(f"  TV(output, warped p) = {dist['warped']:.4f}; TV(output, unwarped softmax) = "
          f"{dist['unwarped']:.4f}; bound {bound:.4f} ({n} rows, 8 tokens + other)")
    assert dist["warped"] < bound
    if m["embedded"]:
        assert dist["unwarped"] > 2 * bound
    return dist


if __name__ == "__main__":
    if not torch.cuda.is_available():
        torch.set_num_threads(1)  # on a shared 2-core CPU, two threads fighting for the cores slow this down
    exercise_1()
    exercise_2()
    exercise_3()
