"""The benchmark's rows, calibration and helpers (tiny random models, so it is quick)."""

import dataclasses
import json

import pytest
import torch

import minispec.tools.steps
from minispec.model.random import random_model
from minispec.roofline.hardware import H100_SXM
from minispec.roofline.policy import MeasuredPolicy
from minispec.tools import bench
from minispec.tools.bench import BenchConfig, break_even, format_table, sweep
from minispec.tools.steps import measure_step_time, step_time_table

pytestmark = pytest.mark.usefixtures("one_thread")

REQUIRED = {"batch_size", "gamma", "temperature", "speedup", "modelled_speedup", "synthetic", "hardware", "dtype",
            "torch", "cuda", "git_revision", "seed", "acceptance_rate", "mean_acceptance_length",
            "per_position_acceptance_rates", "output_throughput", "median_tpot_ms", "p99_tpot_ms",
            "verify_to_decode_step_ratio", "draft_cost_c", "greedy_mismatch"}


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
    from minispec.speculative.loop import speculative_generate

    out = speculative_generate(target, draft, [[1, 2, 3]] * 256, gamma=4, max_new_tokens=40,
                               rule=bench.SyntheticAcceptance(0.7), seed=0)
    assert out.stats.synthetic and abs(out.stats.alpha_estimate - 0.7) < 0.03
    exact = speculative_generate(target, draft, [[1, 2, 3]] * 4, gamma=4, max_new_tokens=8, seed=0)
    assert not exact.stats.synthetic
    with pytest.raises(ValueError, match="synthetic acceptance rate"):
        bench.SyntheticAcceptance(1.5)


def test_break_even_interpolates_the_crossing():
    rows = [{"batch_size": b, "speedup": s} for b, s in [(1, 1.5), (2, 1.2), (4, 0.8), (8, 0.5)]]
    assert break_even(rows) == pytest.approx(2 ** 1.5)  # 1.2 -> 0.8 crosses 1.0 halfway in log2 batch
    assert break_even(rows[:2]) is None


def test_measured_step_times_feed_the_policy(tiny_pair, monkeypatch):
    """The table holds one measured target step per (batch, tokens per row) and one draft step per
    batch, and the policy it builds picks the gamma those times predict fastest."""
    calls = []
    real = measure_step_time

    def spy(model, batch, tokens_per_row=1, context=64, repeats=5):
        calls.append((model is tiny_pair[0], batch, tokens_per_row, context))
        return real(model, batch, tokens_per_row, context, repeats=1)

    monkeypatch.setattr(minispec.tools.steps, "measure_step_time", spy)
    target_s, draft_s = step_time_table(*tiny_pair, batches=(1, 4), gamma_max=2, context=8)
    assert set(target_s) == {(1, 1), (1, 2), (1, 3), (4, 1), (4, 2), (4, 3)} and set(draft_s) == {1, 4}
    assert sorted(c for c in calls if c[0]) == [(True, b, t, 8) for b in (1, 4) for t in (1, 2, 3)]
    assert all(s > 0 for s in [*target_s.values(), *draft_s.values()])
    # Fed times of our choosing, the policy must pick what they predict: verification as cheap as a
    # decode step and a free draft make the longest draft best; verification 10x a step makes it off.
    free = MeasuredPolicy({(1, t): 1.0 for t in (1, 2, 3)}, {1: 0.0}, gamma_max=2, alpha0=0.8)
    costly = MeasuredPolicy({(1, 1): 1.0, (1, 2): 10.0, (1, 3): 10.0}, {1: 0.0}, gamma_max=2, alpha0=0.8)
    assert free.choose(1) == 2 and costly.choose(1) == 0


def test_unknown_shape_is_named():
    with pytest.raises(ValueError, match="unknown shape 'llama-70b'"):
        random_model("llama-70b")


@pytest.mark.slow
def test_compiled_models_decode_the_same_greedy_tokens():
    """Model.compile (static caches, fixed shapes) changes the speed, never the tokens."""
    from support import random_model as tiny

    from minispec import generate, speculative_generate

    target, draft = tiny(seed=0), tiny(seed=1, layers=1, hidden=32, heads=2, kv_heads=1)
    prompts = [[1, 2, 3, 4], [5, 6, 7, 8]]  # one prompt length: every call below has a shape seen before
    plain = generate(target, prompts, max_new_tokens=8).tokens
    spec = speculative_generate(target, draft, prompts, gamma=2, max_new_tokens=8).tokens
    target.compile(), draft.compile()
    assert target.new_cache(1, 4).static and not target.new_cache(1, 4, static=False).static
    assert speculative_generate(target, draft, prompts, gamma=2, max_new_tokens=8).tokens == spec
    assert generate(target, prompts, max_new_tokens=8).tokens == plain


def test_prompts_come_from_real_text_when_there_is_some():
    text = list(range(100, 400))
    prompts = bench.prompts_for(3, 10, 500, text)
    assert [len(p) for p in prompts] == [10, 10, 10] and all(p == text[p[0] - 100:][:10] for p in prompts)
    assert len({tuple(p) for p in prompts}) == 3
    with pytest.raises(ValueError, match="need more than --prompt-len 10"):
        bench.prompts_for(1, 10, 500, text[:10])


@pytest.mark.parametrize("draft", [None, "ngram", "tiny-code-draft"])
def test_transformers_baseline_gives_the_same_tokens(draft, capfd):
    """transformers' generate (plain, prompt lookup, assisted) and minispec agree token for token on the
    embedded pair, and transformers prints no deprecation warning about the way it is called (its
    logger writes to stderr and does not propagate, hence capfd)."""
    from minispec.model.load import resolve, sample_text
    from minispec.tools.baselines import transformers_baseline

    res = transformers_baseline(resolve("tiny-code-target"), list(sample_text("code")[:48]), 12,
                                resolve(draft) if draft == "tiny-code-draft" else draft, gamma=3, repeats=1)
    assert res["identical_greedy_tokens"] and res["new_tokens"] == 12 and res["minispec_over_hf"] > 0
    assert "deprecated" not in capfd.readouterr().err


def test_step_time_table_keeps_the_fastest_and_never_rewards_more_work(monkeypatch):
    """Over rounds, each step keeps its fastest time, and no step is faster than one doing more work."""
    noisy = iter([1.0, 5.0, 9.0, 2.0,  # round 1, target: (1, 1), (1, 2), (2, 1), (2, 2); then draft 1, 2
                  0.5, 0.4,
                  3.0, 4.0, 8.0, 1.5,  # round 2
                  0.6, 0.3])
    monkeypatch.setattr(minispec.tools.steps, "measure_step_time", lambda *a, **k: next(noisy))
    target_s, draft_s = step_time_table(None, None, (1, 2), gamma_max=1, rounds=2)
    assert target_s == {(1, 1): 1.0, (1, 2): 1.5, (2, 1): 1.5, (2, 2): 1.5}
    assert draft_s == {1: 0.3, 2: 0.3}


def _flip_a_token(monkeypatch, row: int, index: int) -> list:
    """bench's speculative runs return token ``index`` of ``row`` changed, as a run that rounds differently
    would; the list collects what they returned."""
    real, returned = bench.speculative_generate, []

    def flipped(*args, **kwargs):
        res = real(*args, **kwargs)
        tokens = [list(t) for t in res.tokens]
        tokens[row][index] = (tokens[row][index] + 1) % 256
        returned.append(tokens)
        return dataclasses.replace(res, tokens=tokens)

    monkeypatch.setattr(bench, "speculative_generate", flipped)
    return returned


GREEDY = BenchConfig(batches=(2,), gammas=(2,), max_new_tokens=6, prompt_len=8, repeats=1, warmup=0)
PROMPTS = [[1, 2, 3, 4, 5, 6, 7, 8], [9, 10, 11, 12, 13, 14, 15, 16]]


def test_a_greedy_mismatch_raises_in_float32_on_the_cpu(tiny_pair, monkeypatch):
    """float32 on a CPU: greedy speculative tokens must equal plain ones, so a difference is an error that
    says where it is."""
    assert bench.bench_point(*tiny_pair, PROMPTS, 2, 0.0, GREEDY, H100_SXM)["greedy_mismatch"] is None
    _flip_a_token(monkeypatch, 1, 3)
    with pytest.raises(RuntimeError, match=r"float32, CPU.*'row': 1, 'index': 3"):
        bench.bench_point(*tiny_pair, PROMPTS, 2, 0.0, GREEDY, H100_SXM)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_greedy_mismatch_in_reduced_precision_is_reported(dtype, monkeypatch):
    """In bfloat16 or float16 the row says where the tokens first differ and by how much the target's
    logits separate the two there, instead of raising. The reduced-precision condition is real here: the
    models are bfloat16/float16 on this CPU, where a 1-token and a (gamma+1)-token forward round
    differently too (on this machine some rows of this batch differ by a tie or one unit in the last place)."""
    target, draft = random_model("tiny", dtype=dtype), random_model("tiny-draft", dtype=dtype, seed=1)
    prompts = torch.randint(0, 256, (16, 8), generator=torch.Generator().manual_seed(0)).tolist()
    cfg = BenchConfig(batches=(16,), gammas=(4,), max_new_tokens=16, prompt_len=8, repeats=1, warmup=0)
    plain = bench.generate(target, prompts, max_new_tokens=16).tokens
    spec = bench.speculative_generate(target, draft, prompts, gamma=4, max_new_tokens=16).tokens
    found = bench.bench_point(target, draft, prompts, 4, 0.0, cfg, H100_SXM)["greedy_mismatch"]
    differ = [b for b in range(16) if plain[b] != spec[b]]
    if not differ:
        assert found is None
    else:  # rounding: the two tokens' logits are within a few units in the last place
        b = differ[0]
        i = next(j for j in range(16) if plain[b][j] != spec[b][j])
        assert (found["rows"], found["row"], found["index"]) == (len(differ), b, i)
        assert abs(found["logit_gap"]) <= 4 * found["logit_spacing"], found
    # A difference put in by hand is reported at its place, with the gap of the target's own logits there.
    returned = _flip_a_token(monkeypatch, 0, 2)
    found = bench.bench_point(target, draft, prompts, 4, 0.0, cfg, H100_SXM)["greedy_mismatch"]
    b = next(b for b in range(16) if plain[b] != returned[-1][b])
    i = next(j for j in range(16) if plain[b][j] != returned[-1][b][j])
    with torch.inference_mode():
        logits = target(torch.tensor([prompts[b] + plain[b][:i]]))[0, -1].float()  # (V,)
    x, y = plain[b][i], returned[-1][b][i]
    assert found == {"rows": found["rows"], "row": b, "index": i, "plain_token": x, "speculative_token": y,
                     "logit_gap": (logits[x] - logits[y]).item(), "logit_spacing": found["logit_spacing"]}
    assert (b, i) <= (0, 2) and found["logit_spacing"] > 0


def test_bad_bench_settings_are_named_before_any_work():
    for kw, message in [(dict(batches=()), "batches"), (dict(gammas=(0,)), "gammas"), (dict(repeats=0), "repeats"),
                        (dict(warmup=-1), "warmup"), (dict(accept_rate=1.5), "synthetic acceptance rate"),
                        (dict(temperatures=(-1.0,)), "temperatures")]:
        with pytest.raises(ValueError, match=message):
            BenchConfig(**kw)
