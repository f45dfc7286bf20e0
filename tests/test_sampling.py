"""Temperature, top-k and top-p as distributions, and the exponential-race sampler."""

import pytest
import torch

from minispec.sampling import SamplingParams, probabilities, sample

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


def test_sample_follows_unnormalised_weights():
    w = torch.tensor([1.0, 0.0, 3.0, 4.0])  # target 0.125, 0, 0.375, 0.5
    g = torch.Generator().manual_seed(0)
    draws = sample(w.expand(200_000, 4), g)
    freq = torch.bincount(draws, minlength=4) / 200_000
    assert freq[1] == 0
    assert torch.allclose(freq, w / w.sum(), atol=0.005)  # 4.5 sigma for p = 0.5 and 200,000 draws


@pytest.mark.parametrize("kw", [dict(temperature=-1), dict(top_k=0), dict(top_k=2.5), dict(top_p=0), dict(top_p=1.01)])
def test_invalid_params(kw):
    with pytest.raises(ValueError):
        SamplingParams(**kw)
