"""minispec.course.medusa: Medusa and Hydra heads, exact through the loop, and their training."""

import pytest
import torch

import minispec
from minispec.course import medusa
from minispec.tools import bench


@pytest.fixture(scope="module")
def target():
    torch.manual_seed(0)
    torch.set_num_threads(1)  # tiny models on a shared machine
    return minispec.load("tiny-code-target")[0]


def _heads(target, kind, scale=0.05):
    heads = medusa.Heads(target.config.hidden_size, 3, kind)
    with torch.no_grad():
        heads.w.normal_(0, scale)  # untrained but not zero: the heads propose something other than the target
    return heads


def test_a_zero_head_is_the_target_itself(target):
    heads = medusa.Heads(target.config.hidden_size, 2, "medusa")
    h = torch.randn(5, target.config.hidden_size)
    assert torch.equal(heads.hidden(0, h), h) and torch.equal(heads.hidden(1, h), h)  # zero init: h + SiLU(0)
    with pytest.raises(ValueError):
        medusa.Heads(8, 0)
    with pytest.raises(ValueError):
        medusa.Heads(8, 2, "eagle")


def test_hydra_reads_the_previous_token_and_medusa_does_not(target):
    C = target.config.hidden_size
    h, a, b = torch.randn(1, C), torch.randn(1, C), torch.randn(1, C)
    hydra, med = _heads(target, "hydra"), _heads(target, "medusa")
    assert not torch.allclose(hydra.hidden(0, h, a), hydra.hidden(0, h, b))
    assert torch.equal(med.hidden(0, h, a), med.hidden(0, h, b))  # Medusa ignores it


@pytest.mark.parametrize("kind", medusa.KINDS)
def test_greedy_through_the_loop_is_plain_decoding(target, kind):
    prompts = bench.prompts_for(3, 24, 256, list(b"def f(x):\n    return x + 1\n" * 20))
    prompts[1] = prompts[1][:17]  # ragged
    plain = minispec.generate(target, prompts, max_new_tokens=12).tokens
    draft = medusa.MedusaDraft(target, _heads(target, kind))
    out = minispec.speculative_generate(target, draft, prompts, gamma=3, max_new_tokens=12)
    assert out.tokens == plain and out.stats.num_drafts > 0
    sampled = minispec.speculative_generate(target, draft, prompts, gamma=2, max_new_tokens=8, temperature=1.0,
                                            seed=[1, 2, 3])
    assert all(len(t) == 8 for t in sampled.tokens)
    with pytest.raises(ValueError, match="at most 3"):
        minispec.speculative_generate(target, draft, prompts, gamma=4, max_new_tokens=8)


def test_a_draft_for_another_target_or_width_is_refused(target):
    with pytest.raises(ValueError, match="hidden size"):
        medusa.MedusaDraft(target, medusa.Heads(target.config.hidden_size + 1, 2))
    other = minispec.load("tiny-code-draft")[0]
    draft = medusa.MedusaDraft(target, _heads(target, "medusa"))
    with pytest.raises(ValueError, match="target it was built with"):
        draft.check(other, 10)
    assert draft.shape.params == 3 * (192 * 192 + 192) + 256 * 192 and "3 medusa heads" in repr(draft)


def test_training_lowers_the_loss_and_far_heads_stay_harder(target):
    tokens = list(b"import os\nfor i in range(10):\n    print(os.path.join('a', str(i)))\n" * 40)
    cfg = medusa.TrainConfig(heads=3, windows=4, seq_len=64, steps=30, batch=128, lr=2e-2)
    data = medusa.teacher(target, tokens, cfg)
    first, rec0 = medusa.train_heads(target, tokens, "hydra", medusa.TrainConfig(**{**cfg.__dict__, "steps": 1}), data)
    heads, rec = medusa.train_heads(target, tokens, "hydra", cfg, data)
    assert sum(rec["loss_per_head"]) < sum(rec0["loss_per_head"]) and rec["steps"] == 30
    assert rec["loss_per_head"][0] < rec["loss_per_head"][-1]
