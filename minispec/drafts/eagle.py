"""An EAGLE-style feature draft: one decoder layer reading the target's hidden states, with an optional hot vocabulary.

The draft (Li et al. 2024, EAGLE-1; EAGLE-3 fuses several target layers) predicts from the target's
residual stream instead of from tokens alone. Its slot t holds the pair (f_t, x_{t+1}): f_t the
target's feature at position t (``features=(L,)``: the residual stream after its last layer, before the
final norm, where SafeAILab's EAGLE-1 reads that norm's output; several layers, e.g. low, mid and high,
are concatenated and reduced to C by a matmul, as EAGLE-3 does; SGLang's EAGLE-3 layer then widens its
Q, K, V to read the embedding beside it, this one fuses them as below) and x_{t+1} the next token's
embedding (the target's own embedding, borrowed, not copied). Both are RMS-normalised, then a fusion
matmul (2 C -> C): the wiring of DeepSeek-V3's MTP module (EAGLE-1 feeds the normed feature and the raw
embedding to its fusion); one decoder layer of the target's architecture then gives a hidden state h_t,
and the LM head gives q for x_{t+2}. Drafting several tokens, a draft position reads the draft's own h
of its parent in place of the target's feature (as EAGLE-1/2/3 do).

The LM head is the target's own (its weight rows, borrowed) behind the draft's own final norm: the
full vocabulary, or a **hot vocabulary** of N tokens (FR-Spec, Zhao et al. 2025, arXiv 2502.14856):
the first N of the head's ranking, which training makes from the tokens the target expects most often
in the training data (sum over positions of p; FR-Spec counts corpus tokens); their N rows are gathered
once, and a draft -> target id map places the N logits. EAGLE-3 keeps a 32k draft vocabulary too (the
training data's most frequent tokens, with a d2t map), but trains a head of its own for it and leaves
out of its loss the positions whose target argmax lies outside it.
q is then exactly 0 outside the hot set (logits -inf there, so temperature, top-k and top-p apply
unchanged), which costs nothing in exactness: the accept rule is exact for any q. It costs
acceptance: the mass p puts outside the hot set is never proposed (the hot set's acceptance ceiling).

Caches: the draft's slot t sits beside the target's slot t, so both hold total - 1 slots between steps.
After a step the draft rolls its cache back and re-reads, at a fixed width (no host sync), the
positions whose true target features have just arrived (the root and the accepted path), overwriting
what it had drafted there from its own hidden states.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from minispec.decoding.plain import DecodeState
from minispec.decoding.sampling import Sampler
from minispec.drafts.base import Draft, DraftRun
from minispec.model.config import ModelConfig, config_from_hf
from minispec.model.kv_cache import KVCache
from minispec.model.llama import Block, Model, TreeMask, attention_masks, rope_inv_freq
from minispec.model.load import ASSETS
from minispec.roofline import eagle_head_shape

SHIPPED = ("tiny-code-eagle", "smollm2-135m-eagle")  # heads inside the package (minispec/assets/NAME)
ARCHITECTURE = "EagleDraft"  # config.json's "architectures" entry


@dataclass(frozen=True)
class EagleConfig:
    """An EAGLE head's shape and what it expects of its target."""

    layer: ModelConfig  # the one decoder layer's shape: the target's, with one layer and no sliding window
    features: tuple[int, ...]  # target layers read (0 = embeddings, l = after layer l), in increasing order
    target_layers: int  # the target's decoder layers (features must lie in 0..target_layers)
    hot_vocab: int | None = None  # hot tokens used by default (the first N of the ranking); None: all

    @classmethod
    def for_target(cls, target: ModelConfig, features: tuple[int, ...] | None = None,
                   hot_vocab: int | None = None) -> EagleConfig:
        """The head for ``target``: ``features`` default (L,), the residual stream after the last layer (pre-norm)."""
        L = target.num_hidden_layers
        features = (L,) if features is None else tuple(features)
        layer = replace(target, num_hidden_layers=1, sliding_window=None)
        cfg = cls(layer, features, L, hot_vocab)
        cfg.check()
        return cfg

    def check(self) -> None:
        f, L, V = self.features, self.target_layers, self.layer.vocab_size
        if not f or list(f) != sorted(set(f)) or not all(isinstance(i, int) and 0 <= i <= L for i in f):
            raise ValueError(f"features must be increasing layer numbers in 0..{L}, got {f!r}")
        if self.hot_vocab is not None and not (isinstance(self.hot_vocab, int) and 1 <= self.hot_vocab <= V):
            raise ValueError(f"hot_vocab must be an integer in 1..{V} (the vocabulary) or None, got {self.hot_vocab!r}")

    def to_dict(self) -> dict:
        return {"architectures": [ARCHITECTURE], "features": list(self.features), "target_layers": self.target_layers,
                "hot_vocab": self.hot_vocab, "layer": self.layer.to_hf_dict()}

    @classmethod
    def from_dict(cls, d: dict) -> EagleConfig:
        if d.get("architectures") != [ARCHITECTURE]:
            raise ValueError(f"not an EAGLE head: architectures is {d.get('architectures')!r}, expected "
                             f"[{ARCHITECTURE!r}]")
        cfg = cls(config_from_hf(d["layer"]), tuple(d["features"]), d["target_layers"], d.get("hot_vocab"))
        cfg.check()
        return cfg


class EagleModel(nn.Module):
    """The head's own weights: feature reduction (several target layers only), fusion, one decoder layer, a
    norm; and the token ranking (the most expected first) its hot vocabulary is cut from."""

    def __init__(self, cfg: EagleConfig):
        super().__init__()
        C, k = cfg.layer.hidden_size, len(cfg.features)
        self.config = cfg
        self.reduce = nn.Linear(k * C, C, bias=False) if k > 1 else None  # k target layers -> C (EAGLE-3)
        self.fc = nn.Linear(2 * C, C, bias=False)  # [embedding of x_{t+1}, feature at t] -> C
        self.layer = Block(cfg.layer, 0)
        self.norm = nn.Parameter(torch.ones(C))
        self.register_buffer("ranking", torch.arange(cfg.layer.vocab_size))  # (V,) token ids, most frequent first
        self.register_buffer("inv_freq", rope_inv_freq(cfg.layer), persistent=False)  # (D/2,)
        for name, p in self.named_parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)
            elif "norm" not in name:
                nn.init.zeros_(p)

    def fuse(self, emb: torch.Tensor, g: torch.Tensor, from_target: bool) -> torch.Tensor:
        """The layer's input (B, T, C) from token embeddings (B, T, C) and features: the target's (B, T, k C)
        when ``from_target``, else the draft's own hidden states (B, T, C). Each is RMS-normalised (no weight)
        first: a residual stream's scale differs by orders of magnitude between layers and positions."""
        C, eps = emb.shape[-1], self.config.layer.rms_norm_eps
        norm = lambda t: F.rms_norm(t, (C,), None, eps)  # noqa: E731
        if from_target and self.reduce is not None:
            g = self.reduce(norm(g.unflatten(-1, (-1, C))).flatten(-2))  # (B, T, C) from (B, T, k, C) normalised
        return self.fc(torch.cat([norm(emb), norm(g)], -1))  # (B, T, C)

    def logits(self, h: torch.Tensor, head: torch.Tensor) -> torch.Tensor:
        """Logits (B, T, N) over the head's N rows (N, C) from hidden states h (B, T, C)."""
        return F.linear(F.rms_norm(h, (h.shape[-1],), self.norm, self.config.layer.rms_norm_eps), head)

    def forward(self, x: torch.Tensor, cache: KVCache, tree: TreeMask | None = None) -> torch.Tensor:
        """Hidden states h (B, T, C) of the layer over inputs x (B, T, C), written into ``cache`` from each
        row's length (as :meth:`minispec.model.llama.Model.forward` does, causal or as nodes of a ``tree``)."""
        B, T, _ = x.shape
        new = cache.lengths[:, None] + torch.arange(T, device=x.device)  # (B, T) the slots this call writes
        cache.begin(new)
        pos, masks = attention_masks(new, cache.slots_in_use, tree, (None,))  # (B, T), {None: (B, 1, T, S')}
        cos, sin = rotary(pos, self.inv_freq, x.dtype)
        h = self.layer(x, cos, sin, masks, cache)  # (B, T, C)
        cache.end(T)
        return h


def rotary(pos: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin (B, 1, T, D) of positions (B, T), computed in float32 as the target does."""
    freqs = pos[..., None].float() * inv_freq.float()  # (B, T, D/2)
    emb = torch.cat((freqs, freqs), dim=-1)[:, None]  # (B, 1, T, D)
    return emb.cos().to(dtype), emb.sin().to(dtype)


class EagleDraft(Draft):
    """An EAGLE-style feature draft for ``target``: ``EagleDraft(target, model)`` or :meth:`from_pretrained`.

    Works as a chain (``speculative_generate(target, draft, ...)``) and inside
    ``TreeDraft(draft, budget=..., depth=...)`` (EAGLE-2) or a static tree, greedy and sampled, batched
    and ragged. ``hot_vocab``: draft over the ``hot_vocab`` most frequent tokens of the head's ranking
    (q = 0 elsewhere); None: the head's own default; the target's vocabulary size: the full vocabulary.
    """

    def __init__(self, target: Model, model: EagleModel, hot_vocab: int | None = None):
        if not isinstance(target, Model) or not isinstance(model, EagleModel):
            raise ValueError(f"EagleDraft needs a minispec Model and an EagleModel, got {type(target).__name__} and "
                             f"{type(model).__name__}")
        cfg, tc = model.config, target.config
        if tc.vocab_size != cfg.layer.vocab_size or tc.hidden_size != cfg.layer.hidden_size:
            raise ValueError(f"this EAGLE head was trained for a target with vocabulary {cfg.layer.vocab_size} and "
                             f"hidden size {cfg.layer.hidden_size}; the target has {tc.vocab_size} and "
                             f"{tc.hidden_size}")
        if tc.num_hidden_layers != cfg.target_layers:
            raise ValueError(f"this EAGLE head reads layers {cfg.features} of a {cfg.target_layers}-layer target; "
                             f"the target has {tc.num_hidden_layers} layers")
        V = tc.vocab_size
        N = cfg.hot_vocab if hot_vocab is None else hot_vocab
        if N is not None and (isinstance(N, bool) or not isinstance(N, int) or not 1 <= N <= V):
            raise ValueError(f"hot_vocab must be an integer in 1..{V} (the target's vocabulary) or None, got {N!r}")
        self.target, self.model = target, model.to(target.device, target.dtype)  # in place
        model.inv_freq = rope_inv_freq(cfg.layer).to(target.device)  # float32, as the target keeps its own
        self.features, self.hot_vocab = cfg.features, None if N in (None, V) else N
        self.embed, W = target.embed, target.lm_head.weight  # borrowed: the target's embedding and head (V, C)
        self.hot = None if self.hot_vocab is None else model.ranking[: self.hot_vocab].sort().values  # (N,) target ids
        self.head = W if self.hot is None else W[self.hot].contiguous()  # (N, C): N rows gathered once
        shape = eagle_head_shape(tc, self.hot_vocab, bytes_per_param=target.dtype.itemsize)
        if model.reduce is not None:  # this head's fusion: k C x C reduction + 2 C x C, not SGLang's EAGLE-3 layout
            shape = replace(shape, params=shape.params + model.reduce.weight.numel())
        self.shape = shape

    @classmethod
    def from_pretrained(cls, name_or_dir: str | Path, target: Model, hot_vocab: int | None = None) -> EagleDraft:
        """Load a head saved by :meth:`save` (``config.json`` + ``model.safetensors``): a shipped name
        (``"tiny-code-eagle"``, ``"smollm2-135m-eagle"``) or a directory, cast to the target's dtype and device."""
        from safetensors.torch import load_file

        if not isinstance(target, Model):
            raise ValueError(f"target must be a minispec Model (minispec.load(...)[0]), got {type(target).__name__}")
        path = ASSETS / str(name_or_dir) if str(name_or_dir) in SHIPPED else Path(name_or_dir).expanduser()
        if not (path / "config.json").is_file() or not (path / "model.safetensors").is_file():
            raise ValueError(f"{name_or_dir!r} is neither a shipped EAGLE head ({', '.join(SHIPPED)}) nor a directory "
                             f"holding config.json and model.safetensors")
        cfg = EagleConfig.from_dict(json.loads((path / "config.json").read_text()))
        with torch.device("meta"):
            model = EagleModel(cfg)
        state = load_file(str(path / "model.safetensors"))
        missing, extra = set(model.state_dict()) - set(state), set(state) - set(model.state_dict())
        if missing or extra:
            raise ValueError(f"{path}: weights do not match the config (missing {sorted(missing)[:4]}, "
                             f"unexpected {sorted(extra)[:4]})")
        model.load_state_dict({k: v.to(target.device, torch.long if k == "ranking" else target.dtype)
                               for k, v in state.items()}, assign=True, strict=True)
        model.inv_freq = rope_inv_freq(cfg.layer)  # (D/2,) not saved
        return cls(target, model.eval().requires_grad_(False), hot_vocab)

    def save(self, out_dir: str | Path, dtype: torch.dtype = torch.float32, extra: dict | None = None) -> Path:
        """Write the head's own weights (not the borrowed embedding and LM head) as ``model.safetensors`` in
        ``dtype``, its ``config.json``, and ``extra`` as ``training.json``."""
        return save_head(self.model, out_dir, dtype, extra)

    def check(self, target: Model, positions: int) -> None:
        if target is not self.target:
            raise ValueError("an EagleDraft reads the features of the target it was built with; pass that target")
        if positions > self.model.config.layer.max_position_embeddings:
            raise ValueError(f"the longest prompt plus max_new_tokens exceeds the draft's maximum length of "
                             f"{self.model.config.layer.max_position_embeddings} positions")

    def start(self, target, state, sampler, features=None) -> _EagleRun:
        return _EagleRun(self, state, sampler, features)

    def __repr__(self) -> str:
        vocab = "full vocabulary" if self.hot is None else f"hot vocabulary {self.hot_vocab}"
        return f"EagleDraft(features={self.features}, {vocab})"


def save_head(model: EagleModel, out_dir: str | Path, dtype: torch.dtype = torch.float32,
              extra: dict | None = None) -> Path:
    """Write ``model`` (see :meth:`EagleDraft.save`); returns the directory."""
    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(model.config.to_dict(), indent=2) + "\n")
    state = {k: (v.to(torch.int32) if k == "ranking" else v.to(dtype)).contiguous()
             for k, v in model.state_dict().items()}
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    if extra is not None:
        (out / "training.json").write_text(json.dumps(extra, indent=2) + "\n")
    return out


class _EagleRun(DraftRun):
    """One call's EAGLE state: the draft's one-layer cache, the target's features at every position so far
    (B, S, F), where the next ones go (``pos``, the target's cache length), and how many pairs to re-read."""

    def __init__(self, draft: EagleDraft, state: DecodeState, sampler: Sampler, features: torch.Tensor):
        super().__init__(sampler)
        m, cfg = draft.model, draft.model.config.layer
        self.draft, self.model, self.state, self.features = draft, m, state, draft.features
        B, S, P = state.batch_size, state.slots, features.shape[1]
        self.cache = KVCache(1, B, cfg.num_key_value_heads, S, cfg.head_dim, device=state.device, dtype=features.dtype)
        self.feats = features.new_zeros(B, S, features.shape[-1])  # (B, S, F) the target's feature at each position
        self.feats[:, :P] = features
        self.pos = state.prompt_len.clone()  # (B,) where the next target features go: the target's cache length
        if P > 1:  # the prompt's pairs (f_t, x_{t+1}), t < P - 1; right padding past a row's prompt is stale
            self._read(features[:, : P - 1], state.seq[:, 1:P])
            self.cache.rollback(state.prompt_len - 1)
        self.lag = 1  # pairs to (re)read at the next catch-up

    @classmethod
    def resume(cls, draft: EagleDraft, state: DecodeState, sampler: Sampler, cache, feats, lag: int) -> _EagleRun:
        """A run over rows whose text the head has read already (the engine keeps its cache and the target's features
        in its blocks, :mod:`minispec.engine.drafting`): nothing to read from a prompt; ``lag`` pairs to re-read."""
        run = cls.__new__(cls)
        DraftRun.__init__(run, sampler)
        run.draft, run.model, run.state, run.features = draft, draft.model, state, draft.features
        run.cache, run.feats, run.pos, run.lag = cache, feats, state.total - 1, lag
        return run

    def _read(self, f: torch.Tensor, tokens: torch.Tensor):
        """Feed pairs of target features f (B, w, F) and next tokens (B, w): hidden states (B, w, C)."""
        return self.model(self.model.fuse(self.draft.embed(tokens), f, True), self.cache)

    def _vocab(self, logits: torch.Tensor) -> torch.Tensor:
        """Logits over the target's vocabulary (..., V): the hot rows' own, -inf elsewhere (q = 0 there)."""
        if self.draft.hot is None:
            return logits
        full = logits.new_full((*logits.shape[:-1], self.draft.target.config.vocab_size), float("-inf"))  # (..., V)
        return full.index_copy_(-1, self.draft.hot, logits)

    def catch_up(self, state):
        lag, S = self.lag, state.slots
        start = (state.total - 1 - lag).clamp_min(0)  # (B,) first pair to (re)read: t = total - 1 - lag
        t = start[:, None] + torch.arange(lag, device=state.device)  # (B, lag) past total - 2: padding
        self.cache.trim(state.longest)
        self.cache.rollback(start)
        f = self.feats.gather(1, t.clamp_max(S - 1)[..., None].expand(-1, -1, self.feats.shape[-1]))  # (B, lag, F)
        h = self._read(f, state.seq.gather(1, (t + 1).clamp_max(S - 1)))  # (B, lag, C)
        self.cache.rollback(state.total - 1)  # the padding's slots become stale
        last = (state.total - 2 - start)[:, None, None].expand(-1, 1, h.shape[-1])  # (B, 1, C) the row's pair total - 2
        h = h.gather(1, last)[:, 0]  # (B, C)
        return self._vocab(self.model.logits(h, self.draft.head)), h  # (B, V), (B, C)

    def extend(self, tokens, hidden, tree=None):
        if tree is not None:  # the draft's slot t is the target's slot t + 1's pair: the tree starts one slot earlier
            tree = TreeMask(tree.base - 1, tree.positions - 1, tree.visible)
        h = self.model(self.model.fuse(self.draft.embed(tokens), hidden, False), self.cache, tree)  # (B, w, C)
        return self._vocab(self.model.logits(h, self.draft.head)), h  # (B, w, V), (B, w, C)

    def _arrived(self, features: torch.Tensor) -> None:
        """Store the target's features (B, w, F) of positions pos, pos + 1, ... (past a row's accepted path:
        padding, overwritten when the true ones arrive); pos moves to the target's new cache length."""
        S, w = self.feats.shape[1], features.shape[1]
        at = (self.pos[:, None] + torch.arange(w, device=features.device)).clamp_max(S - 1)  # (B, w)
        self.feats.scatter_(1, at[..., None].expand(-1, -1, features.shape[-1]), features)
        self.pos = self.state.total - 1

    def verified(self, path, n, features):
        self._arrived(features)  # the root and the accepted path: up to 1 + depth new pairs
        self.lag = 1 + path.shape[1]

    def skipped(self, features):
        self._arrived(features)
        self.lag += 1
