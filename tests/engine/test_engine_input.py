"""Bad input is refused before any work, one request at a time; the clock; the constructor's checks."""

import math
import time
import warnings

import pytest
import torch
from support import random_model

import minispec
from minispec.engine import Engine, Request
from minispec.roofline import hardware
from minispec.roofline.policy import RooflinePolicy, TreePolicy
from minispec.speculative.rule import accept_reject


@pytest.fixture(scope="module")
def pair():
    return random_model(seed=0), random_model(seed=1, layers=1, hidden=32, heads=2, kv_heads=1)


def test_bad_requests_fail_alone_before_any_work(pair):
    """Each bad request comes back with finish_reason "error" and a reason naming the problem; the good ones are
    served exactly, in as many steps as they take alone."""
    target, draft = pair
    engine = Engine(target, draft, gamma=4, block_size=4, num_blocks=40)  # 160 slots; the model takes 256 positions
    good = [Request([1, 2, 3], 10), Request([4, 5], 10, arrival_s=0.0)]
    bad = {
        "the prompt is empty": Request([], 10),
        "token id 64 outside the vocabulary": Request([1, 64], 10),
        "token id -1 outside": Request([-1], 10),
        "arrival_s must be a finite number of seconds >= 0": Request([1], 10, arrival_s=-1.0),
        "more than the cache's 40 blocks x 4 = 160 slots can ever hold": Request([1] * 100, 60),
        "exceeds the model's maximum length of 256": Request([1] * 200, 100),
        "max_new_tokens must be an integer >= 1": Request([1], 0),
        "temperature must be a number >= 0": Request([1], 5, temperature=-1.0),
        "top_p must be in (0, 1]": Request([1], 5, top_p=1.5),
        "top_k must be an integer >= 1": Request([1], 5, temperature=1.0, top_k=0, arrival_s=1.5),
        "eos_token_id 99 is not a token id": Request([1], 5, eos_token_id=99),
        "seed must be an integer": Request([1], 5, seed="7"),
        "expected a minispec.engine.Request": ([1, 2], 5),
    }
    outs = engine.run([good[0], *bad.values(), good[1]])
    by_reason = dict(zip(bad, outs[1:-1]))
    for i, (reason, o) in enumerate(by_reason.items()):
        assert o.finish_reason == "error" and o.tokens == [] and reason in o.error and o.error.startswith(
            f"request {i + 1}: "), o.error
        assert all(math.isnan(t) for t in (o.ttft_s, o.tpot_s, o.first_token_s)) and o.itl_s == [] == o.accepted
    assert by_reason["top_k must be an integer >= 1"].arrival_s == 1.5  # a request's own arrival
    assert by_reason["expected a minispec.engine.Request"].arrival_s == 0.0  # a non-request's: 0
    assert math.isnan(engine.run([Request([], 3, arrival_s="soon"), good[0]])[0].arrival_s)  # not a number: nan
    assert [o.tokens for o in (outs[0], outs[-1])] == minispec.generate(target, [r.prompt for r in good], 10).tokens
    steps = engine.stats.steps
    engine.run(good)
    assert engine.stats.steps == steps  # the bad requests cost no step
    with pytest.raises(ValueError, match="no request can run: request 0: the prompt is empty; request 1: "):
        engine.run([Request([], 3), Request([1], 3, arrival_s=math.nan)])
    with pytest.raises(ValueError, match="non-empty list"):
        engine.run([])


def test_the_constructor_checks_its_arguments(pair):
    target, draft = pair
    for kw, message in [(dict(gamma=0), "gamma must be an integer >= 1, 'auto' or a GammaPolicy"),
                        (dict(gamma=True), "gamma must be an integer >= 1"), (dict(gamma=2.5), "gamma must be"),
                        (dict(block_size=0), "block_size must be an integer >= 1"),
                        (dict(num_blocks=0), "num_blocks must be an integer >= 1"),
                        (dict(max_num_seqs=-1), "max_num_seqs must be an integer >= 1"),
                        (dict(max_num_batched_tokens=0), "max_num_batched_tokens must be an integer >= 1"),
                        (dict(max_num_batched_tokens=4), r"must hold one decoding row's 1 \+ 4 tokens"),
                        (dict(attention="paged"), "attention must be one of .*'sparse'.*, got 'paged'")]:
        with pytest.raises(ValueError, match=message):
            Engine(target, draft, **kw)
    with pytest.raises(ValueError, match="share a vocabulary"):
        Engine(target, random_model(seed=2, vocab=50))
    with pytest.raises(ValueError, match="target must be a minispec Model"):
        Engine("tiny-code-target")
    with pytest.raises(ValueError, match=r"attention='sparse' needs a float32 or float64 target .*torch.bfloat16"):
        Engine(random_model(seed=2).to(torch.bfloat16), attention="sparse")
    assert Engine(target, draft, gamma=1).policy.choose(1, 0) == 1  # the smallest gamma is one
    assert Engine(target, draft, gamma=4, max_num_batched_tokens=5).max_num_batched_tokens == 5  # 1 + 4 fits


def test_the_engine_prepacks_target_and_draft_model_unless_told_not_to():
    """Engine(prepack=True), the default: the target's and a draft model's linears run through oneDNN's prepacked
    weights (Model.prepack: a ``packed`` weight beside each linear); prepack=False leaves both on F.linear."""
    def packed(model):
        return [hasattr(m, "packed") for m in model.modules() if isinstance(m, torch.nn.Linear)]

    if not torch.backends.mkldnn.is_available():
        pytest.skip("no oneDNN in this torch: Model.prepack is a no-op")
    for prepack in (True, False):
        target, draft = random_model(seed=0), random_model(seed=1, layers=1)  # fresh: the fixture's are prepacked
        Engine(target, draft, prepack=prepack)
        assert set(packed(target)) == set(packed(draft)) == {prepack}


def test_step_times_add_up_to_at_most_the_runs_clock(pair):
    """EngineStats.step_s: each step's own seconds, positive, summing to no more than the run's clock; and a rule
    marked synthetic is reported as such."""
    target, draft = pair

    def rule(*args, **kw):
        return accept_reject(*args, **kw)

    rule.synthetic = True
    engine = Engine(target, draft, gamma=2, rule=rule)
    engine.run([Request([1, 2, 3], 8), Request([4, 5], 6, arrival_s=0.01)])
    s = engine.stats
    assert len(s.step_s) == s.steps and all(t > 0 for t in s.step_s) and sum(s.step_s) <= s.wall_s
    assert s.synthetic and not Engine(target, draft, gamma=2).stats.synthetic


def test_a_request_may_fill_the_model_and_the_cache_exactly(pair):
    """The limits are inclusive: a prompt plus max_new_tokens of exactly the model's positions runs (one more is
    refused); a request whose KV (every token but the last) fills the cache exactly runs (one more is refused); an
    EOS id of 0 is a token id."""
    target, _ = pair  # 256 positions, vocabulary 64
    engine = Engine(target, block_size=4, num_blocks=64)  # 256 slots
    assert engine.check(Request([1] * 250, 6)) is None
    assert "exceeds the model's maximum length of 256" in engine.check(Request([1] * 250, 7))
    small = Engine(target, block_size=4, num_blocks=4)  # 16 slots
    assert small.check(Request([1] * 10, 7)) is None  # 16 KV slots
    assert "needs up to 17 KV slots" in small.check(Request([1] * 10, 8))
    assert engine.check(Request([1, 2], 4, eos_token_id=0)) is None
    assert engine.check(Request([1, 2], 4, eos_token_id=[0, 63])) is None
    # the whole length served, with a step's lookahead past it (prompt lookup: no positions of its own): greedy's tokens
    full = Request([(7 * i) % 64 for i in range(250)], 6)
    out = Engine(target, minispec.PromptLookupDraft(), gamma=4, block_size=4, num_blocks=80).run([full])[0]
    assert out.tokens == minispec.generate(target, [full.prompt], 6).tokens[0]


def test_an_auto_engine_prices_steps_on_this_devices_ceilings_and_says_it_measures_them(pair, monkeypatch):
    """gamma="auto" as speculative_generate builds it: the roofline policy on this CPU's calibration for the target's
    dtype (measured once, with a warning the first time)."""
    target, draft = pair
    monkeypatch.setattr(hardware, "_CALIBRATED", {})
    monkeypatch.setattr(hardware, "measure_bandwidth", lambda device: 2e10)
    monkeypatch.setattr(hardware, "measure_flops", lambda device, dtype: 1e11 if dtype == torch.float32 else 7e11)
    with pytest.warns(UserWarning, match="gamma='auto' measures cpu's bandwidth and FLOP/s once"):
        engine = Engine(target, draft, gamma="auto")
    assert (engine.policy.hardware.memory_bandwidth, engine.policy.hardware.peak_flops) == (2e10, 1e11)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Engine(target, draft, gamma="auto")  # calibrated now: no warning
    with pytest.warns(UserWarning, match="gamma='auto' measures"):  # bfloat16 is a calibration of its own
        bf16 = Engine(random_model(seed=0).to(torch.bfloat16), minispec.PromptLookupDraft(), gamma="auto")
    assert bf16.policy.hardware.peak_flops == 7e11


def test_an_auto_engine_prices_a_tree_drafts_nodes_as_speculative_generate_does(pair, monkeypatch):
    """gamma="auto" with a tree draft: the policy that prices every node a row verifies (TreePolicy, with the draft's
    budget and top-k, or its static shape), the one speculative_generate builds, not a chain's; and it serves."""
    target, draft = pair
    monkeypatch.setattr(hardware, "_CALIBRATED", {("cpu", torch.float32): hardware.Hardware("cpu", 2e10, 1e11, 24e9)})
    dynamic, static = minispec.TreeDraft(draft, budget=6, depth=3), minispec.TreeDraft(draft, branching=(2, 2))
    engine = Engine(target, dynamic, gamma="auto")
    assert isinstance(engine.policy, TreePolicy) and (engine.policy.budget, engine.policy.topk) == (6, dynamic.topk)
    tree = Engine(target, static, gamma="auto").policy
    assert isinstance(tree, TreePolicy) and tree.tree.parents == tuple(p - 1 for p in static.parents)
    assert isinstance(Engine(target, draft, gamma="auto").policy, RooflinePolicy)
    prompts = [[1, 2, 3], [9] * 7]
    outs = engine.run([Request(q, 10) for q in prompts])
    assert [o.tokens for o in outs] == minispec.generate(target, prompts, 10).tokens
    assert max(engine.stats.gamma_per_step) <= 3


def test_defaults_serve_a_random_model_plainly_and_speculatively(pair):
    target, draft = pair
    prompts = [[1, 2, 3], [9] * 7]
    for d in (None, draft, minispec.PromptLookupDraft()):
        outs = Engine(target, d).run([Request(p, 12) for p in prompts])
        assert [o.tokens for o in outs] == minispec.generate(target, prompts, 12).tokens


def test_the_clock_realtime_or_with_idle_gaps_skipped(pair):
    """A request arriving at 0.5 s joins once the clock passes it: in real time the run waits for it; by default the
    clock skips the idle gap (the engine's clock then runs ahead of the wall clock), and the outputs' times agree."""
    target, _ = pair
    reqs = [Request([1, 2], 4), Request([3, 4], 4, arrival_s=0.5)]
    for realtime in (True, False):
        engine, t0 = Engine(target), time.perf_counter()
        outs = engine.run(reqs, realtime=realtime)
        wall = time.perf_counter() - t0
        assert outs[1].first_token_s >= 0.5 and outs[1].arrival_s == 0.5 and 0 <= outs[1].ttft_s < outs[1].first_token_s
        assert len(outs[1].itl_s) == 3 and outs[1].tpot_s > 0 and engine.stats.wall_s >= 0.5
        assert wall >= 0.5 if realtime else engine.stats.wall_s > wall
    with pytest.raises(ValueError, match="realtime must be True or False"):
        Engine(target).run(reqs, realtime="yes")


def test_a_run_that_skips_idle_time_starts_a_late_request_at_its_arrival(pair):
    """Engine.run(realtime=False) jumps over the time nothing runs: a request that arrives 50 s after the first one
    gets its first token one step after 50 s on the run's clock, not pushed later by the skip (a clock that skipped
    too much would add about the first request's whole time, 30 decoding steps, which one prefill step cannot)."""
    target, _ = pair
    early, late = Engine(target).run([Request([1, 2, 3], 30), Request([4, 5, 6], 2, arrival_s=50.0)])
    early_done = early.first_token_s + sum(early.itl_s)  # the run's clock when the first request finished
    assert early_done < 50.0
    assert 50.0 <= late.first_token_s < 50.0 + 0.5 * early_done
