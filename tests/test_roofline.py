"""The roofline model reproduces every reference figure, and behaves as physics says."""

import math

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from minispec.cli import main
from minispec.hardware import H100_SXM, H200, HARDWARE, Hardware
from minispec.roofline import (
    LLAMA_1B,
    LLAMA_8B,
    ModelShape,
    best_gamma,
    break_even_batch,
    compute_bound_batch,
    expected_tokens,
    leviathan_speedup,
    max_batch,
    speculative_speedup,
    speedup_table,
    step_time,
)

alphas = st.floats(0, 1)
gammas = st.integers(0, 12)
costs = st.floats(0, 1)
batches = st.floats(1, 4096)


# The reference: 8B params in BF16 on an H100 SXM, alpha 0.8, gamma 4, c 0.05, weights only.

@pytest.mark.parametrize("batch", [1, 2, 4, 8, 16, 32])
def test_speedup_is_2_80_up_to_batch_32(batch):
    assert round(speculative_speedup(batch), 2) == 2.80


@pytest.mark.parametrize("batch, speedup", [(64, 2.62), (128, 1.42), (256, 0.74)])
def test_speedup_falls_at_large_batch(batch, speedup):
    assert round(speculative_speedup(batch, alpha=0.8, gamma=4, draft_cost=0.05), 2) == speedup


def test_expected_tokens_is_3_36():
    assert round(expected_tokens(0.8, 4), 2) == 3.36


def test_ridge_and_compute_bound_batch():
    assert round(H100_SXM.ridge) == 295  # 989e12 FLOP/s / 3.35e12 B/s
    assert round(compute_bound_batch(gamma=4)) == 59  # 295 / (gamma + 1)


def test_break_even_batch_is_187():
    B = break_even_batch(alpha=0.8, gamma=4, draft_cost=0.05)
    assert round(B) == 187
    assert speculative_speedup(B) == pytest.approx(1.0)


def test_low_acceptance_at_batch_1():
    assert round(speculative_speedup(1, alpha=0.3), 2) == 1.19
    assert round(speculative_speedup(1, alpha=0.3, draft_cost=0.25), 2) == 0.71


def test_h200_has_a_lower_ridge_so_speculation_stops_paying_sooner():
    ridge = 989e12 / 4.8e12  # FLOP/byte: same compute as the H100, more bandwidth
    assert H200.ridge == pytest.approx(ridge) and round(ridge) == 206 and ridge < H100_SXM.ridge
    # With 2 bytes per parameter the verify step (5 tokens/row) is compute-bound past ridge / 5 rows.
    assert compute_bound_batch(hardware=H200) == pytest.approx(ridge / 5) and round(ridge / 5) == 41
    # Break-even: E * t_plain = t_verify + gamma c t_plain, i.e. 5 B * 2P/F = (E - 4 * 0.05) * 2P bytes / BW.
    assert break_even_batch(hardware=H200) == pytest.approx((3.3616 - 0.2) * ridge / 5)  # 130.3
    assert round(break_even_batch(hardware=H200)) == 130 < round(break_even_batch())
    assert speculative_speedup(128, hardware=H200) < speculative_speedup(128)


def test_expected_tokens_at_the_ends():
    assert expected_tokens(1.0, 4) == 5  # every draft accepted, plus the target's own token
    assert expected_tokens(0.0, 4) == 1  # nothing accepted: the target's token only
    assert expected_tokens(0.8, 0) == 1


def test_gamma_0_is_plain_decoding():
    assert speculative_speedup(1, gamma=0) == 1.0 and speculative_speedup(1000, gamma=0, context=4096) == 1.0


def test_leviathan_is_the_memory_bound_limit():
    assert leviathan_speedup(0.8, 4, 0.05) == pytest.approx(speculative_speedup(1))
    assert leviathan_speedup(0.8, 4, 0.05) > speculative_speedup(128)


def test_step_time_is_the_reference_formula():
    assert step_time(1) == pytest.approx(16e9 / 3.35e12)  # weight read, 4.78 ms
    assert step_time(64, 5) == pytest.approx(2 * 8e9 * 320 / 989e12)  # compute, 5.18 ms
    assert step_time(1, context=1000) == pytest.approx((16e9 + 1000 * 131072) / 3.35e12)


def test_long_context_keeps_decode_memory_bound_so_speculation_pays_again():
    assert speculative_speedup(256, context=0) < 1
    assert speculative_speedup(256, context=32768) > 1 and speculative_speedup(256, context=4096) > 1
    # Llama-3-8B's KV read (131072 B/token) outgrows the verify FLOPs past ~2070 tokens of context:
    # 5 tokens * 2 * 8e9 / 989e12 s of compute per row = context * 131072 / 3.35e12 s of KV read.
    limit = 5 * 2 * 8e9 / 989e12 * 3.35e12 / 131072
    assert compute_bound_batch(context=math.floor(limit)) > 1e4
    assert compute_bound_batch(context=math.ceil(limit)) == math.inf
    assert break_even_batch(context=32768) == math.inf


def test_memory_the_draft_costs_rows_of_batch():
    # 8B target: 16e9 B of weights, 131072 B/token of KV; Llama-3.2-1B draft: 1.24e9 * 2 B of weights,
    # 16 layers * 8 KV heads * 64 head dim * 2 (K, V) * 2 B = 32768 B/token; 4096 tokens per row; 80e9 B.
    target_row = 4096 * 131072  # 536,870,912 B of KV per row
    alone = (80e9 - 16e9) // target_row  # 64e9 / 0.537e9 = 119.2 -> 119 rows
    with_draft = (80e9 - 16e9 - 2.48e9) // (4096 * (131072 + 32768))  # 61.52e9 / 0.671e9 = 91.7 -> 91 rows
    assert (alone, with_draft) == (119, 91)
    assert max_batch(H100_SXM, LLAMA_8B, context=4096) == alone
    assert max_batch(H100_SXM, LLAMA_8B, context=4096, draft=LLAMA_1B) == with_draft  # the draft costs 28 rows
    assert max_batch(H100_SXM, LLAMA_8B, 4096, reserve_fraction=0.1) == (72e9 - 16e9) // target_row  # 104
    assert max_batch(HARDWARE["l4"], LLAMA_8B, 4096) == 14  # (24e9 - 16e9) / 0.537e9 = 14.9
    assert max_batch(Hardware("tiny", 1e9, 1e12, 10e9), LLAMA_8B, 4096) == 0  # weights do not fit


def test_model_shapes():
    assert LLAMA_8B.weight_bytes == 16e9 and LLAMA_8B.kv_bytes_per_token == 131072
    assert LLAMA_1B.kv_bytes_per_token == 32768
    assert ModelShape.from_params(8e9, 2).weight_bytes == 16e9
    from minispec.model import Model, ModelConfig

    llama3_8b = dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                     num_attention_heads=32, num_key_value_heads=8, head_dim=128)
    shape = ModelShape.from_config(ModelConfig(**llama3_8b))
    assert shape.params == 8_030_261_248 and shape.kv_bytes_per_token == 131072  # Llama-3-8B
    hf = ModelShape.from_config({**llama3_8b, "architectures": ["LlamaForCausalLM"]}, bytes_per_param=4)
    assert hf.params == shape.params and hf.kv_bytes_per_token == 2 * 131072
    import torch

    tiny = ModelConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=4)
    model = Model(tiny).to(torch.bfloat16)
    got = ModelShape.from_model(model)
    assert got.params == sum(p.numel() for p in model.parameters()) and got.bytes_per_param == 2
    assert got.kv_bytes_per_token == 2 * 2 * 2 * 4 * 2  # K and V, 2 layers, 2 KV heads, head dim 4, 2 bytes


def test_speedup_table_rows():
    rows = speedup_table([1, 256])
    assert [round(r["speedup"], 2) for r in rows] == [2.80, 0.74]
    assert rows[0]["plain_ms"] == pytest.approx(4.776, abs=1e-3)
    assert rows[1]["tokens_per_step"] == pytest.approx(256 * 3.3616)


def test_bad_input_raises_value_error_naming_the_problem():
    with pytest.raises(ValueError, match="alpha"):
        expected_tokens(1.2, 4)
    with pytest.raises(ValueError, match="alpha"):
        speculative_speedup(1, alpha=-0.1)
    with pytest.raises(ValueError, match="gamma"):
        expected_tokens(0.5, -1)
    with pytest.raises(ValueError, match="gamma"):
        best_gamma(1, gamma_max=2.5)
    with pytest.raises(ValueError, match="batch"):
        speculative_speedup(0)
    with pytest.raises(ValueError, match="draft_cost"):
        speculative_speedup(1, draft_cost=-1)
    with pytest.raises(ValueError, match="context"):
        step_time(1, context=-5)
    with pytest.raises(ValueError, match="context"):
        max_batch(H100_SXM, LLAMA_8B, context=0)
    with pytest.raises(ValueError, match="memory_bandwidth"):
        Hardware("broken", 0, 1e12, 1e9)


def test_cli_prints_the_reference_table(tmp_path, capsys):
    assert main(["roofline", "--plot", str(tmp_path / "speedup.png")]) == 0
    out = capsys.readouterr().out
    assert "2.80x" in out and "2.62x" in out and "1.42x" in out and "0.74x" in out
    assert "batch 59.0" in out and "batch 186.7" in out
    assert (tmp_path / "speedup.png").stat().st_size > 0
    assert main(["roofline", "--hardware", "h200", "--batches", "1,128"]) == 0
    assert "batch 41.2" in capsys.readouterr().out


@given(alphas, alphas, gammas)
def test_expected_tokens_increases_with_alpha(a1, a2, gamma):
    lo, hi = sorted((a1, a2))
    assert 1 <= expected_tokens(lo, gamma) <= expected_tokens(hi, gamma) + 1e-12 <= gamma + 1 + 1e-9


@given(alphas, gammas)
def test_expected_tokens_increases_with_gamma(alpha, gamma):
    assert expected_tokens(alpha, gamma) <= expected_tokens(alpha, gamma + 1) + 1e-12


@given(batches, batches, alphas, st.integers(1, 8), costs, st.sampled_from([0, 1024, 32768]))
def test_speedup_never_grows_with_batch(b1, b2, alpha, gamma, c, context):
    lo, hi = sorted((b1, b2))
    s = [speculative_speedup(b, alpha, gamma, c, context=context) for b in (lo, hi)]
    assert s[1] <= s[0] * (1 + 1e-12)
    if compute_bound_batch(gamma) < lo < hi < H100_SXM.ridge and context == 0:  # verify compute-bound, plain not
        assert s[1] < s[0]


@given(batches, alphas, costs, st.integers(0, 8))
def test_best_gamma_pays_or_is_off(batch, alpha, c, gamma_max):
    g = best_gamma(batch, alpha, gamma_max, c)
    s = speculative_speedup(batch, alpha, g, c)
    assert (g == 0 and s == 1.0) or s > 1
    assert all(speculative_speedup(batch, alpha, other, c) <= s for other in range(gamma_max + 1))


@given(alphas, costs)
def test_at_batch_1_speculation_pays_exactly_when_alpha_beats_c(alpha, c):
    # Memory-bound: speedup(gamma) = E / (1 + gamma c) and E - 1 <= gamma alpha, so gamma = 1 is the test.
    assume(abs(alpha - c) > 1e-9)
    assert (best_gamma(1, alpha, 8, c) > 0) == (alpha > c)


@given(alphas, st.integers(1, 8), costs, st.sampled_from([0, 1024]))
def test_break_even_is_where_speedup_crosses_one(alpha, gamma, c, context):
    B = break_even_batch(alpha, gamma, c, context=context)
    if 1 <= B < math.inf:
        assert speculative_speedup(B, alpha, gamma, c, context=context) == pytest.approx(1.0)
        assert speculative_speedup(B * 1.01, alpha, gamma, c, context=context) < 1
