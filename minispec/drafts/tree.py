"""A tree of draft tokens per row and step, static or dynamic, grown by any model draft and verified in one pass.

Static shapes (a branching per level, or Medusa/SpecInfer paths) and EAGLE-2's dynamic tree (top-k
expansion by cumulative draft probability, then the best ``budget`` nodes). The tree's shape and
mask are in :mod:`minispec.decoding.tree`; the rule that walks it in :mod:`minispec.speculative.rule`.
"""

from __future__ import annotations

import torch

from minispec.decoding.sampling import DRAFT, PointMass, probabilities, sample
from minispec.decoding.tree import MAX_NODES, Tree, ancestors, static_tree
from minispec.drafts.base import Draft, DraftRun, Proposal
from minispec.drafts.model import as_draft
from minispec.model.llama import TreeMask


def check_tree(branching: tuple[int, ...] | None = None, paths: list[tuple[int, ...]] | None = None,
               budget: int | None = None, depth: int | None = None, topk: int = 4) -> list[int] | None:
    """Check a tree's shape as :class:`TreeDraft` takes it, before any draft or model exists: the parent list
    of a static tree (:func:`~minispec.decoding.tree.static_tree`), None for a dynamic one. At most
    :data:`~minispec.decoding.tree.MAX_NODES` nodes are verified or fed to the draft per row and step."""
    if budget is None and depth is None:
        return static_tree(branching, paths)
    if branching is not None or paths is not None:
        raise ValueError("give a static tree (branching= or paths=) or a dynamic one (budget=, depth=), not both")
    for name, v in (("budget", budget), ("depth", depth), ("topk", topk)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
    fed = (depth - 1) * topk  # nodes the draft reads: topk per level below the last
    if max(budget, fed) > MAX_NODES:
        what = f"verifies {budget:,} nodes per row" if budget > MAX_NODES else \
            f"feeds the draft {fed:,} nodes per row, (depth - 1) x topk,"
        raise ValueError(f"budget={budget}, depth={depth}, topk={topk} {what} each step; a tree may have at most "
                         f"{MAX_NODES:,}")
    return None


class TreeDraft(Draft):
    """A tree of draft tokens per row and step, from any model draft, verified in one target pass.

    - ``TreeDraft(draft, branching=(4, 2, 2, 1))``: a static tree, every node at depth d with
      branching[d] children; or ``paths=[(0,), (0, 0), (1,), ...]`` (Medusa and SpecInfer style).
    - ``TreeDraft(draft, budget=16, depth=5)``: a dynamic tree (EAGLE-2): ``depth`` draft passes, each
      expanding the ``topk`` nodes of the last level with the highest cumulative draft probability
      (the product of the draft's probabilities along the path) by their ``topk`` likeliest
      children; then the ``budget`` nodes of highest cumulative probability are verified.

    ``draft``: a draft :class:`~minispec.model.llama.Model` or a model-based :class:`Draft` (a
    :class:`ModelDraft`, :class:`LayerSkipDraft` or a feature draft). Children at temperature > 0 are
    drawn i.i.d. from the draft's q in a static tree (SpecInfer); at temperature 0, and always in a
    dynamic tree, they are the draft's top-k tokens, point masses (EAGLE-2, Medusa); either way the
    rule in :mod:`minispec.speculative.rule` keeps the output exact. :func:`minispec.speculative_generate` drafts
    the tree to its own ``depth`` unless given a ``gamma``, which cuts it at depth ``gamma`` (``"auto"``
    chooses that depth each step, 0 turning speculation off). A tree has at most
    :data:`~minispec.decoding.tree.MAX_NODES` nodes (:func:`check_tree`).
    """

    def __init__(self, draft, branching: tuple[int, ...] | None = None, paths: list[tuple[int, ...]] | None = None,
                 budget: int | None = None, depth: int | None = None, topk: int = 4):
        parents = check_tree(branching, paths, budget, depth, topk)  # the shape first: nothing else is built yet
        self.draft = draft if isinstance(draft, Draft) else as_draft(draft)
        if isinstance(self.draft, TreeDraft) or self.draft.shape is None:  # text drafts (lookup, suffix): no model
            raise ValueError(f"a TreeDraft grows its tree with a draft model; got {type(self.draft).__name__}")
        if parents is None:
            self.parents, self.budget, self.depth, self.topk = None, budget, depth, topk
        else:
            self.parents = parents  # node j's parent at j - 1
            self.budget, self.branching, self.paths = len(parents), branching, paths
            level, ranks, children = [0] * (len(parents) + 1), [], [0] * (len(parents) + 1)  # linear in the nodes
            for j, par in enumerate(parents, 1):
                level[j] = level[par] + 1  # each node's depth
                ranks.append(children[par])  # its rank among its siblings
                children[par] += 1
            self.levels, self.depth, self.ranks, self.topk = level, max(level), ranks, max(ranks) + 1
        self.shape, self.features = self.draft.shape, self.draft.features

    def check(self, target, positions):
        if self.topk > target.config.vocab_size:
            raise ValueError(f"this tree gives a node up to {self.topk} children, more than the target's "
                             f"{target.config.vocab_size}-token vocabulary")
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
        """The ``budget`` candidates of highest cumulative log q, renumbered in depth order so parents come before
        children. A child's score is its parent's plus a log q <= 0, so never above it; candidates are listed level
        by level, so a stable sort puts a parent before a child that ties with it: every chosen node's ancestors
        are chosen, at any score magnitude (a tie-break added to the score is lost in float32 once |score| >= 16)."""
        sizes = [s.shape[1] for s in scores]
        start = [sum(sizes[:i]) for i in range(len(sizes))]
        score = torch.cat(scores, 1)  # (B, N) every candidate
        level = torch.cat([torch.full_like(s, i, dtype=torch.long) for i, s in enumerate(scores)], 1)  # (B, N)
        up = torch.cat([torch.where(p >= 0, p + start[max(i - 1, 0)], -1) for i, p in enumerate(parents)], 1)  # (B, N)
        B, N = score.shape
        T = min(self.cfg.budget, N)
        chosen = score.sort(dim=-1, descending=True, stable=True).indices[:, :T]  # (B, T) ties: the earlier level
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
