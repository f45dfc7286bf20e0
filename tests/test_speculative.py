"""Speculative decoding is exact: greedy token for token, sampled in distribution."""

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import minispec
from conftest import random_model
from minispec.policy import FixedPolicy
from minispec.sampling import SamplingParams, probabilities
from minispec.speculative import accept_reject, speculative_generate

PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8, 9, 10, 11], [12], [13, 14, 15, 16, 17], [3] * 20, [9, 8], [7] * 11, [60]]


# --- exactness in distribution -------------------------------------------------------------

V = 5  # a small vocabulary keeps the joint distribution of three tokens to 125 cells


def exact_joint(target, prompt, params, n):
    """The target-only distribution of the first n generated tokens, computed from p."""
    seqs, probs = torch.tensor([prompt]), torch.ones(1)
    for _ in range(n):
        p = probabilities(target(seqs)[:, -1], params)  # (N, V)
        probs = (probs[:, None] * p).flatten()  # (N*V,)
        seqs = torch.cat([seqs.repeat_interleave(V, 0), torch.arange(V).repeat(len(seqs))[:, None]], 1)
    return probs  # index = t1 * V^(n-1) + ... + tn


def tv_bound(cells, samples, delta=1e-4):
    """A total-variation distance the empirical distribution exceeds with probability < delta.

    E[TV] <= 0.5 * sqrt((cells - 1) / samples), and TV moves by at most 1/samples per sample,
    so by McDiarmid P(TV > E[TV] + eps) <= exp(-2 samples eps^2).
    """
    return 0.5 * math.sqrt((cells - 1) / samples) + math.sqrt(math.log(1 / delta) / (2 * samples))


def empirical_tv(target, draft, params, gamma, samples=30_000, n=3, **kw):
    prompt = [1, 3]
    out = speculative_generate(target, draft, [prompt] * samples, gamma=gamma, max_new_tokens=n,
                               temperature=params.temperature, top_k=params.top_k, top_p=params.top_p, seed=7, **kw)
    t = torch.tensor(out.tokens)  # (samples, n)
    index = sum(t[:, i] * V ** (n - 1 - i) for i in range(n))
    freq = torch.bincount(index, minlength=V**n).double() / samples
    return 0.5 * (freq - exact_joint(target, prompt, params, n).double()).abs().sum().item(), out


@pytest.fixture(scope="module")
def sharp_pair():
    """Peaked, clearly different target and draft distributions (so a wrong rule shows)."""
    return (random_model(seed=5, vocab=V, logit_scale=10), random_model(seed=6, vocab=V, layers=1, logit_scale=10))


CASES = [
    (SamplingParams(1.0), 1),
    (SamplingParams(1.0), 4),
    (SamplingParams(0.7, top_k=3), 4),
    (SamplingParams(1.0, top_p=0.8), 1),
    (SamplingParams(1.3, top_p=0.9), 4),
]


@pytest.mark.parametrize("params, gamma", CASES)
def test_output_has_the_target_distribution(sharp_pair, params, gamma):
    target, draft = sharp_pair
    tv, out = empirical_tv(target, draft, params, gamma)
    assert 0.05 < out.stats.acceptance_rate < 0.95, "the pair must disagree often enough to test the rule"
    assert tv < tv_bound(V**3, 30_000), f"TV {tv:.4f} exceeds the sampling bound"


def test_the_distribution_test_can_fail(sharp_pair, monkeypatch):
    """A rule that forgets to resample from max(0, p - q) is caught by the same bound."""
    import minispec.speculative as spec

    def accept_all(p, q, x, generator, accept_rate=None, greedy=False):
        accepted, _ = accept_reject(p, q, x, generator, accept_rate=1.0, greedy=greedy)
        return accepted, sample_from(p[:, -1], generator)

    from minispec.sampling import sample as sample_from
    monkeypatch.setattr(spec, "accept_reject", accept_all)
    tv, _ = empirical_tv(*sharp_pair, SamplingParams(1.0), 4)
    assert tv > tv_bound(V**3, 30_000)


# --- exactness, greedy ----------------------------------------------------------------------

@pytest.mark.parametrize("gamma", [1, 3, 4, 8])
def test_greedy_equals_plain_decoding(pair, gamma):
    target, draft = pair
    plain = minispec.generate(target, PROMPTS, max_new_tokens=24).tokens
    spec = speculative_generate(target, draft, PROMPTS, gamma=gamma, max_new_tokens=24)
    assert spec.tokens == plain
    assert spec.stats.num_drafts > 0


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_greedy_equality_random_pairs(data):
    seed = data.draw(st.integers(0, 10_000))
    target = random_model(seed=seed, vocab=32, logit_scale=data.draw(st.sampled_from([1.0, 30.0])))
    draft = random_model(seed=seed + 1, vocab=32, layers=1, hidden=32, heads=2, kv_heads=1, logit_scale=30.0)
    batch = data.draw(st.integers(1, 6))
    prompts = [data.draw(st.lists(st.integers(0, 31), min_size=1, max_size=12)) for _ in range(batch)]
    gamma, n = data.draw(st.integers(1, 8)), data.draw(st.integers(1, 20))
    eos = data.draw(st.none() | st.integers(0, 31))
    plain = minispec.generate(target, prompts, max_new_tokens=n, eos_token_id=eos).tokens
    assert speculative_generate(target, draft, prompts, gamma=gamma, max_new_tokens=n, eos_token_id=eos).tokens == plain


def test_identical_draft_accepts_everything(pair):
    target, _ = pair
    for temperature in (0.0, 1.0):
        out = speculative_generate(target, target, PROMPTS, gamma=4, max_new_tokens=21, temperature=temperature, seed=0)
        assert out.stats.acceptance_rate == 1.0
        assert out.stats.mean_acceptance_length == 5.0  # 4 accepted + the bonus token, every step
        assert out.stats.num_steps == 4  # 1 token from the prefill, then 4 steps of 5
        assert out.accepted[0] == [False] + [True, True, True, True, False] * 4


# --- regression tests for bug classes seen in public implementations -----------------------

def test_a_fresh_uniform_for_every_position():
    """With p/q = 1/2 at every position, a row accepts two tokens with probability 1/4, not 1/2."""
    B, gamma = 100_000, 2
    q = torch.tensor([0.5, 0.5, 0.0]).expand(B, gamma, 3)
    p = torch.tensor([0.25, 0.25, 0.5]).expand(B, gamma + 1, 3)
    x = torch.zeros(B, gamma, dtype=torch.long)
    accepted, t = accept_reject(p, q, x, torch.Generator().manual_seed(0))
    both = accepted.all(1).double().mean().item()
    assert abs(both - 0.25) < 0.01


def test_temperature_zero_never_divides_by_zero():
    p = torch.eye(4)[[2, 1, 3]][None]  # (1, 3, 4) one-hot target
    q = torch.eye(4)[[2, 0]][None]  # (1, 2, 4) one-hot draft: agrees, then disagrees
    accepted, t = accept_reject(p, q, torch.tensor([[2, 0]]), torch.Generator().manual_seed(0))
    assert accepted.tolist() == [[True, False]] and t.tolist() == [1]


def test_no_nan_when_p_equals_q():
    p = torch.softmax(torch.randn(64, 4, 10), -1)
    x = torch.multinomial(p[:, :3].reshape(-1, 10), 1).view(64, 3)
    accepted, t = accept_reject(p, p[:, :3].clone(), x, torch.Generator().manual_seed(0))
    assert accepted.all() and not t.isnan().any() and (t >= 0).all()


def test_top_p_is_applied_to_both_models(sharp_pair):
    """Tokens outside the target's nucleus never appear, whatever the draft proposes."""
    target, draft = sharp_pair
    params = SamplingParams(1.0, top_p=0.6)
    out = speculative_generate(target, draft, [[1, 3]] * 4000, gamma=4, max_new_tokens=2, temperature=1.0,
                               top_p=0.6, seed=0)
    firsts = {(a, b) for a, b in out.tokens}
    for a, b in firsts:
        nucleus = probabilities(target(torch.tensor([[1, 3, a]]))[:, -1], params)[0]
        assert nucleus[b] > 0


def test_rows_do_not_share_a_random_stream(pair):
    target, draft = pair
    out = speculative_generate(target, draft, [[5, 6]] * 64, gamma=4, max_new_tokens=10, temperature=1.0, seed=0)
    assert len({tuple(t) for t in out.tokens}) > 32


def test_the_bonus_token_is_drawn(sharp_pair):
    """When every draft token is accepted the target adds one more: gamma + 1 tokens a step.

    (That the bonus token has the right distribution is part of the joint-distribution tests
    above: with gamma = 1 the third token is a bonus token whenever the first draft is accepted.)
    """
    target, _ = sharp_pair
    out = speculative_generate(target, target, [[1, 3]] * 200, gamma=2, max_new_tokens=4, temperature=1.0, seed=1)
    assert all(len(t) == 4 for t in out.tokens) and out.stats.num_steps == 1
    assert all(a == [False, True, True, False] for a in out.accepted)


# --- bad input ------------------------------------------------------------------------------

def test_bad_gamma(pair):
    for gamma in (0, -1, 2.5, "four", True):
        with pytest.raises(ValueError, match="gamma"):
            speculative_generate(*pair, PROMPTS, gamma=gamma, max_new_tokens=4)


def test_vocabulary_mismatch_names_both_sizes(pair):
    target, _ = pair
    other = random_model(vocab=50)
    with pytest.raises(ValueError, match="target has 64 tokens, draft has 50"):
        speculative_generate(target, other, PROMPTS, max_new_tokens=4)


def test_dtype_mismatch(pair):
    target, draft = pair
    with pytest.raises(ValueError, match="bfloat16"):
        speculative_generate(target, random_model(seed=1).to(torch.bfloat16), PROMPTS, max_new_tokens=4)
    assert draft.dtype == torch.float32


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_device_mismatch(pair):
    target, _ = pair
    with pytest.raises(ValueError, match="cuda"):
        speculative_generate(target, random_model(seed=1).cuda(), PROMPTS, max_new_tokens=4)


def test_device_mismatch_is_checked_before_work(pair):
    from types import SimpleNamespace

    target, draft = pair
    elsewhere = SimpleNamespace(config=draft.config, device=torch.device("meta"), dtype=draft.dtype)
    with pytest.raises(ValueError, match="target is on cpu but draft is on meta"):
        speculative_generate(target, elsewhere, PROMPTS, max_new_tokens=4)


# --- gamma chosen per step -------------------------------------------------------------------

class Scripted(FixedPolicy):
    """A policy that plays a fixed sequence of gammas (0 = a plain step), then repeats it."""

    def __init__(self, gammas):
        super().__init__(max(gammas))
        self.script, self.i = gammas, 0

    def choose(self, batch_size):
        self.i += 1
        return self.script[(self.i - 1) % len(self.script)]


@pytest.mark.parametrize("script", [[0, 3, 0, 0, 5, 1], [2, 0, 0, 0, 0, 4], [0, 0, 1]])
def test_switching_speculation_on_and_off_stays_exact(pair, script):
    """After plain steps the draft cache lags by several tokens; it must catch up exactly."""
    target, draft = pair
    plain = minispec.generate(target, PROMPTS, max_new_tokens=30).tokens
    out = speculative_generate(target, draft, PROMPTS, gamma=Scripted(script), max_new_tokens=30)
    assert out.tokens == plain
    assert out.stats.gamma_per_step == [script[i % len(script)] for i in range(out.stats.num_steps)]
    sampled = speculative_generate(target, target, PROMPTS, gamma=Scripted(script), max_new_tokens=30,
                                   temperature=1.0, seed=0)
    assert sampled.stats.acceptance_rate == 1.0  # an identical draft that caught up agrees everywhere


def test_auto_gamma_records_each_step(pair):
    target, draft = pair
    out = speculative_generate(target, draft, PROMPTS, gamma="auto", max_new_tokens=12)
    assert len(out.stats.gamma_per_step) == out.stats.num_steps and out.stats.gamma == "auto"
    assert out.tokens == minispec.generate(target, PROMPTS, max_new_tokens=12).tokens


def test_roofline_policy_turns_speculation_off_at_large_batch(pair):
    target, draft = pair
    from minispec.policy import RooflinePolicy

    policy = RooflinePolicy(gamma_max=4)  # the reference 8B on an H100: off above batch ~187
    out = speculative_generate(target, draft, [[1, 2]] * 300, gamma=policy, max_new_tokens=3)
    assert set(out.stats.gamma_per_step) == {0} and out.stats.num_drafts == 0


def test_embedded_pair_greedy_batch_8():
    target, tok = minispec.load("tiny-code-target")
    draft, _ = minispec.load("tiny-code-draft")
    from minispec.train import sample_text

    code = sample_text("code")
    prompts = [list(code[i * 700 : i * 700 + 10 + 9 * i]) for i in range(8)]  # 10 to 73 bytes
    plain = minispec.generate(target, prompts, max_new_tokens=40).tokens
    spec = speculative_generate(target, draft, prompts, gamma=4, max_new_tokens=40)
    assert spec.tokens == plain and spec.stats.acceptance_rate > 0.3


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_step_does_not_synchronise_with_the_host():
    from minispec.decode import Batch, prefill
    from minispec.speculative import speculative_step

    target, draft = random_model(seed=0).cuda(), random_model(seed=1, layers=1).cuda()
    for temperature in (0.0, 1.0):
        batch = Batch(target, PROMPTS, 16, SamplingParams(temperature, top_p=0.9 if temperature else None), 0, None,
                      slack=5)
        t_cache, d_cache = target.new_cache(8, batch.slots), draft.new_cache(8, batch.slots)
        batch.first_token(prefill(target, batch, t_cache))
        prefill(draft, batch, d_cache)
        torch.cuda.set_sync_debug_mode("error")
        try:
            speculative_step(target, draft, t_cache, d_cache, batch, 4, 2)
        finally:
            torch.cuda.set_sync_debug_mode("default")
