"""A roofline model of decode step time, per operator, and what it says about speculative decoding.

Notation (Leviathan et al. 2023): p = target distribution, q = draft distribution,
gamma = draft tokens per step, alpha = acceptance rate of one draft token, c = the cost of one
draft step as a fraction of a plain target step at the same batch and context.

One forward of a model over T tokens in each of B rows (N = B * T tokens), each row holding
``context`` tokens of KV cache, runs two kinds of kernel, and each is bound either by memory
traffic or by compute:

    t(B, T) = max(W(N) / bandwidth, 2 * P_active * N / peak)             weight matmuls
            + max(B * context * kv / bandwidth, A * context * N / peak)    attention      (seconds)

    W(N)      weight bytes the step reads: params * bytes per weight for a dense model
    P_active  parameters one token multiplies (2 FLOPs each): all of them for a dense model
    kv        KV bytes per token = 2 (K and V) * layers * kv_heads * head_dim * bytes per KV element
    A         attention FLOPs per query token per cached token = 4 * layers * heads * head_dim (QK^T, PV)

With ``context=0`` this is the reference model, max(weight bytes / bandwidth, 2 * params * N / peak).
The two kernels are summed, not put under one max: the KV read cannot hide the matmuls' FLOPs.
Attention runs at heads / kv_heads * T FLOPs per KV byte, far below every ridge here, so at long
context its KV read is what costs. Left out: activations, norms, softmax, kernel launches, and the
causal half of a prefill's attention.

Mixture of experts (MoESD, Huang et al. 2025): of E experts per layer each token routes to k; N tokens
touch E * (1 - (1 - k/E)^N) distinct experts per layer on average, and W(N) counts the shared weights
plus those; P_active counts the shared weights plus k experts. Verifying gamma + 1 tokens per row reads
more experts than decoding one, so verification is not free at batch 1; at a moderate batch every
expert is read anyway and it is again. Quantized weights (W4A16: 0.5 bytes per weight, 16-bit compute)
cut W but not the FLOPs, so the matmuls turn compute-bound at a quarter of the BF16 batch.

A speculative step drafts gamma tokens, then verifies B * (gamma + 1), and yields
E = (1 - alpha^(gamma+1)) / (1 - alpha) tokens per row (Leviathan et al. 2023; Chen et al. 2023):

    speedup = E * t(B, 1) / (t(B, gamma + 1) + gamma * t_q(B))
    t_q(B)  = c * t(B, 1)                       the reference: c a constant
            = t_draft(B, 1) at min(context, window)   a draft shape: c = t_q / t(B, 1) varies with B and context

At small batch the weight read sets both t(B, 1) and t(B, gamma + 1), so the speedup is Leviathan's
E / (1 + gamma c). Verification turns compute-bound gamma + 1 times sooner than plain decoding
(295 / 5 = 59 rows for an 8B BF16 target on an H100). At long context the KV read, paid by plain and
speculative steps alike, dilutes that extra compute; and a draft whose KV is bounded to a window
(StreamingLLM, Xiao et al. 2023) gets cheaper relative to the target as the batch grows, so the
speedup can rise with batch (MagicDec, Sadhukhan et al. 2024). Choosing gamma per batch, 0 included,
is SmartSpec's goodput rule (Liu et al. 2024) and what vLLM's dynamic speculative decoding reads as
``num_speculative_tokens_per_batch_size``.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import KW_ONLY, dataclass

from minispec.hardware import H100_SXM, Hardware


@dataclass(frozen=True)
class MoE:
    """The routed experts of a mixture-of-experts model."""

    experts: int  # E, experts per layer
    experts_per_token: int  # k, experts each token is routed to
    expert_params: float  # parameters of one expert, summed over all layers

    def __post_init__(self):
        if not 1 <= self.experts_per_token <= self.experts:
            raise ValueError(f"need 1 <= experts_per_token <= experts, got experts_per_token="
                             f"{self.experts_per_token}, experts={self.experts}")
        if not self.expert_params > 0:
            raise ValueError(f"expert_params must be positive, got {self.expert_params}")

    def experts_touched(self, tokens: float) -> float:
        """Expected distinct experts per layer that ``tokens`` tokens route to: E * (1 - (1 - k/E)^N)."""
        return self.experts * (1 - (1 - self.experts_per_token / self.experts) ** tokens)


@dataclass(frozen=True)
class ModelShape:
    """What the roofline needs to know about a model. Fields after ``bytes_per_param`` are keyword-only."""

    params: float  # parameter count, every expert included
    bytes_per_param: float = 2  # bytes per weight: 2 = BF16, 1 = FP8/INT8, 0.5 = 4-bit (W4A16)
    _: KW_ONLY
    layers: int = 0  # decoder layers; 0 = no attention and no KV (a bare matmul)
    heads: int = 0  # query heads per layer
    kv_heads: int = 0  # key/value heads per layer (fewer than heads: grouped-query attention)
    head_dim: int = 0
    bytes_per_kv: float = 2  # bytes per KV-cache element: 2 = BF16, 1 = FP8; 0 = the cache is not counted
    moe: MoE | None = None  # None = dense
    name: str = ""

    def __post_init__(self):
        if not self.params > 0 or not self.bytes_per_param > 0 or not self.bytes_per_kv >= 0:
            raise ValueError(f"params and bytes_per_param must be positive, bytes_per_kv >= 0: {self}")
        if min(self.layers, self.heads, self.kv_heads, self.head_dim) < 0:
            raise ValueError(f"layers, heads, kv_heads and head_dim must be >= 0: {self}")
        if self.moe and self.moe.experts * self.moe.expert_params >= self.params:
            raise ValueError(f"the experts ({self.moe.experts} x {self.moe.expert_params:.4g}) leave no shared "
                             f"parameters out of params={self.params:.4g}")

    @property
    def weight_bytes(self) -> float:
        """Bytes of all the weights (what memory must hold)."""
        return self.params * self.bytes_per_param

    @property
    def kv_bytes_per_token(self) -> float:
        """Bytes of K and V one token adds to the cache, all layers."""
        return 2 * self.layers * self.kv_heads * self.head_dim * self.bytes_per_kv

    @property
    def attention_flops_per_token(self) -> float:
        """FLOPs of attention per query token per cached token: QK^T and PV, 2 * head_dim each, all heads."""
        return 4 * self.layers * self.heads * self.head_dim

    @property
    def active_params(self) -> float:
        """Parameters one token multiplies: all but the experts it is not routed to."""
        if self.moe is None:
            return self.params
        return self.params - (self.moe.experts - self.moe.experts_per_token) * self.moe.expert_params

    def weight_bytes_read(self, tokens: float) -> float:
        """Bytes of weights a step over ``tokens`` tokens reads: all of them, or for an MoE the experts touched."""
        if self.moe is None:
            return self.weight_bytes
        untouched = self.moe.experts - self.moe.experts_touched(tokens)  # experts per layer nobody routed to
        return (self.params - untouched * self.moe.expert_params) * self.bytes_per_param

    @classmethod
    def from_params(cls, params: float, bytes_per_param: float = 2) -> ModelShape:
        """Weights only, no attention or KV cache: the reference model's view."""
        return cls(params, bytes_per_param, name=f"{params / 1e9:.3g}B")

    @classmethod
    def from_config(cls, cfg, bytes_per_param: float = 2, bytes_per_kv: float | None = None) -> ModelShape:
        """From a minispec ``ModelConfig``, a transformers config or a config.json dict (dense Llama family).

        ``bytes_per_kv``: bytes per KV-cache element; None = the weights' ``bytes_per_param``.
        """
        if not hasattr(cfg, "kv_elements_per_token"):  # not a ModelConfig: read it as Hugging Face's
            from minispec.model import config_from_hf

            cfg = config_from_hf(cfg)
        params = cfg.num_parameters
        return cls(params, bytes_per_param, layers=cfg.num_hidden_layers, heads=cfg.num_attention_heads,
                   kv_heads=cfg.num_key_value_heads, head_dim=cfg.head_dim,
                   bytes_per_kv=bytes_per_param if bytes_per_kv is None else bytes_per_kv,
                   name=f"{params / 1e9:.3g}B")

    @classmethod
    def from_model(cls, model) -> ModelShape:
        """From a loaded minispec ``Model``: its config; weights and KV cache in its dtype."""
        return cls.from_config(model.config, model.dtype.itemsize)


# Presets named by their public config.json files; BF16 weights and KV cache.
# meta-llama/Meta-Llama-3-8B: 32 layers, 32 heads, 8 KV heads, head dim 128; params rounded to the
# reference's 8e9 (the checkpoint has 8.03e9). KV: 2 x 32 x 8 x 128 x 2 B = 131,072 B/token.
LLAMA_8B = ModelShape(8e9, 2, layers=32, heads=32, kv_heads=8, head_dim=128, name="Llama-3-8B")
# meta-llama/Llama-3.2-1B: 16 layers, 32 heads, 8 KV heads, head dim 64, embeddings tied (1.24e9 params).
# KV: 2 x 16 x 8 x 64 x 2 B = 32,768 B/token.
LLAMA_1B = ModelShape(1.24e9, 2, layers=16, heads=32, kv_heads=8, head_dim=64, name="Llama-3.2-1B")
# meta-llama/Meta-Llama-3-70B: hidden 8192, FFN 28672, 80 layers, 64 heads, 8 KV heads, head dim 128,
# vocab 128256, untied: 80 x (150,994,944 attention + 704,643,072 MLP + 16,384 norms) + 2 x 1,050,673,152
# embeddings + 8,192 = 70,553,706,496 params. KV: 2 x 80 x 8 x 128 x 2 B = 327,680 B/token.
LLAMA_70B = ModelShape(70_553_706_496, 2, layers=80, heads=64, kv_heads=8, head_dim=128, name="Llama-3-70B")
# mistralai/Mixtral-8x7B-v0.1: hidden 4096, FFN 14336, 32 layers, 32 heads, 8 KV heads, head dim 128,
# vocab 32000, 8 experts, 2 per token. One expert: 3 x 4096 x 14336 x 32 layers = 5,637,144,576 params;
# shared: 1,342,177,280 attention + 262,144,000 embeddings + 1,048,576 routers + 266,240 norms
# = 1,605,636,096. Total 46,702,792,704 (46.7e9); active per token 12,879,925,248 (12.9e9).
MIXTRAL_8X7B = ModelShape(46_702_792_704, 2, layers=32, heads=32, kv_heads=8, head_dim=128,
                          moe=MoE(experts=8, experts_per_token=2, expert_params=5_637_144_576), name="Mixtral-8x7B")
MODEL_SHAPES = {"llama-8b": LLAMA_8B, "llama-1b": LLAMA_1B, "llama-70b": LLAMA_70B, "mixtral-8x7b": MIXTRAL_8X7B}


def _check(batch: float = 1, alpha: float = 0, gamma: int = 0, draft_cost: float = 0, context: float = 0,
           draft: ModelShape | None = None, draft_kv_window: int | None = None):
    if not batch >= 1:
        raise ValueError(f"batch must be >= 1, got {batch}")
    if not 0 <= alpha <= 1:
        raise ValueError(f"alpha (acceptance rate) must be in [0, 1], got {alpha}")
    if gamma < 0 or gamma != int(gamma):
        raise ValueError(f"gamma (draft tokens per step) must be an integer >= 0, got {gamma}")
    if not draft_cost >= 0:
        raise ValueError(f"draft_cost (c) must be >= 0, got {draft_cost}")
    if not context >= 0:
        raise ValueError(f"context must be >= 0 tokens, got {context}")
    if draft_kv_window is not None and not (draft_kv_window >= 1 and draft is not None):
        raise ValueError(f"draft_kv_window must be >= 1 tokens and needs a draft shape, got {draft_kv_window} "
                         f"with draft={draft and draft.name}")


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
    _check(batch=batch, context=context)
    if not tokens_per_row >= 1:
        raise ValueError(f"tokens_per_row must be >= 1, got {tokens_per_row}")
    bw, peak, N = hardware.memory_bandwidth, hardware.peak_flops, batch * tokens_per_row
    matmuls = max(model.weight_bytes_read(N) / bw, 2 * model.active_params * N / peak)
    attention = max(batch * context * model.kv_bytes_per_token / bw,
                    model.attention_flops_per_token * context * N / peak)
    return matmuls + attention


def _draft_step_time(batch, hardware, model, context, draft_cost, draft, draft_kv_window) -> float:
    """Seconds of one draft step: c * t(B, 1), or the draft shape's own step at min(context, window)."""
    if draft is None:
        return draft_cost * step_time(batch, 1, hardware, model, context)
    return step_time(batch, 1, hardware, draft, min(context, draft_kv_window or context))


def modelled_draft_cost(batch: float, draft: ModelShape, hardware: Hardware = H100_SXM, model: ModelShape = LLAMA_8B,
                        context: float = 0, *, draft_kv_window: int | None = None) -> float:
    """c of a draft shape: its step time over the target's plain step time, at this batch and context."""
    _check(batch=batch, context=context, draft=draft, draft_kv_window=draft_kv_window)
    return _draft_step_time(batch, hardware, model, context, 0, draft, draft_kv_window) / step_time(
        batch, 1, hardware, model, context)


def expected_tokens(alpha: float, gamma: int) -> float:
    """E, tokens a speculative step yields per row: accepted drafts plus the one the target adds."""
    _check(alpha=alpha, gamma=gamma)
    return gamma + 1.0 if alpha == 1 else (1 - alpha ** (gamma + 1)) / (1 - alpha)


def speculative_step_time(batch: float, gamma: int = 4, draft_cost: float = 0.05, hardware: Hardware = H100_SXM,
                          model: ModelShape = LLAMA_8B, context: float = 0, *, draft: ModelShape | None = None,
                          draft_kv_window: int | None = None) -> float:
    """Seconds for one speculative step: gamma draft steps, then verify B * (gamma + 1) tokens.

    A draft step costs c * t(B, 1) (``draft_cost``), or, given a ``draft`` shape, its own step time at
    min(context, ``draft_kv_window``) tokens of KV per row; ``draft_cost`` is then not used.
    """
    _check(gamma=gamma, draft_cost=draft_cost, draft=draft, draft_kv_window=draft_kv_window)
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
    _check(draft_cost=c)
    return expected_tokens(alpha, gamma) / (gamma * c + 1)


def compute_bound_batch(gamma: int = 4, hardware: Hardware = H100_SXM, model: ModelShape = LLAMA_8B,
                        context: float = 0) -> float:
    """Batch (continuous) above which the weight matmuls of verifying gamma + 1 tokens per row are compute-bound.

    Solves W(N) / bandwidth = 2 * P_active * N / peak for N = B * (gamma + 1) tokens: for a dense
    model in BF16, N = ridge, so B = 295 / 5 = 59 for the reference. ``context`` does not move it:
    the KV read is a kernel of its own, whose FLOPs and bytes both grow as B * context.
    """
    _check(gamma=gamma, context=context)
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
    _check(alpha=alpha, gamma=gamma, draft_cost=draft_cost, context=context, draft=draft,
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
    _check(gamma=gamma_max)
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
    _check(context=context, draft=draft, draft_kv_window=draft_kv_window)
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


def vllm_config_from_speedup(speedup, largest_batch: int, gamma_max: int = 8) -> dict:
    """vLLM's dynamic speculative decoding keys from any ``speedup(batch, gamma) -> float``.

    Each batch 1..``largest_batch`` gets the gamma in 1..gamma_max with the highest speedup (the
    smallest on a tie) if that speedup exceeds 1, else 0; neighbouring batches with the same K merge
    into one inclusive range [start_bs, end_bs, K]. vLLM applies the last range's K to larger batches.
    ``num_speculative_tokens`` is the largest K used (vLLM's maximum draft window; it must be >= 1).
    """
    if not largest_batch >= 1 or largest_batch != int(largest_batch):
        raise ValueError(f"largest_batch must be an integer >= 1, got {largest_batch}")
    _check(gamma=gamma_max)
    ranges: list[list[int]] = []
    for B in range(1, int(largest_batch) + 1):
        gain = {g: speedup(B, g) for g in range(1, gamma_max + 1)}
        g = max(gain, key=lambda g: (gain[g], -g), default=0)
        K = g if g and gain[g] > 1 else 0
        if ranges and ranges[-1][2] == K:
            ranges[-1][1] = B
        else:
            ranges.append([B, B, K])
    K_max = max(K for _, _, K in ranges)
    if K_max == 0:
        raise ValueError(f"no gamma in 1..{gamma_max} pays at any batch up to {largest_batch}: "
                         "leave speculative decoding off (no --speculative-config)")
    return {"num_speculative_tokens": K_max, "num_speculative_tokens_per_batch_size": ranges}


def vllm_speculative_config(alpha: float = 0.8, gamma_max: int = 8, draft_cost: float = 0.05,
                            hardware: Hardware = H100_SXM, model: ModelShape = LLAMA_8B, context: float = 0, *,
                            draft: ModelShape | None = None, draft_kv_window: int | None = None,
                            usable_fraction: float = 0.9, largest_batch: int | None = None) -> dict:
    """The modelled best gamma per batch as keys of vLLM's ``--speculative-config`` (JSON-ready dict).

    The ranges run from 1 to ``largest_batch``: by default the largest batch that fits in memory
    (:func:`max_batch`), or, where a row needs no memory (context 0), the first batch past every
    gamma's break-even, from which K stays 0.
    """
    kw = dict(draft=draft, draft_kv_window=draft_kv_window)
    if largest_batch is None:
        largest_batch = max_batch(hardware, model, context, draft, usable_fraction, draft_kv_window=draft_kv_window)
        if largest_batch == 0:
            raise ValueError(f"the weights do not fit in {usable_fraction:.0%} of {hardware.name}'s memory")
        if largest_batch == math.inf:
            off = max(break_even_batch(alpha, g, draft_cost, hardware, model, context, **kw)
                      for g in range(1, gamma_max + 1))
            if off == math.inf:
                raise ValueError("speculation pays at every batch and a row needs no memory: pass largest_batch")
            largest_batch = math.floor(off) + 1
    return vllm_config_from_speedup(
        lambda B, g: speculative_speedup(B, alpha, g, draft_cost, hardware, model, context, **kw),
        largest_batch, gamma_max)


def quantized(model: ModelShape, weight_bits: float) -> ModelShape:
    """The same shape with ``weight_bits`` bits per weight (e.g. 4 for W4A16); the KV cache keeps its dtype."""
    return dataclasses.replace(model, bytes_per_param=weight_bits / 8, name=f"{model.name} W{weight_bits:g}")
