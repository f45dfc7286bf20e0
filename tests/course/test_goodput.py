"""minispec.course.goodput: steady-state windows, bisected SLO goodput, and the other two goodputs."""

import math

import pytest

from minispec import serving
from minispec.course import goodput
from minispec.serving import Lengths, Request


def test_the_window_scores_the_middle_of_the_arrivals():
    w = goodput.Window(warmup_s=2, measure_s=5, tail_s=1)
    reqs = [Request(t, 8, 8) for t in (0.0, 1.9, 2.0, 4.5, 6.99, 7.0, 7.5)]
    assert w.duration_s == 8 and [r.arrival_s for r in w.scored(reqs)] == [2.0, 4.5, 6.99]
    with pytest.raises(ValueError):
        goodput.Window(measure_s=0)


def test_attainment_counts_both_slos_and_a_one_token_request_has_no_tpot():
    ok = Request(0.0, 8, 9, first_token_s=0.5, finish_s=0.5 + 8 * 0.01)  # TPOT 10 ms, TTFT 0.5 s
    slow = Request(0.0, 8, 9, first_token_s=0.5, finish_s=0.5 + 8 * 0.02)  # TPOT 20 ms
    late = Request(0.0, 8, 1, first_token_s=2.0, finish_s=2.0)  # one token, TTFT 2 s
    assert goodput.attainment([ok, slow, late], 0.015, 1.0) == pytest.approx(1 / 3)
    assert goodput.attainment([ok, slow, late], 0.015) == pytest.approx(2 / 3)  # no TTFT SLO
    with pytest.raises(ValueError, match="no requests"):
        goodput.attainment([], 0.01)


def test_bisection_finds_the_crossing_without_running_the_ends():
    calls = []

    def met(rate):  # meets 90 % up to 73.2 requests/s
        calls.append(rate)
        return 1.0 if rate <= 73.2 else 0.5

    rate, seen = goodput.slo_goodput(met, 50, 100, 1.0)
    assert 72.2 <= rate <= 73.2 and 50 not in calls and 100 not in calls and len(calls) == 6
    assert goodput.bracketed(seen) and seen == [(r, 1.0 if r <= 73.2 else 0.5) for r in calls]
    _, all_pass = goodput.slo_goodput(lambda r: 1.0, 50, 100, 10)
    assert not goodput.bracketed(all_pass)  # the bracket was wrong: the answer is its top end less a step
    with pytest.raises(ValueError):
        goodput.slo_goodput(met, 100, 50, 1)


def _small():
    steps = serving.RooflineSteps()  # 8B on an H100, c = 0.05
    work = serving.Workload(mix=(serving.Traffic(prompt=Lengths(32, "uniform"), output=Lengths(16, "uniform")),))
    return steps, work, goodput.Window(warmup_s=0.2, measure_s=0.5, tail_s=0.2)


def test_seeds_goodput_is_the_same_in_forked_workers_and_per_gpu():
    steps, work, w = _small()
    one, seen = goodput.seeds_goodput(steps, 4, work, w, range(2), 100, 3000, 200, 0.0052, 1.0)
    two, _ = goodput.seeds_goodput(steps, 4, work, w, range(2), 100, 3000, 200, 0.0052, 1.0, gpus=2, workers=2)
    assert all(goodput.bracketed(s) for s in seen)
    assert [x / 2 for x in one] == two


def test_generated_rate_and_useful_throughput_by_hand():
    steps, work, w = _small()
    run = goodput.serve(400, steps, 4, work, w)
    decode_s = sum(s.seconds for s in run.steps if s.kind == "decode")
    assert goodput.generated_rate(run) == pytest.approx(sum(r.output_tokens - 1 for r in run.requests) / decode_s)
    scored = goodput.steady(run, w)
    span = max(r.finish_s for r in scored) - min(r.arrival_s for r in scored)
    assert goodput.useful_throughput(scored, math.inf) == pytest.approx(sum(r.output_tokens for r in scored) / span)
    assert goodput.useful_throughput(scored, 0.0) == 0.0  # nobody decodes in no time
    assert goodput.spread([3, 1, 2]) == (2.0, 1.0, 3.0)
