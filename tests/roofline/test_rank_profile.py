"""Acceptance conditioned on the parent's rank (issue 23): the steady state of a Markov chain across steps."""

import random

import pytest

import minispec.roofline as rl
from minispec.roofline import EMBEDDED_PROFILE, RankProfile, TreeShape, best_tree, tree_expected_tokens


def simulate(tree: TreeShape, profile: RankProfile, steps: int, seed: int = 0) -> float:
    """Tokens per step over ``steps`` consecutive steps, drawn one by one: below each node the accepted child's rank
    comes from the row of that node's own rank (the root's: whether the last step's bonus token was first-ranked);
    a rank the node has no child of ends the step with the target's token, which the draft did not rank first."""
    children = {}
    for i, (parent, rank) in enumerate(zip(tree.parents, tree.ranks)):
        children.setdefault(parent, {})[rank] = i
    rng, root_first, tokens = random.Random(seed), False, 0
    for _ in range(steps):
        node, first = -1, root_first
        while True:
            row = profile.after_first if first else profile.after_other
            u, k = rng.random(), 0
            while k < len(row) and u >= row[k]:
                u -= row[k]
                k += 1
            tokens += 1  # an accepted node, or the step's last token (a correction or the bonus)
            if node in children and k in children[node]:
                node, first = children[node][k], k == 0
                continue
            root_first = node not in children and k == 0  # a leaf's bonus token the draft ranked first
            break
    return tokens / steps


@pytest.mark.parametrize("tree", [TreeShape.chain(1), TreeShape.chain(5), TreeShape.from_branching((3, 2, 1)),
                                  TreeShape.from_paths([(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0)])])
def test_expected_tokens_is_the_steady_state_of_consecutive_steps(tree):
    """60,000 steps: the standard error of the mean is under 0.01 token; the single row differs by more."""
    simulated = simulate(tree, EMBEDDED_PROFILE, 60_000)
    assert tree_expected_tokens(tree, profile=EMBEDDED_PROFILE) == pytest.approx(simulated, abs=0.03)
    independent = tree_expected_tokens(tree, profile=[(a + b) / 2 for a, b in zip(*[
        EMBEDDED_PROFILE.after_first, EMBEDDED_PROFILE.after_other])])
    assert abs(independent - simulated) > 0.03 or tree.nodes == 1


def test_a_profile_without_streaks_is_the_single_row():
    """Both rows equal: ranks are independent again, and the chain's E is Leviathan's."""
    flat = RankProfile((0.7, 0.2), (0.7, 0.2))
    for tree in (TreeShape.chain(4), TreeShape.from_branching((2, 2))):
        assert tree_expected_tokens(tree, profile=flat) == pytest.approx(tree_expected_tokens(tree, profile=(0.7, 0.2)))
    assert tree_expected_tokens(TreeShape.chain(4), profile=flat) == pytest.approx(rl.expected_tokens(0.7, 4))


def test_streaks_lengthen_the_chain():
    """After a right first guess the next is right more often: deep chains are worth more than independence says."""
    chain = TreeShape.chain(8)
    assert tree_expected_tokens(chain, profile=RankProfile((0.9,), (0.5,))) > tree_expected_tokens(
        chain, profile=RankProfile((0.7,), (0.7,)))


def test_the_search_takes_a_rank_profile():
    """best_tree and the table take it; the table's E is the steady state of the tree it picks."""
    tree = best_tree(20, profile=EMBEDDED_PROFILE)
    assert tree.nodes == 20 and not tree.is_chain
    for row in rl.tree_speedup_table([1, 16, 64], profile=EMBEDDED_PROFILE):
        assert row["tokens_per_step"] == pytest.approx(tree_expected_tokens(row["tree"], profile=EMBEDDED_PROFILE))
        assert not row["capped"]


def test_rank_profiles_are_checked():
    with pytest.raises(ValueError, match="after_first"):
        RankProfile((0.9, 0.2), (0.5,))  # sums past 1
    with pytest.raises(ValueError, match="non-increasing"):
        best_tree(3, profile=RankProfile((0.1, 0.5), (0.5,)))
