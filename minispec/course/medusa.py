"""Medusa and Hydra heads: drafts that read only the target's last hidden state, trained on the CPU in seconds.

A **Medusa head** (Cai et al. 2024, arXiv 2401.10774) is a residual block on the target's final hidden state h_t
(after its final norm, as the LM head reads it, which gives the target's own x_{t+1}): head k gives
q(x_{t+1+k}) = softmax(W_lm (h_t + SiLU(W_k h_t + b_k))), k = 1..K. All K heads run at once from the same h_t, so
one small pass drafts K tokens; but head k never sees the tokens before the one it predicts, not even x_{t+1}, the
target's own next token. Its acceptance therefore falls fast with k: it must guess x_{t+1+k} for every x_{t+1..t+k}
the text might take.

A **Hydra head** (Ankner et al. 2024, arXiv 2402.05109) is sequentially dependent: head k also reads the tokens
drafted before it. Here head k reads h_t and the embedding of x_{t+k}, the token right before the one it predicts
(the target's x_{t+1} for k = 1, the head k - 1's draft after that): q(x_{t+1+k}) = softmax(W_lm (h_t + SiLU(W_k
[h_t; e(x_{t+k})] + b_k))). Hydra's own heads read every earlier draft token's embedding (and its best variant adds a
prefix attention layer); the last one carries most of it. The heads then run one after another, each a small
matmul, still without a decoder layer: the EAGLE head of lesson 12 is the next step up (a whole layer, its own
hidden state fed forward).

Both share the target's LM head, frozen, as minispec's EAGLE head does (Medusa-1 gives each head a copy of it,
initialised from the target's and trained: K times the LM head's bytes). They train by self-distillation, every
head at once: at each position t of windows of training text, head k is fitted to the target's own distribution for
x_{t+1+k} given the true text (soft cross-entropy), from one teacher-forced pass of the target. Greedy decoding with
them is exact (the accept rule holds for any q), and :class:`MedusaDraft` runs in ``speculative_generate`` like any
draft: chains of up to K tokens, greedy or sampled.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from minispec.decoding.sampling import DRAFT, probabilities, sample
from minispec.drafts.base import Draft, DraftRun, Proposal
from minispec.model.llama import Model
from minispec.roofline import ModelShape

KINDS = ("medusa", "hydra")


class Heads(nn.Module):
    """K residual heads on a hidden width C: Medusa's (input h) or Hydra's (input [h; e(previous token)])."""

    def __init__(self, hidden: int, heads: int, kind: str = "medusa"):
        super().__init__()
        if kind not in KINDS or not heads >= 1:
            raise ValueError(f"kind must be one of {KINDS} and heads >= 1, got {kind!r}, {heads}")
        self.kind, self.K, C = kind, heads, hidden
        fan_in = C * (2 if kind == "hydra" else 1)
        self.w = nn.Parameter(torch.zeros(heads, fan_in, C))  # (K, C_in, C): zero, so each head starts as h_t itself
        self.b = nn.Parameter(torch.zeros(heads, C))  # (K, C)

    def hidden(self, k: int, h: torch.Tensor, prev: torch.Tensor | None = None) -> torch.Tensor:
        """Head k's (0-based) residual output (..., C) from h (..., C) and, for Hydra, the previous token's
        embedding prev (..., C)."""
        z = torch.cat([h, prev], -1) if self.kind == "hydra" else h  # (..., C_in)
        return h + F.silu(z @ self.w[k] + self.b[k])  # (..., C)


def final_hidden(target: Model, f: torch.Tensor) -> torch.Tensor:
    """The target's final norm applied to its last layer's residual stream f (..., C): what its LM head reads."""
    return F.rms_norm(f, (f.shape[-1],), target.norm, target.config.rms_norm_eps)


class MedusaDraft(Draft):
    """Trained :class:`Heads` on ``target`` as a draft: ``speculative_generate(target, MedusaDraft(target, heads),
    prompts, gamma=K)`` (chains of at most K tokens; trees are not built here)."""

    def __init__(self, target: Model, heads: Heads):
        if heads.w.shape[-1] != target.config.hidden_size:
            raise ValueError(f"the heads are {heads.w.shape[-1]} wide; the target's hidden size is "
                             f"{target.config.hidden_size}")
        self.target, self.heads = target, heads.to(target.device, target.dtype).eval().requires_grad_(False)
        self.features = (target.config.num_hidden_layers,)  # the residual stream after the last layer
        C, V, K = target.config.hidden_size, target.config.vocab_size, heads.K
        self.shape = ModelShape(heads.w.numel() + heads.b.numel() + V * C, target.dtype.itemsize, vocab=V, hidden=C,
                                name=f"{K} {heads.kind} heads")  # one pass drafts all K: its own matmuls, the LM head

    def check(self, target: Model, positions: int) -> None:
        if target is not self.target:
            raise ValueError("a MedusaDraft reads the hidden states of the target it was built with; pass that target")

    def start(self, target, state, sampler, features=None) -> _MedusaRun:
        return _MedusaRun(self, state, sampler, features)

    def __repr__(self) -> str:
        return f"MedusaDraft({self.heads.K} {self.heads.kind} heads)"


class _MedusaRun(DraftRun):
    """One call: the target's feature at every position so far (B, S, C); a step reads the one before the row's
    last token (that token's own feature comes with the next verify pass)."""

    def __init__(self, draft: MedusaDraft, state, sampler, features: torch.Tensor):
        super().__init__(sampler)
        self.draft, self.state, self.features = draft, state, draft.features
        B, S, P = state.batch_size, state.slots, features.shape[1]
        self.feats = features.new_zeros(B, S, features.shape[-1])  # (B, S, C)
        self.feats[:, :P] = features
        self.pos = state.prompt_len.clone()  # (B,) where the next features go: the target's cache length

    def propose(self, state, gamma: int) -> Proposal:
        heads = self.draft.heads
        if gamma > heads.K:
            raise ValueError(f"{heads.K} heads draft at most {heads.K} tokens a step; got gamma {gamma}")
        S, C = self.feats.shape[1], self.feats.shape[-1]
        at = (state.total - 2).clamp(0, S - 1)[:, None, None].expand(-1, 1, C)  # (B, 1, C) the last fed position
        h = final_hidden(self.draft.target, self.feats.gather(1, at)[:, 0])  # (B, C)
        prev = state.seq.gather(1, (state.total - 1)[:, None])[:, 0]  # (B,) the row's last token: x_{t+1}
        u = self.sampler.uniforms(DRAFT, state.total, gamma)  # (B, gamma) or None when greedy
        W, qs, xs = self.draft.target.lm_head.weight, [], []  # W (V, C)
        for k in range(gamma):
            e = self.draft.target.embed(prev) if heads.kind == "hydra" else None  # (B, C)
            qs.append(probabilities(heads.hidden(k, h, e) @ W.T, self.sampler.params))  # (B, V)
            xs.append(sample(qs[-1], None if u is None else u[:, k]))  # (B,)
            prev = xs[-1]
        return Proposal(torch.stack(xs, 1), torch.stack(qs, 1))  # (B, gamma), (B, gamma, V)

    def _arrived(self, features: torch.Tensor) -> None:
        """Store the target's features (B, w, C) at positions pos, pos + 1, ...; pos moves to the cache length."""
        S, w = self.feats.shape[1], features.shape[1]
        at = (self.pos[:, None] + torch.arange(w, device=features.device)).clamp_max(S - 1)  # (B, w)
        self.feats.scatter_(1, at[..., None].expand(-1, -1, features.shape[-1]), features)
        self.pos = self.state.total - 1

    def verified(self, path, n, features):
        self._arrived(features)  # the root and the accepted path (past a row's n: stale, overwritten later)

    def skipped(self, features):
        self._arrived(features)


@dataclass(frozen=True)
class TrainConfig:
    heads: int = 4  # K: draft tokens a step at most
    windows: int = 64  # windows of training text, teacher-forced through the target once
    seq_len: int = 256  # tokens per window
    steps: int = 300  # AdamW steps over random minibatches of positions
    batch: int = 2048  # positions per step
    lr: float = 1e-2  # AdamW learning rate, cosine-decayed
    seed: int = 0


@torch.inference_mode()
def teacher(target: Model, tokens: list[int], cfg: TrainConfig) -> tuple[torch.Tensor, ...]:
    """One teacher-forced pass over ``cfg.windows`` random windows of ``tokens``: the final hidden states h (N, C),
    the target's log p for the next token (N, V) and the tokens (N,), flattened window by window (N = windows x
    seq_len), on the target's device."""
    rng = random.Random(cfg.seed)
    starts = [rng.randrange(len(tokens) - cfg.seq_len) for _ in range(cfg.windows)]
    x = torch.tensor([tokens[s:s + cfg.seq_len] for s in starts], device=target.device)  # (W, T)
    logits, f = target(x, features=(target.config.num_hidden_layers,))  # (W, T, V), (W, T, C)
    return final_hidden(target, f).float(), logits.float().log_softmax(-1), x  # (W, T, C), (W, T, V), (W, T)


def train_heads(target: Model, tokens: list[int], kind: str = "medusa", cfg: TrainConfig = TrainConfig(),
                data=None) -> tuple[Heads, dict]:
    """Self-distil K heads of ``kind`` onto ``target`` from ``tokens`` (training text, ids); ``data``: a
    :func:`teacher` result to reuse (both kinds can share one pass). Returns the heads (float32, on the target's
    device) and a record: seconds, steps, the final loss per head (nats, soft cross-entropy to the target's p)."""
    t0 = time.perf_counter()
    h, logp, x = data if data is not None else teacher(target, tokens, cfg)  # (W, T, C), (W, T, V), (W, T)
    W_, T, C = h.shape
    K = cfg.heads
    heads = Heads(C, K, kind).to(h.device)
    lm = target.lm_head.weight.detach().float()  # (V, C) frozen, shared
    emb = target.embed.weight.detach().float()  # (V, C)
    # Head k (0-based) at position t predicts x_{t+2+k}: the target's p for it is read at position t + 1 + k < T.
    valid = torch.arange(T - K, device=h.device)  # (T - K,) positions every head can use
    hs = h[:, : T - K].reshape(-1, C)  # (N, C)
    gen = torch.Generator(device="cpu").manual_seed(cfg.seed)
    opt = torch.optim.AdamW(heads.parameters(), lr=cfg.lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * s / cfg.steps)))
    rows = torch.arange(W_, device=h.device)[:, None].expand(-1, T - K).reshape(-1)  # (N,) each position's window
    cols = valid[None].expand(W_, -1).reshape(-1)  # (N,) its position
    last = []
    for _ in range(cfg.steps):
        i = torch.randint(len(hs), (min(cfg.batch, len(hs)),), generator=gen).to(h.device)  # (n,)
        r, t = rows[i], cols[i]
        losses = []
        for k in range(K):
            prev = emb[x[r, t + 1 + k]] if kind == "hydra" else None  # (n, C) x_{t+1+k}: right before the predicted
            q = (heads.hidden(k, hs[i], prev) @ lm.T).log_softmax(-1)  # (n, V)
            losses.append(-(logp[r, t + 1 + k].exp() * q).sum(-1).mean())  # soft cross-entropy to p(x_{t+2+k})
        opt.zero_grad()
        sum(losses).backward()
        opt.step()
        sched.step()
        last = [float(v.detach()) for v in losses]
    return heads.eval(), {"kind": kind, "heads": K, "seconds": time.perf_counter() - t0, "steps": cfg.steps,
                          "loss_per_head": last}
