"""A call's inputs are checked before any work, and the likeliest first mistakes are named."""

import pytest
import torch

import minispec
from minispec.decoding.plain import check_request

FLAT = r"expected a list of token lists .*; for one prompt pass \[ids\], e.g. \[tok.encode\(text\)\]"


@pytest.mark.parametrize("prompts, message", [
    ([5, 6, 7], FLAT),  # tok.encode(text) passed as the batch
    (torch.tensor([5, 6, 7]), "expected a list of token lists"),
    ([[5, 6], 7], "expected a list of token lists"),
    ("def f(x):", "not text"),
    (["def f(x):"], "not text"),
    ([], "non-empty list"),
    ([[5], []], "prompt 1 is empty"),
    ([[1], [0, 10**6, -1]], r"prompt 1 has token id 1000000 outside the vocabulary"),  # the first bad id, not 0
])
def test_bad_prompts_are_named(pair, prompts, message):
    target, draft = pair
    with pytest.raises(ValueError, match=message):
        check_request(target, prompts, 4, None)
    for call in (lambda: minispec.generate(target, prompts, max_new_tokens=4),
                 lambda: minispec.speculative_generate(target, draft, prompts, max_new_tokens=4)):
        with pytest.raises(ValueError, match=message):
            call()


def test_a_batch_of_lists_tuples_and_tensors_is_accepted(pair):
    prompts, _ = check_request(pair[0], [[5, 6], (7,), torch.tensor([8, 9]), [0]], 4, None)
    assert prompts == [[5, 6], [7], [8, 9], [0]]  # token 0 is a token


def test_a_2d_tensor_is_a_batch_of_equal_length_prompts(pair):
    """What Hugging Face users hold: input_ids (B, T)."""
    prompts, _ = check_request(pair[0], torch.tensor([[5, 6, 7], [0, 1, 2]]), 4, None)
    assert prompts == [[5, 6, 7], [0, 1, 2]]
    out = minispec.generate(pair[0], torch.tensor([[5, 6, 7], [0, 1, 2]]), max_new_tokens=4)
    assert out.tokens == minispec.generate(pair[0], [[5, 6, 7], [0, 1, 2]], max_new_tokens=4).tokens
