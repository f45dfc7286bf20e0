"""Phase timers and latency statistics."""

import math
import time

from minispec.decoding.stats import Timeline, latency_stats, percentile
from minispec.decoding.timing import PhaseTimer


def test_cpu_timer_adds_up_the_clock_around_each_phase(monkeypatch):
    """Each phase adds perf_counter's difference around its block; phases accumulate separately."""
    ticks = iter([1.0, 1.5, 2.0, 2.25, 10.0, 10.125])
    monkeypatch.setattr(time, "perf_counter", lambda: next(ticks))
    timer = PhaseTimer("cpu")
    for _ in range(2):
        with timer("draft"):
            pass
    with timer("verify"):
        pass
    assert timer.totals() == {"draft": 0.75, "verify": 0.125}


def test_disabled_timer_records_nothing_and_reads_no_clock(monkeypatch):
    monkeypatch.setattr(time, "perf_counter", lambda: (_ for _ in ()).throw(AssertionError("clock read")))
    timer = PhaseTimer("cpu", enabled=False)
    with timer("draft"):
        pass
    assert timer.totals() == {} and timer("draft") is timer("verify")  # one shared null context manager


def test_percentile():
    assert percentile([3, 1, 2], 50) == 2 and percentile([1, 2], 50) == 1.5 and math.isnan(percentile([], 50))
    assert percentile(list(range(101)), 99) == 99


def test_latency_stats_per_row():
    # t0 = 0, first token at 1.0 s, steps end at 2, 3, 5; row 0 ends at step 1, row 1 after its first token.
    timeline = Timeline(t0=0.0, t_first=1.0, step_ends=[2.0, 3.0, 5.0], step_active=[1, 1, 1])
    lat = latency_stats(timeline, row_tokens=[5, 1], row_finish_step=[1, -1])
    assert lat["ttft_s"] == 1.0
    assert lat["row_tpot_s"][0] == (3.0 - 1.0) / 4 and math.isnan(lat["row_tpot_s"][1])
    assert lat["itl_p50_s"] == 1.0 and lat["num_steps"] == 3


def test_latency_percentiles_over_rows_and_steps():
    """Four rows (one with a single token: no TPOT; one with two: a TPOT), steps of 1, 2, 4 and 8 s serving 3, 2, 2
    and 1 rows: TPOT percentiles over the three rows that have one, ITL percentiles over (row, step) gaps."""
    timeline = Timeline(t0=0.0, t_first=1.0, step_ends=[2.0, 4.0, 8.0, 16.0], step_active=[3, 2, 2, 1])
    lat = latency_stats(timeline, row_tokens=[2, 4, 1, 5], row_finish_step=[0, 2, -1, 3])
    assert lat["row_tpot_s"][:2] == [1.0, 7.0 / 3] and math.isnan(lat["row_tpot_s"][2])
    assert lat["row_tpot_s"][3] == 15.0 / 4
    tpots = [1.0, 7.0 / 3, 15.0 / 4]
    assert lat["tpot_p50_s"] == 7.0 / 3 and lat["tpot_p99_s"] == percentile(tpots, 99) < 15.0 / 4
    itl = [1.0] * 3 + [2.0] * 2 + [4.0] * 2 + [8.0]
    assert lat["itl_p50_s"] == 2.0 and lat["itl_p99_s"] == percentile(itl, 99) < 8.0


def test_elapsed_is_the_time_since_the_timeline_began():
    before = time.perf_counter()
    timeline = Timeline()
    elapsed = timeline.elapsed()
    assert 0 <= elapsed <= time.perf_counter() - before
