"""The rule's edge cases on hand-made inputs: a rejection with nothing left to correct (p <= q everywhere, which
rounding can give when the draft is the target), u = 0 against a token the target never emits, and a tree's padding
nodes. Mutation testing found each branch unchecked: a residual test summed over the whole batch instead of per row,
a rejection that always cuts, u <= r/q for u < r/q, and the greedy shortcut told nothing about padding."""

import torch

from minispec.decoding.sampling import Argmax, PointMass, argmax, one_hot, proposed, q_at
from minispec.decoding.tree import Tree
from minispec.speculative.rule import accept_reject, verify_tree

THIRD = 1 / 3


def draw(w):
    """The argmax of each row's weights, refusing a row with nothing to draw from."""
    assert (w.sum(-1) > 0).all(), "a row drew from all-zero weights"
    return w.argmax(-1)  # (B,)


def test_a_rejection_with_nothing_left_to_correct_draws_from_p_in_its_own_row():
    # row 0: p just below q at x, so u = 0.999 rejects it, and max(0, p - q) is all zero: fall back to p.
    # row 1: a rejection with a residual. The fallback must be decided row by row.
    p = torch.tensor([[[THIRD - 1e-3, THIRD, THIRD - 1e-4], [1.0, 0, 0]],
                      [[0, 0, 1.0], [1.0, 0, 0]]])  # (B=2, gamma+1=2, V=3)
    q = torch.full((2, 1, 3), THIRD)  # (B, gamma, V)
    accepted, t = accept_reject(p, q, torch.tensor([[0], [0]]), torch.tensor([[0.999], [0.5]]), draw)
    assert not accepted.any()
    assert t.tolist() == [1, 2]  # row 0: p's argmax; row 1: the residual's only token


def tree_of(parents, depth, width, B):
    return Tree(torch.tensor(parents).expand(B, len(parents)), depth, width)


def test_a_tree_rejection_with_nothing_left_keeps_the_owed_distribution_row_by_row():
    """Two siblings under the root. Row 0: the first is rejected with nothing left (p <= q), so the second is tried
    against the same p and accepted; row 1: both rejected, the residual corrects."""
    tree = tree_of([0, 0], 1, 2, 2)
    p = torch.tensor([[[THIRD - 1e-3, THIRD, THIRD - 1e-3], [1.0, 0, 0], [0, 1.0, 0]],
                      [[0, 0, 1.0], [1.0, 0, 0], [1.0, 0, 0]]])  # (B, T+1, V)
    q = torch.full((2, 2, 3), THIRD)  # (B, T, V)
    x = torch.tensor([[0, 1], [0, 1]])  # (B, T)
    u = torch.tensor([[0.999, 0.5], [0.5, 0.5]])  # (B, T)
    path, rank, t = verify_tree(p, q, x, tree, u, draw, greedy=False)
    assert path.tolist() == [[2], [-1]] and rank.tolist() == [[1], [-1]]
    assert t.tolist() == [1, 2]  # row 0: the bonus after node 2 (p there); row 1: the correction


def test_u_zero_never_accepts_a_token_the_target_cannot_emit():
    tree = tree_of([0, 1], 2, 1, 1)
    p = torch.tensor([[[0.5, 0.5, 0], [0, 0, 1.0], [1.0, 0, 0]]])  # (1, T+1, V): the root never emits token 2
    x = torch.tensor([[2, 0]])  # (1, T)
    path, _, t = verify_tree(p, torch.full((1, 2, 3), THIRD), x, tree, torch.zeros(1, 2), draw, greedy=False)
    assert path.tolist() == [[-1, -1]] and t.tolist() == [0]


def test_padding_nodes_are_never_accepted_greedy_or_sampled():
    """A row whose tree is smaller pads with nodes it did not propose (q = 0); a padding node whose token happens
    to be the target's argmax must still be rejected, by the greedy shortcut as by the walk."""
    tree = tree_of([0, 1], 2, 1, 2)
    p = torch.eye(3)[[1, 2, 0]].expand(2, 3, 3)  # (B, T+1, V) one-hot: 1 after the root, 2 after node 1
    x = torch.tensor([[1, 2], [1, 2]])  # (B, T) both nodes are the argmax
    q = PointMass(torch.tensor([[True, True], [True, False]]), 3)  # row 1 proposed only node 1
    for greedy in (True, False):
        path, _, t = verify_tree(p, q, x, tree, torch.full((2, 2), 0.5), draw, greedy=greedy)
        assert path.tolist() == [[1, 2], [1, -1]], greedy
        assert t.tolist() == [0, 2], greedy


def test_q_past_the_draft_is_zero_and_only_proposed_positions_count():
    """q_at gives zeros past a row's draft (the bonus position), for dense q and for a step that drafted nothing;
    proposed() marks a dense q's all-zero positions (a chain cut short) as not proposed."""
    q = torch.softmax(torch.randn(2, 3, 5), -1)  # (B, T, V)
    q[1, 2] = 0  # row 1 proposed two tokens
    x = torch.tensor([[0, 1, 2], [3, 4, 0]])  # (B, T)
    assert proposed(q).tolist() == [[True, True, True], [True, True, False]]
    assert torch.equal(q_at(q, x, torch.tensor([3, 1])), torch.stack([torch.zeros(5), q[1, 1]]))
    assert torch.equal(q_at(torch.zeros(2, 0, 5), x[:, :0], torch.tensor([0, 0])), torch.zeros(2, 5))
    p = torch.eye(5)[torch.tensor([[2], [4]])]  # (B, 1, V): the target's next token, nothing drafted
    accepted, t = accept_reject(p, torch.zeros(2, 0, 5), x[:, :0], torch.zeros(2, 0), draw)
    assert accepted.shape == (2, 0) and t.tolist() == [2, 4]


def test_greedy_argmaxes_accept_and_draw_what_the_one_hots_do():
    """Rows that are all greedy hand the rule their argmaxes (Argmax) instead of one-hots (B, gamma+1, V): the same
    accepted prefix and token on random drafts that match the argmax for a while (and at the last token, past a
    rejection), with positions that proposed nothing (prompt lookup's short match), a dense q, ties in the logits (the
    first wins) and a 49,152 vocabulary."""
    g = torch.Generator().manual_seed(0)
    B, gamma, V = 64, 4, 49152
    logits = torch.randn(B, gamma + 1, V, generator=g)
    logits[:8, :, :2] = 9.0  # ties: the first of the largest is the argmax
    top = argmax(logits)  # (B, gamma+1)
    keep = torch.randint(0, gamma + 1, (B, 1), generator=g)  # the draft agrees with the argmax up to here,
    agree = (torch.arange(gamma) < keep) | (torch.arange(gamma) == gamma - 1)  # and again at its last token
    x = torch.where(agree, top[:, :-1], torch.randint(0, V, (B, gamma), generator=g))
    half = torch.full((B, gamma), 0.5, dtype=torch.float64)  # Sampler.accept_uniforms' u for greedy rows
    for q in (PointMass(torch.arange(gamma) < torch.randint(0, gamma + 1, (B, 1), generator=g), V),
              one_hot(x, V)):
        want = accept_reject(one_hot(top, V), q, x, half, draw)
        got = accept_reject(Argmax(top), q, x, half, draw)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
        assert 0 < want[0].sum(1).float().mean() < gamma  # some accepted, some rejected: both branches ran
