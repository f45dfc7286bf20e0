"""Speculative decoding is exact: greedy token for token, sampled in distribution."""


import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import PROMPTS, Scripted, V, empirical_tv, random_model

import minispec
from minispec.course.grader import tv_bound
from minispec.decoding.sampling import (
    ACCEPT,
    TARGET,
    SamplingParams,
    probabilities,
    row_keys,
    row_seeds,
    sample,
    uniforms,
)
from minispec.roofline.policy import FixedPolicy
from minispec.speculative.loop import speculative_generate
from minispec.speculative.rule import accept_reject

# --- exactness in distribution -------------------------------------------------------------


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


def test_prompts_of_different_lengths_keep_the_distribution(sharp_pair):
    """Ragged rows (one, two and five prompt tokens) in one batch: each row still follows p."""
    tv, _ = empirical_tv(*sharp_pair, SamplingParams(1.0), 3, prompts=([2], [1, 3], [4, 0, 2, 2, 1]))
    assert tv < tv_bound(V**3, 30_000)


def resample_from_p(p, q, x, u, draw):
    """A wrong rule: after a rejection it draws from p instead of norm(max(0, p - q))."""
    accepted, _ = accept_reject(p, q, x, u, draw)
    n = accepted.sum(1)
    return accepted, draw(p.gather(1, n[:, None, None].expand(-1, 1, p.shape[-1]))[:, 0])


def test_the_distribution_test_can_fail(sharp_pair):
    """A rule that resamples from p instead of max(0, p - q) is caught by the same bound."""
    tv, _ = empirical_tv(*sharp_pair, SamplingParams(1.0), 4, rule=resample_from_p)
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

def randomness(B, gamma, seed=0):
    """Uniforms (B, gamma) and a draw function from the library's own counter-based generator."""
    keys, zero = row_keys(row_seeds(seed, B)), torch.zeros(B, dtype=torch.long)  # (B, 2), (B,)
    return uniforms(keys, ACCEPT, zero, gamma), lambda w: sample(w, uniforms(keys, TARGET, zero, 1)[:, 0])


def test_a_fresh_uniform_for_every_position():
    """With p/q = 1/2 at every position, a row accepts two tokens with probability 1/4, not 1/2."""
    B, gamma = 100_000, 2
    q = torch.tensor([0.5, 0.5, 0.0]).expand(B, gamma, 3)
    p = torch.tensor([0.25, 0.25, 0.5]).expand(B, gamma + 1, 3)
    x = torch.zeros(B, gamma, dtype=torch.long)
    accepted, t = accept_reject(p, q, x, *randomness(B, gamma))
    both = accepted.all(1).double().mean().item()
    assert abs(both - 0.25) < 0.01


def test_temperature_zero_never_divides_by_zero():
    p = torch.eye(4)[[2, 1, 3]][None]  # (1, 3, 4) one-hot target
    q = torch.eye(4)[[2, 0]][None]  # (1, 2, 4) one-hot draft: agrees, then disagrees
    accepted, t = accept_reject(p, q, torch.tensor([[2, 0]]), torch.zeros(1, 2), lambda w: w.argmax(-1))
    assert accepted.tolist() == [[True, False]] and t.tolist() == [1]


def test_no_nan_when_p_equals_q():
    p = torch.softmax(torch.randn(64, 4, 10), -1)
    x = torch.multinomial(p[:, :3].reshape(-1, 10), 1).view(64, 3)
    accepted, t = accept_reject(p, p[:, :3].clone(), x, *randomness(64, 3))
    assert accepted.all() and not t.isnan().any() and (t >= 0).all()


def test_a_position_with_no_proposal_is_a_plain_draw():
    """q all zero at a position (a prompt-lookup row without a match) rejects it; t then follows p there."""
    B = 200_000
    p = torch.tensor([[0.1, 0.2, 0.7], [0.5, 0.25, 0.25]]).expand(B, 2, 3)
    q = torch.zeros(B, 1, 3)
    accepted, t = accept_reject(p, q, torch.zeros(B, 1, dtype=torch.long), *randomness(B, 1))
    assert not accepted.any()
    freq = torch.bincount(t, minlength=3).double() / B
    assert (freq - torch.tensor([0.1, 0.2, 0.7], dtype=torch.double)).abs().max() < 0.005


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


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_device_mismatch(pair):
    target, _ = pair
    with pytest.raises(ValueError, match="cuda"):
        speculative_generate(target, random_model(seed=1).cuda(), PROMPTS, max_new_tokens=4)


def test_device_mismatch_is_checked_before_work(pair, monkeypatch):
    target, draft = pair
    with torch.device("meta"):
        elsewhere = minispec.Model(draft.config)
    monkeypatch.setattr(target, "forward", lambda *a, **k: pytest.fail("the target ran before validation"))
    with pytest.raises(ValueError, match="target is on cpu but draft is on meta"):
        speculative_generate(target, elsewhere, PROMPTS, max_new_tokens=4)


# --- gamma chosen per step -------------------------------------------------------------------


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
    from minispec.roofline.policy import RooflinePolicy

    policy = RooflinePolicy(gamma_max=4)  # the reference 8B on an H100: off above batch ~187
    out = speculative_generate(target, draft, [[1, 2]] * 300, gamma=policy, max_new_tokens=3)
    assert set(out.stats.gamma_per_step) == {0} and out.stats.num_drafts == 0


def test_embedded_pair_greedy_batch_8():
    target, tok = minispec.load("tiny-code-target")
    draft, _ = minispec.load("tiny-code-draft")
    from minispec.model.load import sample_text

    code = sample_text("code")
    prompts = [list(code[i * 700 : i * 700 + 10 + 9 * i]) for i in range(8)]  # 10 to 73 bytes
    plain = minispec.generate(target, prompts, max_new_tokens=40).tokens
    spec = speculative_generate(target, draft, prompts, gamma=4, max_new_tokens=40)
    assert spec.tokens == plain and spec.stats.acceptance_rate > 0.3


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("make_draft, syncs", [
    (lambda t: minispec.ModelDraft(random_model(seed=1, layers=1).cuda()), 0),
    (lambda t: minispec.LayerSkipDraft(t, 1), 0),
    (lambda t: minispec.PromptLookupDraft(), 1),  # the one labelled sync: the longest proposal
    (lambda t: minispec.TreeDraft(random_model(seed=1, layers=1).cuda(), branching=(2, 2)), 0),
    (lambda t: minispec.TreeDraft(random_model(seed=1, layers=1).cuda(), budget=6, depth=3, topk=2), 0),
], ids=["model", "layerskip", "ngram", "static-tree", "dynamic-tree"])
def test_the_step_synchronises_with_the_host_only_where_labelled(make_draft, syncs):
    import warnings

    from minispec.decoding.plain import DecodeState, first_token, prefill
    from minispec.decoding.sampling import Sampler
    from minispec.decoding.stats import Timeline
    from minispec.decoding.timing import PhaseTimer
    from minispec.speculative.loop import speculative_step

    target = random_model(seed=0).cuda()
    draft = make_draft(target)
    for temperature in (0.0, 1.0):
        params = SamplingParams(temperature, top_p=0.9 if temperature else None)
        state, sampler = DecodeState(PROMPTS, 16, [], "cuda", slack=5), Sampler(params, 0, 8, "cuda")
        draft.check(target, state.slots)
        t_cache = target.new_cache(8, state.slots)
        first_token(state, sampler, prefill(target, state, t_cache), Timeline())
        run = draft.start(target, state, sampler)
        state.start_loop()
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("warn")
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                speculative_step(target, t_cache, run, state, sampler, 4, PhaseTimer("cuda"))
        finally:
            torch.cuda.set_sync_debug_mode("default")
        assert sum("synchroniz" in str(w.message) for w in caught) == syncs, [str(w.message) for w in caught]


# --- seeded rows do not depend on their batch -----------------------------------------------

@pytest.mark.parametrize("speculative", [False, True], ids=["plain", "speculative"])
def test_a_seeded_row_is_the_same_alone_and_in_any_batch(pair, speculative):
    target, draft = pair
    others = [[4, 5, 6, 7, 8, 9, 10, 11], [12], [13, 14, 15, 16, 17], [3] * 20, [9, 8], [7] * 11, [60]]
    row, seed = [1, 2, 3], 1234

    def run(prompts, seeds):
        kw = dict(max_new_tokens=20, temperature=1.0, top_p=0.95, seed=seeds)
        if speculative:
            return speculative_generate(target, draft, prompts, gamma=3, **kw).tokens
        return minispec.generate(target, prompts, **kw).tokens

    alone = run([row], [seed])[0]
    first = run([row] + others, [seed] + list(range(7)))[0]
    fifth = run(others[:4] + [row] + others[4:], list(range(4)) + [seed] + list(range(4, 7)))[4]
    assert alone == first == fifth
    assert alone != run([row], [seed + 1])[0]  # the seed matters: another seed, other tokens


def test_an_int_seed_gives_each_row_its_own_stream(pair):
    target, _ = pair
    out = minispec.generate(target, [[5, 6]] * 3, max_new_tokens=12, temperature=1.0, seed=3).tokens
    assert len({tuple(t) for t in out}) == 3
    assert out[0] == minispec.generate(target, [[5, 6]], max_new_tokens=12, temperature=1.0, seed=3).tokens[0]


def test_bad_seeds(pair):
    target, _ = pair
    with pytest.raises(ValueError, match="2 entries for 3 prompts"):
        minispec.generate(target, [[1], [2], [3]], max_new_tokens=2, seed=[1, 2])
    with pytest.raises(ValueError, match="seed"):
        minispec.generate(target, [[1]], max_new_tokens=2, seed="7")


# --- the other architectures ----------------------------------------------------------------

@pytest.mark.parametrize("kw", [dict(sliding_window=(4, 4)), dict(qkv_bias=True, architecture="Qwen2ForCausalLM")],
                         ids=["sliding-window", "qwen2"])
def test_speculative_equals_plain_for_other_architectures(kw):
    target = random_model(seed=3, logit_scale=10, **kw)
    draft = random_model(seed=4, layers=1, logit_scale=10, **kw)
    with torch.no_grad():  # non-zero biases, so a bias path that was skipped would show
        for name, p in target.named_parameters():
            if name.endswith("bias"):
                p.normal_(0, 0.5)
    plain = minispec.generate(target, PROMPTS, max_new_tokens=24).tokens
    for d in (draft, minispec.LayerSkipDraft(target, 1), minispec.PromptLookupDraft()):
        assert speculative_generate(target, d, PROMPTS, gamma=3, max_new_tokens=24).tokens == plain


# --- drafts that need no draft model ---------------------------------------------------------

REPEATS = ([1, 3, 1, 3, 1], [2, 2, 4, 2, 2], [0, 1, 2, 0, 1])  # every prompt ends in an n-gram seen before


@pytest.mark.parametrize("params", [SamplingParams(1.0), SamplingParams(0.8, top_k=3)], ids=["T1", "T0.8-top3"])
def test_prompt_lookup_is_exact_under_sampling(sharp_pair, params):
    target, _ = sharp_pair
    tv, out = empirical_tv(target, minispec.PromptLookupDraft(), params, 3, prompts=REPEATS)
    assert out.stats.draft_tokens > 10_000 and 0.05 < out.stats.acceptance_rate < 0.95  # proposals were tested
    assert tv < tv_bound(V**3, 30_000)


def test_prompt_lookup_distribution_test_can_fail(sharp_pair):
    target, _ = sharp_pair
    tv, _ = empirical_tv(target, minispec.PromptLookupDraft(), SamplingParams(1.0), 3, prompts=REPEATS,
                         rule=resample_from_p)
    assert tv > tv_bound(V**3, 30_000)


def test_prompt_lookup_proposes_the_continuation_of_the_latest_match():
    """A row ending in "7 8" proposes what followed its most recent earlier "7 8"; a row with no
    match proposes nothing, and the stats count only what was proposed."""
    from minispec.decoding.plain import DecodeState
    from minispec.decoding.sampling import Sampler

    model = random_model(vocab=16)
    prompts = [[7, 8, 1, 2, 3, 7, 8, 4, 5, 7, 8], [1, 2, 3, 4, 5]]
    state = DecodeState(prompts, 4, [], "cpu")
    draft = minispec.PromptLookupDraft(max_ngram=2)
    x, q, tree = draft.start(model, state, Sampler(SamplingParams(), 0, 2)).propose(state, 3)
    assert x[0].tolist() == [4, 5, 7] and q.proposed[0].tolist() == [True] * 3 and tree is None
    assert not q.proposed[1].any()  # no earlier occurrence of any suffix n-gram: q is all zero
    out = speculative_generate(model, draft, prompts, gamma=3, max_new_tokens=4)
    assert out.tokens == minispec.generate(model, prompts, max_new_tokens=4).tokens


def test_layer_skip_with_every_layer_accepts_everything_and_copies_nothing(pair):
    target, _ = pair
    draft = minispec.LayerSkipDraft(target, target.config.num_hidden_layers)
    for temperature in (0.0, 1.0):
        out = speculative_generate(target, draft, PROMPTS, gamma=4, max_new_tokens=21, temperature=temperature, seed=0)
        assert out.stats.acceptance_rate == 1.0
    target_storage = {p.data_ptr() for p in target.parameters()}
    assert {p.data_ptr() for p in draft.model.parameters()} == target_storage and draft.model is target


def test_layer_skip_with_fewer_layers_is_exact_and_cheaper(pair):
    target, _ = pair
    draft = minispec.LayerSkipDraft(target, 1)
    assert draft.shape.params < minispec.ModelShape.from_model(target).params
    plain = minispec.generate(target, PROMPTS, max_new_tokens=16).tokens
    assert speculative_generate(target, draft, PROMPTS, gamma=2, max_new_tokens=16).tokens == plain


@pytest.mark.parametrize("make, message", [
    (lambda t: minispec.LayerSkipDraft(t, 0), "num_layers must be an integer from 1 to the target's 2 layers"),
    (lambda t: minispec.LayerSkipDraft(t, 3), "num_layers must be an integer from 1 to the target's 2 layers"),
    (lambda t: minispec.LayerSkipDraft(t, 1.0), "num_layers must be an integer .* got 1.0"),
    (lambda t: minispec.LayerSkipDraft(t, True), "num_layers must be an integer .* got True"),
    (lambda t: minispec.PromptLookupDraft(min_ngram=0), "min_ngram must be an integer >= 1"),
    (lambda t: minispec.PromptLookupDraft(max_ngram=2, min_ngram=3), "min_ngram \\(3\\) must be at most max_ngram"),
    (lambda t: minispec.PromptLookupDraft(max_ngram=2.0), "max_ngram must be an integer >= 1, got 2.0"),
    (lambda t: minispec.PromptLookupDraft(max_ngram=True), "max_ngram must be an integer >= 1, got True"),
])
def test_bad_drafts_are_named(pair, make, message):
    assert repr(minispec.PromptLookupDraft()) == "PromptLookupDraft(max_ngram=3, min_ngram=1)"  # the defaults
    assert minispec.PromptLookupDraft(2, 2).max_ngram == 2  # one n-gram size
    with pytest.raises(ValueError, match=message):
        make(pair[0])


def test_layer_skip_needs_its_own_target(pair):
    target, draft = pair
    with pytest.raises(ValueError, match="the target it was built from"):
        speculative_generate(target, minispec.LayerSkipDraft(draft, 1), PROMPTS, max_new_tokens=4)


def test_auto_gamma_validates_before_any_calibration(pair, monkeypatch):
    import minispec.roofline.hardware as hardware
    import minispec.speculative.loop as spec

    def calibration(*a, **k):
        raise AssertionError("calibration ran before the inputs were validated")

    monkeypatch.setattr(hardware, "calibrate", calibration)
    monkeypatch.setattr(spec, "device_hardware", calibration)
    target, draft = pair
    for prompts, message in (([[1, 99]], "outside the vocabulary"), ([[]], "prompt 0 is empty")):
        with pytest.raises(ValueError, match=message):
            speculative_generate(target, draft, prompts, gamma="auto", max_new_tokens=4)
    with pytest.raises(AssertionError, match="calibration ran"):  # and with good input it is reached
        speculative_generate(target, draft, [[1, 2]], gamma="auto", max_new_tokens=4)


def test_auto_gamma_plans_at_the_running_rows_context():
    """At batch 256 the reference model turns speculation off at context 0 (0.99x at best), but at 600
    tokens of KV per row the KV read dilutes the verify's extra compute and gamma 2 pays (1.30x): the
    loop passes each step's real context to the policy, so it keeps speculating."""
    from minispec.roofline.policy import RooflinePolicy

    class Recording(RooflinePolicy):
        def choose(self, batch_size, context=None):
            self.seen = getattr(self, "seen", []) + [(batch_size, context)]
            return super().choose(batch_size, context)

    kw = dict(alpha0=0.8, draft_cost=0.1, prior_tokens=1e12, gamma_max=4)  # alpha pinned at 0.8 by the prior
    assert RooflinePolicy(**kw).choose(256, 0) == 0 and RooflinePolicy(**kw).choose(256, 600) == 2
    target = random_model(seed=0, layers=1, hidden=16, heads=1, kv_heads=1, positions=1024)
    draft = random_model(seed=1, layers=1, hidden=16, heads=1, kv_heads=1, positions=1024)
    prompts = [[1 + (i * 7 + b) % 60 for i in range(600)] for b in range(256)]
    policy = Recording(**kw)
    out = speculative_generate(target, draft, prompts, gamma=policy, max_new_tokens=3)
    assert policy.seen[0] == (256, 600.0)  # 601 tokens after the first, all but the last in the cache
    assert out.stats.gamma_per_step[0] == 2


def test_a_policy_past_its_gamma_max_is_an_error(pair):
    target, draft = pair

    class Greedy(FixedPolicy):
        def choose(self, batch_size, context=None):
            return self.gamma + 3

    with pytest.raises(ValueError, match="outside 0..gamma_max=2"):
        speculative_generate(target, draft, [[1, 2, 3]], gamma=Greedy(2), max_new_tokens=8)
