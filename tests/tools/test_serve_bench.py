"""serve-bench: the engine measured under load, the simulator beside it, its files and its command."""

import json

import pytest
from support import random_model

from minispec.cli import main
from minispec.drafts.suffix import SuffixDraft
from minispec.serving import Lengths
from minispec.tools.serve_bench import LoadConfig, goodput_rate, measure, serve_bench, traffic

TINY = LoadConfig(rates=(4.0, 64.0), min_requests=6, max_requests=6, prompt=Lengths(8, "uniform"),
                  output=Lengths(8, "uniform"), max_num_seqs=4, tpot_slo_s=1.0, ttft_slo_s=10.0)


def test_traffic_is_the_same_requests_at_every_rate():
    text = list(range(1, 60)) * 10
    (a, sa), (b, sb) = traffic(4.0, TINY, text), traffic(64.0, TINY, text)
    assert [r.prompt for r in a] == [r.prompt for r in b] and [r.max_new_tokens for r in a] == [
        s.output_tokens for s in sb]
    assert b[-1].arrival_s == pytest.approx(a[-1].arrival_s * 4 / 64) and len(a) == len(sa) == 6


def test_measured_and_simulated_rows_and_files(tmp_path):
    target, draft = random_model(seed=0), random_model(seed=1, layers=1, hidden=32, heads=2, kv_heads=1)
    text = list(range(1, 60)) * 10
    rows = serve_bench(target, {"plain": {}, "gamma 1": dict(draft=draft, gamma=1)}, TINY, text,
                       tmp_path / "sb", progress=lambda line: None)
    keys = [(r["source"], r["rate"], r["setting"]) for r in rows]
    sources = ("measured", "simulated", "simulated, step table")  # step times fitted to the run, or measured apart
    assert keys == [(s, r, n) for s in sources for r in TINY.rates for n in ("plain", "gamma 1")]
    measured = [r for r in rows if r["source"] == "measured"]
    assert all(r["requests"] == 6 and r["mean_batch"] <= 4 and r["loadavg_before"] >= 0 for r in measured)
    assert [r["mean_gamma"] for r in measured] == [0, 1, 0, 1]
    assert goodput_rate(rows, "plain", TINY.attainment) == 64.0  # loose SLOs: every rate meets them
    lines = [json.loads(x) for x in (tmp_path / "sb.jsonl").read_text().splitlines()]
    assert [(r["source"], r["setting"]) for r in lines] == [k[::2] for k in keys]
    assert "Goodput" in (tmp_path / "sb.txt").read_text() and (tmp_path / "sb.png").stat().st_size > 0
    fitted = json.loads((tmp_path / "sb_steps.json").read_text())  # per setting: (batch, 1 + gamma, s) and prefill
    assert {w for _, w, _ in fitted["gamma 1"]["step_s"]} >= {2} and all(s > 0 for *_, s in fitted["plain"]["step_s"])


def test_the_command_checks_its_flags_before_any_work(capsys, tmp_path):
    for argv, message in [(["--gamma", "0"], "each gamma must be an integer >= 1, auto or table"),
                          (["--rates", "1,x"], "--rates takes some comma-separated numbers"),
                          (["--slo", "1"], "--slo takes 2 comma-separated numbers"),
                          (["--rates", "0"], "need positive rates"),
                          (["--accept-rate", "2"], "synthetic acceptance rate must be in [0, 1]"),
                          (["--draft", "no-such-draft"], "no-such-draft")]:
        assert main(["serve-bench", "--out", str(tmp_path / "x"), *argv]) == 2
        assert message in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_a_draft_that_learns_across_requests_starts_each_rate_empty():
    """Every rate serves the same requests: suffix decoding's global tree, kept from the rate before, would hold these
    very outputs (acceptance went from 0.55-0.59 to 0.75-0.79 in the committed load sweep before each rate reset it)."""
    target = random_model(seed=0)
    text = list(range(1, 60)) * 10
    cfg = LoadConfig(rates=(4.0, 4.0), min_requests=6, max_requests=6, prompt=Lengths(8, "uniform"),
                     output=Lengths(24, "uniform"), max_num_seqs=4)
    rows = measure(target, {"suffix": dict(draft=SuffixDraft(), gamma=4)}, cfg, text, progress=lambda line: None)
    first, again = (r["acceptance_rate"] for r in rows)
    assert first == again and first < 1
