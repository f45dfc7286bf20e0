"""The embedded target alone in both engines: greedy tokens equal; sampled, both follow the target's law.

The law is judged the same way for every engine (vllm_lane.law): the target's log-probability of each output token
against the entropy at its position (a z-score of their summed difference), and, where the support is small, the
total variation of the first two tokens' empirical law from the exact one.
"""

import pytest
import vllm_lane as lane

import minispec
from minispec.decoding.sampling import SamplingParams

pytestmark = pytest.mark.vllm

SETTINGS = [(1.0, None), (0.7, 0.9)]  # (temperature, top_p)
ids = ["T1", "T0.7-top-p0.9"]
Z = 4.5  # |z| bound: a correct sampler exceeds it about once in 150,000 runs (normal tails)


@pytest.fixture(scope="module")
def target():
    return minispec.load("tiny-code-target")[0]


@pytest.fixture
def plain(llms):
    return llms.get(**lane.PAIR)


def test_greedy_tokens_are_equal(target, plain):
    prompts = lane.heldout(8)
    tokens, _ = lane.generate(plain, prompts, 48)
    assert tokens == minispec.generate(target, prompts, max_new_tokens=48).tokens


@pytest.mark.parametrize("temperature, top_p", SETTINGS, ids=ids)
def test_sampled_outputs_follow_the_targets_law(target, plain, temperature, top_p):
    """48 prompts x 48 tokens from each engine: mean log p(x) within the bound of minus the mean entropy, and no
    token the target gives probability 0 (top-p's cut-off is the same in both)."""
    prompts, seeds = lane.heldout(48), list(range(48))
    sp = SamplingParams(temperature, None, top_p)
    v, _ = lane.generate(plain, prompts, 48, temperature, top_p)  # vLLM unseeded: see vllm_lane.params
    m = minispec.generate(target, prompts, max_new_tokens=48, temperature=temperature, top_p=top_p, seed=seeds).tokens
    for name, outs in (("vLLM", v), ("minispec", m)):
        r = lane.law(target, prompts, outs, sp)
        assert abs(r["z"]) < Z and r["impossible"] == 0, (name, r)


@pytest.mark.parametrize("temperature, top_p", SETTINGS, ids=ids)
def test_the_first_two_tokens_law_within_a_tv_bound(target, plain, temperature, top_p):
    """2,000 samples of two tokens after one short prompt whose joint law has a small support (about 76 cells above
    1e-4 at T 1, 11 at T 0.7 with top-p): TV from the exact joint law under the largest TV of 400 samples of the same
    size drawn from that law itself."""
    prompt, n = list(lane.TV_PROMPT), 2000
    sp = SamplingParams(temperature, None, top_p)
    exact = lane.exact_two(target, prompt, sp)
    bound = lane.tv_bound(exact, n)
    v, _ = lane.generate(plain, [prompt] * n, 2, temperature, top_p)
    m = minispec.generate(target, [prompt] * n, max_new_tokens=2, temperature=temperature, top_p=top_p,
                          seed=list(range(n))).tokens
    V = target.config.vocab_size
    assert lane.tv(v, exact, V) < bound and lane.tv(m, exact, V) < bound, (lane.tv(v, exact, V), lane.tv(m, exact, V),
                                                                            bound)
