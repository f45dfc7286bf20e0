"""Helpers the test folders share, imported as ``from support import ...`` (tests/ is on sys.path).

Not in conftest.py: tests/vllm has a conftest.py of its own, and whichever conftest pytest imported last is the
module ``conftest`` in sys.modules, so ``from conftest import`` inside a test found tests/vllm's under xdist.
"""

import random

import torch

from minispec.decoding.sampling import probabilities
from minispec.model.config import ModelConfig
from minispec.model.llama import Model
from minispec.roofline.policy import FixedPolicy
from minispec.speculative.loop import speculative_generate


def tiny_config(layers=2, hidden=64, heads=4, kv_heads=2, vocab=64, positions=256, **kw) -> ModelConfig:
    return ModelConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                       num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=hidden // heads,
                       max_position_embeddings=positions, **kw)


def random_model(seed=0, logit_scale=1.0, **kw) -> Model:
    """A randomly initialised model; ``logit_scale`` > 1 sharpens its distributions."""
    torch.manual_seed(seed)
    model = Model(tiny_config(**kw)).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(logit_scale)
    return model.requires_grad_(False)


def nudged_pair() -> tuple[Model, Model]:
    """The target and a draft with its weights but an LM head nudged: some steps accept every draft token, most
    stop earlier."""
    target, draft = random_model(seed=0), random_model(seed=0)
    with torch.no_grad():
        draft.lm_head.weight.add_(0.005 * torch.randn(draft.lm_head.weight.shape,
                                                      generator=torch.Generator().manual_seed(3)))
    return target, draft


PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8, 9, 10, 11], [12], [13, 14, 15, 16, 17], [3] * 20, [9, 8], [7] * 11, [60]]


V = 5  # a small vocabulary keeps the joint distribution of three tokens to 125 cells


def exact_joint(target, prompt, params, n):
    """The target-only distribution of the first n generated tokens, computed from p."""
    seqs, probs = torch.tensor([prompt]), torch.ones(1)
    for _ in range(n):
        p = probabilities(target(seqs)[:, -1], params)  # (N, V)
        probs = (probs[:, None] * p).flatten()  # (N*V,)
        seqs = torch.cat([seqs.repeat_interleave(V, 0), torch.arange(V).repeat(len(seqs))[:, None]], 1)
    return probs  # index = t1 * V^(n-1) + ... + tn


def empirical_tv(target, draft, params, gamma, samples=30_000, n=3, prompts=([1, 3],), **kw):
    """Total variation between the first n tokens of ``samples`` rows (the prompts in turn, each
    with its own share of rows) and the target's exact joint distribution of those prompts' mixture."""
    rows = [list(prompts[i % len(prompts)]) for i in range(samples)]
    out = speculative_generate(target, draft, rows, gamma=gamma, max_new_tokens=n, temperature=params.temperature,
                               top_k=params.top_k, top_p=params.top_p, seed=7, **kw)
    t = torch.tensor(out.tokens)  # (samples, n)
    index = sum(t[:, i] * V ** (n - 1 - i) for i in range(n))
    freq = torch.bincount(index, minlength=V**n).double() / samples
    exact = sum(exact_joint(target, p, params, n).double() for p in prompts) / len(prompts)
    return 0.5 * (freq - exact).abs().sum().item(), out


class Scripted(FixedPolicy):
    """A policy that plays a fixed sequence of gammas (0 = a plain step), then repeats it."""

    def __init__(self, gammas):
        super().__init__(max(gammas))
        self.script, self.i = gammas, 0

    def choose(self, batch_size, context=None):
        self.i += 1
        return self.script[(self.i - 1) % len(self.script)]


def suffix_histories(caches, seed: int, vocab: int, depth: int, tree: bool, steps: int, prompt_max: int,
                     copy_max: int, spec_max: int):
    """Random requests through every suffix cache in ``caches`` at once (Arctic's API: start_request,
    add_active_response, stop_request): prompts that copy earlier ones, outputs that copy earlier stretches, so that
    counts tie and grow. Yields each draft to compare: (request, its last ``depth`` tokens, speculate's keywords)."""
    rng, live, rid = random.Random(seed), {}, 0
    for _ in range(steps):
        r = rng.random()
        if r < 0.1 or not live:
            prompt = [rng.randrange(vocab) for _ in range(rng.randrange(1, prompt_max))]
            if live and rng.random() < 0.5:
                other = rng.choice(list(live.values()))
                prompt = other[: rng.randrange(1, len(other) + 1)] + prompt[:3]
            for c in caches:
                c.start_request(rid, prompt)
            live[rid], rid = list(prompt), rid + 1
        elif r < 0.15:
            k = rng.choice(list(live))
            for c in caches:
                c.stop_request(k)
            del live[k]
        else:
            k = rng.choice(list(live))
            seq = live[k]
            i = rng.randrange(len(seq))
            new = seq[i: i + rng.randrange(1, copy_max)] if rng.random() < 0.6 else [rng.randrange(vocab)]
            for c in caches:
                c.add_active_response(k, new)
            seq += new
            yield k, seq[-depth:], dict(max_spec_tokens=rng.randrange(1, spec_max),
                                        max_spec_factor=rng.choice([0.5, 1.0, 2.0]),
                                        max_spec_offset=rng.choice([0.0, 1.0, -1.0]),
                                        min_token_prob=rng.choice([0.0, 0.1, 0.3]), use_tree_spec=tree)
