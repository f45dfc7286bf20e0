"""Tree speculation on the roofline: accepted length from a rank profile, best trees per budget and batch.

A tree step (SpecInfer, Medusa, EAGLE-2, Sequoia) verifies T draft nodes per row in one pass: t(B, T + 1), the
root (the last accepted token) included. It is drafted in one pass per level, pass i over the w_i nodes of depth
i - 1 that get children, each c * t(B, w_i) (or a draft shape's own step). From an acceptance profile by child
rank (Sequoia's positional acceptance vector: P(the accepted child is the one of rank k)), a node is accepted
with the product of the profile along its path, and E = 1 + the sum over nodes; the best tree of n nodes is the
n most probable nodes. At small batch verification is nearly free, so a large tree raises E well above a
chain's; but every row verifies every node, so the weights turn compute-bound at B (T + 1) = 295 tokens on an
H100 (about 5 rows for 64 nodes), and the best budget falls to a chain and then to 0 (:func:`best_tree_budget`).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from functools import lru_cache

from minispec.roofline.chain import _draft_step_time, step_time
from minispec.roofline.hardware import H100_SXM, Hardware
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


def default_profile(alpha: float, ranks: int = 64) -> tuple[float, ...]:
    """The acceptance profile assumed from alpha alone: the child of rank k is the accepted one with probability
    alpha (1 - alpha)^k, the chance that k tries fail and the next one succeeds if each succeeds with alpha.

    Rank 0 gets alpha, so a chain keeps Leviathan's E. It is a model, not a measurement: under exact sampling a
    rejection removes the rejected token's mass from p, and deterministic top-k children are accepted with
    p(x_k), so real profiles fall faster or slower than this. Measure the pair's own (the share of steps whose
    accepted child at a node had rank k: Sequoia's positional acceptance vector) and pass it as ``profile``.
    """
    check_arguments(alpha=alpha)
    return tuple(alpha * (1 - alpha) ** k for k in range(ranks))


def _profile_rows(alpha: float, profile, ranks: int) -> tuple[tuple[float, ...], ...]:
    """The profile as rows by depth, checked; the default one from alpha if ``profile`` is None."""
    if profile is None:
        return (default_profile(alpha, max(ranks, 1)),)
    rows = list(profile)
    rows = [rows] if rows and not hasattr(rows[0], "__len__") else rows
    rows = tuple(tuple(float(p) for p in row) for row in rows)
    if not rows or not all(rows):
        raise ValueError(f"profile must be a non-empty list of probabilities by rank, or one such list per depth, "
                         f"got {profile!r}")
    for row in rows:
        if not all(0 <= p <= 1 for p in row) or sum(row) > 1 + 1e-9:
            raise ValueError(f"a profile row gives disjoint events' probabilities (which child is accepted): each "
                             f"in [0, 1] and their sum <= 1, got {row}")
    return rows


def _rank_probability(rows, depth: int, rank: int) -> float:
    """P(the accepted child of a node at ``depth`` (the root at 0) is its child of this rank); rows past the last
    repeat it, ranks past a row's end are never accepted."""
    row = rows[min(depth, len(rows) - 1)]
    return row[rank] if rank < len(row) else 0.0


def tree_expected_tokens(tree: TreeShape, alpha: float = 0.8, *, profile=None) -> float:
    """E, tokens a tree step yields per row: 1 + the sum over nodes of P(the node is reached and accepted).

    A node is accepted when each node on its path is the accepted child of its parent, so its probability is the
    product of ``profile[k]`` over the ranks k of its path (Sequoia, Chen et al. 2024, arXiv 2402.12374).
    ``profile``: P(the accepted child is the one of rank k), one list, or one list per depth (row d for the
    children of depth-d nodes, the root's at 0; the last row repeats); None = :func:`default_profile` (alpha).
    A chain with profile (alpha,) gives Leviathan's E = (1 - alpha^(gamma+1)) / (1 - alpha).
    """
    rows = _profile_rows(alpha, profile, max(tree.ranks, default=0) + 1)
    reached, depths = [], tree.depths
    for parent, rank, depth in zip(tree.parents, tree.ranks, depths):
        reached.append((reached[parent] if parent >= 0 else 1.0) * _rank_probability(rows, depth - 1, rank))
    return 1.0 + sum(reached)


def _greedy_tree(rows, budget: int, max_depth: int) -> tuple[tuple[int, ...], tuple[int, ...], tuple[float, ...]]:
    """Nodes in the order best-first search takes them from the infinite tree: (parents, ranks, P(reached))."""
    heap = [(-_rank_probability(rows, 0, 0), 1, 0, -1, 0, 1.0)]  # (-P, depth, tie, parent, rank, P(parent))
    parents, ranks, reached, tie = [], [], [], 0
    while heap and len(parents) < budget:
        neg, depth, _, parent, rank, above = heapq.heappop(heap)
        if neg >= 0:  # the best left is never accepted
            break
        node = len(parents)
        parents.append(parent)
        ranks.append(rank)
        reached.append(-neg)
        sibling = above * _rank_probability(rows, depth - 1, rank + 1)
        child = -neg * _rank_probability(rows, depth, 0)
        for p, d, up, r, a in ((sibling, depth, parent, rank + 1, above), (child, depth + 1, node, 0, -neg)):
            if p > 0 and d <= max_depth:
                tie += 1
                heapq.heappush(heap, (-p, d, tie, up, r, a))
    return tuple(parents), tuple(ranks), tuple(reached)


def _check_tree_arguments(budgets, max_depth) -> tuple[int, ...]:
    budgets = tuple(budgets)
    if not budgets or any(n < 0 or n != int(n) for n in budgets):
        raise ValueError(f"budgets (draft nodes per row) must be integers >= 0, at least one, got {budgets}")
    if max_depth is not None and not (max_depth >= 1 and max_depth == int(max_depth)):
        raise ValueError(f"max_depth must be an integer >= 1 (or None), got {max_depth}")
    return tuple(sorted({int(n) for n in budgets}))


def best_tree(budget: int, alpha: float = 0.8, *, profile=None, max_depth: int | None = None) -> TreeShape:
    """The tree of at most ``budget`` nodes (and ``max_depth`` levels) with the largest expected accepted length.

    Every node adds its probability of being reached and accepted, and a node's is at most its parent's (profile
    entries <= 1) and at most its elder sibling's (a profile non-increasing in rank), so the best tree of n nodes
    is the n most probable nodes of the infinite tree: taking them best first keeps every parent and elder sibling.
    Sequoia's dynamic programme covers profiles that rise with rank; this function refuses them. Nodes never
    accepted are not added, so the tree can have fewer than ``budget`` nodes. Nodes come in the order taken:
    by falling probability, parents first; ties go to the shallower node.
    """
    _check_tree_arguments((budget,), max_depth)
    rows = _profile_rows(alpha, profile, budget)
    if any(a < b for row in rows for a, b in zip(row, row[1:])):
        raise ValueError(f"best_tree needs a profile non-increasing in rank (sort it, or use Sequoia's dynamic "
                         f"programme), got {profile}")
    parents, ranks, _ = _greedy_tree(rows, budget, max_depth or max(budget, 1))
    return TreeShape(parents, ranks)


@lru_cache(maxsize=32)
def _tree_candidates(rows, max_budget: int, max_depth: int) -> dict[int, tuple]:
    """For each budget 1..max_budget, the best trees under each depth cap 1..max_depth, distinct:
    {budget: ((E, nodes, expanded, tree), ...)}."""
    candidates: dict[int, dict] = {n: {} for n in range(1, max_budget + 1)}
    for cap in range(1, max_depth + 1):
        parents, ranks, reached = _greedy_tree(rows, max_budget, cap)
        for n in range(1, max_budget + 1):
            k = min(n, len(parents))
            tree = TreeShape(parents[:k], ranks[:k])
            candidates[n].setdefault(tree, (1.0 + sum(reached[:k]), k, tree.expanded, tree))
    return {n: tuple(found.values()) for n, found in candidates.items()}


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
                               draft: ModelShape | None = None, draft_kv_window: int | None = None) -> float:
    """Seconds for one tree step: ``tree.depth`` draft passes, then verify ``tree.nodes`` per row.

    Draft pass i runs the ``tree.expanded[i]`` nodes of depth i that get children (the root alone in the first);
    a static tree expands every node with children, EAGLE-2 its top-k frontier. A pass over w tokens per row costs
    c * t(B, w), or, given a ``draft`` shape, its own ``step_time(B, w)`` at min(context, ``draft_kv_window``).
    A chain gives :func:`speculative_step_time`.
    """
    check_arguments(draft_cost=draft_cost, draft=draft, draft_kv_window=draft_kv_window)
    drafting = sum(_draft_step_time(batch, hardware, model, context, draft_cost, draft, draft_kv_window, w)
                   for w in tree.expanded)
    return tree_step_time(batch, tree.nodes, hardware, model, context) + drafting


def tree_speedup(batch: float, tree: TreeShape, alpha: float = 0.8, draft_cost: float = 0.05,
                 hardware: Hardware = H100_SXM, model: ModelShape = LLAMA_8B, context: float = 0, *, profile=None,
                 draft: ModelShape | None = None, draft_kv_window: int | None = None) -> float:
    """Plain seconds per token / tree-speculative seconds per token; the empty tree gives 1."""
    if not tree.nodes:
        return 1.0
    spec = tree_speculative_step_time(batch, tree, draft_cost, hardware, model, context, draft=draft,
                                      draft_kv_window=draft_kv_window)
    return tree_expected_tokens(tree, alpha, profile=profile) * step_time(batch, 1, hardware, model, context) / spec


_BUDGETS = tuple(range(65))  # 0 (off), 1 (a chain of one) .. 64 nodes per row


def _best_tree_at(batch, alpha, budgets, draft_cost, hardware, model, context, profile, draft, draft_kv_window,
                  max_depth) -> tuple[float, int, tuple | None]:
    """(speedup, budget, (E, nodes, expanded, tree)) of the fastest tree over ``budgets`` and depth caps 1..
    max_depth; (1.0, 0, None) if none beats plain decoding. Ties go to the smaller budget, then the shallower cap."""
    check_arguments(batch=batch, alpha=alpha, draft_cost=draft_cost, context=context, draft=draft,
                    draft_kv_window=draft_kv_window)
    budgets = _check_tree_arguments(budgets, max_depth)
    max_depth = max_depth or max(budgets[-1], 1)
    rows = _profile_rows(alpha, profile, budgets[-1])
    if any(a < b for row in rows for a, b in zip(row, row[1:])):
        raise ValueError(f"the tree search needs a profile non-increasing in rank, got {profile}")
    candidates = _tree_candidates(rows, budgets[-1], max_depth) if budgets[-1] else {}
    plain = step_time(batch, 1, hardware, model, context)
    verify = lru_cache(lambda T: step_time(batch, T, hardware, model, context))
    drafting = lru_cache(lambda w: _draft_step_time(batch, hardware, model, context, draft_cost, draft,
                                                    draft_kv_window, w))
    best = (1.0, 0, None)
    for n in (n for n in budgets if n):
        for found in candidates[n]:
            E, nodes, expanded, _ = found
            speedup = E * plain / (verify(nodes + 1) + sum(drafting(w) for w in expanded))
            if speedup > best[0]:
                best = (speedup, n, found)
    return best


def best_tree_budget(batch: float, alpha: float = 0.8, budgets=_BUDGETS, draft_cost: float = 0.05,
                     hardware: Hardware = H100_SXM, model: ModelShape = LLAMA_8B, context: float = 0, *,
                     profile=None, draft: ModelShape | None = None, draft_kv_window: int | None = None,
                     max_depth: int = 12) -> int:
    """The draft nodes per row, out of ``budgets``, whose best tree runs fastest at this batch; 0 = plain decoding.

    For each budget n and depth cap 1..``max_depth``, the tree is :func:`best_tree` (the n most probable nodes
    under the ``profile``, the default one from alpha if None); its speed is :func:`tree_speedup` (verify n + 1
    tokens per row, one draft pass per level). The fastest wins if it beats plain decoding; ties go to the smaller
    budget. At small batch verification is free and the largest tree wins; once B (n + 1) tokens cross the ridge
    every node costs compute, the budget falls to a chain (its best tree has one path) and then to 0.
    :func:`tree_speedup_table` gives the tree, its depth and its tokens per step.
    """
    return _best_tree_at(batch, alpha, budgets, draft_cost, hardware, model, context, profile, draft,
                         draft_kv_window, max_depth)[1]


def tree_speedup_table(batches, alpha: float = 0.8, budgets=_BUDGETS, draft_cost: float = 0.05,
                       hardware: Hardware = H100_SXM, model: ModelShape = LLAMA_8B, context: float = 0, *,
                       profile=None, draft: ModelShape | None = None, draft_kv_window: int | None = None,
                       max_depth: int = 12) -> list[dict]:
    """One row per batch: the best budget (:func:`best_tree_budget`), its tree's nodes, depth, branching per depth
    and whether it is a chain, tokens per step per row (E), the speedup, and the tree itself (None when off)."""
    rows = []
    for B in batches:
        speedup, n, found = _best_tree_at(B, alpha, budgets, draft_cost, hardware, model, context, profile, draft,
                                          draft_kv_window, max_depth)
        tree = found[3] if found else TreeShape()
        rows.append({"batch": B, "budget": n, "nodes": tree.nodes, "depth": tree.depth, "branching": tree.branching,
                     "chain": bool(n) and tree.is_chain, "tokens_per_step": found[0] if found else 1.0,
                     "speedup": speedup, "tree": found[3] if found else None})
    return rows
