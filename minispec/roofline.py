"""Predict decode and speculative step times per operator from the roofline of the hardware.

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

A tree step (SpecInfer, Medusa, EAGLE-2, Sequoia) verifies T draft nodes per row in one pass: t(B, T + 1), the
root (the last accepted token) included. It is drafted in one pass per level, pass i over the w_i nodes of depth
i - 1 that get children, each c * t(B, w_i) (or a draft shape's own step). From an acceptance profile by child
rank (Sequoia's positional acceptance vector: P(the accepted child is the one of rank k)), a node is accepted
with the product of the profile along its path, and E = 1 + the sum over nodes; the best tree of n nodes is the
n most probable nodes. At batch 1 verification is free, so 64 nodes raise E from 3.4 (a chain of 4) to 7.0; but
every row verifies every node, so the weights turn compute-bound at B (T + 1) = 295 tokens, about 5 rows for
64 nodes, and the best budget falls to a chain and then to 0 (:func:`best_tree_budget`).

A draft's cost includes its LM head, vocab x hidden: most of a one-layer EAGLE head on a large vocabulary
(68 % of one on Llama-3-8B, 96 % on Gemma-3-270M). A hot vocabulary (FR-Spec, Zhao et al. 2025; EAGLE-3's 32k
draft vocabulary) keeps only N rows, and ``ModelShape.hot_vocab`` reads only N of a full head's rows.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
from collections.abc import Mapping
from dataclasses import KW_ONLY, dataclass
from functools import lru_cache
from types import MappingProxyType

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
    vocab: int = 0  # rows of the LM head (the vocabulary it scores), counted in params; 0 = not given
    hidden: int = 0  # the LM head's columns (the model width)
    hot_vocab: int = 0  # rows of the LM head a step reads (a hot vocabulary, FR-Spec); 0 = all ``vocab`` rows
    name: str = ""

    def __post_init__(self):
        if not self.params > 0 or not self.bytes_per_param > 0 or not self.bytes_per_kv >= 0:
            raise ValueError(f"params and bytes_per_param must be positive, bytes_per_kv >= 0: {self}")
        if min(self.layers, self.heads, self.kv_heads, self.head_dim, self.vocab, self.hidden, self.hot_vocab) < 0:
            raise ValueError(f"layers, heads, kv_heads, head_dim, vocab, hidden and hot_vocab must be >= 0: {self}")
        if self.vocab * self.hidden > self.params:
            raise ValueError(f"the LM head ({self.vocab} x {self.hidden}) is larger than params={self.params:.4g}")
        if self.hot_vocab and not (self.hidden and self.hot_vocab <= self.vocab):
            raise ValueError(f"hot_vocab must be <= vocab and needs hidden > 0, got hot_vocab={self.hot_vocab}, "
                             f"vocab={self.vocab}, hidden={self.hidden}")
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
    def lm_head_params(self) -> int:
        """Parameters of the LM head: vocab x hidden (0 where the shape does not give them)."""
        return self.vocab * self.hidden

    @property
    def _unread_head_params(self) -> int:
        """Rows of the LM head outside the hot vocabulary, which no step reads or multiplies."""
        return (self.vocab - self.hot_vocab) * self.hidden if self.hot_vocab else 0

    @property
    def active_params(self) -> float:
        """Parameters one token multiplies: all but the experts it is not routed to and the head rows not hot."""
        active = self.params - self._unread_head_params
        if self.moe is None:
            return active
        return active - (self.moe.experts - self.moe.experts_per_token) * self.moe.expert_params

    def weight_bytes_read(self, tokens: float) -> float:
        """Bytes of weights a step over ``tokens`` tokens reads: all but the head rows not hot, and for an MoE only
        the experts touched."""
        read = self.params - self._unread_head_params
        if self.moe is not None:
            untouched = self.moe.experts - self.moe.experts_touched(tokens)  # experts per layer nobody routed to
            read -= untouched * self.moe.expert_params
        return read * self.bytes_per_param

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
                   vocab=cfg.vocab_size, hidden=cfg.hidden_size, name=f"{params / 1e9:.3g}B")

    @classmethod
    def from_model(cls, model) -> ModelShape:
        """From a loaded minispec ``Model``: its config; weights and KV cache in its dtype."""
        return cls.from_config(model.config, model.dtype.itemsize)


def eagle_head_shape(target, hot_vocab: int | None = None, *, layers: int = 1, fusion: str = "eagle1",
                     bytes_per_param: float = 2, bytes_per_kv: float | None = None, name: str = "") -> ModelShape:
    """The shape of an EAGLE-style draft head on ``target`` (a config.json dict, a transformers config or a
    minispec ``ModelConfig``): ``layers`` decoder layers of the target's shape, a fusion matmul, a final norm, and
    an LM head of ``hot_vocab`` rows (None = the target's whole vocabulary) x hidden.

    Per layer, as a Llama layer counts it (C = hidden, F = FFN width, D = head_dim): attention C (heads +
    2 kv_heads) D + heads D C, a gated MLP 3 C F and 2 norms. The fusion:

    - ``"eagle1"``: the target's last hidden state beside the next token's embedding, 2 C x C (EAGLE-1,
      Li et al. 2024; its bias of C is left out);
    - ``"eagle3"``: three target layers' hidden states, 3 C x C; the first layer's Q, K and V then read the
      embedding and the fused state side by side (2 C inputs: C (heads + 2 kv_heads) D more) and it has one
      more norm, as SGLang builds it (python/sglang/srt/models/llama_eagle3.py).

    The embedding is the target's and a step reads B rows of it, so it costs nothing here. The head's rows are
    stored and read: ``vocab`` = ``hot_vocab``, as an EAGLE-3 checkpoint stores its 32k-row head and maps it back
    to target ids. A head that keeps every row but reads the hot ones is ``dataclasses.replace(shape,
    hot_vocab=N)`` on a full-vocabulary head: the same read, more memory. A head shared with a tied target (SGLang
    reuses the embedding then) is still read every step, and counted in ``weight_bytes`` a second time.
    """
    get = target.get if isinstance(target, Mapping) else (lambda k, d=None: getattr(target, k, d))
    C, F, V = get("hidden_size"), get("intermediate_size"), get("vocab_size")
    H = get("num_attention_heads")
    K, D = get("num_key_value_heads") or H, get("head_dim") or C // H
    if not (layers >= 1 and layers == int(layers)):
        raise ValueError(f"layers must be an integer >= 1, got {layers}")
    if fusion not in ("eagle1", "eagle3"):
        raise ValueError(f"fusion must be 'eagle1' or 'eagle3', got {fusion!r}")
    if hot_vocab is not None and not 1 <= hot_vocab <= V:
        raise ValueError(f"hot_vocab must be in 1..{V} (the target's vocabulary), got {hot_vocab}")
    rows = hot_vocab or V
    qkv = C * (H + 2 * K) * D  # Q, K, V projections from H inputs
    layer = qkv + H * D * C + 3 * C * F + 2 * C  # attention, gated MLP, 2 norms
    fuse = 2 * C * C if fusion == "eagle1" else 3 * C * C + qkv + C  # EAGLE-3: 3H -> H, 2H-wide QKV, hidden_norm
    params = layers * layer + fuse + C + rows * C  # + final norm + LM head
    return ModelShape(params, bytes_per_param, layers=layers, heads=H, kv_heads=K, head_dim=D,
                      bytes_per_kv=bytes_per_param if bytes_per_kv is None else bytes_per_kv, vocab=rows, hidden=C,
                      name=name or f"{fusion.upper()} head, {layers} layer{'s' * (layers > 1)}, {rows} vocab")


# Presets named by their public config.json files; BF16 weights and KV cache.
# meta-llama/Meta-Llama-3-8B: 32 layers, 32 heads, 8 KV heads, head dim 128; params rounded to the
# reference's 8e9 (the checkpoint has 8.03e9). KV: 2 x 32 x 8 x 128 x 2 B = 131,072 B/token.
LLAMA_8B = ModelShape(8e9, 2, layers=32, heads=32, kv_heads=8, head_dim=128, vocab=128256, hidden=4096,
                      name="Llama-3-8B")
# meta-llama/Llama-3.2-1B: 16 layers, 32 heads, 8 KV heads, head dim 64, embeddings tied (1.24e9 params).
# KV: 2 x 16 x 8 x 64 x 2 B = 32,768 B/token.
LLAMA_1B = ModelShape(1.24e9, 2, layers=16, heads=32, kv_heads=8, head_dim=64, vocab=128256, hidden=2048,
                      name="Llama-3.2-1B")
# meta-llama/Meta-Llama-3-70B: hidden 8192, FFN 28672, 80 layers, 64 heads, 8 KV heads, head dim 128,
# vocab 128256, untied: 80 x (150,994,944 attention + 704,643,072 MLP + 16,384 norms) + 2 x 1,050,673,152
# embeddings + 8,192 = 70,553,706,496 params. KV: 2 x 80 x 8 x 128 x 2 B = 327,680 B/token.
LLAMA_70B = ModelShape(70_553_706_496, 2, layers=80, heads=64, kv_heads=8, head_dim=128, vocab=128256, hidden=8192,
                       name="Llama-3-70B")
# mistralai/Mixtral-8x7B-v0.1: hidden 4096, FFN 14336, 32 layers, 32 heads, 8 KV heads, head dim 128,
# vocab 32000, 8 experts, 2 per token. One expert: 3 x 4096 x 14336 x 32 layers = 5,637,144,576 params;
# shared: 1,342,177,280 attention + 262,144,000 embeddings + 1,048,576 routers + 266,240 norms
# = 1,605,636,096. Total 46,702,792,704 (46.7e9); active per token 12,879,925,248 (12.9e9).
MIXTRAL_8X7B = ModelShape(46_702_792_704, 2, layers=32, heads=32, kv_heads=8, head_dim=128,
                          moe=MoE(experts=8, experts_per_token=2, expert_params=5_637_144_576), vocab=32000,
                          hidden=4096, name="Mixtral-8x7B")

# Three vocabularies for the cost of a draft's LM head, each with its config.json's shape keys.
# meta-llama/Meta-Llama-3-8B (as LLAMA_8B): 128,256 x 4096, untied.
LLAMA3_8B_CONFIG = MappingProxyType(dict(
    vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
    num_key_value_heads=8, head_dim=128, tie_word_embeddings=False))
# HuggingFaceTB/SmolLM2-135M: 30 layers of 576, FFN 1536, 9 heads, 3 KV heads, head dim 64, tied 49,152 x 576
# embedding (21 % of it): 30 x (884,736 attention + 2,654,208 MLP + 1,152 norms) + 28,311,552 + 576 = 134,515,008.
SMOLLM2_135M_CONFIG = MappingProxyType(dict(
    vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
    num_key_value_heads=3, head_dim=64, tie_word_embeddings=True))
SMOLLM2_135M = ModelShape(134_515_008, 2, layers=30, heads=9, kv_heads=3, head_dim=64, vocab=49152, hidden=576,
                          name="SmolLM2-135M")
# google/gemma-3-270m config.json (Gemma3ForCausalLM, not a Llama: a shape only), as copied in
# safety-research/circuit-tracer tests/test_attributions_gemma3_nnsight.py: hidden 640, FFN 2048, 18 layers,
# 4 heads, 1 KV head, head dim 256, tied 262,144 x 640 embedding (63 % of it). Per layer 1,638,400 attention
# + 3,932,160 MLP + 2,560 (4 norms) + 512 (QK norms) = 5,573,632; x 18 + 167,772,160 + 640 = 268,098,176, as
# keras-team/keras-hub gemma3_presets.py gives "gemma3_270m". 15 of its 18 layers attend over a 512-token window:
# the KV read here counts every layer in full, too much past 512 tokens of context.
GEMMA3_270M_CONFIG = MappingProxyType(dict(
    vocab_size=262144, hidden_size=640, intermediate_size=2048, num_hidden_layers=18, num_attention_heads=4,
    num_key_value_heads=1, head_dim=256, tie_word_embeddings=True))
GEMMA3_270M = ModelShape(268_098_176, 2, layers=18, heads=4, kv_heads=1, head_dim=256, vocab=262144, hidden=640,
                         name="Gemma-3-270M")
# An EAGLE-3 head on the 8B reference: one Llama-3-8B layer with 2H-wide Q, K, V, the 3H -> H fusion and a
# 32,000-row head (the draft_vocab_size of EAGLE-3's Llama-3.1-8B configs): 218,112,000 layer + 75,501,568 fusion
# (50,331,648 + 25,165,824 + 4,096) + 4,096 norm + 131,072,000 head = 424,689,664 params; c = 0.053 at batch 1.
EAGLE_8B = eagle_head_shape(LLAMA3_8B_CONFIG, 32000, fusion="eagle3", name="EAGLE-3 head on Llama-3-8B, 32k vocab")
MODEL_SHAPES = {"llama-8b": LLAMA_8B, "llama-1b": LLAMA_1B, "llama-70b": LLAMA_70B, "mixtral-8x7b": MIXTRAL_8X7B,
                "smollm2-135m": SMOLLM2_135M, "gemma3-270m": GEMMA3_270M, "eagle-8b": EAGLE_8B}


def check_arguments(batch: float = 1, alpha: float = 0, gamma: int = 0, draft_cost: float = 0, context: float = 0,
                    draft: ModelShape | None = None, draft_kv_window: int | None = None) -> None:
    """Raise ValueError, naming the argument, for a batch < 1, an alpha outside [0, 1], a gamma that is not an
    integer >= 0, a negative c or context, or a draft KV window without a draft shape. Defaults pass."""
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


def vllm_config_from_speedup(speedup, largest_batch: int, gamma_max: int = 8) -> dict:
    """vLLM's dynamic speculative decoding keys from any ``speedup(batch, gamma) -> float``.

    Each batch 1..``largest_batch`` gets the gamma in 1..gamma_max with the highest speedup (the
    smallest on a tie) if that speedup exceeds 1, else 0; neighbouring batches with the same K merge
    into one inclusive range [start_bs, end_bs, K]. vLLM applies the last range's K to larger batches.
    ``num_speculative_tokens`` is the largest K used (vLLM's maximum draft window; it must be >= 1).
    """
    if not largest_batch >= 1 or largest_batch != int(largest_batch):
        raise ValueError(f"largest_batch must be an integer >= 1, got {largest_batch}")
    check_arguments(gamma=gamma_max)
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


# Trees: T draft nodes per row verified in one pass (SpecInfer, Medusa, EAGLE-2, Sequoia).


@dataclass(frozen=True)
class TreeShape:
    """Draft nodes hanging from the root, the last accepted token (the root is not a node).

    ``parents[i]``: node i's parent, -1 for the root, else an earlier node. ``ranks[i]``: node i's place among its
    siblings in the order verification tries them, 0 first; a node's children hold ranks 0, 1, ... with no gap.
    ``paths`` gives each node as the ranks from the root down (Medusa's and SpecInfer's form: (0,), (0, 0), (1,)
    ...). A chain of gamma drafts is ``TreeShape.chain(gamma)``: gamma nodes, depth gamma, every rank 0.
    """

    parents: tuple[int, ...] = ()
    ranks: tuple[int, ...] = ()

    def __post_init__(self):
        object.__setattr__(self, "parents", tuple(self.parents))  # frozen: lists in, tuples kept
        object.__setattr__(self, "ranks", tuple(self.ranks))
        if len(self.parents) != len(self.ranks):
            raise ValueError(f"parents and ranks must have one entry per node, got {len(self.parents)} and "
                             f"{len(self.ranks)}")
        children: dict[int, list[int]] = {}
        for i, (parent, rank) in enumerate(zip(self.parents, self.ranks)):
            if not -1 <= parent < i:
                raise ValueError(f"node {i}'s parent must be -1 (the root) or an earlier node, got {parent}")
            children.setdefault(parent, []).append(rank)
        for parent, ranks in children.items():
            if sorted(ranks) != list(range(len(ranks))):
                raise ValueError(f"the children of {'the root' if parent < 0 else f'node {parent}'} must hold ranks "
                                 f"0..{len(ranks) - 1} once each, got {sorted(ranks)}")

    @classmethod
    def chain(cls, gamma: int) -> TreeShape:
        """gamma drafts in a row: what plain speculative decoding verifies."""
        check_arguments(gamma=gamma)
        return cls(tuple(range(-1, gamma - 1)), (0,) * gamma)

    @classmethod
    def from_paths(cls, paths) -> TreeShape:
        """From rank paths, e.g. [(0,), (1,), (0, 0)]: every path's prefix must be a path too."""
        paths = sorted({tuple(p) for p in paths}, key=lambda p: (len(p), p))
        if () in paths:
            raise ValueError("the root () is not a node: paths start at a child of the root, e.g. (0,)")
        index = {p: i for i, p in enumerate(paths)}
        missing = [p for p in paths if len(p) > 1 and p[:-1] not in index]
        if missing:
            raise ValueError(f"every path needs its parent path, missing for {missing[0]}")
        return cls(tuple(index[p[:-1]] if len(p) > 1 else -1 for p in paths), tuple(p[-1] for p in paths))

    @classmethod
    def from_branching(cls, branching) -> TreeShape:
        """A static tree: every node at depth d (the root at 0) has ``branching[d]`` children."""
        if any(b < 1 or b != int(b) for b in branching):
            raise ValueError(f"branching must be integers >= 1, got {tuple(branching)}")
        parents, ranks, level = [], [], [-1]
        for b in branching:
            nxt = []
            for parent in level:
                for rank in range(b):
                    nxt.append(len(parents))
                    parents.append(parent)
                    ranks.append(rank)
            level = nxt
        return cls(tuple(parents), tuple(ranks))

    @property
    def nodes(self) -> int:
        """T, draft nodes per row (the root not counted)."""
        return len(self.parents)

    @property
    def depths(self) -> tuple[int, ...]:
        """Each node's depth: 1 for the root's children."""
        depths: list[int] = []
        for parent in self.parents:
            depths.append(1 + (depths[parent] if parent >= 0 else 0))
        return tuple(depths)

    @property
    def depth(self) -> int:
        """The longest path: draft passes to build the tree, and the most tokens one step can accept (+ 1)."""
        return max(self.depths, default=0)

    @property
    def paths(self) -> tuple[tuple[int, ...], ...]:
        """Each node as the ranks from the root down to it."""
        paths: list[tuple[int, ...]] = []
        for parent, rank in zip(self.parents, self.ranks):
            paths.append((paths[parent] if parent >= 0 else ()) + (rank,))
        return tuple(paths)

    def _children_by_depth(self) -> list[dict[int, int]]:
        """For depth 0 (the root) .. depth - 1: {parent: its number of children}."""
        depths, levels = self.depths, [{} for _ in range(self.depth)]
        for parent in self.parents:
            level = levels[depths[parent] if parent >= 0 else 0]
            level[parent] = level.get(parent, 0) + 1
        return levels

    @property
    def expanded(self) -> tuple[int, ...]:
        """Nodes with children at depth 0 (the root) .. depth - 1: the tokens per row of each draft pass."""
        return tuple(len(level) for level in self._children_by_depth())

    @property
    def branching(self) -> tuple[int, ...]:
        """The most children of one node at depth 0 (the root) .. depth - 1; a static tree's ``branching``."""
        return tuple(max(level.values()) for level in self._children_by_depth())

    @property
    def is_chain(self) -> bool:
        """One path: every node the first child of its parent."""
        return not any(self.ranks)


def default_profile(alpha: float, ranks: int = 64) -> tuple[float, ...]:
    """The acceptance profile assumed from alpha alone: the child of rank k is the accepted one with probability
    alpha (1 - alpha)^k, the chance that k tries fail and the next one succeeds if each succeeds with alpha.

    Rank 0 gets alpha, so a chain keeps Leviathan's E. It is a model, not a measurement: under exact sampling a
    rejection removes the rejected token's mass from p, and deterministic top-k children are accepted with
    p(x_k), so real profiles fall faster or slower than this. Measure the pair's own (the share of steps whose
    accepted child at a node had rank k: Sequoia's positional acceptance vector) and pass it as ``profile``.
    """
    check_arguments(alpha=alpha)
    return tuple(alpha * (1 - alpha) ** k for k in range(ranks))


def _profile_rows(alpha: float, profile, ranks: int) -> tuple[tuple[float, ...], ...]:
    """The profile as rows by depth, checked; the default one from alpha if ``profile`` is None."""
    if profile is None:
        return (default_profile(alpha, max(ranks, 1)),)
    rows = list(profile)
    rows = [rows] if rows and not hasattr(rows[0], "__len__") else rows
    rows = tuple(tuple(float(p) for p in row) for row in rows)
    if not rows or not all(rows):
        raise ValueError(f"profile must be a non-empty list of probabilities by rank, or one such list per depth, "
                         f"got {profile!r}")
    for row in rows:
        if not all(0 <= p <= 1 for p in row) or sum(row) > 1 + 1e-9:
            raise ValueError(f"a profile row gives disjoint events' probabilities (which child is accepted): each "
                             f"in [0, 1] and their sum <= 1, got {row}")
    return rows


def _rank_probability(rows, depth: int, rank: int) -> float:
    """P(the accepted child of a node at ``depth`` (the root at 0) is its child of this rank); rows past the last
    repeat it, ranks past a row's end are never accepted."""
    row = rows[min(depth, len(rows) - 1)]
    return row[rank] if rank < len(row) else 0.0


def tree_expected_tokens(tree: TreeShape, alpha: float = 0.8, *, profile=None) -> float:
    """E, tokens a tree step yields per row: 1 + the sum over nodes of P(the node is reached and accepted).

    A node is accepted when each node on its path is the accepted child of its parent, so its probability is the
    product of ``profile[k]`` over the ranks k of its path (Sequoia, Chen et al. 2024, arXiv 2402.12374).
    ``profile``: P(the accepted child is the one of rank k), one list, or one list per depth (row d for the
    children of depth-d nodes, the root's at 0; the last row repeats); None = :func:`default_profile` (alpha).
    A chain with profile (alpha,) gives Leviathan's E = (1 - alpha^(gamma+1)) / (1 - alpha).
    """
    rows = _profile_rows(alpha, profile, max(tree.ranks, default=0) + 1)
    reached, depths = [], tree.depths
    for parent, rank, depth in zip(tree.parents, tree.ranks, depths):
        reached.append((reached[parent] if parent >= 0 else 1.0) * _rank_probability(rows, depth - 1, rank))
    return 1.0 + sum(reached)


def _greedy_tree(rows, budget: int, max_depth: int) -> tuple[tuple[int, ...], tuple[int, ...], tuple[float, ...]]:
    """Nodes in the order best-first search takes them from the infinite tree: (parents, ranks, P(reached))."""
    heap = [(-_rank_probability(rows, 0, 0), 1, 0, -1, 0, 1.0)]  # (-P, depth, tie, parent, rank, P(parent))
    parents, ranks, reached, tie = [], [], [], 0
    while heap and len(parents) < budget:
        neg, depth, _, parent, rank, above = heapq.heappop(heap)
        if neg >= 0:  # the best left is never accepted
            break
        node = len(parents)
        parents.append(parent)
        ranks.append(rank)
        reached.append(-neg)
        sibling = above * _rank_probability(rows, depth - 1, rank + 1)
        child = -neg * _rank_probability(rows, depth, 0)
        for p, d, up, r, a in ((sibling, depth, parent, rank + 1, above), (child, depth + 1, node, 0, -neg)):
            if p > 0 and d <= max_depth:
                tie += 1
                heapq.heappush(heap, (-p, d, tie, up, r, a))
    return tuple(parents), tuple(ranks), tuple(reached)


def _check_tree_arguments(budgets, max_depth) -> tuple[int, ...]:
    budgets = tuple(budgets)
    if not budgets or any(n < 0 or n != int(n) for n in budgets):
        raise ValueError(f"budgets (draft nodes per row) must be integers >= 0, at least one, got {budgets}")
    if max_depth is not None and not (max_depth >= 1 and max_depth == int(max_depth)):
        raise ValueError(f"max_depth must be an integer >= 1 (or None), got {max_depth}")
    return tuple(sorted({int(n) for n in budgets}))


def best_tree(budget: int, alpha: float = 0.8, *, profile=None, max_depth: int | None = None) -> TreeShape:
    """The tree of at most ``budget`` nodes (and ``max_depth`` levels) with the largest expected accepted length.

    Every node adds its probability of being reached and accepted, and a node's is at most its parent's (profile
    entries <= 1) and at most its elder sibling's (a profile non-increasing in rank), so the best tree of n nodes
    is the n most probable nodes of the infinite tree: taking them best first keeps every parent and elder sibling.
    Sequoia's dynamic programme covers profiles that rise with rank; this function refuses them. Nodes never
    accepted are not added, so the tree can have fewer than ``budget`` nodes. Nodes come in the order taken:
    by falling probability, parents first; ties go to the shallower node.
    """
    _check_tree_arguments((budget,), max_depth)
    rows = _profile_rows(alpha, profile, budget)
    if any(a < b for row in rows for a, b in zip(row, row[1:])):
        raise ValueError(f"best_tree needs a profile non-increasing in rank (sort it, or use Sequoia's dynamic "
                         f"programme), got {profile}")
    parents, ranks, _ = _greedy_tree(rows, budget, max_depth or max(budget, 1))
    return TreeShape(parents, ranks)


@lru_cache(maxsize=32)
def _tree_candidates(rows, max_budget: int, max_depth: int) -> dict[int, tuple]:
    """For each budget 1..max_budget, the best trees under each depth cap 1..max_depth, distinct:
    {budget: ((E, nodes, expanded, tree), ...)}."""
    candidates: dict[int, dict] = {n: {} for n in range(1, max_budget + 1)}
    for cap in range(1, max_depth + 1):
        parents, ranks, reached = _greedy_tree(rows, max_budget, cap)
        for n in range(1, max_budget + 1):
            k = min(n, len(parents))
            tree = TreeShape(parents[:k], ranks[:k])
            candidates[n].setdefault(tree, (1.0 + sum(reached[:k]), k, tree.expanded, tree))
    return {n: tuple(found.values()) for n, found in candidates.items()}


def tree_step_time(batch: float, nodes: int, hardware: Hardware = H100_SXM, model: ModelShape = LLAMA_8B,
                   context: float = 0) -> float:
    """Seconds for the target to verify ``nodes`` draft nodes per row: ``step_time(batch, nodes + 1)``.

    One forward reads the weights once and runs T + 1 query tokens per row (the root, the last accepted token,
    whose logits judge the first level, plus the T nodes), each attending to the row's ``context`` tokens of KV
    cache; the attention of nodes to their ancestors inside the tree (at most T + 1 keys) is left out, as is a
    prefill's causal half. A chain of gamma is ``nodes = gamma``: the verify step of :func:`speculative_step_time`.
    """
    check_arguments(gamma=nodes)
    return step_time(batch, nodes + 1, hardware, model, context)


def tree_speculative_step_time(batch: float, tree: TreeShape, draft_cost: float = 0.05,
                               hardware: Hardware = H100_SXM, model: ModelShape = LLAMA_8B, context: float = 0, *,
                               draft: ModelShape | None = None, draft_kv_window: int | None = None) -> float:
    """Seconds for one tree step: ``tree.depth`` draft passes, then verify ``tree.nodes`` per row.

    Draft pass i runs the ``tree.expanded[i]`` nodes of depth i that get children (the root alone in the first);
    a static tree expands every node with children, EAGLE-2 its top-k frontier. A pass over w tokens per row costs
    c * t(B, w), or, given a ``draft`` shape, its own ``step_time(B, w)`` at min(context, ``draft_kv_window``).
    A chain gives :func:`speculative_step_time`.
    """
    check_arguments(draft_cost=draft_cost, draft=draft, draft_kv_window=draft_kv_window)
    drafting = sum(_draft_step_time(batch, hardware, model, context, draft_cost, draft, draft_kv_window, w)
                   for w in tree.expanded)
    return tree_step_time(batch, tree.nodes, hardware, model, context) + drafting


def tree_speedup(batch: float, tree: TreeShape, alpha: float = 0.8, draft_cost: float = 0.05,
                 hardware: Hardware = H100_SXM, model: ModelShape = LLAMA_8B, context: float = 0, *, profile=None,
                 draft: ModelShape | None = None, draft_kv_window: int | None = None) -> float:
    """Plain seconds per token / tree-speculative seconds per token; the empty tree gives 1."""
    if not tree.nodes:
        return 1.0
    spec = tree_speculative_step_time(batch, tree, draft_cost, hardware, model, context, draft=draft,
                                      draft_kv_window=draft_kv_window)
    return tree_expected_tokens(tree, alpha, profile=profile) * step_time(batch, 1, hardware, model, context) / spec


_BUDGETS = tuple(range(65))  # 0 (off), 1 (a chain of one) .. 64 nodes per row


def _best_tree_at(batch, alpha, budgets, draft_cost, hardware, model, context, profile, draft, draft_kv_window,
                  max_depth) -> tuple[float, int, tuple | None]:
    """(speedup, budget, (E, nodes, expanded, tree)) of the fastest tree over ``budgets`` and depth caps 1..
    max_depth; (1.0, 0, None) if none beats plain decoding. Ties go to the smaller budget, then the shallower cap."""
    check_arguments(batch=batch, alpha=alpha, draft_cost=draft_cost, context=context, draft=draft,
                    draft_kv_window=draft_kv_window)
    budgets = _check_tree_arguments(budgets, max_depth)
    max_depth = max_depth or max(budgets[-1], 1)
    rows = _profile_rows(alpha, profile, budgets[-1])
    if any(a < b for row in rows for a, b in zip(row, row[1:])):
        raise ValueError(f"the tree search needs a profile non-increasing in rank, got {profile}")
    candidates = _tree_candidates(rows, budgets[-1], max_depth) if budgets[-1] else {}
    plain = step_time(batch, 1, hardware, model, context)
    verify = lru_cache(lambda T: step_time(batch, T, hardware, model, context))
    drafting = lru_cache(lambda w: _draft_step_time(batch, hardware, model, context, draft_cost, draft,
                                                    draft_kv_window, w))
    best = (1.0, 0, None)
    for n in (n for n in budgets if n):
        for found in candidates[n]:
            E, nodes, expanded, _ = found
            speedup = E * plain / (verify(nodes + 1) + sum(drafting(w) for w in expanded))
            if speedup > best[0]:
                best = (speedup, n, found)
    return best


def best_tree_budget(batch: float, alpha: float = 0.8, budgets=_BUDGETS, draft_cost: float = 0.05,
                     hardware: Hardware = H100_SXM, model: ModelShape = LLAMA_8B, context: float = 0, *,
                     profile=None, draft: ModelShape | None = None, draft_kv_window: int | None = None,
                     max_depth: int = 12) -> int:
    """The draft nodes per row, out of ``budgets``, whose best tree runs fastest at this batch; 0 = plain decoding.

    For each budget n and depth cap 1..``max_depth``, the tree is :func:`best_tree` (the n most probable nodes
    under the ``profile``, the default one from alpha if None); its speed is :func:`tree_speedup` (verify n + 1
    tokens per row, one draft pass per level). The fastest wins if it beats plain decoding; ties go to the smaller
    budget. At small batch verification is free and the largest tree wins; once B (n + 1) tokens cross the ridge
    every node costs compute, the budget falls to a chain (its best tree has one path) and then to 0.
    :func:`tree_speedup_table` gives the tree, its depth and its tokens per step.
    """
    return _best_tree_at(batch, alpha, budgets, draft_cost, hardware, model, context, profile, draft,
                         draft_kv_window, max_depth)[1]


def tree_speedup_table(batches, alpha: float = 0.8, budgets=_BUDGETS, draft_cost: float = 0.05,
                       hardware: Hardware = H100_SXM, model: ModelShape = LLAMA_8B, context: float = 0, *,
                       profile=None, draft: ModelShape | None = None, draft_kv_window: int | None = None,
                       max_depth: int = 12) -> list[dict]:
    """One row per batch: the best budget (:func:`best_tree_budget`), its tree's nodes, depth, branching per depth
    and whether it is a chain, tokens per step per row (E), the speedup, and the tree itself (None when off)."""
    rows = []
    for B in batches:
        speedup, n, found = _best_tree_at(B, alpha, budgets, draft_cost, hardware, model, context, profile, draft,
                                          draft_kv_window, max_depth)
        tree = found[3] if found else TreeShape()
        rows.append({"batch": B, "budget": n, "nodes": tree.nodes, "depth": tree.depth, "branching": tree.branching,
                     "chain": bool(n) and tree.is_chain, "tokens_per_step": found[0] if found else 1.0,
                     "speedup": speedup, "tree": found[3] if found else None})
    return rows


def sglang_eagle_args(tree: TreeShape) -> dict:
    """SGLang's EAGLE server arguments that can build ``tree``: depth, top-k, and nodes verified with the root.

    - ``speculative_num_steps``: draft passes = the tree's depth;
    - ``speculative_eagle_topk``: children per node and frontier width per pass, so the most of either;
    - ``speculative_num_draft_tokens``: tokens verified per row, the root included: nodes + 1. SGLang keeps the
      ``num_verify_tokens - 1`` best-scored draft tokens and puts the verified token in front of them
      (``build_tree_kernel_efficient_preprocess``, python/sglang/srt/speculative/build_eagle_tree.py), and with
      top-k 1 it sets num_draft_tokens = num_steps + 1 (docs/advanced_features/speculative_decoding.md).

    SGLang then picks its own best nodes from the draft's scores; these settings give it room for this tree.
    """
    if not tree.nodes:
        raise ValueError("an empty tree is plain decoding: launch SGLang without --speculative-algorithm")
    return {"speculative_num_steps": tree.depth,
            "speculative_eagle_topk": max(max(tree.branching), max(tree.expanded)),
            "speculative_num_draft_tokens": tree.nodes + 1}


def sglang_speculative_config(alpha: float = 0.8, budgets=_BUDGETS, draft_cost: float = 0.05,
                              hardware: Hardware = H100_SXM, model: ModelShape = LLAMA_8B, context: float = 0, *,
                              profile=None, draft: ModelShape | None = None, draft_kv_window: int | None = None,
                              max_depth: int = 12, usable_fraction: float = 0.9,
                              largest_batch: int | None = None) -> dict:
    """The modelled best tree per batch as SGLang's EAGLE arguments (JSON-ready), beside vLLM's table.

    ``{"server_args_per_batch_size": [[start_bs, end_bs, args], ...]}``: inclusive ranges from batch 1 to
    ``largest_batch``, neighbours with the same arguments merged; ``args`` is :func:`sglang_eagle_args` of the
    best tree, or ``{}`` where plain decoding is fastest (launch without speculation). SGLang takes the three
    arguments once per server (its ``--speculative-adaptive`` mode moves only num_steps, with top-k 1), so pick
    the range of the batch the server will run at (``--speculative-adaptive``: adaptive_spec_params.py in
    python/sglang/srt/speculative/). ``largest_batch``: by default the largest batch that fits in
    memory (:func:`max_batch`), or, where a row needs no memory (context 0), the first batch at which no tree
    pays, found by doubling and bisection (which assumes, as the tests check, that the budget never rises with
    batch there).
    """
    args = (alpha, budgets, draft_cost, hardware, model, context, profile, draft, draft_kv_window, max_depth)
    if largest_batch is None:
        largest_batch = max_batch(hardware, model, context, draft, usable_fraction, draft_kv_window=draft_kv_window)
        if largest_batch == 0:
            raise ValueError(f"the weights do not fit in {usable_fraction:.0%} of {hardware.name}'s memory")
        if largest_batch == math.inf:
            pays = lambda B: _best_tree_at(B, *args)[1] > 0  # noqa: E731
            lo, hi = 0, 1
            while pays(hi):
                lo, hi = hi, 2 * hi
                if hi > 2 ** 24:
                    raise ValueError("a tree pays at every batch and a row needs no memory: pass largest_batch")
            while hi - lo > 1:  # the first batch that does not pay is in (lo, hi]
                mid = (lo + hi) // 2
                lo, hi = (mid, hi) if pays(mid) else (lo, mid)
            largest_batch = hi
    if not largest_batch >= 1 or largest_batch != int(largest_batch):
        raise ValueError(f"largest_batch must be an integer >= 1, got {largest_batch}")
    ranges: list[list] = []
    for B in range(1, int(largest_batch) + 1):
        found = _best_tree_at(B, *args)[2]
        settings = sglang_eagle_args(found[3]) if found else {}
        if ranges and ranges[-1][2] == settings:
            ranges[-1][1] = B
        else:
            ranges.append([B, B, settings])
    return {"server_args_per_batch_size": ranges}


# The LM head in a draft's cost: c of an EAGLE-style head against the vocabulary it scores.

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
