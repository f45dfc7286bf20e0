"""RowParams: a batch whose rows sample differently (the engine's) gives each row, bit for bit, what that row's own
SamplingParams gives alone. Mutation testing found this promise untested: top-k 1 skipped in a batch, a top-k above
the vocabulary out of range, the logits' maximum taken over the whole batch instead of each row (which moves the
last bits), and an all-greedy batch returned in the logits' dtype."""

import pytest
import torch

from minispec.decoding.sampling import RowParams, SamplingParams, probabilities

V = 49_152  # SmolLM2's vocabulary

ROWS = [SamplingParams(0.0), SamplingParams(1.0), SamplingParams(0.7), SamplingParams(1.0, top_k=1),
        SamplingParams(0.8, top_k=5), SamplingParams(1.2, top_k=2 * V), SamplingParams(1.0, top_p=0.8),
        SamplingParams(0.6, top_p=1.0), SamplingParams(0.5, top_k=40, top_p=0.9), SamplingParams(1.3, top_k=1)]


@pytest.mark.parametrize("extra", [(), (3,)], ids=["(B, V)", "(B, T, V)"])
def test_each_row_gets_what_its_own_params_give_alone(extra):
    g = torch.Generator().manual_seed(0)
    B = len(ROWS)
    scale = torch.tensor([1.0, 4.0, 2.0, 1.0, 3.0, 0.5, 2.0, 1.0, 5.0, 2.0]).view(B, *(1,) * len(extra), 1)
    shift = torch.tensor([0.0, 60.0, -80.0, 10.0, -5.0, 0.0, 30.0, -30.0, 7.0, 100.0]).view(B, *(1,) * len(extra), 1)
    logits = torch.randn(B, *extra, V, generator=g) * scale + shift  # (B, ..., V) rows far apart in scale and level
    batch = probabilities(logits, RowParams.of(ROWS))  # (B, ..., V)
    for b, params in enumerate(ROWS):
        assert torch.equal(batch[b], probabilities(logits[b], params)), params
    assert ((batch[[0, 3, 9]] > 0).sum(-1) == 1).all()  # greedy and top-k 1 keep one token at every position


def test_an_all_greedy_batch_is_a_float32_one_hot():
    logits = torch.randn(2, 5, 64).bfloat16()  # (B, T, V)
    p = probabilities(logits, RowParams.of([SamplingParams(0.0)] * 2))  # (B, T, V)
    assert p.dtype == torch.float32
    assert torch.equal(p, probabilities(logits, SamplingParams(0.0)))
