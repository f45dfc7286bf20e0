"""What proposes draft tokens: a smaller model, the target's own first layers, the text itself, or a tree of them.

A draft proposes, per row and step, tokens x (B, T) and the distributions q they were drawn
from: dense (B, T, V), or point masses (:class:`~minispec.sampling.PointMass`, O(B * T) memory)
for tokens chosen deterministically. A row may propose fewer than T tokens, or none: q is zero at
a position where nothing was proposed, and the accept rule treats it as rejected with
max(0, p - 0) = p, so the row's token there is an ordinary draw from the target. T draft tokens
form a chain x_1..x_gamma, or the nodes of a tree (:class:`TreeDraft`).

A :class:`Draft` is configuration only; :meth:`Draft.start` reads one call's prompts and returns a
:class:`DraftRun` holding that call's state (its KV cache, what it has not yet read).

  ModelDraft        a separate, smaller model with its own KV cache (Leviathan et al. 2023)
  LayerSkipDraft    the target's first N layers, then its final norm and LM head: self-speculation
                    with no new weights (after LayerSkip); its own N-layer KV cache, filled by reading
                    the prompt again, is this package's choice (LayerSkip shares the target's cache)
  PromptLookupDraft the tokens that followed the last n-gram's most recent earlier occurrence in the
                    row's own prompt and output (Saxena 2023; vLLM's "ngram", Hugging Face's
                    prompt_lookup_num_tokens): no model, no memory, c ~ 0
  TreeDraft         a tree of drafts from a draft model: a static shape (Medusa, SpecInfer) or a
                    dynamic tree grown by cumulative draft probability (EAGLE-2)
"""

from __future__ import annotations

from dataclasses import replace
from typing import NamedTuple

import torch

from minispec.decode import DecodeState, prefill
from minispec.model import Model, TreeMask
from minispec.roofline import ModelShape
from minispec.sampling import DRAFT, PointMass, Sampler, probabilities, sample
from minispec.tree import Tree, ancestors, static_tree


class Proposal(NamedTuple):
    """One step's draft tokens for every row."""

    x: torch.Tensor  # (B, T) a chain x_1..x_T, or a tree's nodes 1..T
    q: torch.Tensor | PointMass  # (B, T, V) the distribution each token was drawn from, or point masses
    tree: Tree | None = None  # None: a chain


class DraftRun:
    """One call's drafting state: what :meth:`Draft.start` returns.

    Model-based runs implement :meth:`catch_up` and :meth:`extend`; the chain :meth:`propose` and
    :class:`TreeDraft` are built on those two.
    """

    features: tuple[int, ...] = ()  # target layers whose residual stream the draft reads (EAGLE); () none

    def __init__(self, sampler: Sampler):
        self.sampler = sampler

    def catch_up(self, state: DecodeState) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Read the row's tokens the draft has not seen; the draft's logits for the next token (B, V)
        and its hidden state there (B, C) (None for a draft that needs none)."""
        raise NotImplementedError

    def extend(self, tokens: torch.Tensor, hidden: torch.Tensor | None, tree: TreeMask | None = None):
        """Feed draft tokens (B, w) (each after the state ``hidden`` (B, w, C) its parent left); logits (B, w, V)
        and hidden states (B, w, C) or None. ``tree``: the tokens are nodes of a tree growing past the prefix."""
        raise NotImplementedError

    def propose(self, state: DecodeState, gamma: int) -> Proposal:
        """A chain of gamma tokens per row: each drawn from q (the draft's warped distribution), then fed back."""
        u = self.sampler.uniforms(DRAFT, state.total, gamma)  # (B, gamma) or None when greedy
        logits, h = self.catch_up(state)  # (B, V), (B, C) or None
        qs, xs = [], []
        for i in range(gamma):
            if i:
                logits, h = self.extend(xs[-1][:, None], None if h is None else h[:, None])
                logits, h = logits[:, -1], None if h is None else h[:, -1]  # (B, V), (B, C)
            qs.append(probabilities(logits, self.sampler.params))  # (B, V)
            xs.append(sample(qs[-1], None if u is None else u[:, i]))  # (B,)
        return Proposal(torch.stack(xs, 1), torch.stack(qs, 1))  # (B, gamma), (B, gamma, V)

    def compact(self, root: torch.Tensor, slots: torch.Tensor) -> None:
        """Move the accepted tree path's entries in the draft's own cache next to its prefix (see
        :meth:`~minispec.kv_cache.KVCache.compact`); slots (B, depth) relative to the root's slot ``root``."""

    def verified(self, path: torch.Tensor, n: torch.Tensor, features: torch.Tensor | None) -> None:
        """After a speculative step: path (B, depth) the accepted nodes (-1 past a row's n (B,)), and the
        target's ``features`` (B, 1 + depth, F) at the root and along the path (None unless asked for)."""

    def skipped(self, features: torch.Tensor | None) -> None:
        """After a plain step (gamma 0): the target fed one token per row (its ``features`` (B, 1, F))."""


class Draft:
    """A draft's configuration; :meth:`start` makes one call's :class:`DraftRun`."""

    shape: ModelShape | None = None  # what one draft step reads, for the cost model; None: free (c = 0)
    features: tuple[int, ...] = ()  # target layers whose residual stream the draft reads; () none

    def check(self, target: Model, positions: int) -> None:
        """Raise ValueError if this draft cannot serve ``target`` for sequences of ``positions`` tokens."""

    def width(self, gamma: int) -> int:
        """The most slots one step writes past a row's tokens in the target's or the draft's cache, less the
        root's: gamma for a chain (the caches keep that many slots spare, plus one)."""
        return gamma

    def start(self, target: Model, state: DecodeState, sampler: Sampler,
              features: torch.Tensor | None = None) -> DraftRun:
        """Read the prompts (the loop times this as ``draft_prefill``: a cost in time to first token).
        ``features`` (B, P, F): the target's residual stream at every prompt position, if asked for."""
        raise NotImplementedError


class ModelDraft(Draft):
    """A draft model: one cached forward pass per draft token (the first re-reads ``lag`` tokens).

    Each step the draft first re-reads the last ``lag`` tokens of each row: 2 after a speculative
    step, one more for each plain step since. Re-writing a slot it already holds is harmless (same
    token, same position), and it covers the case where every draft token was accepted and the draft
    never saw the last one, without a per-row branch.
    """

    def __init__(self, model: Model, num_layers: int | None = None):
        self.model, self.num_layers = model, num_layers
        cfg = model.config if num_layers is None else replace(model.config, num_hidden_layers=num_layers)
        self.shape = ModelShape.from_config(cfg, model.dtype.itemsize)

    def check(self, target: Model, positions: int) -> None:
        tv, dv = target.config.vocab_size, self.model.config.vocab_size
        if tv != dv:
            raise ValueError(f"the draft and target must share a vocabulary: target has {tv} tokens, draft has {dv}")
        if target.device != self.model.device:
            raise ValueError(f"target is on {target.device} but draft is on {self.model.device}; "
                             "move both to one device")
        if target.dtype != self.model.dtype:
            raise ValueError(f"target is {target.dtype} but draft is {self.model.dtype}; load both with the same dtype")
        if positions > self.model.config.max_position_embeddings:
            raise ValueError(f"the longest prompt plus max_new_tokens exceeds the draft's maximum length of "
                             f"{self.model.config.max_position_embeddings} positions")

    def start(self, target, state, sampler, features=None) -> _ModelRun:
        cache = self.model.new_cache(state.batch_size, state.slots, num_layers=self.num_layers)
        prefill(self.model, state, cache, self.num_layers)
        return _ModelRun(self, cache, sampler)

    def __repr__(self) -> str:
        return f"ModelDraft({self.shape.params / 1e6:.3g}M parameters)"


class _ModelRun(DraftRun):
    def __init__(self, draft: ModelDraft, cache, sampler: Sampler):
        super().__init__(sampler)
        self.model, self.num_layers, self.cache = draft.model, draft.num_layers, cache
        self.lag = 2  # tokens to re-read at the next catch-up (see ModelDraft)

    def catch_up(self, state):
        self.cache.trim(state.longest)
        self.cache.rollback((state.total - self.lag).clamp_min(0))
        logits = self.model(state.last(self.lag), self.cache, num_layers=self.num_layers)[:, -1]  # (B, V)
        return logits, None

    def extend(self, tokens, hidden, tree=None):
        return self.model(tokens, self.cache, num_layers=self.num_layers, tree=tree), None  # (B, w, V)

    def compact(self, root, slots):
        self.cache.compact(root, slots)

    def verified(self, path, n, features):
        self.lag = 2

    def skipped(self, features):
        self.lag += 1


class LayerSkipDraft(ModelDraft):
    """Self-speculation: the target's first ``num_layers`` layers, then its final norm and LM head.

    It shares every weight with the target (nothing is copied). Here it keeps a KV cache of its own
    ``num_layers`` layers and reads each prompt again: that is this package's choice, not the method's.
    LayerSkip (Elhoushi et al. 2024) shares the target's cache and verifies by running only the
    remaining layers. An early exit drafts well for checkpoints trained for it (LayerSkip); skipping
    layers in the middle of an ordinary model instead of the last ones (Draft & Verify, Zhang et al.
    2024; SWIFT, Xia et al. 2025) pays on 7-13B models without new training. A large vocabulary makes
    even a shallow draft costly, because the LM head is read in full every step.
    """

    def __init__(self, target: Model, num_layers: int):
        L = target.config.num_hidden_layers
        if isinstance(num_layers, bool) or not isinstance(num_layers, int) or not 1 <= num_layers <= L:
            raise ValueError(f"num_layers must be an integer from 1 to the target's {L} layers, got {num_layers!r}")
        super().__init__(target, num_layers)

    def check(self, target: Model, positions: int) -> None:
        if target is not self.model:
            raise ValueError("a LayerSkipDraft drafts with the target it was built from; pass that same target")

    def __repr__(self) -> str:
        return f"LayerSkipDraft({self.num_layers} of {self.model.config.num_hidden_layers} layers)"


class PromptLookupDraft(Draft):
    """Prompt lookup: propose the tokens that followed the most recent earlier occurrence of the row's
    last n-gram (n from ``max_ngram`` down to ``min_ngram``, the longest that occurs wins) in the row's
    own prompt and output. Rows with no occurrence propose nothing that step.

    Its q is a point mass on each proposed token, held as a :class:`~minispec.sampling.PointMass`
    (no dense one-hot), so the unchanged accept rule stays exact: x is accepted with probability
    min(1, p(x) / 1) = p(x), and on rejection the token is drawn from norm(max(0, p - onehot(x))),
    which is p with x removed and renormalised. The batch verifies as many positions as the longest
    proposal in it (a plain step when none); vLLM verifies each request's own ragged draft instead.
    """

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1):
        for name, n in (("max_ngram", max_ngram), ("min_ngram", min_ngram)):
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {n!r}")
        if min_ngram > max_ngram:
            raise ValueError(f"min_ngram ({min_ngram}) must be at most max_ngram ({max_ngram})")
        self.max_ngram, self.min_ngram = max_ngram, min_ngram

    def start(self, target, state, sampler, features=None) -> _LookupRun:
        return _LookupRun(self, target.config.vocab_size, sampler)

    def __repr__(self) -> str:
        return f"PromptLookupDraft(max_ngram={self.max_ngram}, min_ngram={self.min_ngram})"


class _LookupRun(DraftRun):
    def __init__(self, draft: PromptLookupDraft, vocab_size: int, sampler: Sampler):
        super().__init__(sampler)
        self.max_ngram, self.min_ngram, self.vocab_size = draft.max_ngram, draft.min_ngram, vocab_size

    def propose(self, state, gamma):
        seq, total = state.seq, state.total  # (B, S), (B,)
        S = seq.shape[1]
        start = torch.full_like(total, -1)  # (B,) where the continuation starts; -1: no match yet
        for n in range(self.max_ngram, self.min_ngram - 1, -1):
            i = torch.arange(S - n + 1, device=seq.device)  # (S-n+1,) window starts
            match = (seq.unfold(1, n, 1) == state.last(n)[:, None, :]).all(-1)  # (B, S-n+1) window i == last n
            match &= (i + n < total[:, None]) & (total[:, None] > n)  # an earlier occurrence, with a next token
            latest = torch.where(match, i + n, -1).amax(1)  # (B,) the most recent one's continuation
            start = torch.where(start < 0, latest, start)
        k = torch.where(start < 0, 0, (total - start).clamp(0, gamma))  # (B,) tokens proposed
        # host sync: verify up to the batch's longest proposal (0: a plain step); vLLM: each request's own draft
        width = int(k.max())
        j = torch.arange(width, device=seq.device)  # (width,)
        x = seq.gather(1, (start.clamp_min(0)[:, None] + j).clamp_max(S - 1))  # (B, width)
        return Proposal(x, PointMass(j < k[:, None], self.vocab_size))  # (B, width), point masses


class TreeDraft(Draft):
    """A tree of draft tokens per row and step, from any model draft, verified in one target pass.

    - ``TreeDraft(draft, branching=(4, 2, 2, 1))``: a static tree, every node at depth d with
      branching[d] children; or ``paths=[(0,), (0, 0), (1,), ...]`` (Medusa and SpecInfer style).
    - ``TreeDraft(draft, budget=16, depth=5)``: a dynamic tree (EAGLE-2): ``depth`` draft passes, each
      expanding the ``topk`` nodes of the last level with the highest cumulative draft probability
      (the product of the draft's probabilities along the path) by their ``topk`` likeliest
      children; then the ``budget`` nodes of highest cumulative probability are verified.

    ``draft``: a draft :class:`~minispec.model.Model` or a model-based :class:`Draft` (a
    :class:`ModelDraft`, :class:`LayerSkipDraft` or a feature draft). Children at temperature > 0 are
    drawn i.i.d. from the draft's q in a static tree (SpecInfer); at temperature 0, and always in a
    dynamic tree, they are the draft's top-k tokens, point masses (EAGLE-2, Medusa); either way the
    rule in :mod:`minispec.tree` keeps the output exact. For a tree, the loop's ``gamma`` caps the depth
    (``gamma >= depth``: the whole tree; ``"auto"`` turns it on and off).
    """

    def __init__(self, draft, branching: tuple[int, ...] | None = None, paths: list[tuple[int, ...]] | None = None,
                 budget: int | None = None, depth: int | None = None, topk: int = 4):
        self.draft = draft if isinstance(draft, Draft) else as_draft(draft)
        if isinstance(self.draft, (PromptLookupDraft, TreeDraft)):
            raise ValueError(f"a TreeDraft grows its tree with a draft model; got {type(self.draft).__name__}")
        if budget is not None or depth is not None:
            if branching is not None or paths is not None:
                raise ValueError("give a static tree (branching= or paths=) or a dynamic one (budget=, depth=), "
                                 "not both")
            for name, v in (("budget", budget), ("depth", depth), ("topk", topk)):
                if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                    raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
            self.parents, self.budget, self.depth, self.topk = None, budget, depth, topk
        else:
            self.parents = static_tree(branching, paths)  # node j's parent at j - 1
            self.budget, self.branching, self.paths = len(self.parents), branching, paths
            level = [0] * (len(self.parents) + 1)  # each node's depth
            for j, par in enumerate(self.parents, 1):
                level[j] = level[par] + 1
            self.levels, self.depth = level, max(level)
            self.ranks = [self.parents[:j].count(par) for j, par in enumerate(self.parents)]  # among siblings
            self.topk = max(self.ranks) + 1
        self.shape, self.features = self.draft.shape, self.draft.features

    def check(self, target, positions):
        self.draft.check(target, positions)

    def width(self, gamma):
        return self.budget if self.parents is not None else max(self.budget, (self.depth - 1) * self.topk)

    def start(self, target, state, sampler, features=None):
        return _TreeRun(self, self.draft.start(target, state, sampler, features), target.config.vocab_size)

    def __repr__(self) -> str:
        if self.parents is None:
            return f"TreeDraft({self.draft!r}, budget={self.budget}, depth={self.depth}, topk={self.topk})"
        shape = f"branching={self.branching}" if self.branching else f"paths={self.paths}"
        return f"TreeDraft({self.draft!r}, {shape}, {self.budget} nodes)"


class _TreeRun(DraftRun):
    def __init__(self, tree: TreeDraft, inner: DraftRun, vocab_size: int):
        super().__init__(inner.sampler)
        self.cfg, self.inner, self.vocab_size, self.features = tree, inner, vocab_size, inner.features

    def propose(self, state, gamma):
        grow = self._static if self.cfg.parents is not None else self._dynamic
        return grow(state, min(gamma, self.cfg.depth))

    def _static(self, state, depth):
        cfg, B, dev = self.cfg, state.batch_size, state.device
        level = [d for d in cfg.levels[1:] if d <= depth]  # node j's depth at j - 1; nodes come in depth order
        T = len(level)
        parents = torch.tensor(cfg.parents[:T], device=dev).expand(B, T)  # (B, T)
        rank = torch.tensor(cfg.ranks[:T], device=dev)  # (T,) each node's rank among its siblings
        u = self.sampler.uniforms(DRAFT, state.total, T)  # (B, T), None when greedy
        logits, h = self.inner.catch_up(state)  # (B, V), (B, C) or None: the root's
        logits, h = logits[:, None], None if h is None else h[:, None]  # (B, 1, V), (B, 1, C): level 0
        self.root = state.total - 1  # (B,) the root's slot in the draft's cache; nodes follow it
        xs, qs = [], []
        anc = ancestors(parents, depth)[:, 1:, 1:]  # (B, T, T) among the nodes
        positions = self.root[:, None] + torch.tensor(level, device=dev)  # (B, T)
        first = 0  # the first node id of the previous level (the root: 0)
        for d in range(1, depth + 1):
            lo, hi = level.index(d), len(level) - level[::-1].index(d)  # x[:, lo:hi] are the depth-d nodes
            up = parents[0, lo:hi] - first  # (w,) each node's parent among the previous level's
            if u is None:  # greedy: the draft's top-k tokens, point masses
                top = logits.topk(max(cfg.ranks[lo:hi]) + 1, -1).indices  # (B, P, k)
                xs.append(top[:, up, rank[lo:hi]])  # (B, w)
            else:  # i.i.d. from the parent's q (SpecInfer)
                dist = probabilities(logits, self.sampler.params)[:, up]  # (B, w, V)
                xs.append(sample(dist, u[:, lo:hi]))  # (B, w)
                qs.append(dist)
            if d < depth:  # feed the depth-d nodes: their children come next
                mask = TreeMask(self.root + 1, positions[:, :hi], anc[:, lo:hi, :hi])
                logits, h = self.inner.extend(xs[-1], None if h is None else h[:, up], mask)  # (B, w, V), (B, w, C)
            first = lo + 1
        fed = torch.tensor(level, device=dev) < depth  # (T,) the nodes the draft's cache holds
        self.slot = torch.where(fed, torch.arange(1, T + 1, device=dev), -1).expand(B, T)  # (B, T) slot - root
        x = torch.cat(xs, 1)  # (B, T)
        q = torch.cat(qs, 1) if qs else PointMass(torch.ones_like(x, dtype=torch.bool), self.vocab_size)
        return Proposal(x, q, Tree(parents, depth, cfg.topk))

    def _dynamic(self, state, depth):
        k, B, dev = self.cfg.topk, state.batch_size, state.device
        logits, h = self.inner.catch_up(state)  # (B, V), (B, C) or None
        self.root = state.total - 1  # (B,) the root's slot in the draft's cache
        score, tok = logits.float().log_softmax(-1).topk(k, -1)  # (B, k) each: the root's children
        scores, toks, parents = [score], [tok], [torch.full((B, k), -1, device=dev)]  # candidates, level by level
        fed = []  # per level: (B, n) each candidate's slot - root in the draft's cache, -1: not fed
        frontier = torch.arange(k, device=dev).expand(B, k)  # (B, k) the candidates to feed (level-local ids)
        vis = torch.zeros(B, 0, 0, dtype=torch.bool, device=dev)  # (B, f, f) ancestors among the fed nodes
        positions = torch.zeros(B, 0, dtype=torch.long, device=dev)  # (B, f)
        hs = None if h is None else h[:, None].expand(B, k, -1)  # (B, k, C) the frontier's parents' states
        frontier_parent = None  # (B, k) from depth 2 on: each frontier node's parent among the fed nodes
        for d in range(1, depth):
            f = vis.shape[1]
            own = torch.eye(k, dtype=torch.bool, device=dev).expand(B, k, k)  # (B, k, k)
            above = (vis.gather(1, frontier_parent[..., None].expand(-1, -1, f)) if d > 1
                     else torch.zeros(B, k, 0, dtype=torch.bool, device=dev))  # (B, k, f) each parent's ancestry
            vis = torch.cat([torch.cat([vis, torch.zeros(B, f, k, dtype=torch.bool, device=dev)], 2),
                             torch.cat([above, own], 2)], 1)  # (B, f+k, f+k)
            positions = torch.cat([positions, (self.root + d)[:, None].expand(B, k)], 1)  # (B, f+k)
            slot = (f + 1 + torch.arange(k, device=dev)).expand(B, k)  # (B, k) where the frontier goes, from the root
            fed.append(torch.full_like(toks[-1], -1).scatter(1, frontier, slot))
            out, hs = self.inner.extend(toks[-1].gather(1, frontier), hs,
                                        TreeMask(self.root + 1, positions, vis[:, f:]))  # (B, k, V), (B, k, C)
            lp, child = out.float().log_softmax(-1).topk(k, -1)  # (B, k, k) each
            scores.append((scores[-1].gather(1, frontier)[..., None] + lp).flatten(1))  # (B, k*k) cumulative log q
            toks.append(child.flatten(1))  # (B, k*k)
            parents.append(frontier.repeat_interleave(k, 1))  # (B, k*k) the parent's level-local id
            best = scores[-1].topk(k, -1).indices  # (B, k) the next frontier
            frontier_parent = f + best.div(k, rounding_mode="floor")  # (B, k) fed index of each one's parent
            if hs is not None:
                hs = hs.gather(1, best.div(k, rounding_mode="floor")[..., None].expand(-1, -1, hs.shape[-1]))
            frontier = best
        fed.append(torch.full_like(toks[-1], -1))
        return self._select(scores, toks, parents, fed, depth)

    def _select(self, scores, toks, parents, fed, depth):
        """The ``budget`` candidates of highest cumulative log q (the shallower on a tie, so a node never
        outranks its parent), renumbered in depth order so parents come before children."""
        sizes = [s.shape[1] for s in scores]
        start = [sum(sizes[:i]) for i in range(len(sizes))]
        score = torch.cat(scores, 1)  # (B, N) every candidate
        level = torch.cat([torch.full_like(s, i, dtype=torch.long) for i, s in enumerate(scores)], 1)  # (B, N)
        up = torch.cat([torch.where(p >= 0, p + start[max(i - 1, 0)], -1) for i, p in enumerate(parents)], 1)  # (B, N)
        B, N = score.shape
        T = min(self.cfg.budget, N)
        chosen = (score - 1e-6 * level).topk(T, -1).indices  # (B, T)
        chosen = chosen.gather(1, (level.gather(1, chosen) * N + chosen).sort(-1).indices)  # (B, T) in depth order
        node = torch.zeros_like(level).scatter(1, chosen, torch.arange(1, T + 1, device=score.device).expand(B, T))
        up = up.gather(1, chosen)  # (B, T) the parent's candidate id, -1: the root
        parent = torch.where(up >= 0, node.gather(1, up.clamp_min(0)), 0)  # (B, T) 0: the root
        x = torch.cat(toks, 1).gather(1, chosen)  # (B, T)
        self.slot = torch.cat(fed, 1).gather(1, chosen)  # (B, T)
        return Proposal(x, PointMass(torch.ones_like(x, dtype=torch.bool), self.vocab_size),
                        Tree(parent, depth, self.cfg.topk))

    def verified(self, path, n, features):
        slots = torch.where(path > 0, self.slot.gather(1, (path - 1).clamp_min(0)), -1)  # (B, depth) -1: not held
        self.inner.compact(self.root, slots)
        self.inner.verified(path, n, features)

    def skipped(self, features):
        self.inner.skipped(features)


def as_draft(draft) -> Draft:
    """A :class:`Draft` from a draft ``Model`` or a Draft."""
    if isinstance(draft, Draft):
        return draft
    if isinstance(draft, Model):
        return ModelDraft(draft)
    raise ValueError(f"draft must be a minispec Model or a Draft (PromptLookupDraft, LayerSkipDraft, TreeDraft, "
                     f"...), got {type(draft).__name__}")

