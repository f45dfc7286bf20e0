"""The benchmark's rows, calibration and helpers (tiny random models, so it is quick)."""

import json

import pytest
import torch

from minispec import bench
from minispec.bench import BenchConfig, break_even, format_table, random_model, sweep

REQUIRED = {"batch_size", "gamma", "temperature", "speedup", "modelled_speedup", "synthetic", "hardware", "dtype",
            "torch", "cuda", "git_revision", "seed", "acceptance_rate", "mean_acceptance_length",
            "per_position_acceptance_rates", "output_throughput", "median_tpot_ms", "p99_tpot_ms",
            "verify_to_decode_step_ratio", "draft_cost_c"}


@pytest.fixture(scope="module")
def tiny_pair():
    return random_model("tiny"), random_model("tiny-draft", seed=1)


def test_jsonl_rows_load_and_carry_the_keys(tiny_pair, tmp_path):
    out = tmp_path / "rows.jsonl"
    cfg = BenchConfig(batches=(1, 2), gammas=(2,), max_new_tokens=6, prompt_len=8, repeats=1, warmup=0,
                      accept_rate=0.5)
    rows = sweep(*tiny_pair, cfg, out=out, progress=False)
    loaded = [json.loads(line) for line in out.read_text().splitlines()]
    assert loaded == json.loads(json.dumps(rows)) and len(loaded) == 2
    for row in loaded:
        assert REQUIRED <= set(row), REQUIRED - set(row)
        assert row["synthetic"] is True and row["speedup"] > 0 and row["modelled_speedup"] > 0
    assert "batch" in format_table(rows).splitlines()[0]


def test_pandas_reads_the_rows_when_installed(tiny_pair, tmp_path):
    pd = pytest.importorskip("pandas")
    out = tmp_path / "rows.jsonl"
    sweep(*tiny_pair, BenchConfig(batches=(1,), gammas=(1,), max_new_tokens=4, prompt_len=4, repeats=1, warmup=0),
          out=out, progress=False)
    assert list(pd.read_json(out, lines=True)["batch_size"]) == [1]


def test_synthetic_acceptance_follows_the_rate(tiny_pair):
    target, draft = tiny_pair
    from minispec.speculative import speculative_generate

    out = speculative_generate(target, draft, [[1, 2, 3]] * 256, gamma=4, max_new_tokens=40, accept_rate=0.7, seed=0)
    assert out.stats.synthetic and abs(out.stats.alpha_estimate - 0.7) < 0.03


def test_break_even_interpolates_the_crossing():
    rows = [{"batch_size": b, "speedup": s} for b, s in [(1, 1.5), (2, 1.2), (4, 0.8), (8, 0.5)]]
    assert break_even(rows) == pytest.approx(2 ** 1.5)  # 1.2 -> 0.8 crosses 1.0 halfway in log2 batch
    assert break_even(rows[:2]) is None


def test_calibration_measures_positive_ceilings():
    from minispec.hardware import measure_bandwidth, measure_flops

    bw, flops = measure_bandwidth("cpu", 16 << 20), measure_flops("cpu", n=256)
    assert bw > 1e8 and flops > 1e8


def test_step_time_grows_with_tokens(tiny_pair):
    target, _ = tiny_pair
    assert bench.step_time(target, 4, 64, context=16, repeats=3) > bench.step_time(target, 1, 1, context=16, repeats=3)


def test_measured_policy_from_step_times(tiny_pair):
    policy = bench.measured_policy(*tiny_pair, batches=(1, 4), gamma_max=2, context=8)
    assert policy.choose(1) in (0, 1, 2) and policy.choose(4) in (0, 1, 2)


def test_unknown_shape_is_named():
    with pytest.raises(ValueError, match="unknown shape 'llama-70b'"):
        random_model("llama-70b")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_device_hardware_preset_on_gpu():
    from minispec.hardware import device_hardware

    assert device_hardware("cuda").name


def test_compiled_models_decode_the_same_greedy_tokens():
    """--compile (static caches, fixed shapes) changes the speed, never the tokens."""
    from conftest import random_model as tiny
    from minispec import generate, speculative_generate
    from minispec.bench import compile_model

    target, draft = tiny(seed=0), tiny(seed=1, layers=1, hidden=32, heads=2, kv_heads=1)
    prompts = [[1, 2, 3, 4], [5, 6, 7, 8]]  # one prompt length: every call below has a shape seen before
    plain = generate(target, prompts, max_new_tokens=8).tokens
    spec = speculative_generate(target, draft, prompts, gamma=2, max_new_tokens=8).tokens
    compile_model(target), compile_model(draft)
    assert speculative_generate(target, draft, prompts, gamma=2, max_new_tokens=8).tokens == spec
    assert generate(target, prompts, max_new_tokens=8).tokens == plain
