"""Batch invariance, stated: a seeded row's draws depend on its own seed and positions only, so its token changes
with the batch around it only where its distribution does, and then only where its uniform falls within that change
of a boundary of the inverse CDF (the engine's docstring and results/cpu/batch_invariance.txt measure how often)."""

import torch

from minispec.decoding.sampling import RowParams, Sampler, SamplingParams, probabilities, sample


def test_a_token_moves_only_where_its_uniform_is_near_a_boundary():
    """V = 32,768: perturbing the logits by about what a different matmul shape does (1e-5) moves a draw only where
    u lies within the perturbation's total variation of a CDF boundary; most draws do not move."""
    g = torch.Generator().manual_seed(0)
    V, n = 32_768, 4_000
    logits = torch.randn(V, generator=g) * 3  # (V,)
    p = probabilities(logits, SamplingParams(1.0))  # (V,)
    p2 = probabilities(logits + 1e-5 * torch.randn(V, generator=g), SamplingParams(1.0))  # (V,)
    u = (torch.arange(n, dtype=torch.float64) + 0.5) / n  # (n,) evenly spread uniforms
    a, b = sample(p.expand(n, V), u), sample(p2.expand(n, V), u)  # (n,) each
    moved = a != b
    cdf = p.double().cumsum(0)  # (V,) boundaries of the inverse CDF
    tv = 0.5 * (p.double() - p2.double()).abs().sum()  # how far the two distributions are
    near = (cdf[None, :] - u[:, None]).abs().min(1).values <= 2 * tv + 1e-12  # (n,) within reach of a boundary
    assert not (moved & ~near).any()  # a moved draw was near a boundary
    assert moved.sum() < 0.01 * n  # and such draws are rare


def test_a_rows_draws_do_not_depend_on_the_batch_around_it():
    """The same seed and position give the same uniform whether the row is alone or the fourth of five rows with
    other settings (RowParams): the batch can change a row's token only through its logits."""
    seeds, pos = [11, 12, 13, 99, 14], torch.tensor([5, 40, 7, 23, 3])
    params = [SamplingParams(1.0), SamplingParams(0.7, top_k=5), SamplingParams(0), SamplingParams(1.3),
              SamplingParams(0.9, top_p=0.8)]
    batch = Sampler(RowParams.of(params), seeds, 5).uniforms(3, pos, 4)  # (5, 4)
    alone = Sampler(params[3], [99], 1).uniforms(3, pos[3:4], 4)  # (1, 4)
    assert torch.equal(batch[3], alone[0])
