"""minispec vs-vllm: its requests, minispec's side end to end, the tables and goodput, its flags; the vLLM side
where vLLM is installed (tests/vllm/test_vs_vllm_quick.py runs the whole --quick command there)."""

import json
import math
from dataclasses import asdict, replace

import pytest

from minispec.cli import build_parser, main
from minispec.engine import Engine, Request
from minispec.tools import vs_vllm, vs_vllm_cli, vs_vllm_report, vs_vllm_workload
from minispec.tools.vllm_side import Served, VllmSettings, available, kv_bytes_per_token
from minispec.tools.vs_vllm import VsConfig, served_by_minispec, step_events
from minispec.tools.vs_vllm_workload import Job, code_prompts, jobs, static_jobs

SHORT = {"pair": ((16, 40), (4, 12))}  # the pair's prompt and output lengths, cut for a test (--lengths-pair)


def test_every_rate_serves_the_same_requests_with_scaled_arrivals():
    cfg, prompts = VsConfig(window_s=2.0, min_requests=5, max_requests=9), code_prompts(10, (20, 30))
    slow, fast = jobs(prompts, (4, 8), 3, 2.0, cfg), jobs(prompts, (4, 8), 3, 8.0, cfg)
    assert len(slow) == 5 and len(fast) == 9  # max(min, rate x window), at most max
    assert [(j.prompt, j.max_new_tokens, j.seed) for j in slow] == [(j.prompt, j.max_new_tokens, j.seed)
                                                                    for j in fast[:5]]
    assert [4 * f.arrival_s for f in fast[:5]] == pytest.approx([s.arrival_s for s in slow])
    assert all(20 <= len(j.prompt) <= 30 and 4 <= j.max_new_tokens <= 8 for j in fast)
    assert jobs(prompts, (4, 8), 4, 2.0, cfg) != slow  # another seed, another sequence
    rounds = static_jobs(prompts, (4, 8), 3, replace(cfg, static_min=8), eos=7)
    assert [len(r) for r in rounds] == [3, 3, 3] and all(j.arrival_s == 0 and j.eos == 7 for r in rounds for j in r)


def test_step_events_split_tokens_at_the_targets_own_tokens():
    class Out:  # accepted: two steps of 1 + 2 accepted, a plain step, then a step cut by max_new_tokens
        first_token_s, itl_s, accepted = 1.0, [0.5, 0.25, 0.25], [False, True, True, False, False, True]

    assert step_events(Out()) == [(1.0, 1), (1.5, 3), (1.75, 1), (2.0, 1)]
    Out.accepted = [False, False]
    with pytest.raises(RuntimeError, match="4 step times but 2 groups"):
        step_events(Out())


@pytest.mark.parametrize("speculative", [False, True])
def test_the_minispec_side_records_every_step_and_token(pair, one_thread, speculative):
    target, draft = pair
    engine = Engine(target, draft if speculative else None, gamma=3)
    batch = [Job(tuple(range(1 + i, 9 + i)), 6 + i, 0.01 * i, seed=i) for i in range(4)]
    served, stats = served_by_minispec(engine, batch, realtime=False)
    alone = engine.run([Request(list(j.prompt), j.max_new_tokens, seed=j.seed) for j in batch])  # greedy
    assert [s.tokens for s in served] == [o.tokens for o in alone]
    for s, j in zip(served, batch):
        assert sum(k for _, k in s.events) == len(s.tokens) == j.max_new_tokens
        assert all(1 <= k <= (4 if speculative else 1) for _, k in s.events)
        assert [t for t, _ in s.events] == sorted(t for t, _ in s.events) and s.first_token_s >= j.arrival_s
    assert stats["steps"] >= max(len(s.events) for s in served) and (stats["num_drafts"] > 0) == speculative


def served(arrivals, first, finish, ntok):
    return [Served(a, list(range(n)), [(f, 1)] + [(f + (e - f) * (i + 1) / (n - 1), 1) for i in range(n - 1)])
            for a, f, e, n in zip(arrivals, first, finish, ntok)]


def test_latency_counts_the_steady_state_and_its_window():
    cfg = VsConfig(exclude=(0.2, 0.2))
    s = served([0, 1, 2, 3, 4], [0.5, 1.2, 2.9, 3.5, 4.1], [1.5, 2.2, 3.9, 4.5, 9.1], [11] * 5)
    row = vs_vllm_report.latency([s], None, cfg, (0.5, 0.11))
    assert (row["requests"], row["counted"]) == (5, 3)  # the first and last arrival served, not counted
    assert row["ttft_p50_s"] == pytest.approx(0.5) and row["tpot_p50_s"] == pytest.approx(0.1)
    assert row["slo_met"] == pytest.approx(2 / 3)  # arrival 2: TTFT 0.9 s > 0.5 s
    in_window = sum(1 for r in s for t, _ in r.events if 1 <= t <= 3)  # first to last counted arrival
    assert row["throughput"] == pytest.approx(in_window / 2) and row["throughput_all"] == pytest.approx(55 / 9.1)
    st = vs_vllm_report.static([s[:2], s[2:]], [s[:2], s[2:]])
    assert st["throughput"] == pytest.approx(55 / (2.2 + 9.1)) and st["requests"] == 5


def test_goodput_is_the_highest_rate_below_every_failure_and_bisection_closes_in():
    tried = {1: 1.0, 2: 0.95, 4: 0.5, 8: 0.95}
    assert vs_vllm_report.goodput(tried, 0.9) == 2  # 8 passing after 4 failing does not count
    assert vs_vllm_report.next_bisection(tried, 0.9) == pytest.approx(math.sqrt(8))
    assert vs_vllm_report.goodput({1: 0.5}, 0.9) == 0 and vs_vllm_report.next_bisection({1: 0.5}, 0.9) == 0.5
    assert vs_vllm_report.next_bisection({1: 0.5, 0.5: 0.95}, 0.9) == pytest.approx(math.sqrt(0.5))  # found below
    assert vs_vllm_report.next_bisection({1: 1.0, 2: 1.0}, 0.9) is None  # every rate passed: nothing to bisect
    assert vs_vllm_report.next_bisection({2: 1.0, 2.05: 0.1}, 0.9) is None  # within 5 %


def row(engine, setting, rate, tpot, thr, slo=1.0, mode="load", seed=0, **kw):
    key = {"rate": rate} if mode == "load" else {"batch": rate}
    return {"workload": "pair", "setting": setting, "engine": engine, "mode": mode, "seed": seed, "bisect": False,
            "tpot_p50_s": tpot, "tpot_p99_s": 2 * tpot, "ttft_p50_s": 0.1, "ttft_p99_s": 0.2, "throughput": thr,
            "throughput_all": thr, "slo_met": slo, "acceptance_rate": 0.5 if setting != "plain" else None,
            "mean_acceptance_length": 2.0 if setting != "plain" else None, "preemptions": 0, "loadavg_before": 1.0,
            "loadavg_after": 1.5, "wall_s": 1.0, "tokens_equal": 1.0, "counters_equal": True, "mean_k": 4.0,
            "num_drafts": 10, "draft_tokens": 40, "accepted_tokens": 20, "accepted_per_position": [8, 6, 4, 2],
            **key, **kw}


def test_the_tables_divide_minispec_by_vllm_and_find_where_speculation_stops_paying():
    rows = [row("minispec", "plain", 4, 0.020, 100), row("vllm", "plain", 4, 0.010, 200),
            row("minispec", "draft", 4, 0.010, 100), row("vllm", "draft", 4, 0.008, 200),
            row("minispec", "plain", 16, 0.040, 300, slo=0.5), row("vllm", "plain", 16, 0.020, 400),
            row("minispec", "draft", 16, 0.050, 250, slo=0.5), row("vllm", "draft", 16, 0.010, 450),
            row("minispec", "plain", 1, 0.004, 250, mode="static"), row("vllm", "plain", 1, 0.002, 500, mode="static"),
            row("minispec", "draft", 1, 0.002, 400, mode="static"), row("vllm", "draft", 1, 0.003, 300, mode="static")]
    table = vs_vllm_report.load_table(rows)
    ratio = [line.split() for line in table.splitlines() if line.split()[:1] == ["ratio"]]
    assert len(ratio) == 4 and ratio[0][3] == "2.00x" and ratio[0][5] == "0.50x"  # TPOT p50 and tok/s, plain at 4
    assert "4 [4-4]" in vs_vllm_report.goodput_table(rows, 0.9) and "0.25x" in vs_vllm_report.goodput_table(rows, 0.9)
    lines = vs_vllm_report.crossover(rows, 0.9)
    mine = next(line for line in lines if "minispec" in line)
    theirs = next(line for line in lines if "vllm" in line)
    assert "4: 0.50, 16: 1.25 -> no gain from rate 16" in mine and "above plain at every batch" in mine
    assert "gains at every rate tried" in theirs and "below plain from batch 1" in theirs
    cfg = VsConfig(workloads=("pair",), seeds=(0,))
    text = vs_vllm_report.text(rows, cfg)
    assert "The same tokens from both engines in 6 of 6 runs" in text
    assert "in 3 of 3 speculative runs at a fixed K" in text
    rows[-1]["accepted_per_position"] = [8, 6, 4, 1]  # vLLM's static draft row: one count off
    assert "in 2 of 3 speculative runs at a fixed K" in vs_vllm_report.text(rows, cfg)
    same = dict(num_drafts=3, draft_tokens=9, accepted_tokens=4, accepted_per_position=[2, 1, 1])
    assert vs_vllm_report.same_counters(same, same | {"accepted_per_position": [2, 1, 1, 0]})  # vLLM's K-long vector
    assert not vs_vllm_report.same_counters(same, same | {"accepted_per_position": [2, 2, 0, 0]})
    assert not vs_vllm_report.same_counters(same, same | {"num_drafts": 4})
    table_rows = rows + [replace_setting(r) for r in rows if r["setting"] == "draft" and r["mode"] == "load"]
    kt = vs_vllm_report.k_table_text(table_rows, cfg, {"num_speculative_tokens": 4,
                                                       "num_speculative_tokens_per_batch_size": [[1, 64, 3]]})
    assert "[[1, 64, 3]]" in kt and "minispec: the table's TPOT p50 beats fixed K at 2 of 2 rates" in kt


def test_the_roofline_lines_price_the_measured_acceptance_on_the_calibrated_ceilings():
    """A weights-only target of 1M float32 parameters on 1 GB/s and 1 GFLOP/s: a pass over N tokens takes
    max(4 ms, 2 ms x N). With E = 2.5 and K = 3 and a free draft, batch 1 gains 2.5 x 4 / 8 = 1.25 and batch 2 loses
    (2.5 x 4 / 16 = 0.62); a draft of a quarter of the weights adds K x 1 ms at batch 1 and 2 (2.5 x 4 / 11 = 0.91,
    2.5 x 4 / 19 = 0.53)."""
    shape = {"params": 1e6, "bytes_per_param": 4}
    inputs = {"hardware": {"name": "cpu", "memory_bandwidth": 1e9, "peak_flops": 1e9, "memory_bytes": 1e9},
              "threads": 1, "when": "a test", "workloads": {"pair": {"target": shape, "context": 0,
                                                                       "draft": shape | {"params": 2.5e5}}}}
    kw = dict(mode="static", mean_acceptance_length=2.5, mean_k=3.0)
    rows = [row(e, s, B, 0.01, thr, **kw) for e in ("minispec", "vllm") for s, B, thr in (
        ("plain", 1, 100), ("draft", 1, 150), ("plain", 2, 180), ("draft", 2, 90), ("ngram", 1, 120), ("ngram", 2, 90))]
    head, draft, ngram = vs_vllm_report.roofline(rows, inputs)
    assert "1.0 GB/s, 1 GFLOP/s at 1 thread(s), a test" in head
    assert draft.startswith("pair, draft: batch 1: 0.91 predicted (E 2.50, K 3.00), measured minispec 1.50, vLLM 1.50")
    assert "batch 2: 0.53 predicted" in draft and draft.endswith("predicted to stop paying from batch 1")
    assert ngram.startswith("pair, ngram: batch 1: 1.25 predicted") and "batch 2: 0.62 predicted" in ngram
    assert ngram.endswith("predicted to stop paying from batch 2")
    assert vs_vllm_report.roofline(rows, {}) == []


def replace_setting(r):
    return r | {"setting": "draft, K table", "tpot_p50_s": r["tpot_p50_s"] / 2, "mean_k": 3.0}


@pytest.mark.slow
def test_the_minispec_side_end_to_end_writes_rows_table_and_plot(tmp_path, monkeypatch, one_thread):
    cfg = VsConfig(workloads=("pair",), engines=("minispec",), rates={"pair": (8.0, 256.0)}, seeds=(0, 1),
                   window_s=0.5, min_requests=4, max_requests=6, bisect=1, static_batches=(1, 4), static_min=2,
                   slo={"pair": (0.5, 0.01)}, exclude=(0.25, 0.25), k_table=str(tmp_path / "k.json"), lengths=SHORT)
    table = {"num_speculative_tokens": 4, "num_speculative_tokens_per_batch_size": [[1, 1, 4], [2, 64, 1]]}
    (tmp_path / "k.json").write_text(json.dumps(table))
    monkeypatch.setattr(vs_vllm, "SETTLE_S", 0.0)
    rows = vs_vllm.run(cfg, tmp_path / "vs", progress=lambda line: None)
    settings = ("plain", "draft", "draft, K table")
    grid = [(r["setting"], r["rate"], r["seed"]) for r in rows if r["mode"] == "load" and not r["bisect"]]
    assert grid == [(s, r, seed) for s in settings for seed in (0, 1) for r in (8.0, 256.0)]
    static = [(r["setting"], r["batch"], r["requests"]) for r in rows if r["mode"] == "static"]
    assert static == [(s, B, n) for s in settings for B, n in ((1, 2), (4, 4))]
    assert all(4 * r["requests"] <= r["output_tokens"] <= 12 * r["requests"] for r in rows if r["mode"] == "static")
    by = {(r["setting"], r["mode"], r.get("batch")): r for r in rows if r["mode"] == "static"}
    assert by["draft, K table", "static", 1]["mean_k"] == 4 and by["draft, K table", "static", 4]["mean_k"] < 4
    assert all(r["engine"] == "minispec" and r["torch_threads"] == 1 and "tokens_equal" not in r for r in rows)
    spec = [r for r in rows if r["setting"] == "draft"]
    assert all(r["num_drafts"] > 0 and 0 <= r["acceptance_rate"] <= 1 and 0 < r["mean_k"] <= 4 for r in spec)
    for r in (r for r in rows if r["mode"] == "load"):
        assert 4 <= r["requests"] <= 6 and r["counted"] == r["requests"] - 2 * (r["requests"] // 4)
        assert r["ttft_p50_s"] >= 0
    lines = (tmp_path / "vs.jsonl").read_text().splitlines()
    meta = json.loads(lines[0])["meta"]
    assert meta["threads"] == 1 and meta["config"]["seeds"] == [0, 1] and "git_revision" in meta
    assert meta["roofline"]["hardware"]["peak_flops"] > 0 and meta["roofline"]["workloads"]["pair"]["draft"]
    assert [(r["setting"], r["mode"], r["engine"]) for r in map(json.loads, lines[1:])] == [
        (r["setting"], r["mode"], r["engine"]) for r in rows]
    text = (tmp_path / "vs.txt").read_text()
    assert "Under Poisson load" in text and "Goodput (DistServe)" in text and "Static batches" in text
    assert "threads: minispec 1, vLLM's worker 1," in text
    assert "Where speculation stops paying" in text and "Load average" in text and (tmp_path / "vs.png").stat().st_size
    assert "roofline on this CPU's ceilings" in text and "pair, draft: batch 1:" in text
    assert "prompt and output tokens pair 16-40 and 4-12" in text and meta["config"]["lengths"] == {
        "pair": [[16, 40], [4, 12]]}
    assert meta["roofline"]["workloads"]["pair"]["context"] == (16 + 40) / 2 + (4 + 12) / 4
    (tmp_path / "vs.txt").unlink()
    assert vs_vllm_cli.redraw(tmp_path / "vs.jsonl") == text == (tmp_path / "vs.txt").read_text()  # from the .jsonl
    kt = (tmp_path / "vllm_k_table.txt").read_text()
    assert "[[1, 1, 4], [2, 64, 1]]" in kt and "minispec: the table's TPOT p50 beats fixed K at" in kt
    assert json.loads((tmp_path / "vllm_k_table.jsonl").read_text().splitlines()[0])["k_table"] == table


def test_vllm_settings_name_threads_and_openmp():
    env = VllmSettings(threads=1).environment()
    assert env["VLLM_CPU_OMP_THREADS_BIND"].isdigit() and "LD_PRELOAD" not in env
    assert env["NUMBA_THREADING_LAYER"] == "workqueue"  # not numba's OpenMP pool beside torch's threads
    assert VllmSettings(threads=2, bind="nobind", numba="default").environment() == {
        "VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": "2"}
    with pytest.raises(ValueError, match="gomp or iomp"):
        VllmSettings(omp="tbb")
    with pytest.raises(ValueError, match="workqueue or default"):
        VllmSettings(numba="omp")
    with pytest.raises(ValueError, match="need 999 CPUs|999 vLLM threads"):
        VllmSettings(threads=999).environment()
    assert kv_bytes_per_token(vs_vllm_workload.resolve("tiny-code-target")) == 8 * 2 * 2 * 48 * 4


def test_a_records_vllm_settings_read_back_as_they_ran():
    """A record made before the numba setting existed ran vLLM on numba's default layer and reads back so; a newer
    record reads back with the layer it names."""
    old = {"threads": 2, "omp": "gomp", "bind": None, "eager": True}
    cfg = lambda vllm: vs_vllm_cli.config_from_meta({"config": {"workloads": ["pair"], "vllm": vllm}})  # noqa: E731
    assert cfg(old).vllm == VllmSettings(2, numba="default")
    assert cfg(old | {"numba": "workqueue"}).vllm.numba == "workqueue"


def test_other_prompt_and_output_lengths_from_the_command_line():
    parse = lambda *a: vs_vllm_cli.cli_config(build_parser().parse_args(["vs-vllm", "--engines", "minispec", *a]))[0]  # noqa: E731
    cfg = parse("--workloads", "pair", "--lengths-pair", "16,40,100,192")
    assert cfg.lengths_of("pair") == ((16, 40), (100, 192)) and cfg.lengths_of("smollm2") == ((64, 512), (32, 128))
    meta = {"config": json.loads(json.dumps(asdict(cfg), default=str))}
    assert vs_vllm_cli.config_from_meta(meta).lengths == cfg.lengths  # a record's lengths read back as given
    assert all(16 <= len(p) <= 40 for p in vs_vllm_workload.code_prompts(20, cfg.lengths_of("pair")[0]))


def test_chat_prompts_keep_to_their_lengths_and_a_range_too_short_for_the_template_is_refused():
    try:
        path = vs_vllm_workload.resolve("smollm2-135m-instruct")
    except ValueError as e:
        pytest.skip(str(e))
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(path))
    prompts = vs_vllm_workload.copy_prompts(tok, 12, (40, 90), seed=6)
    assert len(prompts) == 12 and all(40 <= len(p) <= 90 for p in prompts)
    with pytest.raises(ValueError, match="no chat prompt of 5-10 tokens"):  # the template alone is longer
        vs_vllm_workload.copy_prompts(tok, 2, (5, 10))


def test_vllm_threads_default_to_minispecs_and_can_differ():
    parse = lambda *a: vs_vllm_cli.cli_config(build_parser().parse_args(["vs-vllm", "--engines", "minispec", *a]))[0]  # noqa: E731
    cfg = parse("--threads", "2")
    assert (cfg.threads, cfg.vllm.threads) == (2, 2)
    cfg = parse("--threads", "2", "--vllm-threads", "1")
    assert (cfg.threads, cfg.vllm.threads) == (2, 1)
    with pytest.raises(ValueError, match="vLLM threads must be an integer >= 1"):
        parse("--vllm-threads", "0")


def test_compile_flags_reach_each_engine(monkeypatch):
    """``--compile`` builds every minispec engine with ``compile=True``; ``--vllm-compile`` lifts vLLM's enforce_eager;
    neither is on by default."""
    parse = lambda *a: vs_vllm_cli.cli_config(build_parser().parse_args(["vs-vllm", "--engines", "minispec", *a]))[0]  # noqa: E731
    default, both = parse("--workloads", "pair"), parse("--workloads", "pair", "--compile", "--vllm-compile")
    assert (default.compile, default.vllm.eager) == (False, True) and (both.compile, both.vllm.eager) == (True, False)
    made = []
    monkeypatch.setattr(vs_vllm_workload, "Engine", lambda *a, **k: made.append(k["compile"]))
    for cfg in (default, both):
        vs_vllm_workload.minispec_engines(dict(name="pair", target_model=None, draft="d", draft_model=None), cfg, None)
    assert made == [False, False, True, True]  # plain and the draft model, by default and with --compile


def test_repeated_static_runs_give_medians_and_pair_each_run_with_its_own():
    """``static_repeat``: each static batch served several times an engine; the table divides the medians, and the
    counters are compared run by run (minispec's second run with vLLM's second)."""
    thr = {"minispec": (100, 130, 90), "vllm": (110, 100, 120)}
    rows = [row(e, "draft", 8, 0.01, thr[e][i], mode="static", repeat=i) for i in range(3) for e in thr]
    rows[3]["accepted_per_position"] = [8, 6, 4, 1]  # vLLM's second run (rows alternate minispec, vLLM)
    rows += [row(e, "plain", 8, 0.01, 100, mode="static", repeat=i) for i in range(3) for e in thr]
    cfg = VsConfig(workloads=("pair",), seeds=(0,), static_repeat=3)
    static = vs_vllm_report.static_table(rows).splitlines()[1].split()  # the draft's line
    assert static[3:6] == ["100", "110", "0.91x"]  # medians: 100 of 90-130, 110 of 100-120
    text = vs_vllm_report.text(rows, cfg)
    assert "medians of 3 runs an engine, alternated" in text and "in 2 of 3 speculative runs at a fixed K" in text
    with pytest.raises(ValueError, match="repeats must be >= 1"):
        VsConfig(static_repeat=0)


@pytest.mark.parametrize("field", ["rates", "slo", "kv_tokens", "lengths"])
def test_a_per_workload_setting_naming_no_workload_is_refused(field):
    value = {"rates": (1.0,), "slo": (1.0, 0.1), "kv_tokens": 4096, "lengths": ((10, 20), (10, 20))}[field]
    with pytest.raises(ValueError, match=rf"{field} names no workload: \['smolm2'\]"):
        VsConfig(**{field: {"smolm2": value}})
    read = {"rates": "rates_of", "slo": "slo_of", "kv_tokens": "kv_of", "lengths": "lengths_of"}[field]
    assert getattr(VsConfig(**{field: {"smollm2": value}}), read)("smollm2") == value  # a workload's key is read


def test_the_command_checks_its_flags_before_any_work(capsys, tmp_path):
    out = ["--out", str(tmp_path / "x")]
    for argv, message in [(["--engines", "minispec,sglang"], "engines minispec, vllm"),
                          (["--engines", "minispec", "--rates-pair", "0"], "need positive rates"),
                          (["--engines", "minispec", "--rates-pair", "1,x"], "--rates-pair takes some"),
                          (["--engines", "minispec", "--slo-pair", "1"], "--slo-pair takes 2"),
                          (["--engines", "minispec", "--k-table", str(tmp_path / "no.json")], "no such file"),
                          (["--engines", "minispec", "--k-table", __file__], "not vLLM's speculative-config keys"),
                          (["--engines", "minispec", "--workloads", "pair,gpt"], "workloads are smollm2, pair"),
                          (["--engines", "minispec", "--repeat", "0"], "repeats must be >= 1"),
                          (["--engines", "minispec", "--lengths-pair", "16,40,4"], "--lengths-pair takes 4"),
                          (["--engines", "minispec", "--lengths-pair", "16,40.5,4,8"], "whole token counts"),
                          (["--engines", "minispec", "--lengths-pair", "40,16,4,8"], "pair: prompt and output lengths"),
                          (["--engines", "minispec", "--lengths-pair", "16,400,4,200"], "within 512 tokens"),
                          (["--from-jsonl", str(tmp_path / "no.jsonl")], "no such file")]:
        assert main(["vs-vllm", *out, *argv]) == 2, argv
        assert message in capsys.readouterr().err
    if available() is not None:  # without vLLM the default (both engines) says how to get it
        assert main(["vs-vllm", "--quick", *out]) == 2
        assert "scripts/vllm_env.sh" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


@pytest.mark.slow
def test_the_vllm_side_serves_the_same_tokens_and_counts(one_thread):
    """vLLM's side: the same greedy tokens and acceptance counters as minispec's on a few requests."""
    if (why := available()) is not None:
        pytest.skip(why)
    from minispec.model.load import load
    from minispec.tools.vllm_side import VllmServer

    target, draft = (vs_vllm_workload.resolve(n) for n in ("tiny-code-target", "tiny-code-draft"))
    batch = [Job(p, 16, 0.01 * i) for i, p in enumerate(code_prompts(4, (20, 40)))]
    spec = {"method": "draft_model", "model": str(draft), "num_speculative_tokens": 3}
    with VllmServer(target, spec, settings=VllmSettings(1), kv_tokens=2048, max_num_seqs=8,
                    max_num_batched_tokens=512, max_model_len=512, tokenizer=False) as server:
        theirs, counts = server.serve(batch)
    mine, mine_counts = served_by_minispec(Engine(load(target)[0], load(draft)[0], gamma=3), batch, False)
    assert [s.tokens for s in theirs] == [s.tokens for s in mine]
    assert {k: counts[k] for k in ("num_drafts", "accepted_per_position")} == {
        k: mine_counts[k] for k in ("num_drafts", "accepted_per_position")}
    assert all(sum(k for _, k in s.events) == 16 for s in theirs)
