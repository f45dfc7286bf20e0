"""The published incidents, replayed: what the simulator reproduces, where it disagrees, and what it took to agree."""

import math
from dataclasses import replace

import numpy as np
import pytest

from minispec.roofline import LLAMA_70B
from minispec.serving import RooflineSteps, Workload, incidents, poisson_requests, simulate
from minispec.serving.incidents import CNN_DAILYMAIL, HIGH_QPS, INCIDENTS, QWAMA_05B, SHAREGPT, V0, TableEngine, replay


@pytest.fixture(scope="module")
def replays():
    return {name: replay(name) for name in INCIDENTS}


def test_every_published_figure_is_replayed(replays):
    for name, incident in INCIDENTS.items():
        assert incident.source.startswith("https://") and incident.published
        assert set(incident.published) <= set(replays[name])
        assert all(math.isfinite(replays[name][figure]) for figure in incident.published)
    with pytest.raises(ValueError, match="unknown incident"):
        replay("vllm#1")


def test_vllm_blog_low_qps_holds_and_only_the_draft_models_slowdown_is_reproduced(replays):
    """alpha fitted at batch 1 to 1.5x and 2.8x: simulating QPS 1 keeps both within 10 %. At high QPS the draft
    model slows down (its verify at ~100 rows is compute-bound on 4 H100s and its draft pays 48 all-reduces a
    step) as published, within 15 %; n-gram does not: at the loads where its queue drains it still speeds up
    2.7x, and agreeing takes a fixed cost per speculative step of more than twice a plain step."""
    r, published = replays["vllm-blog-2024-10-17"], INCIDENTS["vllm-blog-2024-10-17"].published
    assert 0.3 < r["fit: draft model alpha"] < r["fit: n-gram alpha"] < 0.9
    for label in ("draft model", "n-gram"):
        assert r[f"{label}, QPS 1"] == pytest.approx(published[f"{label}, QPS 1"], rel=0.1)
    assert r["draft model, high QPS"] < 1 and r["draft model, high QPS"] == pytest.approx(1 / 1.4, rel=0.15)
    assert r["n-gram, high QPS"] > 2
    assert r["fit: n-gram s per speculative step, to agree at high QPS"] > 0.02  # s; a plain step is ~12 ms


def test_high_qps_is_the_last_rate_whose_queues_drain(replays):
    """The rule HIGH_QPS states: both settings keep p99 TTFT under 1 s there, and one of them does not 4 requests/s
    higher (at the fitted alpha)."""
    r = replays["vllm-blog-2024-10-17"]
    plain = RooflineSteps(model=LLAMA_70B, tensor_parallel=4)
    cases = {"draft model": (SHAREGPT, replace(plain, draft=QWAMA_05B)), "n-gram": (CNN_DAILYMAIL, replace(
        plain, draft_cost=0.0))}
    for label, (traffic, steps) in cases.items():
        assert max(r[f"{label}, high QPS: p99 TTFT s, plain / K=5"]) < 1.0
        traffic = replace(traffic, alpha=r[f"fit: {label} alpha"])
        requests = poisson_requests(Workload(rate=HIGH_QPS[label] + 4, duration_s=30.0, mix=(traffic,)))
        ttft = [simulate(requests, s, g, V0).summary(math.inf)["ttft_p99_s"] for s, g in ((plain, 0), (steps, 5))]
        assert max(ttft) > 1.0


def test_vllm_49548_the_table_costs_what_plain_decoding_does_not_the_collapse(replays):
    """With the table, 8 rows get K = 0: the simulator gives plain decoding's rate less the penalties the single
    stream shows (0.7-0.9 of static), not the published 0.10-0.68; reaching 40 s of wall clock would take a stall
    per decode step longer than a whole static step."""
    r, published = replays["vllm#49548"], INCIDENTS["vllm#49548"].published
    assert 0.6 < r["fit: MTP alpha"] < 0.95 and r["fit: PIECEWISE s more per forward pass"] > 0
    assert r["table over static K=2, single stream"] == pytest.approx(published["table over static K=2, single stream"])
    assert published["table over static K=2, 8 concurrent"] < r["table over static K=2, 8 concurrent"] < 1
    assert r["table over static K=2, 8 concurrent"] < r["plain decoding (no table) over static K=2, 8 concurrent"]
    assert r["fit: s of stall per decode step to reach 40 s"] > r["static K=2 decode step at 8 rows, s"]


def test_the_table_engine_charges_a_draft_pass_where_k_is_0():
    steps, context = RooflineSteps(draft=QWAMA_05B), np.array([100, 300])
    engine = TableEngine(steps, piecewise_s=1e-3)
    assert engine.plain(context) == pytest.approx(steps.plain(context) + steps.draft_step(context) + 2e-3)
    assert engine.speculative(context, 2) == pytest.approx(steps.speculative(context, 2) + 3e-3)


def test_spark_343_per_position_acceptance_does_not_make_k2_win_at_8(replays):
    """Fitted to the single-stream tie, the simulator puts K = 4 ahead at 8 concurrent (its 3.10 tokens a step
    against 2.31 beat the dearer verify); the report has K = 2 1.45x ahead and calls it noisy. Treating the
    average acceptance as one alpha per position moves the simulator toward the report, for the wrong reason."""
    r, published = replays["spark-vllm-docker#343"], INCIDENTS["spark-vllm-docker#343"].published
    assert r["fit: s per forward pass"] > 0 and r["fit: s per step"] > 0
    assert r["K=2 over K=4, single stream"] == pytest.approx(published["K=2 over K=4, single stream"], rel=1e-6)
    assert r["tokens per step, K=4 / K=2"] == pytest.approx((3.099, 2.311))
    assert r["K=2 over K=4, 8 concurrent"] < 1 < published["K=2 over K=4, 8 concurrent"]
    assert r["K=2 over K=4, 8 concurrent, one alpha per K"] > 1


def test_vllm_15025_the_roofline_says_faster_and_a_per_pass_cost_makes_it_slower(replays):
    """On the roofline a 135M draft costs c ~ 0.08 and K = 5 is 1.5-2.4x faster; 30 % slower takes a fixed cost
    per forward pass above the 1.7B target's own roofline step at one row: the deep, thin draft is launch-bound."""
    r = replays["vllm#15025"]
    assert r["roofline alone, 256 prompts"] > 1.3 and r["roofline alone, 1 prompts"] > 2
    assert r["K=5 over no speculation"] == pytest.approx(0.7, rel=1e-3)
    assert r["fit: s per forward pass, 1 prompts"] > r["target's roofline step at 1 rows, s"]


def test_the_comparison_table(replays):
    rows = incidents.compare(replays)
    assert len(rows) == sum(len(i.published) for i in INCIDENTS.values())
    assert {row["incident"] for row in rows} == set(INCIDENTS)
