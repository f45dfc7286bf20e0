"""Step time, speedup and break-even batch of a chain of gamma draft tokens on the roofline.

The formulas are in :mod:`minispec.roofline`'s docstring: a step is the weight matmuls' max(memory,
compute) plus attention's; a speculative step drafts gamma tokens at c each and verifies gamma + 1 per
row; E = (1 - alpha^(gamma+1)) / (1 - alpha). Also the largest batch memory holds and the draft's c
against the vocabulary its LM head scores.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from types import MappingProxyType

from minispec.roofline.hardware import H100_SXM, Hardware
from minispec.roofline.shapes import (
    GEMMA3_270M,
    GEMMA3_270M_CONFIG,
    LLAMA3_8B_CONFIG,
    LLAMA_8B,
    SMOLLM2_135M,
    SMOLLM2_135M_CONFIG,
    ModelShape,
    check_arguments,
    eagle_head_shape,
)


def _bisect(f, lo: float, hi: float) -> float:
    """The x in [lo, hi] where f changes sign (f(lo) and f(hi) of opposite signs), to float precision."""
    below = f(lo) < 0
    for _ in range(200):
        mid = (lo + hi) / 2
        if mid in (lo, hi):
            break
        lo, hi = (mid, hi) if (f(mid) < 0) == below else (lo, mid)
    return (lo + hi) / 2


def step_time(batch: float, tokens_per_row: int = 1, hardware: Hardware = H100_SXM, model: ModelShape = LLAMA_8B,
              context: float = 0) -> float:
    """Seconds for one forward over ``tokens_per_row`` tokens in each of ``batch`` rows: matmuls plus attention."""
    check_arguments(batch=batch, context=context)
    if not tokens_per_row >= 1:
        raise ValueError(f"tokens_per_row must be >= 1, got {tokens_per_row}")
    bw, peak, N = hardware.memory_bandwidth, hardware.peak_flops, batch * tokens_per_row
    matmuls = max(model.weight_bytes_read(N) / bw, 2 * model.active_params * N / peak)
    attention = max(batch * context * model.kv_bytes_per_token / bw,
                    model.attention_flops_per_token * context * N / peak)
    return matmuls + attention


def _draft_step_time(batch, hardware, model, context, draft_cost, draft, draft_kv_window, tokens_per_row=1) -> float:
    """Seconds of one draft pass over w = ``tokens_per_row`` tokens per row: c * t(B, w), or the draft shape's own
    step at min(context, window)."""
    if draft is None:
        return draft_cost * step_time(batch, tokens_per_row, hardware, model, context)
    return step_time(batch, tokens_per_row, hardware, draft, min(context, draft_kv_window or context))


def modelled_draft_cost(batch: float, draft: ModelShape, hardware: Hardware = H100_SXM, model: ModelShape = LLAMA_8B,
                        context: float = 0, *, draft_kv_window: int | None = None) -> float:
    """c of a draft shape: its step time over the target's plain step time, at this batch and context."""
    check_arguments(batch=batch, context=context, draft=draft, draft_kv_window=draft_kv_window)
    return _draft_step_time(batch, hardware, model, context, 0, draft, draft_kv_window) / step_time(
        batch, 1, hardware, model, context)


def expected_tokens(alpha: float, gamma: int) -> float:
    """E, tokens a speculative step yields per row: accepted drafts plus the one the target adds."""
    check_arguments(alpha=alpha, gamma=gamma)
    return gamma + 1.0 if alpha == 1 else (1 - alpha ** (gamma + 1)) / (1 - alpha)


def speculative_step_time(batch: float, gamma: int = 4, draft_cost: float = 0.05, hardware: Hardware = H100_SXM,
                          model: ModelShape = LLAMA_8B, context: float = 0, *, draft: ModelShape | None = None,
                          draft_kv_window: int | None = None) -> float:
    """Seconds for one speculative step: gamma draft steps, then verify B * (gamma + 1) tokens.

    A draft step costs c * t(B, 1) (``draft_cost``), or, given a ``draft`` shape, its own step time at
    min(context, ``draft_kv_window``) tokens of KV per row; ``draft_cost`` is then not used.
    """
    check_arguments(gamma=gamma, draft_cost=draft_cost, draft=draft, draft_kv_window=draft_kv_window)
    verify = step_time(batch, gamma + 1, hardware, model, context)
    return verify + gamma * _draft_step_time(batch, hardware, model, context, draft_cost, draft, draft_kv_window)


def speculative_speedup(batch: float, alpha: float = 0.8, gamma: int = 4, draft_cost: float = 0.05,
                        hardware: Hardware = H100_SXM, model: ModelShape = LLAMA_8B, context: float = 0, *,
                        draft: ModelShape | None = None, draft_kv_window: int | None = None) -> float:
    """Plain seconds per token / speculative seconds per token (> 1: speculation helps). gamma = 0 gives 1."""
    plain = step_time(batch, 1, hardware, model, context)
    spec = speculative_step_time(batch, gamma, draft_cost, hardware, model, context, draft=draft,
                                 draft_kv_window=draft_kv_window)
    return expected_tokens(alpha, gamma) * plain / spec


def leviathan_speedup(alpha: float, gamma: int, c: float) -> float:
    """Leviathan et al. (2023): (1 - alpha^(gamma+1)) / ((1 - alpha)(gamma c + 1)), verification free."""
    check_arguments(draft_cost=c)
    return expected_tokens(alpha, gamma) / (gamma * c + 1)


def compute_bound_batch(gamma: int = 4, hardware: Hardware = H100_SXM, model: ModelShape = LLAMA_8B,
                        context: float = 0) -> float:
    """Batch (continuous) above which the weight matmuls of verifying gamma + 1 tokens per row are compute-bound.

    Solves W(N) / bandwidth = 2 * P_active * N / peak for N = B * (gamma + 1) tokens: for a dense
    model in BF16, N = ridge, so B = 295 / 5 = 59 for the reference. ``context`` does not move it:
    the KV read is a kernel of its own, whose FLOPs and bytes both grow as B * context.
    """
    check_arguments(gamma=gamma, context=context)
    bw, peak = hardware.memory_bandwidth, hardware.peak_flops
    excess = lambda N: 2 * model.active_params * N / peak - model.weight_bytes_read(N) / bw  # noqa: E731
    hi = 1.0
    while excess(hi) < 0:
        hi *= 2
    return _bisect(excess, 0.0, hi) / (gamma + 1)


_GRID = [2 ** (i / 8) for i in range(8 * 24 + 1)]  # batch 1 .. 16.7M, 8 points per doubling


def break_even_batch(alpha: float = 0.8, gamma: int = 4, draft_cost: float = 0.05, hardware: Hardware = H100_SXM,
                     model: ModelShape = LLAMA_8B, context: float = 0, *, draft: ModelShape | None = None,
                     draft_kv_window: int | None = None) -> float:
    """Batch (continuous) above which speculation is slower than plain decoding, for good.

    The last batch where the speedup falls through 1.0: 0.0 if it never exceeds 1, inf if it is
    still 1 or more at 16.7M rows (every term grows linearly with the batch there, so the speedup
    has reached its limit). Found on a grid of 8 points per doubling, then refined by bisection.
    """
    check_arguments(alpha=alpha, gamma=gamma, draft_cost=draft_cost, context=context, draft=draft,
           draft_kv_window=draft_kv_window)
    pays = lambda B: speculative_speedup(B, alpha, gamma, draft_cost, hardware, model, context,  # noqa: E731
                                         draft=draft, draft_kv_window=draft_kv_window) - 1 > 1e-12
    paying = [i for i, B in enumerate(_GRID) if pays(B)]
    if not paying:
        return 0.0
    if speculative_speedup(_GRID[-1], alpha, gamma, draft_cost, hardware, model, context, draft=draft,
                           draft_kv_window=draft_kv_window) > 1 - 1e-12:
        return math.inf
    return _bisect(lambda B: 1 if pays(B) else -1, _GRID[paying[-1]], _GRID[paying[-1] + 1])


def best_gamma(batch: float, alpha: float = 0.8, gamma_max: int = 8, draft_cost: float = 0.05,
               hardware: Hardware = H100_SXM, model: ModelShape = LLAMA_8B, context: float = 0, *,
               draft: ModelShape | None = None, draft_kv_window: int | None = None) -> int:
    """The gamma in 0..gamma_max with the highest modelled speedup (the smallest on a tie); 0 = off."""
    check_arguments(gamma=gamma_max)
    kw = dict(draft=draft, draft_kv_window=draft_kv_window)
    return max(range(gamma_max + 1),
               key=lambda g: (speculative_speedup(batch, alpha, g, draft_cost, hardware, model, context, **kw), -g))


def max_batch(hardware: Hardware, target: ModelShape, context: int, draft: ModelShape | None = None,
              usable_fraction: float = 0.9, *, draft_kv_window: int | None = None) -> float:
    """Largest batch whose weights and KV caches fit in ``usable_fraction`` of ``hardware.memory_bytes``.

    Counts both models' weights, ``context`` tokens of target KV per row and min(context,
    ``draft_kv_window``) of draft KV; nothing else (activations, logits, CUDA context, allocator
    slack live in the rest, as vLLM's ``gpu_memory_utilization`` leaves it). 0 if the weights
    alone do not fit; inf if they do and a row needs no memory (context 0, or no KV).
    """
    check_arguments(context=context, draft=draft, draft_kv_window=draft_kv_window)
    if not 0 < usable_fraction <= 1:
        raise ValueError(f"usable_fraction must be in (0, 1], got {usable_fraction}")
    draft_context = min(context, draft_kv_window or context)
    free = hardware.memory_bytes * usable_fraction - target.weight_bytes - (draft.weight_bytes if draft else 0)  # B
    per_row = context * target.kv_bytes_per_token + (draft_context * draft.kv_bytes_per_token if draft else 0)  # B
    if free < 0:
        return 0
    return math.floor(free / per_row) if per_row else math.inf


def speedup_table(batches, alpha: float = 0.8, gamma: int = 4, draft_cost: float = 0.05,
                  hardware: Hardware = H100_SXM, model: ModelShape = LLAMA_8B, context: float = 0, *,
                  draft: ModelShape | None = None, draft_kv_window: int | None = None,
                  usable_fraction: float = 0.9) -> list[dict]:
    """One row per batch: step times (ms), c, tokens per speculative step (all rows), speedup, and whether
    the batch fits in memory (:func:`max_batch`)."""
    args, kw = (hardware, model, context), dict(draft=draft, draft_kv_window=draft_kv_window)
    fits = max_batch(hardware, model, context, draft, usable_fraction, draft_kv_window=draft_kv_window)
    rows = []
    for B in batches:
        plain = step_time(B, 1, *args)
        rows.append({"batch": B,
                     "plain_ms": 1e3 * plain,
                     "speculative_ms": 1e3 * speculative_step_time(B, gamma, draft_cost, *args, **kw),
                     "draft_cost": _draft_step_time(B, *args, draft_cost, draft, draft_kv_window) / plain,
                     "tokens_per_step": B * expected_tokens(alpha, gamma),
                     "speedup": speculative_speedup(B, alpha, gamma, draft_cost, *args, **kw),
                     "fits": B <= fits})
    return rows


VOCAB_TARGETS = MappingProxyType({  # name: (config.json shape keys, the target's ModelShape)
    "SmolLM2-135M": (SMOLLM2_135M_CONFIG, SMOLLM2_135M),
    "Llama-3-8B": (LLAMA3_8B_CONFIG, LLAMA_8B),
    "Gemma-3-270M": (GEMMA3_270M_CONFIG, GEMMA3_270M),
})


def draft_cost_by_vocab(batch: float = 1, hardware: Hardware = H100_SXM, context: float = 0, *,
                        hot_vocab: int = 32000, hot_fraction: float = 0.25, fusion: str = "eagle1",
                        targets: Mapping = VOCAB_TARGETS) -> list[dict]:
    """c of an EAGLE-style head (:func:`eagle_head_shape`: one layer of the target's shape) on each target, with
    the full LM head, a ``hot_vocab``-row head (EAGLE-3 keeps 32,000) and a head of ``hot_fraction`` of the
    vocabulary (FR-Spec's 25 %). One row per target: vocab, hidden, ``head_share`` (the full head's share of the
    draft's parameters), ``target_head_share`` (the target's LM head's share of its own), and c for each head.
    """
    if not 0 < hot_fraction <= 1:
        raise ValueError(f"hot_fraction must be in (0, 1], got {hot_fraction}")
    rows = []
    for name, (config, target) in targets.items():
        V = config["vocab_size"]
        full, hot, part = (eagle_head_shape(config, n, fusion=fusion)
                           for n in (None, min(hot_vocab, V), max(1, round(hot_fraction * V))))
        c_full, c_hot, c_part = (modelled_draft_cost(batch, d, hardware, target, context) for d in (full, hot, part))
        rows.append({"target": name, "vocab": V, "hidden": full.hidden, "draft_params": full.params,
                     "head_share": full.lm_head_params / full.params,
                     "target_head_share": target.lm_head_params / target.params,
                     "c_full": c_full, "hot_vocab": hot.vocab, "c_hot": c_hot,
                     "fraction_vocab": part.vocab, "c_fraction": c_part})
    return rows
