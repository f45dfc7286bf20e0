"""The roofline model reproduces every reference figure, and behaves as physics says."""

import dataclasses
import json
import math

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from minispec.cli import main
from minispec.roofline import (
    LLAMA_1B,
    LLAMA_8B,
    LLAMA_70B,
    MIXTRAL_8X7B,
    ModelShape,
    MoE,
    best_gamma,
    break_even_batch,
    compute_bound_batch,
    expected_tokens,
    leviathan_speedup,
    max_batch,
    modelled_draft_cost,
    quantized,
    speculative_speedup,
    speculative_step_time,
    speedup_table,
    step_time,
    vllm_config_from_speedup,
    vllm_speculative_config,
)
from minispec.roofline.hardware import H100_SXM, H200, HARDWARE, Hardware

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
    assert step_time(1, context=1000) == pytest.approx((16e9 + 1000 * 131072) / 3.35e12)  # both reads memory-bound


def test_per_operator_step_time_by_hand():
    """8B target, H100 SXM, batch 256, context 4096, 5 tokens per row (a gamma = 4 verify step).

    Weight matmuls, N = 256 x 5 = 1280 tokens:
        memory  16e9 B / 3.35e12 B/s                          =  4.776 ms
        compute 2 x 8e9 x 1280 FLOP / 989e12 FLOP/s           = 20.708 ms   -> 20.708 ms (compute-bound)
    Attention:
        memory  256 x 4096 x 131,072 B = 137.44e9 B / 3.35e12  = 41.027 ms
        compute 4 x 32 x 32 x 128 x 4096 x 1280 = 2.749e12 FLOP / 989e12 = 2.779 ms   -> 41.027 ms (memory-bound)
    Step: 20.708 + 41.027 = 61.734 ms. One max over the summed bytes and FLOPs would say
    max(4.776 + 41.027, 20.708 + 2.779) = 45.803 ms: the KV read would hide the matmuls.

    Plain step (1 token per row): max(4.776, 4.142) + max(41.027, 0.556) = 45.803 ms, so with
    alpha 0.8, gamma 4, c 0.05: 3.3616 x 45.803 / (61.734 + 4 x 0.05 x 45.803) = 2.17x (not 2.80x).
    """
    matmuls = max(16e9 / 3.35e12, 2 * 8e9 * 1280 / 989e12)
    attention = max(256 * 4096 * 131072 / 3.35e12, 4 * 32 * 32 * 128 * 4096 * 1280 / 989e12)
    assert (round(1e3 * matmuls, 3), round(1e3 * attention, 3)) == (20.708, 41.027)
    assert step_time(256, 5, H100_SXM, LLAMA_8B, context=4096) == pytest.approx(matmuls + attention)
    assert round(1e3 * step_time(256, 5, context=4096), 3) == 61.734
    assert round(1e3 * step_time(256, 1, context=4096), 3) == 45.803
    assert round(speculative_speedup(256, 0.8, 4, 0.05, context=4096), 2) == 2.17


def test_kv_bytes_use_the_caches_dtype():
    fp8_cache = dataclasses.replace(LLAMA_8B, bytes_per_kv=1)
    assert fp8_cache.kv_bytes_per_token == 65536 and fp8_cache.weight_bytes == LLAMA_8B.weight_bytes
    assert step_time(1, context=4096, model=fp8_cache) == pytest.approx((16e9 + 4096 * 65536) / 3.35e12)


def test_long_context_keeps_decode_memory_bound_so_speculation_pays_again():
    assert speculative_speedup(256, context=0) < 1 < speculative_speedup(256, context=4096)
    assert speculative_speedup(256, context=4096) < speculative_speedup(256, context=32768)
    # The matmuls of verification turn compute-bound at batch 59 whatever the context (a kernel of their own) ...
    assert compute_bound_batch(context=32768) == compute_bound_batch() == pytest.approx(59.04, abs=0.01)
    # ... but the KV read, paid by plain and speculative steps alike, dilutes their cost: at 32k the
    # speedup tends to 3.3616 x (k + r) / (5k + r + 0.2 (k + r)) = 2.69x with k = 2 x 8e9 / 989e12 s per
    # token and r = 32768 x 131072 / 3.35e12 s of KV read per row, so it never falls below 1.
    k, r = 2 * 8e9 / 989e12, 32768 * 131072 / 3.35e12
    assert speculative_speedup(1e6, context=32768) == pytest.approx(3.3616 * (k + r) / (5 * k + r + 0.2 * (k + r)))
    assert break_even_batch(context=32768) == math.inf


def test_a_draft_shape_prices_c_from_its_own_weights_and_kv():
    # Context 0 (or a draft with no KV) at small batch: both steps read their weights, c = 2.48e9 / 16e9 B.
    assert modelled_draft_cost(1, LLAMA_1B) == pytest.approx(1.24e9 / 8e9) == 0.155
    no_kv = dataclasses.replace(LLAMA_1B, bytes_per_kv=0)
    assert modelled_draft_cost(8, no_kv, context=4096) < modelled_draft_cost(8, no_kv)  # only the target pays KV
    # With its full KV cache c grows with context (toward 32768 / 131072 = 0.25, the KV bytes' ratio) ...
    full = [modelled_draft_cost(8, LLAMA_1B, context=n) for n in (0, 512, 1024, 4096, 32768)]
    assert full == sorted(full) and full[0] < full[-1] < 0.25
    # ... with a 512-token window the draft's step stops growing past 512 and c falls as the target's grows.
    step = [speculative_step_time(8, 1, context=n, draft=LLAMA_1B, draft_kv_window=512)
            - step_time(8, 2, context=n) for n in (512, 1024, 4096)]  # one draft step, the verify removed
    assert step == pytest.approx([step[0]] * 3)
    windowed = [modelled_draft_cost(8, LLAMA_1B, context=n, draft_kv_window=512) for n in (512, 1024, 4096)]
    assert windowed == sorted(windowed, reverse=True) and windowed[0] == full[1]
    # The reference form is the same formula with c fixed.
    c = modelled_draft_cost(64, LLAMA_1B, context=4096)
    assert speculative_speedup(64, draft=LLAMA_1B, context=4096) == pytest.approx(
        speculative_speedup(64, draft_cost=c, context=4096))


def test_magicdec_a_bounded_kv_draft_gains_with_batch_at_long_context():
    full = {B: speculative_speedup(B, context=4096, draft=LLAMA_1B) for B in (1, 64)}
    windowed = {B: speculative_speedup(B, context=4096, draft=LLAMA_1B, draft_kv_window=512) for B in (1, 64)}
    assert windowed[64] > windowed[1] and full[64] < full[1]
    assert [round(full[1], 2), round(full[64], 2)] == [2.06, 1.76]
    assert [round(windowed[1], 2), round(windowed[64], 2)] == [2.10, 2.57]
    assert max_batch(H100_SXM, LLAMA_8B, 4096, LLAMA_1B) >= 64  # both fit: 79 and 96 rows
    # The best draft even lengthens with batch: gamma 5 at batch 1, 6 at batch 32.
    assert best_gamma(1, context=4096, draft=LLAMA_1B, draft_kv_window=512) == 5
    assert best_gamma(32, context=4096, draft=LLAMA_1B, draft_kv_window=512) == 6
    assert break_even_batch(context=4096, draft=LLAMA_1B, draft_kv_window=512) == math.inf


def test_w4a16_turns_compute_bound_at_a_quarter_of_the_batch():
    w4 = quantized(LLAMA_8B, 4)
    assert w4.bytes_per_param == 0.5 and w4.kv_bytes_per_token == LLAMA_8B.kv_bytes_per_token
    assert compute_bound_batch(model=w4) == pytest.approx(compute_bound_batch() / 4)  # 295 / 4 / 5 = 14.8
    assert round(compute_bound_batch(model=w4), 1) == 14.8
    assert round(break_even_batch(model=w4), 1) == round(break_even_batch() / 4, 1) == 46.7
    assert round(speculative_speedup(1, model=w4), 2) == 2.80 and speculative_speedup(64, model=w4) < 1


def test_moe_verification_reads_more_experts_so_the_speedup_rises_then_falls():
    moe = MIXTRAL_8X7B.moe
    shared = 1_342_177_280 + 262_144_000 + 1_048_576 + 266_240
    assert MIXTRAL_8X7B.params == shared + 8 * moe.expert_params and round(MIXTRAL_8X7B.params / 1e9, 1) == 46.7
    assert MIXTRAL_8X7B.active_params == shared + 2 * moe.expert_params and round(shared / 1e9, 2) == 1.61
    assert moe.experts_touched(1) == 2 and moe.experts_touched(5) == pytest.approx(8 * (1 - 0.75**5))  # 6.10
    # Batch 1: verifying 5 tokens reads (1.61 + 6.10 x 5.64) / (1.61 + 2 x 5.64) = 2.80x the bytes of one.
    assert step_time(1, 5, model=MIXTRAL_8X7B) / step_time(1, 1, model=MIXTRAL_8X7B) == pytest.approx(2.795, abs=1e-3)
    s = {B: speculative_speedup(B, 0.8, 4, 0.05, model=MIXTRAL_8X7B) for B in (1, 16, 1024)}
    assert s[1] < s[16] and s[1024] < s[16]
    assert (round(s[1], 2), round(s[16], 2)) == (1.12, 2.78)
    assert MIXTRAL_8X7B.weight_bytes > 0.9 * H100_SXM.memory_bytes  # 93.4 GB: it needs an H200 (or FP8)
    assert max_batch(H100_SXM, MIXTRAL_8X7B, 4096) == 0 < max_batch(H200, MIXTRAL_8X7B, 4096)


def test_memory_the_draft_costs_rows_of_batch():
    # 8B target: 16e9 B of weights, 131072 B/token of KV; Llama-3.2-1B draft: 1.24e9 * 2 B of weights,
    # 16 layers * 8 KV heads * 64 head dim * 2 (K, V) * 2 B = 32768 B/token; 4096 tokens per row; 80e9 B.
    target_row = 4096 * 131072  # 536,870,912 B of KV per row
    alone = (80e9 - 16e9) // target_row  # 64e9 / 0.537e9 = 119.2 -> 119 rows
    with_draft = (80e9 - 16e9 - 2.48e9) // (4096 * (131072 + 32768))  # 61.52e9 / 0.671e9 = 91.7 -> 91 rows
    assert (alone, with_draft) == (119, 91)
    assert max_batch(H100_SXM, LLAMA_8B, context=4096, usable_fraction=1.0) == alone
    assert max_batch(H100_SXM, LLAMA_8B, context=4096, draft=LLAMA_1B, usable_fraction=1.0) == with_draft
    # By default 90 % of the memory is for weights and KV (vLLM's gpu_memory_utilization): 72e9 B.
    assert max_batch(H100_SXM, LLAMA_8B, 4096) == (72e9 - 16e9) // target_row == 104
    assert max_batch(H100_SXM, LLAMA_8B, 4096, LLAMA_1B) == (72e9 - 16e9 - 2.48e9) // (4096 * 163840) == 79
    # A windowed draft keeps only 512 tokens of KV per row: 53.52e9 / (536.9e6 + 16.8e6) = 96.7 -> 96 rows.
    assert max_batch(H100_SXM, LLAMA_8B, 4096, LLAMA_1B, draft_kv_window=512) == 96
    # At 32k context an 8B target alone fits (72e9 - 16e9) / (32768 x 131072) = 13.04 -> 13 rows (14 at 100 %).
    assert max_batch(H100_SXM, LLAMA_8B, 32768) == 13 and max_batch(H100_SXM, LLAMA_8B, 32768, usable_fraction=1) == 14
    assert max_batch(HARDWARE["l4"], LLAMA_8B, 4096, usable_fraction=1.0) == 14  # (24e9 - 16e9) / 0.537e9 = 14.9
    assert max_batch(Hardware("tiny", 1e9, 1e12, 10e9), LLAMA_8B, 4096) == 0  # weights do not fit
    assert max_batch(H100_SXM, LLAMA_8B, 0) == math.inf  # no KV at context 0: only the weights must fit


def test_speedup_table_marks_rows_that_do_not_fit():
    rows = speedup_table([1, 13, 14, 256], context=32768)
    assert [r["fits"] for r in rows] == [True, True, False, False]
    assert all(r["draft_cost"] == 0.05 for r in rows)
    drafted = speedup_table([1, 64], context=4096, draft=LLAMA_1B, draft_kv_window=512)
    assert drafted[0]["draft_cost"] > drafted[1]["draft_cost"] and all(r["fits"] for r in drafted)


def test_plots_stop_where_memory_ends():
    from minispec.course.plots import plot_speedup_vs_batch

    grid = [2 ** (i / 4) for i in range(4 * 8 + 1)]  # batch 1 .. 256
    contexts = {"4k": 4096, "32k": 32768}
    curves = {k: [(B, speculative_speedup(B, context=n)) for B in grid] for k, n in contexts.items()}
    limits = {k: max_batch(H100_SXM, LLAMA_8B, n) for k, n in contexts.items()}  # 104 and 13 rows
    fig = plot_speedup_vs_batch(curves, max_batch=limits)
    ends = {line.get_label(): max(line.get_xdata()) for line in fig.axes[0].lines if line.get_label() in curves}
    assert ends == {k: max(B for B in grid if B <= limits[k]) for k in curves}
    assert ends["32k"] < 13 < ends["4k"] < 104


def test_model_shapes():
    assert LLAMA_8B.weight_bytes == 16e9 and LLAMA_8B.kv_bytes_per_token == 131072
    assert LLAMA_1B.kv_bytes_per_token == 32768 and LLAMA_70B.kv_bytes_per_token == 327680
    assert LLAMA_8B.attention_flops_per_token == 4 * 32 * 32 * 128
    assert ModelShape.from_params(8e9, 2).weight_bytes == 16e9
    from minispec.model.config import ModelConfig
    from minispec.model.llama import Model

    llama3_8b = dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                     num_attention_heads=32, num_key_value_heads=8, head_dim=128)
    shape = ModelShape.from_config(ModelConfig(**llama3_8b))
    assert shape.params == 8_030_261_248 and shape.kv_bytes_per_token == 131072
    assert (shape.layers, shape.heads, shape.kv_heads, shape.head_dim) == (32, 32, 8, 128)
    hf = ModelShape.from_config({**llama3_8b, "architectures": ["LlamaForCausalLM"]}, bytes_per_param=4)
    assert hf.params == shape.params and hf.kv_bytes_per_token == 2 * 131072  # KV in the weights' dtype
    assert ModelShape.from_config(ModelConfig(**llama3_8b), 0.5, bytes_per_kv=1).kv_bytes_per_token == 65536
    llama3_70b = dict(vocab_size=128256, hidden_size=8192, intermediate_size=28672, num_hidden_layers=80,
                      num_attention_heads=64, num_key_value_heads=8, head_dim=128)
    assert LLAMA_70B.params == ModelConfig(**llama3_70b).num_parameters
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


REFERENCE_VLLM = {"num_speculative_tokens": 8, "num_speculative_tokens_per_batch_size": [
    [1, 32, 8], [33, 37, 7], [38, 43, 6], [44, 52, 5], [53, 65, 4], [66, 87, 3], [88, 130, 2], [131, 258, 1],
    [259, 259, 0]]}


def test_vllm_table_for_the_reference_setting():
    config = vllm_speculative_config(alpha=0.8, gamma_max=8, draft_cost=0.05, hardware=H100_SXM, model=LLAMA_8B)
    assert json.loads(json.dumps(config)) == config == REFERENCE_VLLM
    ranges = config["num_speculative_tokens_per_batch_size"]
    assert ranges[0][0] == 1 and all(a[1] + 1 == b[0] for a, b in zip(ranges, ranges[1:]))  # contiguous
    assert all(a[2] != b[2] for a, b in zip(ranges, ranges[1:]))  # no range repeats its neighbour's K
    assert config["num_speculative_tokens"] == max(K for *_, K in ranges)
    for start, end, K in ranges:
        assert all(best_gamma(B, 0.8, 8, 0.05) == K for B in range(start, end + 1))
    # It ends where every gamma's break-even is behind it (gamma 1, batch 258.6), and K = 0 holds beyond.
    assert ranges[-1][0] == math.floor(break_even_batch(0.8, 1, 0.05)) + 1
    assert best_gamma(10_000) == 0


def test_vllm_table_clipped_to_memory_and_from_any_speedup():
    config = vllm_speculative_config(context=4096, draft=LLAMA_1B)
    ranges = config["num_speculative_tokens_per_batch_size"]
    assert ranges[-1][1] == max_batch(H100_SXM, LLAMA_8B, 4096, LLAMA_1B) == 79
    assert config == {"num_speculative_tokens": 5,
                      "num_speculative_tokens_per_batch_size": [[1, 1, 5], [2, 61, 4], [62, 79, 3]]}
    # Any speedup(batch, gamma): here a made-up one where gamma 2 pays up to batch 10 and nothing after.
    made_up = vllm_config_from_speedup(lambda B, g: (1.5 if B <= 10 else 0.9) - abs(g - 2) / 10, 20, 4)
    assert made_up == {"num_speculative_tokens": 2, "num_speculative_tokens_per_batch_size": [[1, 10, 2], [11, 20, 0]]}
    with pytest.raises(ValueError, match="no gamma .* pays"):
        vllm_config_from_speedup(lambda B, g: 0.5, 8, 4)
    with pytest.raises(ValueError, match="weights do not fit"):
        vllm_speculative_config(model=MIXTRAL_8X7B)


def test_bad_input_raises_value_error_naming_the_problem():
    with pytest.raises(ValueError, match="alpha"):
        expected_tokens(1.2, 4)
    with pytest.raises(ValueError, match="alpha"):
        speculative_speedup(1, alpha=-0.1)
    with pytest.raises(ValueError, match="alpha"):
        vllm_speculative_config(alpha=1.5, context=4096)
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
        max_batch(H100_SXM, LLAMA_8B, context=-1)
    with pytest.raises(ValueError, match="draft_kv_window"):
        speculative_speedup(1, context=4096, draft=LLAMA_1B, draft_kv_window=0)
    with pytest.raises(ValueError, match="draft_kv_window"):
        speculative_speedup(1, context=4096, draft_kv_window=512)  # a window needs a draft shape
    with pytest.raises(ValueError, match="experts_per_token"):
        MoE(experts=8, experts_per_token=9, expert_params=1e9)
    with pytest.raises(ValueError, match="usable_fraction"):
        max_batch(H100_SXM, LLAMA_8B, 4096, usable_fraction=1.5)
    with pytest.raises(ValueError, match="largest_batch"):
        vllm_config_from_speedup(lambda B, g: 2.0, 0)
    with pytest.raises(ValueError, match="memory_bandwidth"):
        Hardware("broken", 0, 1e12, 1e9)
    with pytest.raises(TypeError):
        ModelShape(8e9, 2, 131072)  # everything after bytes_per_param is named, not positional


def test_cli_prints_the_reference_table(tmp_path, capsys):
    assert main(["roofline", "--plot", str(tmp_path / "speedup.png")]) == 0
    out = capsys.readouterr().out
    assert "2.80x" in out and "2.62x" in out and "1.42x" in out and "0.74x" in out
    assert "batch 59.0" in out and "batch 186.7" in out
    assert (tmp_path / "speedup.png").stat().st_size > 0
    assert main(["roofline", "--hardware", "h200", "--batches", "1,128"]) == 0
    assert "batch 41.2" in capsys.readouterr().out


def test_cli_long_context_draft_shape_quantized_and_moe(tmp_path, capsys):
    argv = ["roofline", "--context", "4096", "--draft-shape", "llama-1b", "--draft-kv-window", "512",
            "--batches", "1,64,128", "--plot", str(tmp_path / "magicdec.png")]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "2.10x" in out and "2.57x" in out and "at most 96 rows fit" in out
    assert out.count("does not fit") == 1 and (tmp_path / "magicdec.png").stat().st_size > 0
    assert main(["roofline", "--weight-bits", "4"]) == 0
    assert "batch 14.8" in capsys.readouterr().out
    assert main(["roofline", "--target-shape", "mixtral-8x7b", "--hardware", "h200", "--batches", "1,16"]) == 0
    out = capsys.readouterr().out
    assert "1.12x" in out and "2.78x" in out
    assert main(["roofline", "--draft-kv-window", "0", "--draft-shape", "llama-1b"]) == 2
    assert "draft_kv_window" in capsys.readouterr().err


def test_cli_prints_vllm_json(capsys):
    assert main(["roofline", "--vllm"]) == 0
    assert json.loads(capsys.readouterr().out) == REFERENCE_VLLM
    assert main(["roofline", "--vllm", "--context", "4096", "--draft-shape", "llama-1b", "--gamma-max", "4"]) == 0
    config = json.loads(capsys.readouterr().out)
    assert config == vllm_speculative_config(gamma_max=4, context=4096, draft=LLAMA_1B)
    assert config["num_speculative_tokens"] == 4


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


@given(alphas, st.integers(1, 8), st.sampled_from([0, 1024, 8192]), st.sampled_from([None, 256]))
def test_break_even_with_a_draft_shape_is_its_last_crossing(alpha, gamma, context, window):
    kw = dict(context=context, draft=LLAMA_1B, draft_kv_window=window)
    B = break_even_batch(alpha, gamma, **kw)
    later = [B * 1.01 ** i for i in range(1, 200)] if 1 <= B < math.inf else []
    if later:
        assert speculative_speedup(B, alpha, gamma, **kw) == pytest.approx(1.0)
        assert all(speculative_speedup(b, alpha, gamma, **kw) < 1 for b in later)
    g = best_gamma(1, alpha, 8, **kw)
    assert (g == 0) == all(speculative_speedup(1, alpha, other, **kw) <= 1 for other in range(1, 9))
