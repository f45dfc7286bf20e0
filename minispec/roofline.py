"""A roofline model of decode step time, and what it says about speculative decoding.

Notation (Leviathan et al. 2023): p = target distribution, q = draft distribution,
gamma = draft tokens per step, alpha = acceptance rate of one draft token, c = the cost of one
draft step as a fraction of a plain target step at the same batch and context.

One decode step of the target over ``T`` tokens for each of ``B`` rows takes

    t(B, T) = max(bytes / bandwidth, 2 * params * B * T / peak_flops)     seconds
    bytes   = weight bytes + B * context * KV bytes per token

a weight read plus every row's KV-cache read, against 2 FLOPs per parameter per token. With
``context=0`` this is exactly the reference model (the README's reference figures). Left out: activations, kernel
launch overhead, and attention FLOPs (about 4 * layers * heads * head_dim * context per token;
attention does heads / kv_heads * T FLOPs per KV byte, far below every ridge here, so the KV read
and not its FLOPs is what matters).

A speculative step costs one target step over B * (gamma + 1) tokens plus gamma draft steps of
c * t(B, 1) each, and yields E = (1 - alpha^(gamma+1)) / (1 - alpha) tokens per row, so

    speedup = E * t(B, 1) / (t(B, gamma + 1) + gamma * c * t(B, 1))

Because c is a fraction of a plain target step at the same batch and context, the draft's own
KV read, which also grows with context, is included in proportion (MagicDec 2024 shows that at
long context the KV read keeps large-batch decode memory-bound, so speculation pays again).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from minispec.hardware import H100_SXM, Hardware


@dataclass(frozen=True)
class ModelShape:
    """What the roofline needs to know about a model."""

    params: float  # parameter count
    bytes_per_param: float = 2  # 2 = BF16/FP16
    kv_bytes_per_token: float = 0  # bytes of K and V one token adds to the cache, all layers
    name: str = ""

    def __post_init__(self):
        if not self.params > 0 or not self.bytes_per_param > 0 or self.kv_bytes_per_token < 0:
            raise ValueError(f"params and bytes_per_param must be positive, kv_bytes_per_token >= 0: {self}")

    @property
    def weight_bytes(self) -> float:
        return self.params * self.bytes_per_param

    @classmethod
    def from_params(cls, params: float, bytes_per_param: float = 2) -> ModelShape:
        """Weights only, no KV cache: the reference model's view."""
        return cls(params, bytes_per_param, name=f"{params / 1e9:.3g}B")

    @classmethod
    def from_config(cls, cfg, bytes_per_param: float = 2) -> ModelShape:
        """From a minispec ``ModelConfig``, a transformers config or a config.json dict.

        The KV cache is assumed to be stored in the weights' dtype (``bytes_per_param`` per element).
        """
        if not hasattr(cfg, "kv_elements_per_token"):  # not a ModelConfig: read it as Hugging Face's
            from minispec.model import config_from_hf

            cfg = config_from_hf(cfg)
        params = cfg.num_parameters
        return cls(params, bytes_per_param, cfg.kv_elements_per_token * bytes_per_param, f"{params / 1e9:.3g}B")

    @classmethod
    def from_model(cls, model) -> ModelShape:
        """From a loaded minispec ``Model``: its config, bytes per parameter from its dtype."""
        return cls.from_config(model.config, model.dtype.itemsize)


# Llama-3-8B in BF16, with params rounded to the reference's 8e9 (the checkpoint has 8.03e9).
# KV: 32 layers x 8 KV heads x 128 head dim x 2 (K and V) x 2 bytes = 131,072 bytes/token.
LLAMA_8B = ModelShape(8e9, 2, 32 * 8 * 128 * 2 * 2, "Llama-3-8B")
# Llama-3.2-1B in BF16 (1.24e9 params, embeddings tied). KV: 16 layers x 8 x 64 x 2 x 2 = 32,768 bytes/token.
LLAMA_1B = ModelShape(1.24e9, 2, 16 * 8 * 64 * 2 * 2, "Llama-3.2-1B")


def _check(batch: float = 1, alpha: float = 0, gamma: int = 0, draft_cost: float = 0, context: float = 0):
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


def _terms(hardware: Hardware, model: ModelShape, context: float) -> tuple[float, float, float]:
    """(a, b, k) such that t(B, T) = max(a + b * B, k * B * T) seconds."""
    a = model.weight_bytes / hardware.memory_bandwidth  # s, the weight read
    b = context * model.kv_bytes_per_token / hardware.memory_bandwidth  # s per row, its KV read
    k = 2 * model.params / hardware.peak_flops  # s per token of compute
    return a, b, k


def step_time(batch: float, tokens_per_row: int = 1, hardware: Hardware = H100_SXM, model: ModelShape = LLAMA_8B,
              context: float = 0) -> float:
    """Seconds for one target forward over ``tokens_per_row`` tokens in each of ``batch`` rows."""
    _check(batch=batch, context=context)
    a, b, k = _terms(hardware, model, context)
    return max(a + b * batch, k * batch * tokens_per_row)


def expected_tokens(alpha: float, gamma: int) -> float:
    """E, tokens a speculative step yields per row: accepted drafts plus the one the target adds."""
    _check(alpha=alpha, gamma=gamma)
    return gamma + 1.0 if alpha == 1 else (1 - alpha ** (gamma + 1)) / (1 - alpha)


def speculative_step_time(batch: float, gamma: int = 4, draft_cost: float = 0.05, hardware: Hardware = H100_SXM,
                          model: ModelShape = LLAMA_8B, context: float = 0) -> float:
    """Seconds for one speculative step: gamma draft steps of c * t(B, 1), then verify B * (gamma+1) tokens."""
    _check(gamma=gamma, draft_cost=draft_cost)
    plain = step_time(batch, 1, hardware, model, context)
    return step_time(batch, gamma + 1, hardware, model, context) + gamma * draft_cost * plain


def speculative_speedup(batch: float, alpha: float = 0.8, gamma: int = 4, draft_cost: float = 0.05,
                        hardware: Hardware = H100_SXM, model: ModelShape = LLAMA_8B, context: float = 0) -> float:
    """Plain seconds per token / speculative seconds per token (> 1: speculation helps). gamma = 0 gives 1."""
    plain = step_time(batch, 1, hardware, model, context)
    return expected_tokens(alpha, gamma) * plain / speculative_step_time(batch, gamma, draft_cost, hardware, model,
                                                                          context)


def leviathan_speedup(alpha: float, gamma: int, c: float) -> float:
    """Leviathan et al. (2023): (1 - alpha^(gamma+1)) / ((1 - alpha)(gamma c + 1)), verification free."""
    _check(draft_cost=c)
    return expected_tokens(alpha, gamma) / (gamma * c + 1)


def compute_bound_batch(gamma: int = 4, hardware: Hardware = H100_SXM, model: ModelShape = LLAMA_8B,
                        context: float = 0) -> float:
    """Batch (continuous) above which verifying gamma + 1 tokens per row is compute-bound; inf if never.

    Solves a + b * B = k * B * (gamma + 1). At context 0 and 2 bytes per parameter this is
    ridge / (gamma + 1): 295 / 5 = 59 for the reference.
    """
    _check(gamma=gamma, context=context)
    a, b, k = _terms(hardware, model, context)
    slope = k * (gamma + 1) - b
    return a / slope if slope > 0 else math.inf


def break_even_batch(alpha: float = 0.8, gamma: int = 4, draft_cost: float = 0.05, hardware: Hardware = H100_SXM,
                     model: ModelShape = LLAMA_8B, context: float = 0) -> float:
    """Batch (continuous) above which speculation is slower than plain decoding.

    0.0 if it never helps, inf if it never hurts. The speedup is E / (f + gamma c) with
    f = t(B, gamma+1) / t(B, 1), which grows with B from 1 to gamma + 1, so it crosses 1 once,
    where f = r = E - gamma c: then the verify step is compute-bound and the plain one is not,
    k * B * (gamma + 1) = r * (a + b * B).
    """
    _check(draft_cost=draft_cost, context=context)
    r = expected_tokens(alpha, gamma) - gamma * draft_cost
    if r <= 1:
        return 0.0
    if r >= gamma + 1:
        return math.inf
    a, b, k = _terms(hardware, model, context)
    slope = k * (gamma + 1) - r * b
    return r * a / slope if slope > 0 else math.inf


def best_gamma(batch: float, alpha: float = 0.8, gamma_max: int = 8, draft_cost: float = 0.05,
               hardware: Hardware = H100_SXM, model: ModelShape = LLAMA_8B, context: float = 0) -> int:
    """The gamma in 0..gamma_max with the highest modelled speedup (the smallest on a tie); 0 = off."""
    _check(gamma=gamma_max)
    return max(range(gamma_max + 1),
               key=lambda g: (speculative_speedup(batch, alpha, g, draft_cost, hardware, model, context), -g))


def speedup_table(batches, alpha: float = 0.8, gamma: int = 4, draft_cost: float = 0.05,
                  hardware: Hardware = H100_SXM, model: ModelShape = LLAMA_8B, context: float = 0) -> list[dict]:
    """One row per batch: step times (ms), expected tokens per speculative step (all rows), speedup."""
    args = (hardware, model, context)
    return [{"batch": B,
             "plain_ms": 1e3 * step_time(B, 1, *args),
             "speculative_ms": 1e3 * speculative_step_time(B, gamma, draft_cost, *args),
             "tokens_per_step": B * expected_tokens(alpha, gamma),
             "speedup": speculative_speedup(B, alpha, gamma, draft_cost, *args)} for B in batches]


def max_batch(hardware: Hardware, target: ModelShape, context: int, draft: ModelShape | None = None,
              reserve_fraction: float = 0.0) -> int:
    """Largest batch whose weights and KV caches fit in ``hardware.memory_bytes``.

    Counts the target's weights and ``context`` tokens of KV per row, plus the same for the
    draft if one is given; nothing else (no activations, logits, CUDA context or allocator
    slack): ``reserve_fraction`` of the memory is held back for those. 0 if the weights alone
    do not fit.
    """
    if not context >= 1:
        raise ValueError(f"context must be >= 1 token per row, got {context}")
    if not 0 <= reserve_fraction < 1:
        raise ValueError(f"reserve_fraction must be in [0, 1), got {reserve_fraction}")
    models = [target] + ([draft] if draft else [])
    free = hardware.memory_bytes * (1 - reserve_fraction) - sum(m.weight_bytes for m in models)  # bytes
    per_row = context * sum(m.kv_bytes_per_token for m in models)  # bytes
    if per_row == 0:
        raise ValueError("the models have no KV bytes per token, so the batch is unbounded")
    return max(0, math.floor(free / per_row))
