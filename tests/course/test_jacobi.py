"""minispec.course.jacobi: Jacobi decoding gives greedy decoding's tokens, one or more a pass."""

import pytest
import torch

import minispec
from minispec.course import jacobi


@pytest.fixture(scope="module")
def target():
    torch.set_num_threads(1)
    return minispec.load("tiny-code-target")[0]


def test_jacobi_is_greedy_decoding_and_counts_its_passes(target):
    prompt = list(b"    def __init__(self, name):\n        self.name = name\n")
    plain = minispec.generate(target, [prompt], max_new_tokens=24).tokens[0]
    for window in (1, 4):
        out = jacobi.jacobi(target, prompt, 24, window)
        assert out["tokens"] == plain and sum(out["per_pass"]) == 24
        assert all(1 <= n <= window + 1 for n in out["per_pass"]) and len(out["pool_right"]) == len(out["per_pass"])
        assert all(0 <= r <= 3 for r in out["pool_right"])  # 4-grams: at most 3 tokens after the last one


def test_a_repeated_text_converges_in_big_steps(target):
    prompt = list(b"abcabcabcabcabcabcabcabc")
    out = jacobi.jacobi(target, prompt, 30, window=8)
    assert len(out["per_pass"]) < 30  # some pass yields more than one token
    with pytest.raises(ValueError):
        jacobi.jacobi(target, prompt, 0)
