"""Draft state that outlives a step: each draft's per-row memory kept in the engine's blocks.

In :func:`~minispec.speculative.loop.speculative_generate` a draft's :class:`~minispec.drafts.base.DraftRun`
lives for one call over a fixed batch. In the engine rows join and leave between steps, so what
a draft remembers per row is kept where the target's KV is, in the same blocks under the same
block table (as vLLM keeps a draft model's KV), and a fresh ``DraftRun`` is assembled over each
step's rows from it:

  PromptLookupDraft  nothing to keep: it reads the row's tokens each step
  SuffixDraft        nothing in the blocks: its suffix trees are its own (the engine tells it each finished
                     request, :meth:`~minispec.drafts.base.Draft.observe`)
  ModelDraft         its own KV cache (its layers, the target's block tables), and per row the
  LayerSkipDraft     tokens it has not read yet (``lag``: 2 after a speculative step, one more
                     per plain step); rows with different lags re-read at one width, each from its
                     own start (:class:`_RaggedModelRun`)
  EagleDraft         its one-layer KV cache, the target's feature at every position
                     (:class:`~minispec.engine.paged.PagedRows`), and its lag
  TreeDraft          what its inner draft keeps

Each kind reads a prefill chunk with :meth:`PagedDraft.prefill` (a cost in TTFT), builds the
step's run with :meth:`PagedDraft.run`, and updates each row's lag with :meth:`PagedDraft.after`.
A preempted row's draft state is dropped with its blocks and rebuilt by the same prefill.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from minispec.decoding.plain import DecodeState
from minispec.decoding.sampling import Sampler
from minispec.drafts.base import Draft, DraftRun
from minispec.drafts.eagle import EagleDraft, _EagleRun
from minispec.drafts.lookup import PromptLookupDraft
from minispec.drafts.model import ModelDraft, _ModelRun
from minispec.drafts.suffix import SuffixDraft
from minispec.drafts.tree import TreeDraft, _TreeRun
from minispec.engine.paged import PagedPool, PagedRows
from minispec.engine.request import Sequence
from minispec.model.llama import Model


class Chunk(NamedTuple):
    """One step's prefill rows: each computes KV slots ``starts[b] .. starts[b] + n[b] - 1``."""

    tables: torch.Tensor  # (B, nb) block tables, padded with the scratch block
    starts: torch.Tensor  # (B,) the first slot each row computes (its KV so far)
    bound: int  # host-side max(starts)
    tokens: torch.Tensor  # (B, T) the chunk's tokens, right-padded
    last: torch.Tensor  # (B,) each row's last real token in the chunk (n - 1)
    seq: torch.Tensor  # (B, S) each row's tokens so far, right-padded (S > starts + T)


class PagedDraft:
    """A draft plus its per-row state in blocks (this base: a draft that keeps nothing)."""

    features: tuple[int, ...] = ()  # target layers whose residual stream the draft reads
    start_lag = 0  # each row's lag after its prefill
    keep = True  # a step's view of the draft's own pool copies each layer's rows once, not at every forward

    def __init__(self, draft: Draft, target: Model, num_blocks: int, block_size: int):
        self.draft, self.target = draft, target

    @property
    def nbytes(self) -> int:
        return 0

    def prefill(self, chunk: Chunk, features: torch.Tensor | None) -> None:
        """Read a prefill chunk (a cost in TTFT), given the target's ``features`` (B, T, F) there, if asked for."""

    def run(self, state: DecodeState, sampler: Sampler, rows: list[Sequence], tables: torch.Tensor) -> DraftRun:
        return self.draft.start(self.target, state, sampler)

    def after(self, run: DraftRun, rows: list[Sequence], speculative: bool) -> None:
        """After the step: each row's lag."""


class _RaggedModelRun(_ModelRun):
    """A draft model's run whose rows re-read different numbers of tokens: ``lags`` (B,) per row, read at one
    width from each row's own start, as an EAGLE head's catch-up does (past a row's own lag: padding)."""

    def __init__(self, draft: ModelDraft, cache, sampler: Sampler, lags: list[int]):
        super().__init__(draft, cache, sampler)
        self.lags = torch.tensor(lags, device=cache.lengths.device)  # (B,)
        self.width = max(lags)  # host-side: the engine keeps each row's lag

    def catch_up(self, state):
        start = state.total - self.lags  # (B,) >= 0: a row's lag never exceeds its tokens
        t = start[:, None] + torch.arange(self.width, device=start.device)  # (B, W) past total - 1: padding
        self.cache.trim(state.longest)
        self.cache.rollback(start)
        logits = self.model(state.seq.gather(1, t.clamp_max(state.slots - 1)), self.cache,
                            num_layers=self.num_layers)  # (B, W, V)
        self.cache.rollback(state.total)  # the padding's slots become stale
        return logits.gather(1, (self.lags - 1)[:, None, None].expand(-1, 1, logits.shape[-1]))[:, 0], None  # (B, V)


class PagedModelDraft(PagedDraft):
    """A draft model (or the target's first layers) with its KV in the engine's blocks."""

    start_lag = 2

    def __init__(self, draft: ModelDraft, target, num_blocks, block_size):
        super().__init__(draft, target, num_blocks, block_size)
        m = draft.model
        self.pool = PagedPool(draft.num_layers or m.config.num_hidden_layers, num_blocks, block_size,
                              m.config.num_key_value_heads, m.config.head_dim, m.device, m.dtype)

    @property
    def nbytes(self) -> int:
        return self.pool.nbytes

    def prefill(self, chunk, features):
        cache = self.pool.view(chunk.tables, chunk.starts)
        cache.trim(chunk.bound)
        self.draft.model(chunk.tokens, cache, output_index=chunk.last[:, None], num_layers=self.draft.num_layers)

    def run(self, state, sampler, rows, tables):
        cache = self.pool.view(tables, state.total - 1, keep=self.keep)  # its forwards this step read one copy
        return _RaggedModelRun(self.draft, cache, sampler, [s.lag for s in rows])

    def after(self, run, rows, speculative):
        for s in rows:
            s.lag = 2 if speculative else s.lag + 1


class PagedEagleDraft(PagedDraft):
    """An EAGLE head: its one-layer KV and the target's features at every position, in the engine's blocks."""

    start_lag = 1

    def __init__(self, draft: EagleDraft, target, num_blocks, block_size):
        super().__init__(draft, target, num_blocks, block_size)
        cfg, self.features = draft.model.config.layer, draft.features
        self.pool = PagedPool(1, num_blocks, block_size, cfg.num_key_value_heads, cfg.head_dim, target.device,
                              target.dtype)
        F = cfg.hidden_size * len(draft.features)
        self.feats = torch.zeros((num_blocks + 1) * block_size, F, device=target.device, dtype=target.dtype)  # (P, F)

    @property
    def nbytes(self) -> int:
        return self.pool.nbytes + self.feats.numel() * self.feats.element_size()

    def prefill(self, chunk, features):
        """Store the chunk's features, then read its pairs (f_t, x_{t+1}) as
        :class:`~minispec.drafts.eagle._EagleRun` reads a prompt. x_{t+1} is the row's next token, known for every
        pair but a new request's last (its first output is not drawn yet): that pair is stale until the first
        catch-up (lag 1) reads it."""
        m, T, S = self.draft.model, chunk.tokens.shape[1], chunk.seq.shape[1]
        view = self.pool.view(chunk.tables, chunk.starts)
        t = chunk.starts[:, None] + torch.arange(T, device=chunk.tokens.device)  # (B, T) the chunk's positions
        PagedRows(self.feats, view, S).scatter_(1, t[..., None], features)  # kept for catch-ups; padding: stale
        view.trim(chunk.bound)
        x = chunk.seq.gather(1, (t + 1).clamp_max(S - 1))  # (B, T) x_{t+1}; past a row's chunk: padding
        m(m.fuse(self.draft.embed(x), features, True), view)  # (B, T, C) pairs t of the chunk

    def run(self, state, sampler, rows, tables):
        cache = self.pool.view(tables, state.total - 1, keep=self.keep)
        # rows with a smaller lag than the batch's re-read a few true pairs: harmless
        return _EagleRun.resume(self.draft, state, sampler, cache, PagedRows(self.feats, cache, state.slots),
                                max(s.lag for s in rows))

    def after(self, run, rows, speculative):
        for s in rows:
            s.lag = run.lag if speculative else s.lag + 1


class PagedTreeDraft(PagedDraft):
    """A tree of drafts around a model draft or an EAGLE head: the inner draft's state, the tree's shape per step."""

    def __init__(self, draft: TreeDraft, target, num_blocks, block_size):
        super().__init__(draft, target, num_blocks, block_size)
        self.inner = paged_draft(draft.draft, target, num_blocks, block_size)
        self.features, self.start_lag = self.inner.features, self.inner.start_lag

    @property
    def nbytes(self) -> int:
        return self.inner.nbytes

    def prefill(self, chunk, features):
        self.inner.prefill(chunk, features)

    def run(self, state, sampler, rows, tables):
        return _TreeRun(self.draft, self.inner.run(state, sampler, rows, tables), self.target.config.vocab_size)

    def after(self, run, rows, speculative):
        self.inner.after(run.inner, rows, speculative)


def paged_draft(draft: Draft, target: Model, num_blocks: int, block_size: int) -> PagedDraft:
    """The engine's keeper for ``draft``'s per-row state."""
    for kind, keeper in ((TreeDraft, PagedTreeDraft), (EagleDraft, PagedEagleDraft), (ModelDraft, PagedModelDraft),
                         (PromptLookupDraft, PagedDraft), (SuffixDraft, PagedDraft)):
        if isinstance(draft, kind):
            return keeper(draft, target, num_blocks, block_size)
    raise ValueError(f"the engine does not know how to keep {type(draft).__name__}'s state between steps")


