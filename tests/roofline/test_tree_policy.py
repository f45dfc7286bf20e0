"""gamma="auto" for a tree draft prices the tree every row verifies, not a chain (issue 23)."""

import pytest

from minispec.roofline import LLAMA_8B, TreeShape, best_tree, default_profile, speculative_speedup, tree_speedup
from minispec.roofline.hardware import H100_SXM
from minispec.roofline.policy import RooflinePolicy, TreePolicy, auto_policy

STATIC = TreeShape.from_branching((4, 2, 2, 1))  # 44 nodes, depth 4


def test_truncated_keeps_the_nodes_down_to_a_depth():
    assert [STATIC.truncated(d).nodes for d in range(6)] == [0, 4, 12, 28, 44, 44]
    assert STATIC.truncated(2) == TreeShape.from_branching((4, 2)) and STATIC.truncated(9) == STATIC
    odd = TreeShape.from_paths([(0,), (1,), (0, 0), (1, 0), (0, 0, 0)])
    assert odd.truncated(2).paths == ((0,), (1,), (0, 0), (1, 0))


def test_a_static_tree_is_priced_node_by_node():
    """Batch 64 on the H100, alpha 0.8, c 0.05: the chain of 4 the old policy priced predicts 2.62x; the 44-node
    tree it then drafted verifies 45 tokens per row, 2,880 in all, ten times the ridge: 0.40x."""
    policy = auto_policy(LLAMA_8B, None, H100_SXM, draft_cost=0.05, tree=STATIC)
    assert isinstance(policy, TreePolicy)
    for B in (1, 16, 64, 128):
        for g in range(1, 9):
            assert policy.speedup(B, g, 0.8) == pytest.approx(tree_speedup(B, STATIC.truncated(g), 0.8))
    assert speculative_speedup(64, 0.8, 4) == pytest.approx(2.62, abs=0.005)
    assert tree_speedup(64, STATIC, 0.8) < 0.5
    chosen = {B: policy.choose(B) for B in (1, 16, 64, 128)}
    assert chosen[1] == 4 and chosen[128] == 0 and chosen[1] > chosen[16] > chosen[64] > chosen[128]
    assert RooflinePolicy(draft_cost=0.05).choose(64) == 4  # the chain's pricing


def test_a_dynamic_tree_is_priced_as_its_passes_and_its_best_nodes():
    """EAGLE-2's tree of 16 nodes, top-4: g passes over 1, 4, ..., 4 tokens per row; credited with the best tree of
    min(16, 4 + (g - 1) 16) nodes of depth <= g and ranks < 4."""
    policy = auto_policy(LLAMA_8B, None, H100_SXM, draft_cost=0.05, budget=16, topk=4)
    for g, nodes in ((1, 4), (2, 16), (5, 16)):
        tree = best_tree(nodes, profile=default_profile(0.7, 4), max_depth=g)
        assert tree.nodes == nodes and max(tree.ranks) < 4
        assert policy.speedup(8, g, 0.7) == pytest.approx(tree_speedup(8, tree, 0.7, passes=(1,) + (4,) * (g - 1)))


def test_tree_policies_are_checked():
    with pytest.raises(ValueError, match="not both or neither"):
        TreePolicy()
    with pytest.raises(ValueError, match="not both or neither"):
        TreePolicy(tree=STATIC, budget=4)
    with pytest.raises(ValueError, match="budget and topk"):
        TreePolicy(budget=0)
