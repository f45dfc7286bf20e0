"""What the cost model knows of a model: parameters, layers, heads, KV bytes, experts, LM head and presets.

A :class:`ModelShape` is read from a config (:meth:`ModelShape.from_config`) or named (``MODEL_SHAPES``);
:func:`eagle_head_shape` counts a one-layer feature draft; :func:`quantized` stores weights in fewer bits.
Each preset cites the public config.json it comes from. The model they feed is in :mod:`minispec.roofline`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import KW_ONLY, dataclass
from types import MappingProxyType


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
            from minispec.model.config import config_from_hf

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


def quantized(model: ModelShape, weight_bits: float) -> ModelShape:
    """The same shape with ``weight_bits`` bits per weight (e.g. 4 for W4A16); the KV cache keeps its dtype."""
    return dataclasses.replace(model, bytes_per_param=weight_bits / 8, name=f"{model.name} W{weight_bits:g}")
