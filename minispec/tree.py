"""Verify a tree of draft tokens exactly, in one target pass: its shapes, its attention mask, its accept rule.

A tree step verifies T draft nodes per row at once (SpecInfer, Miao et al. 2024; Medusa; EAGLE-2).
Nodes are numbered 1..T with parents before children (node 0 is the root: the row's last token,
already accepted); ``parent[b, j - 1]`` is node j's parent. The target reads the root and the T
nodes in one forward pass: each node sits at position (prefix length + depth) and attends to the
prefix and its own ancestors (:func:`tree_mask`), so node j's logits are exactly those the target
would give the path from the root to j. A chain of gamma tokens is the one-path tree.

**The rule** (:func:`verify_tree`), at any temperature, top-k and top-p included (p is the warped
target distribution). Walk down from the root keeping r, the distribution the next token must
follow (r = p at the current node). Try the node's children in order; child c with token x was
drawn from q_c, the draft's distribution there, and:

- is accepted with probability min(1, r(x) / q_c(x)); then move to c, and r = p at c;
- after a rejection, r <- norm(max(0, r - q_c)), and the next child is tried.

When no child is accepted (or the node is a leaf) the row's last token is drawn from r: the
correction, or the bonus token after an accepted leaf.

*Why the output has law p.* At one node, with r the current target law and one child x ~ q: the
token leaves as x with probability q(x) min(1, r(x)/q(x)) = min(q, r)(x), and a rejection happens
with probability 1 - sum min(q, r) = sum max(0, r - q); after it the residual norm(max(0, r - q)) is
what is still owed: min(q, r) + max(0, r - q) = r. This is Leviathan et al.'s one-token proof, and it
holds for whatever r is, so trying the next child against the residual and drawing from it at the
end keeps the token's law r at every stage, by induction over the children (SpecInfer's multi-step
speculative sampling). It needs each child drawn from q_c independently of the target's randomness
and of the earlier children's accept tests: children drawn i.i.d. from q (sampled trees), or chosen
deterministically, e.g. the draft's top-k (EAGLE-2, Medusa). A deterministic child is the point mass
q_c = onehot(x): accepted with probability r(x), and max(0, r - onehot(x)) is r with x removed, then
renormalised. Once a child is accepted, the next token is drawn, by the same argument, from p at
that child, which is the target's law given the prefix and the accepted tokens. Children drawn
*without* replacement from the same q would need a different residual (Recursive Speculative
Decoding, arXiv 2402.14160); they are not supported.

Greedy is the temperature-0 case of the same rule: r is one-hot, so a child is accepted exactly
when it is the target's argmax, and the row gets the longest path that agrees with greedy decoding.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from minispec.model import TreeMask
from minispec.sampling import q_at, q_of, take


class Tree(NamedTuple):
    """The shape of one step's trees: T nodes per row, parents before children."""

    parent: torch.Tensor  # (B, T) node j's parent in 0..j-1 (0: the root), at index j - 1
    depth: int  # the deepest node's depth (a host int: no sync)
    width: int  # the most children any node has (a host int)


def static_tree(branching: tuple[int, ...] | None = None, paths: list[tuple[int, ...]] | None = None) -> list[int]:
    """The parent list (node j's parent at index j - 1; 0 = the root) of a static tree, nodes in depth order.

    ``branching=(4, 2, 2, 1)``: every node at depth d has branching[d] children (4 + 8 + 16 + 16 = 44
    nodes). ``paths``: Medusa/SpecInfer style, each path a tuple of child ranks from the root, e.g.
    ``[(0,), (0, 0), (1,), (0, 1)]``; every prefix of a path is a node too.
    """
    if (branching is None) == (paths is None):
        raise ValueError("give exactly one of branching=(children per node at each depth) or paths=[...]")
    if branching is not None:
        if not branching or not all(isinstance(k, int) and not isinstance(k, bool) and k >= 1 for k in branching):
            raise ValueError(f"branching must be a non-empty tuple of integers >= 1, got {branching!r}")
        level, parents = [0], []
        for k in branching:
            nxt = []
            for node in level:
                for _ in range(k):
                    parents.append(node)
                    nxt.append(len(parents))
            level = nxt
        return parents
    if not paths or not all(isinstance(p, (tuple, list)) and p and all(
            isinstance(r, int) and not isinstance(r, bool) and r >= 0 for r in p) for p in paths):
        raise ValueError(f"paths must be a non-empty list of non-empty tuples of child ranks >= 0, got {paths!r}")
    nodes = sorted({tuple(p[:i]) for p in paths for i in range(1, len(p) + 1)}, key=lambda p: (len(p), p))
    index = {(): 0} | {p: i + 1 for i, p in enumerate(nodes)}
    for p in nodes:
        if p[-1] and p[:-1] + (p[-1] - 1,) not in index:
            raise ValueError(f"path {p} has child rank {p[-1]} but its parent has no child of rank {p[-1] - 1}")
    return [index[p[:-1]] for p in nodes]


def depths(parent: torch.Tensor, depth: int) -> torch.Tensor:
    """Each node's depth (B, T + 1), the root's 0, for parents (B, T) of trees at most ``depth`` deep."""
    par = torch.cat([torch.zeros_like(parent[:, :1]), parent], 1)  # (B, T+1) the root is its own parent
    d, cur = torch.zeros_like(par), torch.arange(par.shape[1], device=par.device).expand_as(par)  # (B, T+1) each
    for _ in range(depth):
        d += cur > 0
        cur = par.gather(1, cur)
    return d


def ancestors(parent: torch.Tensor, depth: int) -> torch.Tensor:
    """(B, T + 1, T + 1) bool: [b, i, j] when node j is node i or one of its ancestors (the root included)."""
    par = torch.cat([torch.zeros_like(parent[:, :1]), parent], 1)  # (B, T+1)
    cur = torch.arange(par.shape[1], device=par.device).expand_as(par)  # (B, T+1)
    anc = torch.zeros(*par.shape, par.shape[1], dtype=torch.bool, device=par.device)  # (B, T+1, T+1)
    anc.scatter_(2, cur[..., None], True)
    for _ in range(depth):
        cur = par.gather(1, cur)
        anc.scatter_(2, cur[..., None], True)
    return anc


def tree_mask(tree: Tree, base: torch.Tensor) -> TreeMask:
    """The verify pass's mask for the root and T nodes written from slot ``base`` (B,): node j at base + j."""
    return TreeMask(base, base[:, None] + depths(tree.parent, tree.depth), ancestors(tree.parent, tree.depth))


def children(parent: torch.Tensor, width: int) -> torch.Tensor:
    """(B, T + 1, width): node v's children in order (node ids), -1 where it has fewer."""
    B, T = parent.shape
    j = torch.arange(T, device=parent.device)  # (T,)
    rank = ((parent[:, None, :] == parent[:, :, None]) & (j[None, :] < j[:, None])).sum(-1)  # (B, T) earlier siblings
    table = torch.full((B, (T + 1) * width + 1), -1, dtype=torch.long, device=parent.device)  # (B, (T+1)*width + 1)
    slot = torch.where(rank < width, parent * width + rank, (T + 1) * width)  # (B, T) the spare last slot: too many
    table.scatter_(1, slot, j.expand(B, T) + 1)
    return table[:, :-1].view(B, T + 1, width)


def verify_tree(p: torch.Tensor, q, x: torch.Tensor, tree: Tree, u: torch.Tensor, draw, greedy: bool = False):
    """The exact rule of the module docstring, for every row at once.

    p (B, T+1, V): the target at the root and each node; q: the draft's distribution of each node's
    token, dense (B, T, V) or a :class:`~minispec.sampling.PointMass`; x (B, T) the nodes' tokens; u
    (B, T) one uniform per node; ``draw(weights (B, V)) -> (B,)``. Returns path (B, depth): the accepted
    nodes from depth 1 down (-1 past a row's last), rank (B, depth): their ranks among their siblings,
    and t (B,): the row's next token (a correction, or the bonus after an accepted leaf). ``greedy``: p is
    one-hot (temperature 0), and :func:`verify_greedy` gives the same answer without walking over V.
    """
    if greedy:
        return verify_greedy(p, x, tree, draw)
    B = x.shape[0]
    kids = children(tree.parent, tree.width)  # (B, T+1, width)
    q_x = q_of(q, x)  # (B, T)
    cur = torch.zeros(B, dtype=torch.long, device=x.device)  # (B,) the node the row stands on (0: the root)
    r, mass = p[:, 0], torch.ones(B, device=x.device)  # (B, V) what is still owed, (B,) its total
    path = torch.full((B, tree.depth), -1, dtype=torch.long, device=x.device)  # (B, depth)
    rank = torch.full_like(path, -1)  # (B, depth)
    walking = torch.ones(B, dtype=torch.bool, device=x.device)  # (B,)
    for d in range(tree.depth):
        moved = torch.zeros_like(walking)  # (B,)
        for k in range(tree.width):
            c = take(kids, cur)[:, k]  # (B,) the k-th child of the current node, -1: none
            i = (c - 1).clamp_min(0)  # (B,) its index in x
            x_c = take(x, i)  # (B,)
            tried = walking & ~moved & (c > 0)  # (B,)
            ok = tried & (take(u, i) * take(q_x, i) * mass < take(r, x_c)) & (take(q_x, i) > 0)  # (B,) u < r/q
            left = (r - mass[:, None] * q_at(q, x, i)).clamp_min(0)  # (B, V) max(0, r - q), unnormalised
            cut = tried & ~ok & (left.sum(-1) > 0)  # (B,) rejected (if r == q, nothing is left to correct)
            r = torch.where(cut[:, None], left, r)  # (B, V)
            mass = torch.where(cut, left.sum(-1), mass)  # (B,)
            r = torch.where(ok[:, None], take(p, c.clamp_min(0)), r)  # (B, V) accepted: p at the child
            mass = torch.where(ok, 1.0, mass)  # (B,)
            path[:, d] = torch.where(ok, c, path[:, d])
            rank[:, d] = torch.where(ok, k, rank[:, d])
            cur, moved = torch.where(ok, c, cur), moved | ok  # (B,) each
        walking &= moved
    return path, rank, draw(r)


def verify_greedy(p: torch.Tensor, x: torch.Tensor, tree: Tree, draw):
    """:func:`verify_tree` where p is one-hot: a child is accepted when it is the first of its siblings whose
    token is the target's argmax at their parent, and the walk goes on below it. Computed for all nodes at
    once, in O(depth) small ops on (B, T) tensors instead of a walk over (B, V) distributions."""
    B, T = x.shape
    best = p.argmax(-1)  # (B, T+1) the target's token after each node
    hit = x == best.gather(1, tree.parent)  # (B, T) the node is its parent's argmax
    same = tree.parent[:, None, :] == tree.parent[:, :, None]  # (B, T, T) siblings (and itself)
    earlier = same & (torch.arange(T, device=x.device)[None, :] < torch.arange(T, device=x.device)[:, None])
    hit &= ~(earlier & hit[:, None, :]).any(-1)  # (B, T) only the first sibling that hits
    rank = earlier.sum(-1)  # (B, T) each node's rank among its siblings
    ok = torch.cat([torch.ones_like(hit[:, :1]), hit], 1)  # (B, T+1) the root is accepted
    for _ in range(tree.depth):  # accepted: it hits and its parent is accepted
        ok = ok & torch.cat([ok[:, :1], ok.gather(1, tree.parent)], 1)
    level = depths(tree.parent, tree.depth)  # (B, T+1)
    ids = torch.arange(T + 1, device=x.device)  # (T+1,)
    path = torch.stack([torch.where(ok & (level == d), ids, -1).amax(1) for d in range(1, tree.depth + 1)], 1)
    last = torch.where(ok, level * (T + 1) + ids, -1).argmax(1)  # (B,) the deepest accepted node (the root: 0)
    pr = torch.cat([torch.zeros_like(rank[:, :1]), rank], 1).gather(1, path.clamp_min(0))  # (B, depth)
    return path, torch.where(path > 0, pr, -1), draw(take(p, last))
