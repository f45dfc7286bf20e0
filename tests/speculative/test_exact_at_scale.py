"""Exactness at the vocabulary sizes of real checkpoints, through the public API.

A 64-token vocabulary hid a sampler bug that fired on 0.8 % of draws at 128k (a uniform that rounded
to 1.0 made an exponential race pick a zero-weight token). These tests run random models built from
configs at V = 131,072 and 32,768, with a negative control that puts that bug back.
"""

import math

import pytest
import torch

import minispec
from minispec.course.grader import tv_bound
from minispec.decoding import sampling
from minispec.decoding.sampling import probabilities
from minispec.model.config import ModelConfig
from minispec.model.llama import Model

pytestmark = pytest.mark.slow


def wide(vocab, layers=1, hidden=16, seed=0, scale=30.0, from_model=None, noise=0.0):
    """A small random Llama with a real-sized vocabulary; ``scale`` sharpens its logits (a real model's
    next-token distribution is far from uniform); ``from_model`` + ``noise``: a perturbed copy (a draft
    that agrees with the target often, but not always)."""
    torch.manual_seed(seed)
    cfg = ModelConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=hidden // 4,
                      max_position_embeddings=2048)
    model = Model(cfg).eval().requires_grad_(False)
    with torch.no_grad():
        if from_model is not None:
            model.load_state_dict(from_model.state_dict())
            for p in model.parameters():
                p.add_(noise * torch.randn_like(p) * p.std())
        else:
            model.lm_head.weight.mul_(scale)
    return model


@pytest.fixture(scope="module")
def v128k():
    target = wide(131_072, layers=2)
    return target, wide(131_072, layers=2, from_model=target, noise=0.3, seed=1)


def drafts(target, draft):
    """Every kind of draft, small (each verified position costs a few passes over V here). The EAGLE head has
    random weights and a hot vocabulary of 32,768 of the 131,072 tokens (q is 0 outside it)."""
    from minispec.drafts.eagle import EagleConfig, EagleModel

    torch.manual_seed(4)
    head = EagleModel(EagleConfig.for_target(target.config, None, 32_768)).requires_grad_(False)
    return {
        "model": draft,
        "layer skip": minispec.LayerSkipDraft(target, 1),
        "prompt lookup": minispec.PromptLookupDraft(),
        "static tree": minispec.TreeDraft(draft, branching=(2, 1)),
        "dynamic tree": minispec.TreeDraft(draft, budget=4, depth=2, topk=2),
        "eagle, hot vocabulary": minispec.EagleDraft(target, head, hot_vocab=32_768),
    }


def test_top_k_1_at_temperature_1_is_greedy_at_128k(v128k):
    """1,024 tokens (32 rows x 32) at V = 131,072: top_k=1 sampled equals greedy, plain and through
    every draft (a sampler that can pick a zero-probability token breaks this within 64 tokens)."""
    target, draft = v128k
    prompts = [[(97 * b + 13 * i) % 131_072 for i in range(1 + b % 5)] * 2 for b in range(32)]
    greedy = minispec.generate(target, prompts, max_new_tokens=32).tokens
    assert minispec.generate(target, prompts, max_new_tokens=32, temperature=1.0, top_k=1, seed=0).tokens == greedy
    for name, d in drafts(target, draft).items():
        out = minispec.speculative_generate(target, d, prompts, gamma=2, max_new_tokens=32, temperature=1.0,
                                            top_k=1, seed=0)
        assert out.tokens == greedy, name
        assert out.stats.draft_tokens > 0, name
        if not name.startswith("eagle"):  # a random head almost never agrees with the target's argmax
            assert out.stats.accepted_tokens > 0, name  # the drafts' tokens are used, not only the target's


def support_violations(model, k, rows, tokens, speculative=None):
    """Output tokens outside the target's top-k support (a logit below the k-th largest), over rows * tokens
    draws at temperature 1."""
    prompts = [[b % 1000, (7 * b) % 1000 + 1] for b in range(rows)]
    kw = dict(max_new_tokens=tokens, temperature=1.0, top_k=k, seed=list(range(rows)))
    out = (minispec.generate(model, prompts, **kw) if speculative is None
           else minispec.speculative_generate(model, speculative, prompts, gamma=2, **kw))
    seq = torch.tensor([p + t for p, t in zip(prompts, out.tokens)])  # (rows, 2 + tokens)
    bad = 0
    for chunk in seq.split(16):  # the target's logits at each output, 16 rows at a time
        logits = model(chunk[:, :-1])[:, 1:]  # (16, tokens, V)
        kth = logits.topk(k, -1).values[..., -1]  # (16, tokens)
        bad += int((logits.gather(-1, chunk[:, 2:, None])[..., 0] < kth).sum())
    return bad, seq.shape[0] * tokens


@pytest.fixture(scope="module")
def v32k():
    target = wide(32_768, seed=2, scale=10.0)
    return target, wide(32_768, from_model=target, noise=0.3, seed=3)


def test_no_token_outside_the_top_k_support_in_1e5_draws_at_32k(v32k):
    """10^5 draws at V = 32,768 with top_k = 4: the target's distributions after 1,000 prefixes, each drawn
    100 times with the library's uniforms (a fresh counter each time), exactly as decoding draws."""
    target, _ = v32k
    params = minispec.SamplingParams(1.0, top_k=4)
    prefixes = torch.tensor([[b % 1000, (7 * b) % 1000 + 1] for b in range(1000)])  # (1000, 2)
    p = probabilities(target(prefixes)[:, -1], params)  # (1000, V) 4 tokens each, the rest exactly 0
    keys = sampling.row_keys(sampling.row_seeds(0, 1000))  # (1000, 2)
    bad = 0
    for position in range(100):
        u = sampling.uniforms(keys, sampling.TARGET, torch.full((1000,), position), 1)[:, 0]  # (1000,)
        bad += int((p.gather(1, sampling.sample(p, u)[:, None]) == 0).sum())
    assert bad == 0 and (p > 0).sum(1).eq(4).all()


def test_the_support_test_catches_the_old_boundary_bug(v32k):
    """A negative control: the old sampler (an exponential race whose 24-bit float32 uniform rounds to 1.0
    with probability 2^-24) on the same distributions. At V = 32,768 with 4 tokens kept each draw has about
    32,764 / 2^24 = 0.2 % chance of a zero-weight token, so 10,000 draws expect about 19.5 of them (Poisson:
    2 or fewer with probability 7e-7)."""
    target, _ = v32k
    prefixes = torch.tensor([[b % 1000, (7 * b) % 1000 + 1] for b in range(1000)])  # (1000, 2)
    p = probabilities(target(prefixes)[:, -1], minispec.SamplingParams(1.0, top_k=4))  # (1000, V)
    g, bad = torch.Generator().manual_seed(0), 0
    for _ in range(10):
        raw = torch.randint(0, 2**24, p.shape, generator=g)  # (1000, V) 24 random bits per token
        race = -((raw.float() + 0.5) / 2**24).log()  # the top value rounds to u = 1.0: -log 1 = -0
        bad += int((p.gather(1, (p / race).argmax(-1)[:, None]) == 0).sum())  # 0 / -0 = NaN wins the argmax
    assert bad >= 3


@pytest.mark.parametrize("speculative", [False, True], ids=["plain", "speculative"])
def test_no_token_outside_the_top_k_support_through_decoding(v32k, speculative):
    """10^4 tokens through generate, 5,000 through speculative_generate (its corrections draw from
    max(0, p - q), which is zero on about half the vocabulary)."""
    target, draft = v32k
    bad, draws = support_violations(target, 4, 50 if speculative else 100, 100, draft if speculative else None)
    assert draws >= 5_000 and bad == 0


def exact_two_token_law(model, prompt, params):
    """The target's exact joint law of its first two tokens, as {(t1, t2): probability} over the support."""
    p1 = probabilities(model(torch.tensor([prompt]))[0, -1], params)  # (V,)
    law = {}
    for t1 in p1.nonzero()[:, 0].tolist():
        p2 = probabilities(model(torch.tensor([prompt + [t1]]))[0, -1], params)  # (V,)
        for t2 in p2.nonzero()[:, 0].tolist():
            law[(t1, t2)] = p1[t1].item() * p2[t2].item()
    return law


@pytest.mark.parametrize("speculative, params", [
    (False, minispec.SamplingParams(0.8, top_k=3)),
    (True, minispec.SamplingParams(0.8, top_k=3)),
], ids=["plain", "speculative"])
def test_two_token_law_with_a_sparse_support_at_32k(v32k, speculative, params):
    """20,000 rows at V = 32,768 with a sparse support (top-k 3: 9 cells): TV to the exact law under the
    bound, and no mass outside the support."""
    target, draft = v32k
    prompt, n = [17, 4242], 20_000
    law = exact_two_token_law(target, prompt, params)
    assert len(law) == 9 and math.isclose(sum(law.values()), 1.0, rel_tol=1e-5)
    counts = {}
    for lo in range(0, n, 2000):
        kw = dict(max_new_tokens=2, temperature=params.temperature, top_k=params.top_k, top_p=params.top_p,
                  seed=list(range(lo, lo + 2000)))
        out = (minispec.speculative_generate(target, draft, [prompt] * 2000, gamma=1, **kw) if speculative
               else minispec.generate(target, [prompt] * 2000, **kw))
        for t in out.tokens:
            counts[tuple(t)] = counts.get(tuple(t), 0) + 1
    assert set(counts) <= set(law)  # nothing outside the support
    tv = 0.5 * sum(abs(counts.get(k, 0) / n - v) for k, v in law.items())
    assert tv < tv_bound(len(law), n), (tv, tv_bound(len(law), n))
