"""The exact accept rules of speculative sampling, for a chain of gamma drafts and for a tree verified in one pass.

Notation (Leviathan et al. 2023; Chen et al. 2023):
  p      the target's distribution (after temperature / top-k / top-p)
  q      the draft's distribution (after the same warping)
  gamma  draft tokens proposed per row and step
  alpha  acceptance rate; c the cost of a draft step relative to a target step

**A chain** (:func:`accept_reject`), for every row at once: the draft proposed x_1..x_gamma from q; the
target scored all gamma+1 positions in one forward pass; x_i is accepted with probability
min(1, p_i(x_i) / q_i(x_i)); at a row's first rejection the next token is drawn from norm(max(0, p_i - q_i));
if all gamma are accepted a bonus token is drawn from p_{gamma+1}. Each row thus gains n+1 tokens, n its
own number of accepted tokens, and the tokens have exactly the target's distribution p.

**A tree** (:func:`verify_tree`; shapes and masks in :mod:`minispec.decoding.tree`), at any temperature,
top-k and top-p included. Walk down from the root keeping r, the distribution the next token must
follow (r = p at the current node). Try the node's children in order; child c with token x was
drawn from q_c, the draft's distribution there, and:

- is accepted with probability min(1, r(x) / q_c(x)); then move to c, and r = p at c;
- after a rejection, r <- norm(max(0, r - q_c)), and the next child is tried.

When no child is accepted (or the node is a leaf) the row's last token is drawn from r: the
correction, or the bonus token after an accepted leaf. A chain is the one-path tree.

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

import torch

from minispec.decoding.sampling import Argmax, argmax, q_at, q_of, take
from minispec.decoding.tree import Tree, depths


def accept_reject(p, q, x, u, draw):
    """The speculative-sampling rule, for every row; nothing else.

    p (B, gamma+1, V): the target's distributions at the gamma draft positions and one more; for rows that are
    all greedy, their argmaxes (:class:`~minispec.decoding.sampling.Argmax`): the same tokens, no one-hots.
    q: the draft's, dense (B, gamma, V) or point masses (:class:`~minispec.decoding.sampling.PointMass`);
    x (B, gamma): the draft tokens; u (B, gamma): one uniform per row and position;
    ``draw(weights)``: one token per row (B,) from unnormalised weights (B, V).

    - accepted tokens: x_i is accepted if u_i < p_i(x_i) / q_i(x_i) and every earlier x was;
    - recovered token: at a row's first rejection i, t ~ norm(max(0, p_i - q_i));
    - bonus token: when all gamma are accepted, t ~ p_{gamma+1}.

    Returns accepted (B, gamma), the accepted prefix of each row, and t (B,). A position where q
    is all zero proposed nothing: q(x) = 0 is rejected and max(0, p - 0) = p, a plain draw.
    """
    q_x = q_of(q, x)  # (B, gamma) > 0 for every proposed token
    if isinstance(p, Argmax):  # every row greedy, p one-hot: u q < p(x) holds iff x is the argmax, and max(0, p - q)
        #                        at the first rejection (or p past gamma) is the argmax's one-hot: what follows, cheaper
        accepted = ((p.top[:, :-1] == x) & (q_x > 0)).cumprod(1).bool()  # (B, gamma)
        return accepted, take(p.top, accepted.sum(1))  # (B, gamma), (B,) the argmax where each row stopped
    p_x = p[:, :-1].gather(-1, x[..., None])[..., 0]  # (B, gamma)
    accepted = ((u * q_x < p_x) & (q_x > 0)).cumprod(1).bool()  # (B, gamma) u < p/q, up to the first rejection
    n = accepted.sum(1)  # (B,)
    p_n = take(p, n)  # (B, V) p at the first rejection, or p_{gamma+1}
    residual = (p_n - q_at(q, x, n)).clamp_min(0)  # (B, V) max(0, p - q); q is zero past gamma: the bonus's p
    # Where p == q nothing is ever rejected and max(0, p - q) is all zero: fall back to p, no 0/0.
    residual = torch.where(residual.sum(-1, keepdim=True) > 0, residual, p_n)  # (B, V)
    return accepted, draw(residual)


def children(parent: torch.Tensor, width: int) -> torch.Tensor:
    """(B, T + 1, width): node v's children in order (node ids), -1 where it has fewer."""
    B, T = parent.shape
    j = torch.arange(T, device=parent.device)  # (T,)
    rank = ((parent[:, None, :] == parent[:, :, None]) & (j[None, :] < j[:, None])).sum(-1)  # (B, T) earlier siblings
    table = torch.full((B, (T + 1) * width + 1), -1, dtype=torch.long, device=parent.device)  # (B, (T+1)*width + 1)
    slot = torch.where(rank < width, parent * width + rank, (T + 1) * width)  # (B, T) the spare last slot: too many
    table.scatter_(1, slot, j.expand(B, T) + 1)
    return table[:, :-1].view(B, T + 1, width)


def verify_tree(p: torch.Tensor, q, x: torch.Tensor, tree: Tree, u: torch.Tensor, draw, greedy: bool):
    """The exact rule of the module docstring, for every row at once.

    p (B, T+1, V): the target at the root and each node; q: the draft's distribution of each node's
    token, dense (B, T, V) or a :class:`~minispec.decoding.sampling.PointMass`; x (B, T) the nodes' tokens; u
    (B, T) one uniform per node; ``draw(weights (B, V)) -> (B,)``. Returns path (B, depth): the accepted
    nodes from depth 1 down (-1 past a row's last), rank (B, depth): their ranks among their siblings,
    and t (B,): the row's next token (a correction, or the bonus after an accepted leaf). ``greedy``: p is
    one-hot (temperature 0), and :func:`verify_greedy` gives the same answer without walking over V.
    """
    if greedy:
        return verify_greedy(p, x, tree, draw, q)
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


def verify_greedy(p: torch.Tensor, x: torch.Tensor, tree: Tree, draw, q=None):
    """:func:`verify_tree` where p is one-hot: a child is accepted when it is the first of its siblings whose
    token is the target's argmax at their parent, and the walk goes on below it. Computed for all nodes at
    once, in O(depth) small ops on (B, T) tensors instead of a walk over (B, V) distributions. ``q``: as
    verify_tree's; a node where it is zero (nothing proposed: a smaller tree's padding) is never accepted."""
    B, T = x.shape
    best = argmax(p)  # (B, T+1) the target's token after each node
    hit = x == best.gather(1, tree.parent)  # (B, T) the node is its parent's argmax
    if q is not None:
        hit &= q_of(q, x) > 0  # (B, T) and was proposed
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
