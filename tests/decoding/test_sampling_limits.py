"""The sampler at its numeric limits: the smallest temperatures, and zero weights under any scan order (issue 23)."""

import pytest
import torch
from support import PROMPTS, random_model

import minispec
from minispec.decoding.sampling import MIN_TEMPERATURE, SamplingParams, probabilities, sample


@pytest.mark.parametrize("temperature", [1e-38, MIN_TEMPERATURE, 1e-30, 0.01])
def test_a_tiny_temperature_gives_the_argmax_not_nan(temperature):
    """logits / 1e-38 overflowed to +-inf, softmax gave NaN, and the inverse CDF returned token V - 1 every time."""
    logits = torch.tensor([[5.0, 1.0, -3.0, 4.5], [-7.0, 9.0, 8.0, -1.0]])  # (2, 4)
    p = probabilities(logits, SamplingParams(temperature))  # (2, 4)
    assert not p.isnan().any()
    if temperature < 1e-20:
        assert torch.equal(p, torch.eye(4)[[0, 1]])  # the argmax, to float32
    assert torch.equal(sample(p, torch.tensor([0.999, 0.999], dtype=torch.float64)), torch.tensor([0, 1]))


def test_sampling_at_a_tiny_temperature_decodes_as_greedy():
    target = random_model(seed=5, logit_scale=10)  # logits well above 3.4, so logits / 1e-38 overflowed
    draft = random_model(seed=6, layers=1, logit_scale=10)
    greedy = minispec.generate(target, PROMPTS, max_new_tokens=6).tokens
    assert minispec.generate(target, PROMPTS, max_new_tokens=6, temperature=1e-38, seed=0).tokens == greedy
    out = minispec.speculative_generate(target, draft, PROMPTS, gamma=3, max_new_tokens=6, temperature=1e-38, seed=0)
    assert out.tokens == greedy


@pytest.mark.parametrize("temperature", [1e-39, 5e-324])
def test_a_temperature_whose_reciprocal_overflows_is_refused(temperature):
    with pytest.raises(ValueError, match="overflows float32; use temperature=0 for greedy"):
        SamplingParams(temperature)


def blocked_scan(cumsum, block=8):
    """A cumulative sum added in another order, as a parallel scan on a GPU adds it: a left-to-right scan inside
    blocks of ``block`` entries, each block's total by pairwise reduction, then the blocks' running totals added in.
    Over floats, an entry at a block's start then rounds apart from the one before it, even where its weight is 0."""

    def scan(self, dim):
        assert dim in (-1, self.dim() - 1)
        V = self.shape[-1]
        x = torch.nn.functional.pad(self, (0, -V % block)).unflatten(-1, (-1, block))  # (..., V/block, block)
        local = cumsum(x, -1)  # (..., V/block, block)
        totals = x
        while totals.shape[-1] > 1:
            totals = totals[..., 0::2] + totals[..., 1::2]  # pairwise
        before = cumsum(totals, -2) - totals  # (..., V/block, 1) the blocks before each
        return (before + local).flatten(-2)[..., :V]

    return scan


def test_no_zero_weight_token_whatever_order_the_scan_adds_in(monkeypatch):
    """Under a blocked scan the raw float64 cumulative sum gave zero-weight tokens at block starts an interval of
    about 1e-16, and u aimed there drew them. On the integer grid every order adds exactly: the same tokens as a
    left-to-right scan, for every u."""
    gen = torch.Generator().manual_seed(0)
    w = torch.exp(-40 * torch.rand(16, 400, generator=gen))  # (16, 400) weights over 17 orders of magnitude
    w *= torch.rand(16, 400, generator=gen) < 0.3  # 70 % zeros
    w[:, -1] = 0  # a zero at the end too
    cdf = w.double().cumsum(-1)  # (16, 400) left to right
    u = (cdf / cdf[:, -1:]).clamp(2**-53, 1 - 2**-53)  # (16, 400) u * total on every boundary
    u = torch.cat([u, torch.nextafter(u, u + 1), torch.nextafter(u, u - 1)], 1)  # (16, 1200) and either side
    weights = w[:, None].expand(-1, u.shape[1], -1)  # (16, 1200, 400)
    left_to_right = sample(weights, u)  # (16, 1200)
    monkeypatch.setattr(torch.Tensor, "cumsum", blocked_scan(torch.Tensor.cumsum))
    assert not torch.equal(w.double().cumsum(-1), cdf)  # the blocked scan does round differently
    x = sample(weights, u)  # (16, 1200)
    assert (w.gather(1, x) > 0).all(), "a zero-weight token was drawn"
    assert torch.equal(x, left_to_right)
