"""The acceptance profile in the package (roofline.profile's constants) is what the embedded pair measures today.

The constants come from ``python scripts/tree_bench.py --profile``: 64 prompts of held-out code, 64 greedy tokens
each, the rank of the target's token in the draft's order at each of the 4,096 positions. Here half of those prompts,
drawn with a fixed seed, are measured again the same way (about 10 s on one core), and four numbers of the profile are
compared with the constants within a stated tolerance: three standard errors of the half-sample's estimate.

The standard error treats each prompt as a cluster (positions within a prompt are not independent: acceptance runs in
streaks), with the finite-population correction for drawing 32 of the 64 prompts: about 0.016 for P(rank 0) and 0.021
for P(rank 0 | previous not), so constants off by more than about 0.05 and 0.06 there fail. (The whole measurement,
all 64 prompts, reproduces the constants' counts exactly on this machine; it takes twice as long.)
"""

import random

import pytest
import torch

import minispec
from minispec.model.load import sample_text
from minispec.roofline import EMBEDDED_PROFILE, profile

PROMPTS, PROMPT_LEN, NEW, SAMPLED = 64, 64, 64, 32  # as scripts/tree_bench.py; 32 of its 64 prompts re-measured


def ratio_and_error(y: torch.Tensor, x: torch.Tensor) -> tuple[float, float]:
    """sum(y) / sum(x) over (prompts, positions) and its standard error with prompts as clusters (the linearised
    ratio estimator's variance), with the finite-population correction for SAMPLED of PROMPTS prompts."""
    Y, X = y.sum(1), x.sum(1)  # (n,) per prompt
    r, n = Y.sum() / X.sum(), len(Y)
    var = n / (n - 1) * ((Y - r * X) ** 2).sum() / X.sum() ** 2 * (1 - n / PROMPTS)
    return float(r), float(var.sqrt())


@pytest.fixture(scope="module")
def ranks():
    """(32, 64) the rank of the target's greedy token in the draft's order, teacher-forced, at each position."""
    target, tok = minispec.load("tiny-code-target")
    draft, _ = minispec.load("tiny-code-draft")
    code = tok.encode(sample_text("code").decode("utf-8", "replace"))
    stride = (len(code) - PROMPT_LEN) // PROMPTS  # the script's prompts: evenly spaced over the held-out code
    prompts = [code[i * stride + stride // 2:][:PROMPT_LEN] for i in range(PROMPTS)]
    chosen = sorted(random.Random(0).sample(range(PROMPTS), SAMPLED))
    prompts = [prompts[i] for i in chosen]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.inference_mode():
            out = minispec.generate(target, prompts, NEW).tokens
            seqs = torch.tensor([p + o for p, o in zip(prompts, out)])  # (32, 128)
            greedy = seqs[:, PROMPT_LEN:]  # (32, 64) the tokens a greedy tree step must accept
            order = draft(seqs)[:, PROMPT_LEN - 1: -1].argsort(-1, descending=True)  # (32, 64, V) likeliest first
    finally:
        torch.set_num_threads(threads)
    return (order == greedy[..., None]).int().argmax(-1)  # (32, 64)


def test_a_fresh_half_measurement_agrees_with_the_package_constants(ranks):
    first = (ranks == 0).double()  # (32, 64)
    every = torch.ones_like(first)
    measured = {
        "P(rank 0)": ratio_and_error(first, every),
        "P(rank 1)": ratio_and_error((ranks == 1).double(), every),
        "P(rank 0 | previous rank 0)": ratio_and_error(first[:, 1:] * first[:, :-1], first[:, :-1]),
        "P(rank 0 | previous not)": ratio_and_error(first[:, 1:] * (1 - first[:, :-1]), 1 - first[:, :-1]),
    }
    (n_all, all_counts), (n_first, after_first), (n_other, after_other) = (
        profile._EMBEDDED_ALL, profile._EMBEDDED_AFTER_FIRST, profile._EMBEDDED_AFTER_OTHER)
    constants = {"P(rank 0)": all_counts[0] / n_all, "P(rank 1)": all_counts[1] / n_all,
                 "P(rank 0 | previous rank 0)": after_first[0] / n_first,
                 "P(rank 0 | previous not)": after_other[0] / n_other}
    for name, (estimate, error) in measured.items():
        assert 0 < error < 0.05, (name, error)  # a real sample's spread, not a degenerate one
        assert abs(estimate - constants[name]) <= 3 * error, (name, estimate, constants[name], error)
    # the package's profile is those constants: what the tree model reads
    assert EMBEDDED_PROFILE.after_first[0] == pytest.approx(constants["P(rank 0 | previous rank 0)"])
    assert EMBEDDED_PROFILE.after_other[0] == pytest.approx(constants["P(rank 0 | previous not)"])
    assert n_first + n_other == n_all - PROMPTS  # every position but each prompt's first has a previous one
