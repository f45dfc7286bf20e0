"""The shape of a tree of draft tokens and the attention mask that verifies it in one target pass.

A tree step verifies T draft nodes per row at once (SpecInfer, Miao et al. 2024; Medusa; EAGLE-2).
Nodes are numbered 1..T with parents before children (node 0 is the root: the row's last token,
already accepted); ``parent[b, j - 1]`` is node j's parent. The target reads the root and the T
nodes in one forward pass: each node sits at position (prefix length + depth) and attends to the
prefix and its own ancestors (:func:`tree_mask`), so node j's logits are exactly those the target
would give the path from the root to j. A chain of gamma tokens is the one-path tree. The rule that
accepts a path is :func:`minispec.speculative.rule.verify_tree`.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from minispec.model.llama import TreeMask


class Tree(NamedTuple):
    """The shape of one step's trees: T nodes per row, parents before children."""

    parent: torch.Tensor  # (B, T) node j's parent in 0..j-1 (0: the root), at index j - 1
    depth: int  # the deepest node's depth (a host int: no sync)
    width: int  # the most children any node has (a host int)


MAX_NODES = 1024  # draft nodes per row a tree may have: its verify pass holds (T+1) x V logits and a (T+1)^2 mask


def tree_nodes(branching: tuple[int, ...]) -> int:
    """Nodes of the static tree ``branching`` (4 + 8 + 16 + 16 = 44 for (4, 2, 2, 1)), without building it."""
    total, level = 0, 1
    for k in branching:
        level *= k
        total += level
    return total


def static_tree(branching: tuple[int, ...] | None = None, paths: list[tuple[int, ...]] | None = None) -> list[int]:
    """The parent list (node j's parent at index j - 1; 0 = the root) of a static tree, nodes in depth order.

    ``branching=(4, 2, 2, 1)``: every node at depth d has branching[d] children (4 + 8 + 16 + 16 = 44
    nodes). ``paths``: Medusa/SpecInfer style, each path a tuple of child ranks from the root, e.g.
    ``[(0,), (0, 0), (1,), (0, 1)]``; every prefix of a path is a node too. At most :data:`MAX_NODES`
    nodes; built in time linear in the nodes (paths: plus a sort).
    """
    if (branching is None) == (paths is None):
        raise ValueError("give exactly one of branching=(children per node at each depth) or paths=[...]")
    if branching is not None:
        if not branching or not all(isinstance(k, int) and not isinstance(k, bool) and k >= 1 for k in branching):
            raise ValueError(f"branching must be a non-empty tuple of integers >= 1, got {branching!r}")
        _check_size(tree_nodes(branching), f"branching={tuple(branching)}")
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
    if sum(len(p) for p in paths) > MAX_NODES:  # an upper bound on the nodes: check before building the set
        _check_size(len({tuple(p[:i]) for p in paths for i in range(1, len(p) + 1)}), f"{len(paths)} paths")
    nodes = sorted({tuple(p[:i]) for p in paths for i in range(1, len(p) + 1)}, key=lambda p: (len(p), p))
    index = {(): 0} | {p: i + 1 for i, p in enumerate(nodes)}
    for p in nodes:
        if p[-1] and p[:-1] + (p[-1] - 1,) not in index:
            raise ValueError(f"path {p} has child rank {p[-1]} but its parent has no child of rank {p[-1] - 1}")
    return [index[p[:-1]] for p in nodes]


def _check_size(nodes: int, what: str) -> None:
    if nodes > MAX_NODES:
        raise ValueError(f"{what} makes a tree of {nodes:,} nodes per row; a tree may have at most {MAX_NODES:,} "
                         f"(its verify pass holds (nodes + 1) x vocabulary logits and a (nodes + 1)^2 mask per row)")


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
