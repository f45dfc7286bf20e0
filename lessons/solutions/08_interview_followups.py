"""Worked solutions to the exercises of lesson 08, interview follow-ups.

Run from the repository root: ``python lessons/solutions/08_interview_followups.py``.
Every number a solution claims is asserted; everything here is the roofline model, nothing is timed.
"""

import math

from minispec import roofline, serving
from minispec.roofline import ModelShape, MoE, hardware


def exercise_1():
    """A 70B target: the same bend, less long-context relief, and no room on one GPU."""
    print("Exercise 1: Llama-3-70B instead of the 8B, H100, alpha 0.8, gamma 4, c 0.05")
    L70, L8 = roofline.LLAMA_70B, roofline.LLAMA_8B
    bend, be = roofline.compute_bound_batch(model=L70), roofline.break_even_batch(model=L70)
    print(f"  weights only: verification compute-bound from batch {bend:.1f}, break-even {be:.1f} (8B: 59.0, 186.7)")
    assert math.isclose(bend, roofline.compute_bound_batch()) and math.isclose(be, roofline.break_even_batch())
    assert all(math.isclose(roofline.speculative_speedup(B, model=L70), roofline.speculative_speedup(B))
               for B in (1, 32, 64, 128, 256, 512))
    print("  Identical: weight bytes and FLOPs both scale with the parameter count, so their ratio, the")
    print("  intensity B (gamma + 1) FLOP/byte, does not depend on the model's size. Only the ridge matters.")
    at128 = {s.name: roofline.speculative_speedup(128, model=s, context=4096) for s in (L8, L70)}
    kv_share = {s.name: s.kv_bytes_per_token / s.weight_bytes for s in (L8, L70)}  # per token of context
    print(f"  context 4096, batch 128: 8B {at128[L8.name]:.2f}x, 70B {at128[L70.name]:.2f}x (weights only: 1.42x)")
    print(f"  KV bytes per token per weight byte: 8B {kv_share[L8.name]:.2e}, 70B {kv_share[L70.name]:.2e}")
    assert round(at128[L8.name], 2) == 2.37 and round(at128[L70.name], 2) == 1.95
    assert kv_share[L8.name] > 3 * kv_share[L70.name]
    print("  The 8B keeps more: its KV read is a larger share of its step (GQA gives the 70B only 8 KV heads")
    print("  over 80 layers for 70B parameters), so the read that plain and speculative steps share dilutes the")
    print("  verify pass's compute more.")
    fits = {hw.name: roofline.max_batch(hw, L70, 4096) for hw in (hardware.H100_SXM, hardware.H200)}
    print(f"  rows that fit at 4096 tokens: {fits}: its 141 GB of BF16 weights alone exceed one GPU's usable memory")
    assert set(fits.values()) == {0} and L70.weight_bytes > 0.9 * hardware.H200.memory_bytes
    print("  In BF16 it needs tensor parallelism across GPUs, which adds communication this roofline does not model.")
    w8 = roofline.quantized(L70, 8)  # FP8 weights: 70.6 GB
    fp8 = {hw.name: roofline.max_batch(hw, w8, 4096) for hw in (hardware.H100_SXM, hardware.H200)}
    print(f"  in FP8 ({w8.weight_bytes / 1e9:.1f} GB of weights) rows that fit at 4096 tokens: {fp8}")
    assert fp8 == {"H100 SXM": 1, "H200": 41}  # BF16 KV: one row on an H100, 41 on an H200
    print("  An H100 holds the FP8 weights with room for one 4k-token row: a single H200 is the smallest real home.")


def exercise_2():
    """The largest draft cost at which speculation still pays at batch 1, per traffic type."""
    print("Exercise 2: largest c that pays at batch 1 (verification free: speedup = E / (1 + gamma c))")
    for t in serving.MIX:
        E = roofline.expected_tokens(t.alpha, 4)
        c4 = (E - 1) / 4  # E / (1 + 4 c) = 1
        assert math.isclose(roofline.speculative_speedup(1, t.alpha, 4, c4), 1)
        assert roofline.speculative_speedup(1, t.alpha, 4, 0.99 * c4) > 1 > roofline.speculative_speedup(
            1, t.alpha, 4, 1.01 * c4)
        # Best gamma: gamma pays while c < (E(gamma) - 1) / gamma = mean of alpha, alpha^2, .., alpha^gamma,
        # which is largest at gamma = 1: a one-token draft pays exactly while c < alpha.
        per_gamma = {g: (roofline.expected_tokens(t.alpha, g) - 1) / g for g in range(1, 9)}
        assert max(per_gamma, key=per_gamma.get) == 1 and math.isclose(per_gamma[1], t.alpha)
        assert roofline.best_gamma(1, t.alpha, draft_cost=0.99 * t.alpha) == 1
        assert roofline.best_gamma(1, t.alpha, draft_cost=1.01 * t.alpha) == 0
        print(f"  {t.name:<8} alpha {t.alpha}: gamma 4 pays while c < {c4:.3f}; the best gamma (1 token) while "
              f"c < alpha = {t.alpha}")
    c_1b = roofline.modelled_draft_cost(1, roofline.LLAMA_1B)
    creative = next(t for t in serving.MIX if t.name == "creative")
    assert (roofline.expected_tokens(creative.alpha, 4) - 1) / 4 < c_1b < creative.alpha
    print(f"  The 1B draft's c = {c_1b:.3f} is too dear for gamma 4 on creative traffic (c < 0.106) but fine for")
    print("  a one-token draft there: which is why lesson 08's table picks gamma 1 for creative text.")


def fine_grained() -> ModelShape:
    """Mixtral's shape and total parameters, each expert split into eight: 64 experts, 4 per token."""
    M = roofline.MIXTRAL_8X7B
    return ModelShape(M.params, 2, layers=M.layers, heads=M.heads, kv_heads=M.kv_heads, head_dim=M.head_dim,
                      moe=MoE(experts=64, experts_per_token=4, expert_params=M.moe.expert_params / 8),
                      name="64 experts, top-4")


def exercise_3():
    """A fine-grained MoE: verification touches even more experts per token, so batch 1 gains nothing."""
    print("Exercise 3: 64 experts, 4 per token, against Mixtral's 8 experts, 2 per token, on an H200 (as in the")
    print("  lesson: 93 GB of BF16 weights do not fit an H100's 80 GB)")
    M, F, H200 = roofline.MIXTRAL_8X7B, fine_grained(), hardware.H200
    assert roofline.max_batch(hardware.H100_SXM, F, 0) == 0 < roofline.max_batch(H200, F, 4096)
    assert F.params == M.params and F.weight_bytes == M.weight_bytes
    reached = {}
    for shape in (M, F):
        moe = shape.moe
        read = shape.weight_bytes_read(5) / shape.weight_bytes_read(1)  # verify step's weight bytes / plain step's
        s1 = roofline.speculative_speedup(1, model=shape, hardware=H200)
        reached[shape.name] = next(B for B in range(1, 1000)
                                   if roofline.speculative_speedup(B, model=shape, hardware=H200) >= 2.5)
        print(f"  {shape.name}: {shape.active_params / 1e9:.1f}B active; experts touched per layer "
              f"{moe.experts_touched(1):.1f} by one token, {moe.experts_touched(5):.1f} by five (of {moe.experts}); "
              f"verify reads {read:.2f}x the bytes; at batch 1 {s1:.3f}x; 2.5x from batch {reached[shape.name]}")
    s_m, s_f = (roofline.speculative_speedup(1, model=shape, hardware=H200) for shape in (M, F))
    assert round(s_m, 2) == 1.12 and s_f < 1 < s_m  # the fine-grained MoE is slower with speculation at batch 1
    assert F.weight_bytes_read(5) / F.weight_bytes_read(1) > M.weight_bytes_read(5) / M.weight_bytes_read(1)
    assert reached[F.name] > 2 * reached[M.name]
    print("  Worse. With 1/16 of the experts active, one token reads few of them and five tokens read about")
    print("  4.4 times as many expert bytes, against about 3 times for Mixtral: the verify pass is dearer")
    print("  relative to a plain step, and only a larger batch (which reads every expert anyway) makes it free.")


if __name__ == "__main__":
    exercise_1()
    exercise_2()
    exercise_3()
