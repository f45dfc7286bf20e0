"""A call's inputs are checked before any work, and the likeliest first mistakes are named."""

import pytest
import torch

import minispec
from minispec.decoding.plain import check_request


@pytest.mark.parametrize("prompts, message", [
    ([5, 6, 7], "expected a list of token lists"),  # tok.encode(text) passed as the batch
    (torch.tensor([5, 6, 7]), "expected a list of token lists"),
    ([[5, 6], 7], "expected a list of token lists"),
    ("def f(x):", "not text"),
    (["def f(x):"], "not text"),
    ([], "non-empty list"),
    ([[5], []], "prompt 1 is empty"),
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
    prompts, _ = check_request(pair[0], [[5, 6], (7,), torch.tensor([8, 9])], 4, None)
    assert prompts == [[5, 6], [7], [8, 9]]
