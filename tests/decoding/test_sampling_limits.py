"""The sampler at its numeric limits: the smallest temperatures, and zero weights under any scan order (issue 23)."""

import pytest
import torch

import minispec
from conftest import PROMPTS, random_model
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
