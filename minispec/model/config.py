"""A decoder's shape as a frozen config, read from Hugging Face's config.json and weight names.

:class:`ModelConfig` holds what :class:`~minispec.model.llama.Model` needs (field names follow Hugging
Face's); :func:`config_from_hf` reads a Llama, Mistral or Qwen2 config; :func:`from_hf_state_dict` and
:func:`to_hf_state_dict` convert between Hugging Face's weight names and this package's fused layout
(q/k/v are one matmul, ``wqkv``; gate/up are one, ``w13``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM")
_MAX_POSITIONS = {"LlamaForCausalLM": 2048, "MistralForCausalLM": 4096 * 32, "Qwen2ForCausalLM": 32768}  # defaults


@dataclass(frozen=True)
class ModelConfig:
    """Shape and numerics of one decoder; field names follow Hugging Face's configs."""

    vocab_size: int
    hidden_size: int  # C
    intermediate_size: int  # F, the SwiGLU width
    num_hidden_layers: int
    num_attention_heads: int  # H
    num_key_value_heads: int  # K; H % K == 0 (grouped-query attention)
    head_dim: int  # D
    max_position_embeddings: int = 2048  # longest prompt + generation the model accepts
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_type: str = "default"  # "default", "linear" or "llama3"
    rope_factor: float = 1.0  # "linear" and "llama3"
    rope_low_freq_factor: float = 1.0  # "llama3"
    rope_high_freq_factor: float = 4.0  # "llama3"
    rope_original_max_position: int = 8192  # "llama3"
    tie_word_embeddings: bool = False
    qkv_bias: bool = False  # Qwen2 always, Llama when attention_bias
    o_bias: bool = False  # Llama when attention_bias
    mlp_bias: bool = False  # Llama's mlp_bias
    sliding_window: tuple[int | None, ...] | None = None  # per layer; None = full attention
    architecture: str = "LlamaForCausalLM"

    def __post_init__(self):
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads={self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads={self.num_key_value_heads}"
            )
        if self.rope_type not in ("default", "linear", "llama3"):
            raise ValueError(f"rope type {self.rope_type!r} is not supported (default, linear, llama3)")

    @property
    def num_parameters(self) -> int:
        """Parameters, counting a tied embedding once."""
        C, F_, D = self.hidden_size, self.intermediate_size, self.head_dim
        H, K, V = self.num_attention_heads, self.num_key_value_heads, self.vocab_size
        attn = C * (H + 2 * K) * D + H * D * C
        attn += (H + 2 * K) * D * self.qkv_bias + C * self.o_bias
        mlp = 3 * C * F_ + (2 * F_ + C) * self.mlp_bias
        layer = attn + mlp + 2 * C
        embeddings = V * C * (1 if self.tie_word_embeddings else 2)
        return self.num_hidden_layers * layer + embeddings + C

    @property
    def kv_elements_per_token(self) -> int:
        """Elements of K and V one token adds to the cache, all layers (times the cache dtype's bytes = bytes)."""
        return 2 * self.num_hidden_layers * self.num_key_value_heads * self.head_dim

    def _hf_windows(self) -> dict:
        """The sliding-window keys of config.json, as each architecture names them."""
        windows = self.sliding_window or (None,) * self.num_hidden_layers
        if not any(windows):
            return {"sliding_window": None} if self.architecture != "LlamaForCausalLM" else {}
        if self.architecture == "MistralForCausalLM":
            if len(set(windows)) != 1:
                raise ValueError(f"Mistral has one sliding window for every layer, got {windows}")
            return {"sliding_window": windows[0]}
        if self.architecture == "Qwen2ForCausalLM":
            sizes = {w for w in windows if w}
            if len(sizes) != 1:
                raise ValueError(f"Qwen2 has one sliding-window size, got {sorted(sizes)}")
            return {"use_sliding_window": True, "sliding_window": sizes.pop(),
                    "layer_types": ["sliding_attention" if w else "full_attention" for w in windows]}
        raise ValueError(f"{self.architecture} has no sliding window; use MistralForCausalLM or Qwen2ForCausalLM")

    def to_hf_dict(self) -> dict:
        """The config.json Hugging Face's Llama/Mistral/Qwen2 classes read back to this shape."""
        rope = {"rope_type": self.rope_type, "rope_theta": self.rope_theta}
        if self.rope_type == "linear":
            rope["factor"] = self.rope_factor
        if self.rope_type == "llama3":
            rope |= {
                "factor": self.rope_factor,
                "low_freq_factor": self.rope_low_freq_factor,
                "high_freq_factor": self.rope_high_freq_factor,
                "original_max_position_embeddings": self.rope_original_max_position,
            }
        return {
            "architectures": [self.architecture],
            "model_type": {"LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral",
                           "Qwen2ForCausalLM": "qwen2"}[self.architecture],
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "max_position_embeddings": self.max_position_embeddings,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_parameters": rope,
            "tie_word_embeddings": self.tie_word_embeddings,
            "attention_bias": self.qkv_bias,
            "mlp_bias": self.mlp_bias,
            **self._hf_windows(),
            "hidden_act": "silu",
            "bos_token_id": None,
            "eos_token_id": None,
            "pad_token_id": None,
        }


def config_from_hf(hf) -> ModelConfig:
    """Read a transformers config (object or dict) into a :class:`ModelConfig`.

    Raises ValueError, naming it, for an architecture outside the Llama family.
    """
    get = hf.get if isinstance(hf, dict) else (lambda k, d=None: getattr(hf, k, d))
    arch = (get("architectures") or [None])[0]
    if arch not in ARCHITECTURES:
        raise ValueError(f"architecture {arch!r} is not supported; minispec supports {', '.join(ARCHITECTURES)}")
    if get("hidden_act", "silu") != "silu":
        raise ValueError(f"hidden_act {get('hidden_act')!r} is not supported (only silu)")
    rope = dict(get("rope_parameters") or get("rope_scaling") or {})
    rope_theta = rope.get("rope_theta", get("rope_theta", 10000.0))
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    C, H = get("hidden_size"), get("num_attention_heads")
    layers = get("num_hidden_layers")
    window = get("sliding_window")
    if arch == "Qwen2ForCausalLM":  # as transformers' Qwen2Config derives layer_types when config.json has none
        window = window if get("use_sliding_window", False) or get("layer_types") else None
        first = get("max_window_layers", layers)
        types = get("layer_types") or ["sliding_attention" if window and i >= first else "full_attention"
                                       for i in range(layers)]
        windows = tuple(window if t == "sliding_attention" else None for t in types)
    elif arch == "MistralForCausalLM":
        windows = (get("sliding_window", 4096),) * layers  # transformers' MistralConfig default when absent
    else:
        windows = (None,) * layers
    is_qwen = arch == "Qwen2ForCausalLM"
    return ModelConfig(
        vocab_size=get("vocab_size"),
        hidden_size=C,
        intermediate_size=get("intermediate_size"),
        num_hidden_layers=layers,
        num_attention_heads=H,
        num_key_value_heads=get("num_key_value_heads") or H,
        head_dim=get("head_dim") or C // H,
        max_position_embeddings=get("max_position_embeddings", _MAX_POSITIONS[arch]),
        rms_norm_eps=get("rms_norm_eps", 1e-6),
        rope_theta=float(rope_theta),
        rope_type=rope_type,
        rope_factor=float(rope.get("factor", 1.0)),
        rope_low_freq_factor=float(rope.get("low_freq_factor", 1.0)),
        rope_high_freq_factor=float(rope.get("high_freq_factor", 4.0)),
        rope_original_max_position=int(rope.get("original_max_position_embeddings", 8192)),
        tie_word_embeddings=bool(get("tie_word_embeddings", False)),
        qkv_bias=True if is_qwen else bool(get("attention_bias", False)),
        o_bias=False if is_qwen else bool(get("attention_bias", False)),
        mlp_bias=bool(get("mlp_bias", False)),
        sliding_window=windows if any(w is not None for w in windows) else None,
        architecture=arch,
    )


# Hugging Face name -> ours, for one layer; q/k/v and gate/up are concatenated on load.
_HF_LAYER = {
    "input_layernorm.weight": "attn_norm",
    "post_attention_layernorm.weight": "mlp_norm",
    "self_attn.o_proj.weight": "wo.weight",
    "self_attn.o_proj.bias": "wo.bias",
    "mlp.down_proj.weight": "w2.weight",
    "mlp.down_proj.bias": "w2.bias",
}


_FUSED = {"wqkv": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
          "w13": ("mlp.gate_proj", "mlp.up_proj")}


def from_hf_state_dict(sd: dict[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """Rename and fuse a Hugging Face Llama-family state dict into this module's layout."""
    out = {"embed.weight": sd["model.embed_tokens.weight"], "norm": sd["model.norm.weight"]}
    out["lm_head.weight"] = sd["model.embed_tokens.weight" if cfg.tie_word_embeddings else "lm_head.weight"]
    for i in range(cfg.num_hidden_layers):
        pre = f"model.layers.{i}."
        for hf, ours in _HF_LAYER.items():
            if pre + hf in sd:
                out[f"layers.{i}.{ours}"] = sd[pre + hf]
        for ours, parts in _FUSED.items():
            for kind in ("weight", "bias"):
                if pre + f"{parts[0]}.{kind}" in sd:
                    out[f"layers.{i}.{ours}.{kind}"] = torch.cat([sd[pre + f"{p}.{kind}"] for p in parts])
    return out


def to_hf_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """This module's weights under Hugging Face's names (the inverse of :func:`from_hf_state_dict`)."""
    cfg, sd = model.config, model.state_dict()
    H, K, D, F_ = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.intermediate_size
    out = {"model.embed_tokens.weight": sd["embed.weight"], "model.norm.weight": sd["norm"]}
    if not cfg.tie_word_embeddings:
        out["lm_head.weight"] = sd["lm_head.weight"]
    sizes = {"wqkv": [H * D, K * D, K * D], "w13": [F_, F_]}
    for i in range(cfg.num_hidden_layers):
        pre = f"model.layers.{i}."
        for hf, ours in _HF_LAYER.items():
            if f"layers.{i}.{ours}" in sd:
                out[pre + hf] = sd[f"layers.{i}.{ours}"]
        for ours, parts in _FUSED.items():
            for kind in ("weight", "bias"):
                if f"layers.{i}.{ours}.{kind}" in sd:
                    for p, t in zip(parts, sd[f"layers.{i}.{ours}.{kind}"].split(sizes[ours])):
                        out[pre + f"{p}.{kind}"] = t
    return {k: v.contiguous() for k, v in out.items()}
