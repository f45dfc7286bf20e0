"""Temperature, top-k and top-p as distributions, and the exponential-race sampler."""

import pytest
import torch

from minispec.sampling import SamplingParams, keys_at, probabilities, row_keys, row_seeds, sample, uniform

LOGITS = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0]])


def test_greedy_is_one_hot_and_never_divides_by_zero():
    p = probabilities(LOGITS, SamplingParams(0.0))
    assert p.tolist() == [[1.0, 0.0, 0.0, 0.0, 0.0]]


def test_temperature_softmax():
    p = probabilities(LOGITS, SamplingParams(0.5))
    assert torch.allclose(p, (LOGITS / 0.5).softmax(-1))


def test_top_k_keeps_k_tokens():
    p = probabilities(LOGITS, SamplingParams(1.0, top_k=2))
    ref = torch.zeros_like(p)
    ref[0, :2] = LOGITS[0, :2].softmax(-1)
    assert torch.allclose(p, ref)


def test_top_p_keeps_the_smallest_nucleus():
    full = LOGITS.softmax(-1)[0]  # about 0.55, 0.20, 0.12, 0.07, 0.03
    p = probabilities(LOGITS, SamplingParams(1.0, top_p=0.7))[0]
    # 0.55 < 0.7, 0.55 + 0.20 >= 0.7: the nucleus is the first two tokens
    assert (p > 0).tolist() == [True, True, False, False, False]
    assert torch.allclose(p[:2], full[:2] / full[:2].sum())
    assert torch.allclose(probabilities(LOGITS, SamplingParams(1.0, top_p=0.5))[0], torch.eye(5)[0])


def keys(n, seed=0):
    return row_keys(row_seeds(seed, n), "cpu")  # (n,)


def test_sample_follows_unnormalised_weights():
    w = torch.tensor([1.0, 0.0, 3.0, 4.0])  # target 0.125, 0, 0.375, 0.5
    draws = sample(w.expand(200_000, 4), keys(200_000))
    freq = torch.bincount(draws, minlength=4) / 200_000
    assert freq[1] == 0
    assert torch.allclose(freq, w / w.sum(), atol=0.005)  # 4.5 sigma for p = 0.5 and 200,000 draws
    assert torch.equal(sample(w.expand(5, 4), None), torch.full((5,), 3))  # no keys: the argmax (greedy)


def test_counter_based_uniforms_are_uniform_and_independent():
    u = uniform(keys(4096), 64)  # (4096, 64): 64 draws from each of 4096 row keys
    assert 0 < u.min() and u.max() < 1
    assert abs(u.mean().item() - 0.5) < 0.002 and abs(u.var().item() - 1 / 12) < 0.002
    counts = torch.histc(u, bins=16, min=0, max=1)  # 16,384 expected per bin
    assert ((counts - 16384).abs() < 5 * 128).all()  # 5 sigma, sigma = sqrt(16384 * 15/16) ~ 124
    corr = torch.corrcoef(torch.stack([u[:, :-1].flatten(), u[:, 1:].flatten()]))[0, 1]
    assert abs(corr.item()) < 0.01  # neighbouring draws of a row are uncorrelated
    rows = torch.corrcoef(torch.stack([u[:-1].flatten(), u[1:].flatten()]))[0, 1]
    assert abs(rows.item()) < 0.01  # and so are neighbouring rows


def test_a_rows_numbers_depend_on_its_seed_stream_and_position_only():
    a = keys_at(row_keys([7, 8, 9], "cpu"), 1, torch.tensor([5, 5, 5]))
    b = keys_at(row_keys([9], "cpu"), 1, torch.tensor([5]))
    assert a[2] == b[0] and len(set(a.tolist())) == 3
    assert keys_at(row_keys([9], "cpu"), 2, torch.tensor([5])) != b  # another stream
    assert keys_at(row_keys([9], "cpu"), 1, torch.tensor([6])) != b  # another position
    assert row_seeds(3, 2) == row_seeds(3, 2) != row_seeds(4, 2) and row_seeds([1, 2], 2) == [1, 2]


@pytest.mark.parametrize("kw", [dict(temperature=-1), dict(top_k=0), dict(top_k=2.5), dict(top_p=0), dict(top_p=1.01)])
def test_invalid_params(kw):
    with pytest.raises(ValueError):
        SamplingParams(**kw)
