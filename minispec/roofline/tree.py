"""Tree speculation on the roofline: accepted length from a rank profile, best trees per budget and batch.

A tree step (SpecInfer, Medusa, EAGLE-2, Sequoia) verifies T draft nodes per row in one pass: t(B, T + 1), the
root (the last accepted token) included. It is drafted in one pass per level, pass i over the w_i nodes of depth
i - 1 that get children, each c * t(B, w_i) (or a draft shape's own step). From an acceptance profile by child
rank (Sequoia's positional acceptance vector: P(the accepted child is the one of rank k)), a node is accepted
with the product of the profile along its path, and E = 1 + the sum over nodes; the best tree of n nodes is the
n most probable nodes (profiles: :mod:`minispec.roofline.profile`). At small batch verification is nearly free,
so a large tree raises E well above a chain's; but every row verifies every node, so the weights turn
compute-bound at B (T + 1) = 295 tokens on an H100 (the best tree: 294 nodes at batch 1, 72 at batch 4), and the
best budget falls to a chain and then to 0 (:func:`best_tree_budget`, which searches budgets until no larger tree
can win).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from functools import lru_cache

from minispec.roofline.chain import _draft_step_time, step_time
from minispec.roofline.hardware import H100_SXM, Hardware
from minispec.roofline.profile import Rows, profile_rows, steady, steady_tokens
from minispec.roofline.shapes import LLAMA_8B, ModelShape, check_arguments


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

    def truncated(self, depth: int) -> TreeShape:
        """The nodes down to ``depth``: what a tree draft verifies when gamma caps its depth."""
        index: dict[int, int] = {-1: -1}
        for i, d in enumerate(self.depths):
            if d <= depth:
                index[i] = len(index) - 1
        kept = [i for i in index if i >= 0]
        return TreeShape(tuple(index[self.parents[i]] for i in kept), tuple(self.ranks[i] for i in kept))


def tree_expected_tokens(tree: TreeShape, alpha: float = 0.8, *, profile=None) -> float:
    """E, tokens a tree step yields per row: 1 + the sum over nodes of P(the node is reached and accepted).

    A node is accepted when each node on its path is the accepted child of its parent, so its probability is the
    product of the profile's entries along its path (Sequoia, Chen et al. 2024, arXiv 2402.12374). ``profile``
    (:mod:`minispec.roofline.profile`): P(the accepted child is the one of rank k), one list, one list per depth
    (row d for the children of depth-d nodes, the root's at 0; the last row repeats), or a :class:`RankProfile`
    (conditioned on each parent's own rank, the root's from the step before, in the steady state); None:
    :func:`default_profile` of alpha (an assumption, stated there). A chain with profile (alpha,) gives Leviathan's
    E = (1 - alpha^(gamma+1)) / (1 - alpha).
    """
    models, depths = profile_rows(alpha, profile, max(tree.ranks, default=0) + 1), tree.depths
    return steady(tree.parents, tree.ranks, depths, models, [_reach(tree.parents, tree.ranks, depths, m)
                                                            for m in models])


def _reach(parents, ranks, depths, model: Rows) -> list[float]:
    """Each node's P(reached and accepted) under ``model``."""
    reached: list[float] = []
    for parent, rank, depth in zip(parents, ranks, depths):
        up, parent_rank = (reached[parent], ranks[parent]) if parent >= 0 else (1.0, -1)
        reached.append(up * model.p(depth - 1, parent_rank, rank))
    return reached


def _greedy_tree(model: Rows, budget: int, max_depth: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Nodes in the order best-first search takes them from the infinite tree: (parents, ranks)."""
    heap = [(-model.p(0, -1, 0), 1, 0, -1, -1, 0, 1.0)]  # (-P, depth, tie, parent, its rank, rank, P(parent))
    parents, ranks, tie = [], [], 0
    while heap and len(parents) < budget:
        neg, depth, _, parent, parent_rank, rank, above = heapq.heappop(heap)
        if neg >= 0:  # the best left is never accepted
            break
        node = len(parents)
        parents.append(parent)
        ranks.append(rank)
        sibling = above * model.p(depth - 1, parent_rank, rank + 1)
        child = -neg * model.p(depth, rank, 0)
        for q, d, up, up_rank, r, a in ((sibling, depth, parent, parent_rank, rank + 1, above),
                                        (child, depth + 1, node, rank, 0, -neg)):
            if q > 0 and d <= max_depth:
                tie += 1
                heapq.heappush(heap, (-q, d, tie, up, up_rank, r, a))
    return tuple(parents), tuple(ranks)


def _check_tree_arguments(budgets, max_depth) -> tuple[int, ...] | None:
    if budgets is not None:
        budgets = tuple(budgets)
        if not budgets or any(n < 0 or n != int(n) for n in budgets):
            raise ValueError(f"budgets (draft nodes per row) must be integers >= 0, at least one, got {budgets}")
        budgets = tuple(sorted({int(n) for n in budgets}))
    if max_depth is not None and not (max_depth >= 1 and max_depth == int(max_depth)):
        raise ValueError(f"max_depth must be an integer >= 1 (or None), got {max_depth}")
    return budgets


def _models(alpha, profile, ranks: int, who: str) -> tuple[Rows, ...]:
    models = profile_rows(alpha, profile, ranks)
    if not all(m.non_increasing for m in models):
        raise ValueError(f"{who} needs a profile non-increasing in rank (sort it, or use Sequoia's dynamic "
                         f"programme), got {profile}")
    return models


def best_tree(budget: int, alpha: float = 0.8, *, profile=None, max_depth: int | None = None) -> TreeShape:
    """The tree of at most ``budget`` nodes (and ``max_depth`` levels) with the largest expected accepted length.

    Every node adds its probability of being reached and accepted, and a node's is at most its parent's (profile
    entries <= 1) and at most its elder sibling's (a profile non-increasing in rank), so the best tree of n nodes
    is the n most probable nodes of the infinite tree: taking them best first keeps every parent and elder sibling.
    Sequoia's dynamic programme covers profiles that rise with rank; this function refuses them. Nodes never
    accepted are not added, so the tree can have fewer than ``budget`` nodes. Nodes come in the order taken:
    by falling probability, parents first; ties go to the shallower node. With a :class:`RankProfile`, nodes are
    ranked as in a step after a rejection (the root's children by ``after_other``), most steps once trees are wide.
    """
    _check_tree_arguments((budget,), max_depth)
    model = _models(alpha, profile, budget, "best_tree")[0]
    return TreeShape(*_greedy_tree(model, budget, max_depth or max(budget, 1)))


@lru_cache(maxsize=64)
def _prefixes(models: tuple[Rows, ...], limit: int, cap: int) -> tuple[tuple, tuple, tuple, tuple]:
    """The best trees of 1, 2, ... nodes at depth <= ``cap``: the prefixes of one best-first order of at most
    ``limit`` nodes. Returns each prefix's E, the draft pass each node widens (the level of its parent if the parent
    had no child yet, else -1: ``TreeShape.expanded`` grows by one there), and the order's parents and ranks."""
    parents, ranks = _greedy_tree(models[0], limit, cap)
    depths: list[int] = []
    for parent in parents:
        depths.append(1 + (depths[parent] if parent >= 0 else 0))
    reached = [_reach(parents, ranks, depths, m) for m in models]
    # each model's summed reach, and its leaves' reach times P(the bonus token below them is first-ranked)
    total, first, has_child, E, widen = [0.0] * len(models), [0.0] * len(models), set(), [], []
    bonus = lambda m, i: m.p(depths[i], ranks[i], 0)  # noqa: E731
    for i, (parent, d) in enumerate(zip(parents, depths)):
        for j, (m, r) in enumerate(zip(models, reached)):
            total[j] += r[i]
            first[j] += r[i] * bonus(m, i)
            if parent >= 0 and parent not in has_child:  # the parent is a leaf no more
                first[j] -= r[parent] * bonus(m, parent)
        widen.append(-1 if parent in has_child else d - 1)
        has_child.add(parent)
        E.append(steady_tokens(total, first))
    return tuple(E), tuple(widen), parents, ranks


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
                               draft: ModelShape | None = None, draft_kv_window: int | None = None,
                               passes: tuple[int, ...] | None = None) -> float:
    """Seconds for one tree step: ``tree.depth`` draft passes, then verify ``tree.nodes`` per row.

    Draft pass i runs the ``tree.expanded[i]`` nodes of depth i that get children (the root alone in the first);
    a static tree expands every node with children, EAGLE-2 its top-k frontier. A pass over w tokens per row costs
    c * t(B, w), or, given a ``draft`` shape, its own ``step_time(B, w)`` at min(context, ``draft_kv_window``).
    A chain gives :func:`speculative_step_time`. ``passes``: the tokens per row of each draft pass where they are
    not ``tree.expanded`` (a dynamic tree feeds its whole top-k frontier: (1, k, ..., k)).
    """
    check_arguments(draft_cost=draft_cost, draft=draft, draft_kv_window=draft_kv_window)
    drafting = sum(_draft_step_time(batch, hardware, model, context, draft_cost, draft, draft_kv_window, w)
                   for w in (tree.expanded if passes is None else passes))
    return tree_step_time(batch, tree.nodes, hardware, model, context) + drafting


def tree_speedup(batch: float, tree: TreeShape, alpha: float = 0.8, draft_cost: float = 0.05,
                 hardware: Hardware = H100_SXM, model: ModelShape = LLAMA_8B, context: float = 0, *, profile=None,
                 draft: ModelShape | None = None, draft_kv_window: int | None = None,
                 passes: tuple[int, ...] | None = None) -> float:
    """Plain seconds per token / tree-speculative seconds per token; the empty tree gives 1. ``passes`` as in
    :func:`tree_speculative_step_time`."""
    if not tree.nodes:
        return 1.0
    spec = tree_speculative_step_time(batch, tree, draft_cost, hardware, model, context, draft=draft,
                                      draft_kv_window=draft_kv_window, passes=passes)
    return tree_expected_tokens(tree, alpha, profile=profile) * step_time(batch, 1, hardware, model, context) / spec


SEARCH_LIMIT = 4096  # the most draft nodes per row the budget search tries before it gives up proving an optimum


def _best_tree_at(batch, alpha, budgets, draft_cost, hardware, model, context, profile, draft, draft_kv_window,
                  max_depth) -> tuple[float, int, tuple | None, dict]:
    """(speedup, budget, (E, nodes, expanded, tree) or None, search) of the fastest tree over ``budgets`` (None: every
    budget from 1 up) and depth caps 1..max_depth; (1.0, 0, None, search) if none beats plain decoding. Ties go to
    the smaller budget, then the shallower cap. ``search``: {"searched": the largest budget tried, "capped": True
    when a budget above it could still be faster}.

    With ``budgets=None`` the search stops at the first budget n past which no tree can win: a tree of any size
    yields at most E_max = 1 + s + s^2 + ... + s^max_depth tokens per row (s the largest sum of a profile row) and
    costs at least a verify of n + 2 tokens per row and one draft pass, so once E_max * t(B, 1) / that is no more
    than the best speedup found, no larger budget beats it; or where the best-first order runs out (no node left
    that is ever accepted). It gives up at ``SEARCH_LIMIT`` nodes, and then says ``capped``.
    """
    check_arguments(batch=batch, alpha=alpha, draft_cost=draft_cost, context=context, draft=draft,
                    draft_kv_window=draft_kv_window)
    budgets = _check_tree_arguments(budgets, max_depth)
    top = SEARCH_LIMIT if budgets is None else budgets[-1]
    models = _models(alpha, profile, top, "the tree search")
    plain = step_time(batch, 1, hardware, model, context)
    verify = lru_cache(lambda T: step_time(batch, T, hardware, model, context))
    drafting = lru_cache(lambda w: _draft_step_time(batch, hardware, model, context, draft_cost, draft,
                                                    draft_kv_window, w))
    s = max(m.most for m in models)
    e_max = 1.0 + sum(s ** d for d in range(1, min(max_depth or top, top) + 1))
    beyond = lambda n: e_max * plain / (verify(n + 2) + drafting(1))  # noqa: E731 the most any budget > n gives
    best, orders, limit, n, proven, ran_out, drafted = (1.0, 0, None), {}, 0, 0, False, False, {}
    for n in (b for b in (budgets or range(1, SEARCH_LIMIT + 1)) if b):
        while n > limit:  # the best-first orders, for every depth cap, far enough: 256 nodes, then 4x
            limit = min(top, 4 * limit or 256)
            uncapped = _prefixes(models, limit, limit)  # no cap: max_depth=None, and the deepest a cap can matter
            caps = min(max_depth or limit, _depth(uncapped[2]))
            orders = {cap: _prefixes(models, limit, cap) for cap in range(1, caps + 1)}
        for cap, (E, widen, parents, ranks) in orders.items():
            k = min(n, len(E))  # fewer than n where this cap's order ran out
            done, widths, cost = drafted.get(cap, (0, [0] * cap, 0.0))  # draft passes' seconds of the first nodes
            if not k or k == done:  # nothing accepted, or the tree stopped growing and was tried at its own size
                continue
            for level in widen[done:k]:
                if level >= 0:
                    widths[level] += 1
                    cost += drafting(widths[level]) - (drafting(widths[level] - 1) if widths[level] > 1 else 0.0)
            drafted[cap] = (k, widths, cost)
            speedup = E[k - 1] * plain / (verify(k + 1) + cost)
            if speedup > best[0]:
                best = (speedup, n, (E[k - 1], k, parents, ranks))
        ran_out = all(n >= len(E) < limit for E, *_ in orders.values())  # no node left is ever accepted
        if budgets is None and (beyond(n) <= best[0] or ran_out):
            proven = True
            break
    search = {"searched": n, "capped": not (proven or ran_out) and bool(n) and beyond(n) > best[0]}
    if best[2] is None:
        return best[0], best[1], None, search
    E, k, parents, ranks = best[2]
    tree = TreeShape(parents[:k], ranks[:k])
    return best[0], best[1], (E, k, tree.expanded, tree), search


def _depth(parents) -> int:
    """The depth of the tree with these parents (parents before children)."""
    depths: list[int] = []
    for parent in parents:
        depths.append(1 + (depths[parent] if parent >= 0 else 0))
    return max(depths, default=1)


def best_tree_budget(batch: float, alpha: float = 0.8, budgets=None, draft_cost: float = 0.05,
                     hardware: Hardware = H100_SXM, model: ModelShape = LLAMA_8B, context: float = 0, *,
                     profile=None, draft: ModelShape | None = None, draft_kv_window: int | None = None,
                     max_depth: int = 12) -> int:
    """The draft nodes per row whose best tree runs fastest at this batch; 0 = plain decoding.

    For each budget n and depth cap 1..``max_depth``, the tree is :func:`best_tree` (the n most probable nodes
    under the ``profile``; None: :func:`default_profile` of alpha, an assumption); its speed is
    :func:`tree_speedup` (verify n + 1 tokens per row, one draft pass per level). The fastest wins if it beats
    plain decoding; ties go to the smaller budget. ``budgets``: the budgets to try; None: every budget from 1 up
    until no larger tree can win (a bound, see :data:`SEARCH_LIMIT`), so the answer is not an artefact of a search
    cap. Given budgets, the largest can bind: :func:`tree_speedup_table`'s ``capped`` says when it does. At small
    batch verification is free and large trees win; once B (n + 1) tokens cross the ridge every node costs
    compute, the budget falls to a chain (its best tree has one path) and then to 0.
    """
    return _best_tree_at(batch, alpha, budgets, draft_cost, hardware, model, context, profile, draft,
                         draft_kv_window, max_depth)[1]


def tree_speedup_table(batches, alpha: float = 0.8, budgets=None, draft_cost: float = 0.05,
                       hardware: Hardware = H100_SXM, model: ModelShape = LLAMA_8B, context: float = 0, *,
                       profile=None, draft: ModelShape | None = None, draft_kv_window: int | None = None,
                       max_depth: int = 12) -> list[dict]:
    """One row per batch: the best budget (:func:`best_tree_budget`), its tree's nodes, depth, branching per depth
    and whether it is a chain, tokens per step per row (E), the speedup, the tree itself (None when off), the
    largest budget the search tried (``searched``) and ``capped``: True when a budget above that one could still
    be faster (the largest of the ``budgets`` given binds, or the search gave up at :data:`SEARCH_LIMIT`)."""
    rows = []
    for B in batches:
        speedup, n, found, search = _best_tree_at(B, alpha, budgets, draft_cost, hardware, model, context, profile,
                                                  draft, draft_kv_window, max_depth)
        tree = found[3] if found else TreeShape()
        rows.append({"batch": B, "budget": n, "nodes": tree.nodes, "depth": tree.depth, "branching": tree.branching,
                     "chain": bool(n) and tree.is_chain, "tokens_per_step": found[0] if found else 1.0,
                     "speedup": speedup, "tree": found[3] if found else None} | search)
    return rows
