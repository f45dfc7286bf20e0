"""An EAGLE-3 head (Li et al. 2025, arXiv 2503.01840), computed and saved as vLLM's ``eagle3`` method reads it.

Notation as everywhere here: p the target's distribution, q the draft's, gamma the draft length. C is the
hidden size, V the target's vocabulary, N the head's draft vocabulary (N <= V).

Where :class:`~minispec.drafts.eagle.EagleDraft` (EAGLE-1 style) reads the target's last layer, an EAGLE-3 head
reads three: low, middle and high. vLLM (``Eagle3LlamaForCausalLM``, ``vllm/model_executor/models/llama_eagle3.py``,
0.32) takes by default the residual stream entering the target's layers 2, L // 2 and L - 3 (its
``get_eagle3_default_aux_hidden_state_layers``; ``eagle_aux_hidden_state_layer_ids`` in the head's config overrides
them). "Entering layer l" is minispec's feature l ("after layer l", 0 = the embeddings), so the numbers are the
same: (2, 4, 5) for the 8-layer embedded target. The head's slot t holds the pair (g_t, x_{t+1}), as EAGLE-1's:

    g_t = fc([f^a_t, f^b_t, f^c_t])                     3 C -> C, no norm before it (vLLM's default)
          or, past the root, the head's own h at its parent (drafting several tokens)
    a   = [input_layernorm(e(x_{t+1})), hidden_norm(g_t)]  2 C: the layer's Q, K and V read both
    r   = g_t + o_proj(attention(a))                    the residual is g_t itself, not a norm of it
    h_t = r + mlp(post_attention_layernorm(r))          before the final norm: fed back as the next g
    q   = softmax(lm_head(norm(h_t)))                   over the N draft tokens, placed at target ids d2t

e is the target's embedding (borrowed; vLLM shares it too when the head has none). The LM head is the head's own,
N x C, trained with it; draft id i is target id i + d2t[i] (vLLM's convention), and q is exactly 0 outside those N
ids (logits -inf there), which keeps the accept rule exact and caps acceptance at p's mass inside them.

The weights are saved under vLLM's names (``fc.weight``, ``midlayer.self_attn.q_proj.weight``, ...,
``midlayer.hidden_norm.weight``, ``norm.weight``, ``lm_head.weight``, ``d2t``, ``t2d``) beside a Llama
config.json whose architecture is ``LlamaForCausalLMEagle3``, so that ``speculative_config={"method": "eagle3",
"model": DIR}`` loads the same folder; in memory q/k/v and gate/up are fused (``wqkv``, ``w13``) as in
:class:`~minispec.model.llama.Block`. Caching, rollback and the re-read of accepted positions are EAGLE-1's
(:class:`~minispec.drafts.eagle._EagleRun`): :class:`Eagle3Draft` is an ``EagleDraft`` whose model fuses and
reads differently, so trees, the tree verifier and the engine's per-row state take it unchanged.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from minispec.drafts.eagle import EagleDraft, EagleModel
from minispec.model.config import ModelConfig, config_from_hf
from minispec.model.kv_cache import KVCache
from minispec.model.llama import Model, rope_inv_freq, rotate
from minispec.model.load import ASSETS
from minispec.roofline import eagle_head_shape

SHIPPED = ("tiny-code-eagle3",)  # heads inside the package (minispec/assets/NAME)
ARCHITECTURE = "LlamaForCausalLMEagle3"  # config.json's architecture: vLLM 0.32's registry maps it to Eagle3Llama...
ARCHITECTURES = (ARCHITECTURE, "Eagle3LlamaForCausalLM")  # ... and so does this name; both are read
UNSUPPORTED = ("norm_before_fc", "fc_norm", "norm_before_residual", "norm_output")  # vLLM variants not computed here


def default_features(num_layers: int) -> tuple[int, ...]:
    """vLLM's default layers for an L-layer target: (2, L // 2, L - 3)."""
    return (2, num_layers // 2, num_layers - 3)


@dataclass(frozen=True)
class Eagle3Config:
    """An EAGLE-3 head's shape and what it expects of its target."""

    layer: ModelConfig  # the one decoder layer's shape: the target's, one layer, no sliding window
    features: tuple[int, ...]  # target layers read (0 = embeddings, l = entering layer l), increasing
    target_layers: int  # the target's decoder layers
    draft_vocab: int  # N, rows of the head's own LM head (N = V: the full vocabulary, d2t all zero)

    @classmethod
    def for_target(cls, target: ModelConfig, features: tuple[int, ...] | None = None,
                   draft_vocab: int | None = None) -> Eagle3Config:
        """The head for ``target``: ``features`` default vLLM's (2, L // 2, L - 3); ``draft_vocab`` default V."""
        L = target.num_hidden_layers
        layer = replace(target, num_hidden_layers=1, sliding_window=None, tie_word_embeddings=False,
                        architecture="LlamaForCausalLM", qkv_bias=False, o_bias=False, mlp_bias=False)  # vLLM's
        cfg = cls(layer,
                  default_features(L) if features is None else tuple(features), L,
                  target.vocab_size if draft_vocab is None else draft_vocab)
        cfg.check()
        return cfg

    def check(self) -> None:
        f, L, V, N = self.features, self.target_layers, self.layer.vocab_size, self.draft_vocab
        if not f or list(f) != sorted(set(f)) or not all(isinstance(i, int) and 0 <= i <= L for i in f):
            raise ValueError(f"EAGLE-3 features must be increasing layer numbers in 0..{L} (the target's layers), "
                             f"got {f!r}")
        if isinstance(N, bool) or not isinstance(N, int) or not 1 <= N <= V:
            raise ValueError(f"draft_vocab must be an integer in 1..{V} (the target's vocabulary), got {N!r}")

    def to_dict(self) -> dict:
        """config.json: a one-layer Llama config as vLLM's ``eagle3`` method reads it, and the target's layer count."""
        d = self.layer.to_hf_dict()
        d.update(architectures=[ARCHITECTURE], draft_vocab_size=self.draft_vocab,
                 target_hidden_size=self.layer.hidden_size, target_num_hidden_layers=self.target_layers,
                 eagle_config={"eagle_aux_hidden_state_layer_ids": list(self.features), "use_aux_hidden_state": True})
        return d

    @classmethod
    def from_dict(cls, d: dict, target_layers: int | None = None) -> Eagle3Config:
        """Read a config.json (ours, or another trainer's for vLLM): layers from ``eagle_config`` or the top level,
        else vLLM's default for ``target_layers`` (the target's, given when loading beside it)."""
        if d.get("architectures") not in [[a] for a in ARCHITECTURES]:
            raise ValueError(f"not an EAGLE-3 head: architectures is {d.get('architectures')!r}, expected "
                             f"[{ARCHITECTURE!r}]")
        if d.get("num_hidden_layers") != 1:
            raise ValueError(f"an EAGLE-3 head here has one decoder layer; this config has "
                             f"{d.get('num_hidden_layers')}")
        if not (d.get("eagle_config") or {}).get("use_aux_hidden_state", True):
            raise ValueError("eagle_config.use_aux_hidden_state is false: a head that reads no target layers is not "
                             "supported")
        odd = [k for k in UNSUPPORTED if d.get(k) or (d.get("eagle_config") or {}).get(k)]
        if odd:
            raise ValueError(f"this head sets {odd}, vLLM variants minispec does not compute")
        L = d.get("target_num_hidden_layers", target_layers)
        if L is None:
            raise ValueError("the head's config does not say how many layers its target has; load it with the target")
        ids = (d.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids") or \
            d.get("eagle_aux_hidden_state_layer_ids") or default_features(L)
        C = d["hidden_size"]
        if d.get("target_hidden_size", C) != C:
            raise ValueError(f"target_hidden_size {d['target_hidden_size']} differs from the head's {C}: not supported")
        layer = config_from_hf({**d, "architectures": ["LlamaForCausalLM"], "tie_word_embeddings": False})
        cfg = cls(layer, tuple(ids), L, d.get("draft_vocab_size") or d["vocab_size"])
        cfg.check()
        return cfg


class Eagle3Layer(nn.Module):
    """vLLM's first (here the only) EAGLE-3 decoder layer: Q, K and V read [input_layernorm(e), hidden_norm(g)]
    (2 C), the residual is g; then the usual SwiGLU MLP with its own residual."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        H, K, D, C = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.hidden_size
        self.H, self.K, self.D, self.eps = H, K, D, cfg.rms_norm_eps
        self.input_norm = nn.Parameter(torch.ones(C))  # on the embedding
        self.hidden_norm = nn.Parameter(torch.ones(C))  # on g
        self.wqkv = nn.Linear(2 * C, (H + 2 * K) * D, bias=cfg.qkv_bias)
        self.wo = nn.Linear(H * D, C, bias=cfg.o_bias)
        self.mlp_norm = nn.Parameter(torch.ones(C))  # post_attention_layernorm
        self.w13 = nn.Linear(C, 2 * cfg.intermediate_size, bias=cfg.mlp_bias)  # gate and up
        self.w2 = nn.Linear(cfg.intermediate_size, C, bias=cfg.mlp_bias)  # down

    def forward(self, x, cos, sin, masks, cache: KVCache | None):
        """x (B, T, 2 C): [e, g] as :meth:`Eagle3Model.fuse` makes it; h (B, T, C) before the final norm."""
        B, T, C2 = x.shape
        e, g = x.chunk(2, -1)  # (B, T, C) each
        C = C2 // 2
        a = torch.cat([F.rms_norm(e, (C,), self.input_norm, self.eps), F.rms_norm(g, (C,), self.hidden_norm, self.eps)],
                      -1)  # (B, T, 2C)
        q, k, v = self.wqkv(a).split([self.H * self.D, self.K * self.D, self.K * self.D], -1)
        q = rotate(q.view(B, T, self.H, self.D).transpose(1, 2), cos, sin)  # (B, H, T, D)
        k = rotate(k.view(B, T, self.K, self.D).transpose(1, 2), cos, sin)  # (B, K, T, D)
        v = v.view(B, T, self.K, self.D).transpose(1, 2)  # (B, K, T, D)
        if cache is not None:
            k, v = cache.update(0, k, v)  # (B, K, S', D) each
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=masks[None], enable_gqa=self.H != self.K)  # (B, H, T, D)
        r = g + self.wo(y.transpose(1, 2).reshape(B, T, self.H * self.D))  # (B, T, C)
        gate, up = self.w13(F.rms_norm(r, (C,), self.mlp_norm, self.eps)).chunk(2, -1)  # (B, T, F) each
        return r + self.w2(F.silu(gate) * up)  # (B, T, C)


class Eagle3Model(nn.Module):
    """The head's own weights: fc (k C -> C), the layer, the final norm, the LM head (N x C) and the id maps."""

    def __init__(self, cfg: Eagle3Config):
        super().__init__()
        C, k, N, V = cfg.layer.hidden_size, len(cfg.features), cfg.draft_vocab, cfg.layer.vocab_size
        self.config = cfg
        self.fc = nn.Linear(k * C, C, bias=False)  # the target's k features, concatenated -> C
        self.layer = Eagle3Layer(cfg.layer)
        self.norm = nn.Parameter(torch.ones(C))
        self.lm_head = nn.Linear(C, N, bias=False)  # (N, C) the head's own rows
        self.register_buffer("d2t", torch.zeros(N, dtype=torch.long))  # (N,) target id - draft id
        self.register_buffer("t2d", torch.arange(V) < N)  # (V,) bool: the target id is in the draft vocabulary
        self.register_buffer("inv_freq", rope_inv_freq(cfg.layer), persistent=False)  # (D/2,)
        for name, p in self.named_parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)
            elif "norm" not in name:
                nn.init.zeros_(p)

    def set_vocab(self, ids: torch.Tensor) -> None:
        """Make the draft vocabulary the target ids ``ids`` (N,), in increasing order (draft id i -> ids[i])."""
        ids = torch.as_tensor(ids, dtype=torch.long, device=self.d2t.device)
        V = self.config.layer.vocab_size
        if ids.shape != self.d2t.shape or ids.min() < 0 or ids.max() >= V or (ids.diff() <= 0).any():
            raise ValueError(f"a draft vocabulary is {self.d2t.numel()} distinct target ids in 0..{V - 1}, increasing")
        self.d2t.copy_(ids - torch.arange(len(ids), device=ids.device))
        self.t2d.zero_()
        self.t2d[ids] = True

    def target_ids(self) -> torch.Tensor:
        """(N,) the target id of each draft id."""
        return torch.arange(self.d2t.numel(), device=self.d2t.device) + self.d2t

    def fuse(self, emb: torch.Tensor, g: torch.Tensor, from_target: bool) -> torch.Tensor:
        """The layer's input (B, T, 2 C): token embeddings (B, T, C) beside the target's features (B, T, k C)
        reduced by fc when ``from_target``, else beside the head's own hidden states (B, T, C)."""
        return torch.cat([emb, self.fc(g) if from_target else g], -1)  # (B, T, 2C)

    def logits(self, h: torch.Tensor, head: torch.Tensor) -> torch.Tensor:
        """Logits (B, T, N) from hidden states h (B, T, C) through the final norm and ``head`` (N, C)."""
        return F.linear(F.rms_norm(h, (h.shape[-1],), self.norm, self.config.layer.rms_norm_eps), head)

    # hidden states h (B, T, C) of the layer over inputs x (B, T, 2 C), written into a cache from each row's length,
    # causal or as nodes of a tree: EAGLE-1's pass, which reads only self.layer and self.inv_freq
    forward = EagleModel.forward


# --- vLLM's names <-> this module's --------------------------------------------------------------------------

_NAMES = {"layer.input_norm": "midlayer.input_layernorm.weight", "layer.hidden_norm": "midlayer.hidden_norm.weight",
          "layer.mlp_norm": "midlayer.post_attention_layernorm.weight",
          "layer.wo.weight": "midlayer.self_attn.o_proj.weight",
          "layer.wo.bias": "midlayer.self_attn.o_proj.bias", "layer.w2.weight": "midlayer.mlp.down_proj.weight",
          "layer.w2.bias": "midlayer.mlp.down_proj.bias", "fc.weight": "fc.weight", "norm": "norm.weight",
          "lm_head.weight": "lm_head.weight", "d2t": "d2t", "t2d": "t2d"}
_FUSED = {"layer.wqkv": ("midlayer.self_attn.q_proj", "midlayer.self_attn.k_proj", "midlayer.self_attn.v_proj"),
          "layer.w13": ("midlayer.mlp.gate_proj", "midlayer.mlp.up_proj")}


def to_vllm(model: Eagle3Model) -> dict[str, torch.Tensor]:
    """The head's state dict under vLLM's (and SpecForge's) names, q/k/v and gate/up split."""
    cfg, sd = model.config.layer, model.state_dict()
    sizes = {"layer.wqkv": [cfg.num_attention_heads * cfg.head_dim] + [cfg.num_key_value_heads * cfg.head_dim] * 2,
             "layer.w13": [cfg.intermediate_size] * 2}
    out = {_NAMES[k]: v for k, v in sd.items() if k in _NAMES}
    for ours, parts in _FUSED.items():
        for kind in ("weight", "bias"):
            if f"{ours}.{kind}" in sd:
                out |= {f"{p}.{kind}": t for p, t in zip(parts, sd[f"{ours}.{kind}"].split(sizes[ours]))}
    return out


def from_vllm(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The inverse of :func:`to_vllm` (a head without d2t/t2d: the full vocabulary, as vLLM takes it)."""
    back = {v: k for k, v in _NAMES.items()}
    out = {back[k]: v for k, v in state.items() if k in back}
    for ours, parts in _FUSED.items():
        for kind in ("weight", "bias"):
            if f"{parts[0]}.{kind}" in state:
                out[f"{ours}.{kind}"] = torch.cat([state[f"{p}.{kind}"] for p in parts])
    return out


class Eagle3Draft(EagleDraft):
    """An EAGLE-3 head for ``target``: ``Eagle3Draft(target, model)`` or :meth:`from_pretrained`.

    A chain (``speculative_generate(target, draft, ...)``), inside ``TreeDraft(draft, ...)`` (static or EAGLE-2's
    dynamic tree) and in :class:`minispec.Engine`, greedy and sampled, batched and ragged, as :class:`EagleDraft`.
    Its vocabulary is the head's own (``draft_vocab`` rows); there is no separate hot vocabulary to choose.
    """

    def __init__(self, target: Model, model: Eagle3Model):  # not EagleDraft's: that one builds an EAGLE-1 head
        if not isinstance(target, Model) or not isinstance(model, Eagle3Model):
            raise ValueError(f"Eagle3Draft needs a minispec Model and an Eagle3Model, got {type(target).__name__} "
                             f"and {type(model).__name__}")
        cfg, tc = model.config, target.config
        if tc.vocab_size != cfg.layer.vocab_size or tc.hidden_size != cfg.layer.hidden_size:
            raise ValueError(f"this EAGLE-3 head was trained for a target with vocabulary {cfg.layer.vocab_size} "
                             f"and hidden size {cfg.layer.hidden_size}; the target has {tc.vocab_size} and "
                             f"{tc.hidden_size}")
        if tc.num_hidden_layers != cfg.target_layers:
            raise ValueError(f"this EAGLE-3 head reads layers {cfg.features} of a {cfg.target_layers}-layer target; "
                             f"the target has {tc.num_hidden_layers} layers")
        N, V = cfg.draft_vocab, tc.vocab_size
        if N == V and model.d2t.any():
            raise ValueError("a head over the full vocabulary maps each draft id to itself (d2t all zero), as vLLM "
                             "assumes; this one's d2t is not")
        self.target, self.model = target, model.to(target.device, target.dtype)  # in place
        model.d2t, model.t2d = model.d2t.long(), model.t2d.bool()  # .to(dtype) above leaves them, checked here
        model.inv_freq = rope_inv_freq(cfg.layer).to(target.device)  # float32, as the target keeps its own
        self.features, self.hot_vocab = cfg.features, None if N == V else N
        self.embed = target.embed  # borrowed (vLLM shares it too)
        self.hot = None if N == V else model.target_ids()  # (N,) target ids of the draft ids, placed by _EagleRun
        self.head = model.lm_head.weight  # (N, C) the head's own
        self.shape = eagle_head_shape(tc, self.hot_vocab, fusion="eagle3", bytes_per_param=target.dtype.itemsize)

    @classmethod
    def from_pretrained(cls, name_or_dir: str | Path, target: Model) -> Eagle3Draft:
        """Load a head saved by :meth:`save` or written for vLLM's ``eagle3`` (config.json + model.safetensors): a
        shipped name (``"tiny-code-eagle3"``) or a directory, cast to the target's dtype and device."""
        from safetensors.torch import load_file

        if not isinstance(target, Model):
            raise ValueError(f"target must be a minispec Model (minispec.load(...)[0]), got {type(target).__name__}")
        path = head_path(name_or_dir)
        cfg = Eagle3Config.from_dict(json.loads((path / "config.json").read_text()), target.config.num_hidden_layers)
        with torch.device("meta"):
            model = Eagle3Model(cfg)
        state = from_vllm(load_file(str(path / "model.safetensors")))
        if cfg.draft_vocab == cfg.layer.vocab_size:  # vLLM reads no maps for a full vocabulary
            state.setdefault("d2t", torch.zeros(cfg.draft_vocab, dtype=torch.long))
            state.setdefault("t2d", torch.ones(cfg.draft_vocab, dtype=torch.bool))
        missing, extra = set(model.state_dict()) - set(state), set(state) - set(model.state_dict())
        if missing or extra:
            raise ValueError(f"{path}: weights do not match the config (missing {sorted(missing)[:4]}, "
                             f"unexpected {sorted(extra)[:4]})")
        shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
        for k, v in state.items():
            if tuple(v.shape) != shapes[k]:
                raise ValueError(f"{path}: {k} has shape {tuple(v.shape)}; the config says {shapes[k]}")
        kinds = {"d2t": torch.long, "t2d": torch.bool}
        model.load_state_dict({k: v.to(target.device, kinds.get(k, target.dtype)) for k, v in state.items()},
                              assign=True, strict=True)
        if not torch.equal(model.t2d.nonzero()[:, 0], model.target_ids().sort().values):
            raise ValueError(f"{path}: d2t and t2d name different draft vocabularies")
        model.inv_freq = rope_inv_freq(cfg.layer)  # (D/2,) not saved
        return cls(target, model.eval().requires_grad_(False))

    def save(self, out_dir: str | Path, dtype: torch.dtype = torch.float32, extra: dict | None = None) -> Path:
        """Write the head in vLLM's layout (see the module docstring) in ``dtype``, and ``extra`` as training.json."""
        return save_head(self.model, out_dir, dtype, extra)

    def __repr__(self) -> str:
        vocab = "full vocabulary" if self.hot is None else f"draft vocabulary {self.hot_vocab}"
        return f"Eagle3Draft(features={self.features}, {vocab})"


def head_path(name_or_dir: str | Path) -> Path:
    """The folder of a shipped head or a directory (``eagle3:DIR`` too), checked to hold an EAGLE-3 head."""
    name = str(name_or_dir).removeprefix("eagle3:")
    path = ASSETS / name if name in SHIPPED else Path(name).expanduser()
    if not (path / "config.json").is_file() or not (path / "model.safetensors").is_file():
        raise ValueError(f"{name_or_dir!r} is neither a shipped EAGLE-3 head ({', '.join(SHIPPED)}) nor a directory "
                         f"holding config.json and model.safetensors")
    return path


def is_eagle3(name: str) -> bool:
    """Whether ``name`` names an EAGLE-3 head: ``eagle3:DIR``, a shipped name, or a folder whose config says so."""
    if name.startswith("eagle3:") or name in SHIPPED:
        return True
    config = Path(name).expanduser() / "config.json"
    return config.is_file() and json.loads(config.read_text()).get("architectures") in [[a] for a in ARCHITECTURES]


def save_head(model: Eagle3Model, out_dir: str | Path, dtype: torch.dtype = torch.float32,
              extra: dict | None = None) -> Path:
    """Write ``model`` as vLLM reads it (see :meth:`Eagle3Draft.save`); returns the directory."""
    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(model.config.to_dict(), indent=2) + "\n")
    state = {k: (v if k in ("d2t", "t2d") else v.to(dtype)).contiguous() for k, v in to_vllm(model).items()}
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    if extra is not None:
        (out / "training.json").write_text(json.dumps(extra, indent=2) + "\n")
    return out
