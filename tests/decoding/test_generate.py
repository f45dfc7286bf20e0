"""Plain batched decoding: ragged prompts, per-row stopping, sampling, validation."""

import math

import pytest
import torch
from support import random_model

import minispec

PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8, 9, 10, 11], [12], [13, 14, 15, 16, 17]]


def greedy_by_full_forward(model, prompt, n):
    x = torch.tensor([prompt])
    for _ in range(n):
        x = torch.cat([x, model(x)[:, -1:].argmax(-1)], 1)
    return x[0, len(prompt):].tolist()


def test_batched_greedy_equals_each_prompt_alone():
    model = random_model(logit_scale=20)
    batched = minispec.generate(model, PROMPTS, max_new_tokens=12).tokens
    for prompt, tokens in zip(PROMPTS, batched):
        assert minispec.generate(model, [prompt], max_new_tokens=12).tokens[0] == tokens
        assert greedy_by_full_forward(model, prompt, 12) == tokens


def test_rows_stop_at_their_own_eos():
    model = random_model(logit_scale=20)
    free = minispec.generate(model, PROMPTS, max_new_tokens=12).tokens
    eos = free[1][4]  # row 1 emits this token fifth
    out = minispec.generate(model, PROMPTS, max_new_tokens=12, eos_token_id=eos).tokens
    for row, tokens in zip(free, out):
        cut = row.index(eos) + 1 if eos in row else len(row)
        assert tokens == row[:cut]  # EOS kept, nothing after it, other rows unaffected
    assert len(out[1]) <= 5


def test_stats_are_consistent():
    model = random_model()
    res = minispec.generate(model, PROMPTS, max_new_tokens=6)
    s = res.stats
    assert [len(t) for t in res.tokens] == [6] * 4
    assert s.num_output_tokens == 24 and s.num_steps == 5 and s.batch_size == 4
    assert 0 < s.ttft_s <= s.wall_s and s.tpot_p50_s > 0 and s.tpot_p99_s >= s.tpot_p50_s
    assert math.isclose(s.output_throughput, 24 / s.wall_s)
    assert set(s.phase_s) == {"prefill", "decode"}
    assert s.acceptance_rate is None and s.to_dict()["num_drafts"] is None


def test_seeded_sampling_is_reproducible_and_rows_differ():
    model = random_model(logit_scale=3)
    kw = dict(max_new_tokens=8, temperature=1.0, seed=123)
    a = minispec.generate(model, [[1, 2]] * 64, **kw).tokens
    assert a == minispec.generate(model, [[1, 2]] * 64, **kw).tokens
    assert len({tuple(t) for t in a}) > 32, "identical prompts must not share one random stream"
    assert a != minispec.generate(model, [[1, 2]] * 64, **kw | {"seed": 124}).tokens


def test_top_k_one_is_greedy():
    model = random_model(logit_scale=3)
    greedy = minispec.generate(model, PROMPTS, max_new_tokens=6).tokens
    assert minispec.generate(model, PROMPTS, max_new_tokens=6, temperature=1.0, top_k=1, seed=0).tokens == greedy


@pytest.mark.parametrize("kwargs, message", [
    (dict(prompts=[]), "non-empty list"),
    (dict(prompts=[[1, 2], []]), "prompt 1 is empty"),
    (dict(prompts=[[1, 64]]), "token id 64 outside the vocabulary"),
    (dict(prompts=[[1, -1]]), "token id -1 outside"),
    (dict(max_new_tokens=250), "exceeds the model's maximum length of 256"),
    (dict(max_new_tokens=0), "max_new_tokens"),
    (dict(temperature=-0.5), "temperature"),
    (dict(temperature=1.0, top_p=0.0), "top_p"),
    (dict(temperature=1.0, top_p=1.5), "top_p"),
    (dict(temperature=1.0, top_k=0), "top_k"),
    (dict(eos_token_id=99), "eos_token_id"),
    (dict(eos_token_id=[3, 64]), "eos_token_id"),  # the vocabulary is 0..63
])
def test_bad_input_is_named_before_any_work(kwargs, message, monkeypatch):
    model = random_model()
    monkeypatch.setattr(model, "forward", lambda *a, **k: pytest.fail("the model ran before validation"))
    args = dict(prompts=[[1, 2, 3], [4, 5, 6, 7, 8, 9, 10]], max_new_tokens=4) | kwargs
    with pytest.raises(ValueError, match=message):
        minispec.generate(model, **args)


def test_a_request_may_fill_the_models_maximum_length():
    """prompt + max_new_tokens == max_position_embeddings (256) is allowed, and runs: the last token at position 255."""
    model = random_model()
    prompt = [[t % 64 for t in range(250)]]
    out = minispec.generate(model, prompt, max_new_tokens=6)
    assert len(out.tokens[0]) == 6
    with pytest.raises(ValueError, match="exceeds the model's maximum length of 256"):
        minispec.generate(model, prompt, max_new_tokens=7)
