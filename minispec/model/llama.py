"""A Llama-family decoder in plain PyTorch.

Covers what Hugging Face calls Llama (with Llama-3 rope scaling), Mistral (sliding window),
Qwen2 (q/k/v bias) and the checkpoints that reuse them (SmolLM, TinyLlama): RMSNorm, rotary
embeddings, grouped-query attention, a SwiGLU MLP, tied or untied embeddings.

Shape symbols: B batch, T tokens in this call, S cache slots, H query heads, K key/value
heads, D head dim, C hidden size, F MLP width, V vocabulary.

Two details differ from Hugging Face's module layout, to cut the number of kernels a decode
step launches: q/k/v are one matmul (``wqkv``) and gate/up are one matmul (``w13``).
:func:`~minispec.model.config.from_hf_state_dict` and :func:`~minispec.model.config.to_hf_state_dict`
convert between the two layouts.
"""

from __future__ import annotations

import math
from functools import partial
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from minispec.model.config import ModelConfig
from minispec.model.kv_cache import KVCache

PACKED_MIN_MACS = 1 << 20  # a smaller product runs through F.linear: see _packed_linear
PACKED_MIN_WEIGHT = 1 << 18  # compiled, a smaller weight runs through F.linear at every token count: _packed_linear


_OPS = torch.library.Library("minispec", "FRAGMENT")  # torch.ops.minispec: operators torch.compile leaves opaque


def opaque(fake):
    """Decorator: the function as ``torch.ops.minispec.<its name>``, which ``torch.compile`` calls and does not trace,
    ``fake`` giving its output's shape. Defined straight on a Library, as vLLM's ``direct_register_custom_op`` does:
    ``torch.library.custom_op``'s Python wrapper cost about 40 us a call here under the profiler."""
    def define(fn):
        _OPS.define(fn.__name__ + torch.library.infer_schema(fn, mutates_args=()))
        _OPS.impl(fn.__name__, fn, "CompositeExplicitAutograd")
        torch.library.register_fake(f"minispec::{fn.__name__}", fake, lib=_OPS)
        return getattr(torch.ops.minispec, fn.__name__)
    return define


@opaque(lambda x, packed, bias, out: x.new_empty(*x.shape[:-1], out))  # (..., out)
def packed_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None, out: int) -> torch.Tensor:
    """x (..., C) times a weight prepacked by oneDNN (``out`` features): (..., out). An operator of its own only for
    ``torch.compile``, which cannot lower oneDNN's call with dynamic shapes (:mod:`minispec.engine.compiled`)."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")  # (..., out)


def _packed_linear(m: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """``m(x)`` through oneDNN's prepacked weight (see :meth:`Model.prepack`), or through ``F.linear`` when the
    product is under :data:`PACKED_MIN_MACS` multiply-adds: oneDNN's call cost about 30 us before any arithmetic on
    this project's AVX2 machines, F.linear's about 10 (``results/cpu/linear_prepack.txt``: F.linear the faster for
    SmolLM2's qkv and down at 1 token and the embedded target's qkv and down at 1-16 tokens).

    Compiled (:mod:`minispec.engine.compiled`) the count is known in the graph of one token only, where the rule holds;
    in the graph for every other count it would put a guard on the count. There a weight of fewer than
    :data:`PACKED_MIN_WEIGHT` elements (every product of the embedded target, none of SmolLM2's) runs through F.linear
    at every count: for the embedded target's qkv and down F.linear was the faster or within 6 % from 1 to 512 tokens
    on both of this project's CPUs (``results/cpu/linear_prepack.txt``, ``linear_prepack_xeon.txt``), its gate and up
    the faster on the Xeon but 1.04-1.64x slower on the AVX2 machine from 2 to 128 tokens (the threshold is the Xeon's
    choice: docs/VS_VLLM.md), and through the compiled engine the pair's batch of one
    with its draft model, whose verify pass is 5 tokens, ran 1.08-1.31x as fast on the Xeon, its other static batches
    within the runs' noise (``results/cpu/engine_small_weights.txt``). Every other product there is oneDNN's."""
    tokens, n = x.shape[:-1].numel(), m.weight.numel()  # from shapes (no sync)
    if torch.compiler.is_compiling():  # oneDNN's call opaque to Inductor, which cannot lower it with dynamic shapes
        small = n < PACKED_MIN_WEIGHT or tokens == 1 and n < PACKED_MIN_MACS  # known when traced: no guard on N
        return F.linear(x, m.weight, m.bias) if small else packed_linear(x, m.packed, m.bias, m.out_features)
    if tokens * n < PACKED_MIN_MACS:  # tokens x in x out
        return F.linear(x, m.weight, m.bias)
    return torch.ops.mkldnn._linear_pointwise(x, m.packed, m.bias, "none", [], "")


def native_bf16() -> bool:
    """Whether this CPU computes bfloat16 products natively (AVX-512 BF16, AMX: what oneDNN asks for). Without it
    bfloat16 is emulated: on this project's AVX2 machines a 10-step EAGLE-3 training run took 20 s under bfloat16
    autocast and 2.4 s in float32, and oneDNN cannot pack bfloat16 weights (:meth:`Model.prepack`)."""
    return torch.ops.mkldnn._is_mkldnn_bf16_supported()


def rope_inv_freq(cfg: ModelConfig) -> torch.Tensor:
    """Inverse rotary frequencies (D/2,), float32, with linear or Llama-3 scaling."""
    D = cfg.head_dim
    inv_freq = 1.0 / cfg.rope_theta ** (torch.arange(0, D, 2, dtype=torch.float32) / D)  # (D/2,)
    if cfg.rope_type == "linear":
        return inv_freq / cfg.rope_factor
    if cfg.rope_type == "llama3":  # transformers' _compute_llama3_parameters
        old, lo, hi = cfg.rope_original_max_position, cfg.rope_low_freq_factor, cfg.rope_high_freq_factor
        wavelen = 2 * math.pi / inv_freq  # (D/2,)
        scaled = torch.where(wavelen > old / lo, inv_freq / cfg.rope_factor, inv_freq)  # (D/2,)
        smooth = (old / wavelen - lo) / (hi - lo)  # (D/2,)
        smoothed = (1 - smooth) * scaled / cfg.rope_factor + smooth * scaled  # (D/2,)
        medium = (wavelen >= old / hi) & (wavelen <= old / lo)
        return torch.where(medium, smoothed, scaled)
    return inv_freq


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Apply rotary embeddings in Hugging Face's rotate-half convention."""
    x1, x2 = x.chunk(2, dim=-1)  # (B, *, T, D/2) each
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin  # (B, *, T, D)


class TreeMask(NamedTuple):
    """A forward pass's tokens as nodes of a tree: each sees the cached prefix and its own ancestors.

    The tree occupies the R cache slots from ``base``; this call's T tokens are its last T slots (the
    earlier ones were written by earlier calls of the same tree, as when a draft grows a tree level by
    level). Slots before ``base`` are the prefix, visible to every node.
    """

    base: torch.Tensor  # (B,) the tree's first slot in each row (the cache length when the tree began)
    positions: torch.Tensor  # (B, R) each tree slot's position (rotary and window): base + its depth
    visible: torch.Tensor  # (B, T, R) bool: tree slot r is this call's token i or one of its ancestors


def attention_masks(new: torch.Tensor, S: int, tree: TreeMask | None, windows) -> tuple[torch.Tensor, dict]:
    """Each query's position (B, T) and what it may see, {window: (B or 1, 1, T, S) bool}, for queries written at
    slots ``new`` (B, T) of a cache whose first S slots are read. Causal: a query sees every slot up to its own
    (slot = position). A ``tree``: its nodes see the prefix and their ancestors, at position base + depth. A
    sliding window also hides slots w or more positions back."""
    T = new.shape[1]
    slots = torch.arange(S, device=new.device)  # (S,)
    if tree is None:  # causal: a query sees every slot up to its own
        pos, slot_pos, visible = new, slots, slots <= new[:, None, :, None]  # (B, T), (S,), (B, 1, T, S)
    else:
        r = slots - tree.base[:, None]  # (B, S) slot's index in the tree, < 0 in the prefix
        in_tree = (r >= 0) & (r < tree.positions.shape[1])  # (B, S)
        ri = r.clamp(0, tree.positions.shape[1] - 1)  # (B, S)
        seen = tree.visible.gather(2, ri[:, None, :].expand(-1, T, -1))  # (B, T, S)
        visible = ((r < 0)[:, None, :] | (in_tree[:, None, :] & seen))[:, None]  # (B, 1, T, S)
        slot_pos = torch.where(in_tree, tree.positions.gather(1, ri), slots)[:, None, None, :]  # (B, 1, 1, S)
        pos = tree.positions[:, -T:]  # (B, T)
    return pos, {w: visible if w is None else visible & (slot_pos > pos[:, None, :, None] - w) for w in windows}


class Block(nn.Module):
    """One pre-norm transformer layer: attention then SwiGLU MLP, each with a residual."""

    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        H, K, D, C = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.hidden_size
        self.layer, self.H, self.K, self.D, self.eps = layer, H, K, D, cfg.rms_norm_eps
        self.window = cfg.sliding_window[layer] if cfg.sliding_window else None
        self.attn_norm = nn.Parameter(torch.ones(C))
        self.wqkv = nn.Linear(C, (H + 2 * K) * D, bias=cfg.qkv_bias)
        self.wo = nn.Linear(H * D, C, bias=cfg.o_bias)
        self.mlp_norm = nn.Parameter(torch.ones(C))
        self.w13 = nn.Linear(C, 2 * cfg.intermediate_size, bias=cfg.mlp_bias)  # gate and up
        self.w2 = nn.Linear(cfg.intermediate_size, C, bias=cfg.mlp_bias)  # down

    def forward(self, x, cos, sin, masks, cache: KVCache | None):
        B, T, C = x.shape
        h = F.rms_norm(x, (C,), self.attn_norm, self.eps)  # (B, T, C)
        HK = self.H + self.K
        qkv = self.wqkv(h).view(B, T, HK + self.K, self.D).transpose(1, 2)  # (B, H + 2K, T, D): q, k, v heads
        q, k = rotate(qkv[:, :HK], cos, sin).split([self.H, self.K], 1)  # (B, H, T, D), (B, K, T, D): one rotation
        v = qkv[:, HK:]  # (B, K, T, D)
        if getattr(cache, "attends", False):  # the engine's paged step writes k, v and attends through its tables
            y = cache.attend(self.layer, q, k, v, self.window)  # (B, H, T, D)
        else:
            if cache is not None:
                k, v = cache.update(self.layer, k, v)  # (B, K, S', D) each, S' = slots in use
            mask = masks[self.window]  # (B or 1, 1, T, S')
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=self.H != self.K)  # (B, H, T, D)
        x = x + self.wo(y.transpose(1, 2).reshape(B, T, self.H * self.D))  # (B, T, C)
        gate, up = self.w13(F.rms_norm(x, (C,), self.mlp_norm, self.eps)).chunk(2, -1)  # (B, T, F) each
        return x + self.w2(F.silu(gate) * up)  # (B, T, C)


class Model(nn.Module):
    """Decoder-only transformer. ``model(tokens, cache)`` returns logits (B, T, V)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(Block(cfg, i) for i in range(cfg.num_hidden_layers))
        self.norm = nn.Parameter(torch.ones(cfg.hidden_size))
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.embed.weight
        self.register_buffer("inv_freq", rope_inv_freq(cfg), persistent=False)  # (D/2,)
        for name, p in self.named_parameters():  # transformers' initializer_range = 0.02
            if "norm" not in name:
                nn.init.normal_(p, std=0.02) if p.dim() == 2 else nn.init.zeros_(p)
        self.windows = sorted({b.window for b in self.layers}, key=lambda w: w or 0)
        self.static_cache = False  # set by compile(): caches then attend over all slots (fixed shapes)
        self.paged_layers = None  # set by Engine(compile=True): the layers compiled for the engine's paged step

    @classmethod
    def from_state_dict(cls, cfg: ModelConfig, state: dict[str, torch.Tensor], device="cpu",
                        dtype: torch.dtype = torch.float32) -> Model:
        """A model of ``cfg`` holding ``state`` (this module's names), built in place on ``device`` in
        ``dtype`` with no random initialisation. The rotary frequencies stay float32, as transformers'
        ``from_pretrained(dtype=...)`` keeps them (a later ``.to(dtype)`` casts them, as in transformers)."""
        with torch.device("meta"):
            model = cls(cfg)
        missing = set(model.state_dict()) - set(state)
        if missing:
            raise ValueError(f"the checkpoint lacks weights {sorted(missing)[:5]}")
        model.load_state_dict({k: v.to(device, dtype) for k, v in state.items()}, assign=True, strict=True)
        if cfg.tie_word_embeddings:
            model.lm_head.weight = model.embed.weight
        model.inv_freq = rope_inv_freq(cfg).to(device)
        return model.eval().requires_grad_(False)

    def compile(self, mode: str | None = "reduce-overhead", recompile_limit: int | None = None, **kwargs) -> Model:
        """``torch.compile`` this model in place for fixed shapes (as gpt-fast does): caches it makes
        from now on are static, attending over all S slots, so a decode or verify step keeps one shape
        per batch size. Speed changes, tokens do not.

        Each new shape (batch size, tokens per call, cache size, layers run) compiles once, and every
        compiled Model draws on one budget of shapes: Dynamo caches per function, and ``forward`` is one.
        ``fullgraph``, so past the budget a new shape raises ``torch._dynamo.exc.FailOnRecompileLimitHit``
        instead of silently running eagerly. ``recompile_limit`` sets the budget for the whole process
        (``torch._dynamo.config.recompile_limit``; torch's default is 8; torch 2.11's ``torch.compile`` has
        no per-function limit). ``torch._dynamo.utils.counters["stats"]["unique_graphs"]`` counts the
        shapes compiled so far, and ``TORCH_LOGS=recompiles`` says why each one was.
        """
        if recompile_limit is not None:
            torch._dynamo.config.recompile_limit = recompile_limit
        self.static_cache = True
        super().compile(mode=mode, dynamic=False, fullgraph=True, **kwargs)
        return self

    def prepack(self) -> Model:
        """On a CPU, run every linear layer through oneDNN with its weight reordered once into oneDNN's blocked
        layout, as vLLM's CPU build does (``create_onednn_mm``) and ``torch.compile`` does when it freezes CPU
        weights. The products are the same up to float rounding (about 1e-6 relative); at 8 to 512 tokens a pass they
        ran 2-3x faster on one of this project's AVX2 machines and 1.0-1.9x on another (``scripts/linear_prepack.py``).
        Products under :data:`PACKED_MIN_MACS` still run through ``F.linear``, whose fixed cost is lower: through the
        engine, static batches of the embedded pair, that made plain decoding 1.12x / 1.04x / 1.03x as fast at batch
        1 / 8 / 32 and SmolLM2's batch of 1 1.08x (rounds alternated in one process, the same tokens). In place and
        opt-in, as :meth:`compile` is; it keeps the plain weights (drafts and tied embeddings read
        them), so it costs one more copy of them. Elsewhere (a GPU, a torch without oneDNN, or bfloat16 / float16
        weights on a CPU without the instructions oneDNN packs them with: AVX-512 BF16 or FP16, or AVX-NE-CONVERT)
        it changes nothing."""
        packs = {torch.float32: True, torch.bfloat16: native_bf16(),
                 torch.float16: torch.ops.mkldnn._is_mkldnn_fp16_supported()}
        if self.device.type != "cpu" or not torch.backends.mkldnn.is_available() or not packs.get(self.dtype):
            return self
        for m in self.modules():
            if isinstance(m, nn.Linear) and not hasattr(m, "packed"):
                m.packed = torch.ops.mkldnn._reorder_linear_weight(m.weight.detach(), None)  # (out, in), blocked
                m.forward = partial(_packed_linear, m)
        return self

    @property
    def device(self) -> torch.device:
        return self.embed.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.embed.weight.dtype

    def new_cache(self, batch_size: int, max_len: int, static: bool | None = None,
                  num_layers: int | None = None) -> KVCache:
        """A preallocated cache of ``max_len`` slots per row, for the first ``num_layers`` layers (default
        all). ``static`` (default: whether the model is compiled) makes attention span all slots."""
        cfg = self.config
        return KVCache(num_layers or cfg.num_hidden_layers, batch_size, cfg.num_key_value_heads, max_len, cfg.head_dim,
                       device=self.device, dtype=self.dtype, static=self.static_cache if static is None else static)

    def forward(self, tokens: torch.Tensor, cache: KVCache | None = None, output_index: torch.Tensor | None = None,
                num_layers: int | None = None, tree: TreeMask | None = None, features: tuple[int, ...] = ()):
        """Logits for ``tokens`` (B, T).

        With a cache, row b's tokens are written at slots ``cache.lengths[b] + 0..T-1`` and take
        those positions, and ``cache.lengths`` grows by T. Without one, the tokens are a whole
        sequence from position 0. ``tree`` makes the tokens nodes of a tree (:class:`TreeMask`):
        each takes position base + its depth and attends to the prefix and its ancestors only.
        ``output_index`` (B, N) picks the positions whose logits are returned (B, N, V), e.g. each
        row's last prompt token; default all (B, T, V); the LM head runs at those positions only.
        ``num_layers`` exits early: only the first layers run, then the final norm and LM head
        (self-speculation, as in LayerSkip); the cache
        then holds those layers only. ``features``: also return the residual stream after these
        layers (0 = the embeddings, l = after layer l), concatenated, at every position, as
        ``(logits, (B, T, C * k))``. A ``cache`` whose ``attends`` is true (the engine's flattened step,
        :class:`minispec.engine.attention.PagedStep`) brings each token's position and does the attention itself.
        """
        B, T = tokens.shape
        paged = getattr(cache, "attends", False)
        if paged:  # the engine's flattened step: it brings positions and masks itself
            pos, masks = cache.positions, None  # (B, T)
        else:
            length = torch.zeros(B, dtype=torch.long, device=tokens.device) if cache is None else cache.lengths  # (B,)
            new = length[:, None] + torch.arange(T, device=tokens.device)  # (B, T) the slots this call writes
            if cache is not None:
                cache.begin(new)
            pos, masks = attention_masks(new, T if cache is None else cache.slots_in_use, tree, self.windows)
        freqs = pos[..., None].float() * self.inv_freq.float()  # (B, T, D/2), float32 as in transformers
        emb = torch.cat((freqs, freqs), dim=-1)[:, None]  # (B, 1, T, D)
        cos, sin = emb.cos().to(self.dtype), emb.sin().to(self.dtype)
        x = self.embed(tokens)  # (B, T, C)
        kept = [x] if 0 in features else []
        if paged and self.paged_layers is not None and not features and num_layers is None:
            x = self.paged_layers(x, cos, sin, cache)  # (1, N, C): Engine(compile=True), minispec.engine.compiled
        else:
            for i, block in enumerate(self.layers[:num_layers]):
                x = block(x, cos, sin, masks, cache)
                if i + 1 in features:
                    kept.append(x)
        if cache is not None:
            cache.end(T)
        if output_index is not None:
            x = x.gather(1, output_index[..., None].expand(-1, -1, x.shape[-1]))  # (B, N, C)
        logits = self.lm_head(F.rms_norm(x, (x.shape[-1],), self.norm, self.config.rms_norm_eps))  # (B, T|N, V)
        return (logits, torch.cat(kept, -1)) if features else logits
