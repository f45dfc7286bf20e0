"""The engine is exact: each request's tokens are what it would get alone, whoever else runs and however often it
is preempted; sampled requests follow the target's distribution."""

import pytest
import torch
from support import random_model

import minispec
from minispec.course.grader import tv_bound
from minispec.decoding.sampling import SamplingParams, probabilities
from minispec.engine import Engine, Request, drafting
from minispec.engine import engine as engine_module
from minispec.model.load import sample_text
from minispec.roofline.policy import BatchTablePolicy

DRAFTS = ["model", "lookup", "eagle"]


@pytest.fixture(scope="module")
def embedded():
    """The embedded target and draft, the shipped EAGLE head, and six code prompts of 24 to 89 bytes."""
    target, _ = minispec.load("tiny-code-target")
    draft, _ = minispec.load("tiny-code-draft")
    eagle = minispec.EagleDraft.from_pretrained("tiny-code-eagle", target)
    text = sample_text("code")
    return target, draft, eagle, [list(text[400 * i: 400 * i + 24 + 13 * i]) for i in range(6)]  # bytes = tokens


def pick(embedded, name):
    target, draft, eagle, _ = embedded
    return {"model": draft, "lookup": minispec.PromptLookupDraft(), "eagle": eagle,
            "tree": minispec.TreeDraft(draft, budget=8, depth=4), "layerskip": minispec.LayerSkipDraft(target, 2)}[name]


def staggered(prompts, max_new=32, **kw):
    """Requests 25 ms apart on the engine's clock (a few steps each): later ones join a batch already decoding."""
    return [Request(p, max_new, arrival_s=0.025 * i, **kw) for i, p in enumerate(prompts)]


@pytest.fixture
def step_clock(monkeypatch):
    """The engine's clock read as 5 ms more at each reading (twice a step) instead of the wall clock: which step a
    staggered request joins in is then the same on a fast machine and on a loaded one (under load, 25 ms of wall
    clock can pass in the first step, and every request joins at once)."""

    def now(self):
        self.readings = getattr(self, "readings", 0) + 1
        return 0.005 * self.readings + self.skipped

    monkeypatch.setattr(engine_module._Clock, "now", now)


def joined_mid_flight(stats) -> bool:
    """Some request was prefilled in a step after another had started decoding, and the batch changed size."""
    first_decode = next(i for i, b in enumerate(stats.batch_per_step) if b)
    return any(stats.prefill_per_step[first_decode + 1:]) and len(set(stats.batch_per_step)) > 2


@pytest.fixture(scope="module")
def greedy(embedded):
    """Plain greedy tokens of each prompt (a batch decodes each row as alone: tests/test_generate.py)."""
    target, _, _, prompts = embedded
    return minispec.generate(target, prompts, 32).tokens


@pytest.mark.parametrize("name", DRAFTS + ["tree", "layerskip"])
def test_greedy_equals_plain_greedy_per_request_under_staggered_arrivals(embedded, greedy, name, step_clock):
    target, _, _, prompts = embedded
    draft = pick(embedded, name)
    engine = Engine(target, draft, gamma=4)
    outs = engine.run(staggered(prompts))
    assert [o.tokens for o in outs] == greedy
    assert all(o.finish_reason == "length" and o.ttft_s >= 0 and o.tpot_s > 0 and len(o.itl_s) > 0 for o in outs)
    assert joined_mid_flight(engine.stats), engine.stats.batch_per_step
    # tokens per step: the engine accepts what each request accepts alone (a lost draft token would show here);
    # speculative_generate's greedy rows are each as alone (tests/test_speculative.py)
    ref = minispec.speculative_generate(target, draft, prompts, gamma=4, max_new_tokens=32)
    assert engine.stats.accepted_tokens == ref.stats.accepted_tokens > 0
    assert engine.stats.accepted_per_position == ref.stats.accepted_per_position
    assert [o.accepted for o in outs] == ref.accepted


@pytest.mark.parametrize("name", ["model", "eagle"])
def test_prompts_prefilled_in_chunks_keep_every_token_and_every_acceptance(embedded, name):
    """16 tokens a step: each 60-to-81-token prompt is prefilled over several steps, its draft's state (KV, EAGLE's
    features and pairs) chunk by chunk, and the run accepts what a one-pass prefill accepts."""
    target, _, _, prompts = embedded
    draft, long = pick(embedded, name), [list(sample_text("code")[400 * i: 400 * i + 60 + 7 * i]) for i in range(4)]
    engine = Engine(target, draft, gamma=4, max_num_batched_tokens=16)
    outs = engine.run([Request(p, 24) for p in long])
    ref = minispec.speculative_generate(target, draft, long, gamma=4, max_new_tokens=24)
    assert ([o.tokens for o in outs], [o.accepted for o in outs]) == (ref.tokens, ref.accepted)
    assert max(engine.stats.tokens_per_step) <= 16 and sum(engine.stats.prefill_per_step) >= 4 * 4


@pytest.mark.parametrize("name", DRAFTS)
def test_seeded_sampled_requests_equal_their_run_alone(embedded, name):
    """Fixed gamma, float32 on the CPU: a request's tokens are speculative_generate's for its prompt and seed alone."""
    target, _, _, prompts = embedded
    draft, kw = pick(embedded, name), dict(temperature=0.8, top_p=0.95)
    engine = Engine(target, draft, gamma=3)
    outs = engine.run([Request(p, 32, seed=100 + i, **kw) for i, p in enumerate(prompts)])
    for i in (0, 3, 5):  # alone: one row, its own seed
        alone = minispec.speculative_generate(target, draft, [prompts[i]], gamma=3, max_new_tokens=32,
                                              seed=[100 + i], **kw)
        assert (outs[i].tokens, outs[i].accepted) == (alone.tokens[0], alone.accepted[0])
    assert outs[0].tokens != engine.run([Request(prompts[0], 32, seed=99, **kw)])[0].tokens  # the seed matters


@pytest.mark.parametrize("name", ["model", "eagle"])
def test_too_few_blocks_preempts_and_changes_no_output(embedded, name):
    """14 blocks of 16 slots hold about three of these requests at once: the youngest are preempted, recomputed,
    and every request finishes with the tokens it gets with room to spare; every block comes back."""
    target, _, _, prompts = embedded
    draft = pick(embedded, name)
    mixed = [Request(p, 40, seed=i, temperature=0.0 if i % 2 else 1.0) for i, p in enumerate(prompts)]
    roomy, tight = Engine(target, draft, gamma=4, num_blocks=400), Engine(target, draft, gamma=4, num_blocks=14)
    expected, got = roomy.run(mixed), tight.run(mixed)
    assert roomy.stats.preemptions == 0 and tight.stats.preemptions >= 2
    assert sum(o.preemptions for o in got) == tight.stats.preemptions
    assert [o.tokens for o in got] == [o.tokens for o in expected]
    assert all(o.finish_reason == "length" for o in got)
    assert tight.blocks.num_free == 14


def test_rows_with_different_settings_and_stops_run_together(embedded):
    """Greedy and sampled rows, different max_new_tokens and an EOS in one run: each as if alone."""
    target, draft, _, prompts = embedded
    reqs = [Request(prompts[0], 30), Request(prompts[1], 12, temperature=1.0, seed=5),
            Request(prompts[2], 30, temperature=0.7, top_k=20, seed=6), Request(prompts[3], 25)]
    plain = minispec.generate(target, [prompts[3]], 25).tokens[0]
    reqs[3].eos_token_id = plain[7]  # stops at the first time it produces this token
    outs = Engine(target, draft, gamma=4).run(reqs)
    for r, o in zip(reqs, outs):
        alone = minispec.speculative_generate(target, draft, [r.prompt], gamma=4, max_new_tokens=r.max_new_tokens,
                                              temperature=r.temperature, top_k=r.top_k, seed=[r.seed or 0],
                                              eos_token_id=r.eos_token_id)
        assert o.tokens == alone.tokens[0]
    assert outs[3].finish_reason == "stop" and outs[3].tokens[-1] == plain[7] and len(outs[3].tokens) <= 8
    assert [len(o.tokens) for o in outs[:3]] == [30, 12, 30]


@pytest.mark.filterwarnings("ignore:gamma=.auto. measures")
def test_a_policy_chooses_gamma_from_the_running_batch(embedded, greedy):
    """vLLM's batch-size table: K 4 up to 2 rows, 1 up to 4, off beyond. Greedy output is unchanged."""
    target, draft, _, prompts = embedded
    table = BatchTablePolicy(ranges=[[1, 2, 4], [3, 4, 1], [5, 64, 0]])
    engine = Engine(target, draft, gamma=table)
    reqs = [Request(p, 8 + 4 * i) for i, p in enumerate(prompts)]  # finishing one by one, the batch shrinks
    outs = engine.run(reqs)
    assert [o.tokens for o in outs] == [g[: r.max_new_tokens] for g, r in zip(greedy, reqs)]
    s = engine.stats
    used = {(b, g) for b, g in zip(s.batch_per_step, s.gamma_per_step) if b}
    assert used <= {(1, 4), (2, 4), (3, 1), (4, 1), (5, 0), (6, 0)} and {g for _, g in used} == {0, 1, 4}
    assert [o.tokens for o in Engine(target, draft, gamma="auto").run(reqs)] == [o.tokens for o in outs]


def test_a_row_that_joins_after_plain_steps_catches_up_beside_rows_far_behind(embedded, monkeypatch):
    """A draft model's catch-up reads each row's lag at one width, the batch's longest lag, so a row with a short lag
    reads padding past its own tokens. Here that padding runs past the step's token buffer: rows A, B, C and E decode
    plainly (K 0 from batch 3 up) so their lags grow; D, with the longest prompt, joins when B finishes and decodes
    plainly beside them; when C and E finish, A (lag 15) and D (lag 5) speculate together (K 4 at batch 2), and D,
    the longest row, reads padding 4 slots past the buffer. The padding must be clamped inside it (a wrong clamp
    indexes past the buffer); each request's tokens are greedy decoding's, and the clamp is seen to bind."""
    target, draft, _, prompts = embedded
    engine = Engine(target, draft, gamma=BatchTablePolicy(ranges=[[1, 2, 4], [3, 64, 0]]), max_num_seqs=4)
    reqs = [Request(prompts[0][:5], 40), Request(prompts[1][:5], 10), Request(prompts[2][:5], 14),
            Request(prompts[3][:5], 14), Request(prompts[5], 20)]  # D: 89 tokens, longer than A will ever be
    bound = []
    catch_up = drafting._RaggedModelRun.catch_up

    def spy(run, state):
        past = state.total - run.lags + run.width - 1 - (state.slots - 1)  # (B,) > 0: the row reads past the buffer
        bound.append(int(past.max()))
        return catch_up(run, state)

    monkeypatch.setattr(drafting._RaggedModelRun, "catch_up", spy)
    outs = engine.run(reqs)
    assert max(bound) > 0  # the scenario: some row's padding ran past the buffer, and the clamp kept it inside
    for o, r in zip(outs, reqs):
        assert o.tokens == minispec.generate(target, [r.prompt], r.max_new_tokens).tokens[0]
    assert set(engine.stats.gamma_per_step) >= {0, 4}


# --- the sampled law through the engine ---------------------------------------------------------

V = 5


def exact_joint(target, prompt, params, n):
    """The target's distribution of the first n generated tokens (index t1 V^(n-1) + ... + tn)."""
    seqs, probs = torch.tensor([prompt]), torch.ones(1)
    for _ in range(n):
        p = probabilities(target(seqs)[:, -1], params)  # (N, V)
        probs = (probs[:, None] * p).flatten()
        seqs = torch.cat([seqs.repeat_interleave(V, 0), torch.arange(V).repeat(len(seqs))[:, None]], 1)
    return probs


def engine_tv(seed_of, samples=12_000, n=3):
    """TV between the first n tokens of ``samples`` requests (two prompts, alternating, arriving over time, in a
    cache small enough to preempt) and the target's exact joint law."""
    target = random_model(seed=5, vocab=V, logit_scale=10)
    draft = random_model(seed=6, vocab=V, layers=1, logit_scale=10)
    prompts, params = ([1, 3], [4, 0, 2]), SamplingParams(1.0)
    engine = Engine(target, draft, gamma=3, block_size=4, num_blocks=600, max_num_seqs=512)
    reqs = [Request(list(prompts[i % 2]), n, temperature=1.0, seed=seed_of(i), arrival_s=i * 2e-5)
            for i in range(samples)]
    t = torch.tensor([o.tokens for o in engine.run(reqs)])  # (samples, n)
    freq = torch.bincount(sum(t[:, i] * V ** (n - 1 - i) for i in range(n)), minlength=V**n).double() / samples
    exact = sum(exact_joint(target, p, params, n).double() for p in prompts) / 2
    return 0.5 * (freq - exact).abs().sum().item(), engine.stats


def test_sampled_requests_have_the_target_distribution():
    tv, stats = engine_tv(lambda i: 1000 + i)
    assert stats.preemptions > 0 and 0.1 < stats.acceptance_rate < 0.9  # rows came, went, were recomputed
    assert tv < tv_bound(V**3, 12_000), f"TV {tv:.4f}"
    shared, _ = engine_tv(lambda i: 7, samples=4_000)  # every request one seed: all the same tokens
    assert shared > tv_bound(V**3, 4_000)
