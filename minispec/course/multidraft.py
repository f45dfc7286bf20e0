"""Multi-draft verification: of k draft tokens for one position, the most an exact verifier can accept.

With one draft token x ~ q, the accept rule keeps x with probability min(1, p(x)/q(x)) and the output still follows p
exactly; its acceptance is sum_v min(p(v), q(v)) = 1 - TV(p, q), the most any exact verifier of one draft can get.
With k drafts x_1..x_k drawn independently from q (SpecTr, Sun et al. 2023, arXiv 2310.15141; SpecInfer's
multi-step rule, Miao et al. 2024), a verifier may output any of them, and the question becomes a transport problem:
couple the set S = {x_1..x_k} with an output Y ~ p so that P(Y in S) is as large as possible.

- :func:`optimal`: that largest P(Y in S), exactly. By Strassen's theorem a coupling with P(Y in S) >= 1 - e exists
  iff p(B) <= P(S meets B) + e for every set of tokens B, and P(S meets B) = 1 - (1 - q(B))^k for independent
  drafts; so the optimum is 1 - max_B [p(B) - 1 + (1 - q(B))^k], over all 2^V subsets (a small vocabulary only).
  k = 1 gives 1 - TV.
- :func:`recursive`: SpecInfer's multi-step rule, one draft after another: accept x_i with probability
  min(1, p_i(x_i) / q(x_i)), else p_{i+1} = normalised max(p_i - q, 0); if all k are rejected, draw from p_{k+1}.
  Exact, and its acceptance is 1 - prod_i (1 - sum_v min(p_i(v), q(v))). SpecTr's k-sequential rule gets within a
  factor (1 - 1/e) of the optimum; this one is the simple baseline.
- :func:`recursive_sample`: the rule as a sampler, to check by drawing that it outputs p.
"""

from __future__ import annotations

import itertools

import numpy as np


def _check(p: np.ndarray, q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    p, q = np.asarray(p, dtype=float), np.asarray(q, dtype=float)
    if p.shape != q.shape or p.ndim != 1 or (p < 0).any() or (q < 0).any():
        raise ValueError("p and q must be 1-D non-negative arrays of one shape")
    if not (np.isclose(p.sum(), 1) and np.isclose(q.sum(), 1)):
        raise ValueError(f"p and q must sum to 1, got {p.sum()} and {q.sum()}")
    return p, q


def single(p, q) -> float:
    """Acceptance of one draft token under the accept rule: sum_v min(p, q)."""
    p, q = _check(p, q)
    return float(np.minimum(p, q).sum())


def optimal(p, q, k: int) -> float:
    """The largest P(output in the k drafts) of any verifier whose output follows p, for k independent draws of q."""
    p, q = _check(p, q)
    if k < 1 or len(p) > 20:
        raise ValueError(f"need k >= 1 and a vocabulary of at most 20 tokens (2^V subsets), got {k}, {len(p)}")
    worst = 0.0  # B = {} gives 0
    for r in range(1, len(p) + 1):
        for B in itertools.combinations(range(len(p)), r):
            idx = list(B)
            worst = max(worst, p[idx].sum() - 1 + (1 - q[idx].sum()) ** k)
    return float(1.0 - worst)


def _residuals(p: np.ndarray, q: np.ndarray, k: int) -> list[np.ndarray]:
    """p_1 = p, p_{i+1} = normalised max(p_i - q, 0) (p_i itself where nothing is left: q >= p_i everywhere)."""
    out = [p]
    for _ in range(k):
        r = np.maximum(out[-1] - q, 0)
        out.append(r / r.sum() if r.sum() > 0 else out[-1])
    return out


def recursive(p, q, k: int) -> float:
    """Acceptance of SpecInfer's multi-step rule with k independent drafts: 1 - prod_i (1 - sum min(p_i, q))."""
    p, q = _check(p, q)
    if k < 1:
        raise ValueError(f"need k >= 1, got {k}")
    miss = 1.0
    for pi in _residuals(p, q, k)[:k]:
        miss *= 1 - np.minimum(pi, q).sum()
    return 1.0 - float(miss)


def recursive_sample(p, q, k: int, n: int, seed: int = 0) -> tuple[np.ndarray, float]:
    """Run the multi-step rule n times: the empirical distribution of its output (V,) and the share of draws whose
    output was one of the drafts."""
    p, q = _check(p, q)
    rng = np.random.default_rng(seed)
    res = _residuals(p, q, k)
    counts, hits = np.zeros(len(p)), 0
    for _ in range(n):
        y = None
        for i in range(k):
            x = rng.choice(len(q), p=q)
            if rng.random() * q[x] < res[i][x]:  # accept with probability min(1, p_i(x) / q(x))
                y, hits = x, hits + 1
                break
        if y is None:
            y = rng.choice(len(p), p=res[k])
        counts[y] += 1
    return counts / n, hits / n
