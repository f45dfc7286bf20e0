"""What a user meets with trees: the size cap, the depth a tree drafts to, and the stats that describe it."""

import random

import pytest

import minispec
from minispec import TreeDraft
from minispec.decoding.tree import MAX_NODES, static_tree, tree_nodes
from minispec.drafts.tree import _TreeRun, check_tree
from tests.support import Scripted

PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8, 9, 10, 11], [12], [13, 14, 15, 16, 17]]


@pytest.mark.parametrize("kw, nodes", [
    (dict(branching=(64, 64, 64)), "266,304 nodes"),
    (dict(branching=(1025,)), "1,025 nodes"),
    (dict(paths=[(i,) for i in range(MAX_NODES + 1)]), "1,025 nodes"),
    (dict(budget=MAX_NODES + 1, depth=2), "verifies 1,025 nodes"),
    (dict(budget=16, depth=300, topk=4), "feeds the draft 1,196 nodes"),
    (dict(budget=MAX_NODES, depth=3, topk=513), "feeds the draft 1,026 nodes"),  # a budget at the cap is allowed
])
def test_a_tree_over_the_cap_is_refused_with_its_node_count(pair, kw, nodes):
    """Before: branching=(64, 64, 64) was accepted and ran for more than 13 minutes."""
    with pytest.raises(ValueError, match=f"{nodes}.*at most {MAX_NODES:,}"):
        TreeDraft(pair[1], **kw)
    with pytest.raises(ValueError, match=nodes):
        check_tree(**kw)


def test_the_smallest_trees_are_allowed(pair):
    """A dynamic tree of one node at depth 1 with one child per node, and a static tree of one node: legal, if
    useless (each is a chain of one)."""
    assert check_tree(budget=1, depth=1, topk=1) is None and check_tree(branching=(1,)) == [0]
    TreeDraft(pair[1], budget=1, depth=1, topk=1)


def test_the_refusal_names_the_tree():
    with pytest.raises(ValueError, match=r"^branching=\(64, 64, 64\) makes a tree of 266,304 nodes"):
        static_tree(branching=(64, 64, 64))
    with pytest.raises(ValueError, match=rf"^{MAX_NODES + 1} paths makes a tree of 1,025 nodes"):
        static_tree(paths=[(i,) for i in range(MAX_NODES + 1)])


def test_a_node_may_have_as_many_children_as_the_vocabulary_has_tokens(pair):
    target, draft = pair
    V = target.config.vocab_size
    out = minispec.speculative_generate(target, TreeDraft(draft, branching=(V,)), PROMPTS[:1], max_new_tokens=4)
    assert out.stats.tree_nodes == V
    with pytest.raises(ValueError, match=f"up to {V + 1} children, more than the target's {V}-token vocabulary"):
        minispec.speculative_generate(target, TreeDraft(draft, paths=[(i,) for i in range(V + 1)]), PROMPTS[:1],
                                      max_new_tokens=4)


def test_a_tree_says_what_it_is(pair):
    draft = pair[1]
    assert repr(TreeDraft(draft, branching=(2, 1))) == f"TreeDraft({minispec.ModelDraft(draft)!r}, branching=(2, 1), " \
        "4 nodes)"
    assert repr(TreeDraft(draft, paths=[(0,), (1,)])) == f"TreeDraft({minispec.ModelDraft(draft)!r}, " \
        "paths=[(0,), (1,)], 2 nodes)"
    millions = sum(p.numel() for p in draft.parameters()) / 1e6  # the draft model's own count, in millions
    assert repr(minispec.ModelDraft(draft)) == f"ModelDraft({millions:.3g}M parameters)"


def test_a_tree_at_the_cap_is_built():
    assert len(static_tree(branching=(4, 4, 4, 4))) == tree_nodes((4, 4, 4, 4)) == 340
    assert len(static_tree(branching=(MAX_NODES,))) == MAX_NODES


def test_ranks_and_depths_match_a_direct_count(pair):
    """The linear construction gives each node the depth and sibling rank a direct (quadratic) count gives."""
    rng = random.Random(0)
    for _ in range(20):
        paths, frontier = [], [()]  # a random tree: each node gets 0 to 3 children, to depth 5
        while frontier and len(paths) < 40:
            node = frontier.pop(rng.randrange(len(frontier)))
            children = [node + (r,) for r in range(rng.randrange(4) if len(node) < 5 else 0)]
            paths, frontier = paths + children, frontier + children
        tree = TreeDraft(pair[1], paths=rng.sample(paths, len(paths)) or [(0,)])
        parents = tree.parents
        assert tree.ranks == [parents[:j].count(par) for j, par in enumerate(parents)]
        depth = [0]
        for par in parents:
            depth.append(depth[par] + 1)
        assert tree.levels == depth and tree.depth == max(depth) and tree.topk == max(tree.ranks) + 1


def test_a_tree_drafts_to_its_own_depth_by_default(pair):
    """gamma left out: the tree's own depth (before: gamma 4 cut a depth-5 tree to depth 4); gamma given: the
    tree is cut there."""
    target, draft = pair
    plain = minispec.generate(target, PROMPTS, max_new_tokens=24).tokens
    for tree, depth, nodes in ((TreeDraft(draft, budget=16, depth=5), 5, 16),
                               (TreeDraft(draft, branching=(2, 1, 1, 1, 1, 1)), 6, 12)):
        out = minispec.speculative_generate(target, tree, PROMPTS, max_new_tokens=24)
        assert out.tokens == plain
        assert (out.stats.tree_depth, out.stats.tree_nodes, out.stats.gamma) == (depth, nodes, depth)
        assert set(out.stats.gamma_per_step) == {depth}
        cut = minispec.speculative_generate(target, tree, PROMPTS, gamma=2, max_new_tokens=24).stats
        assert cut.tree_depth == 2 and len(cut.accepted_per_position) <= 2


def test_a_tree_self_draft_reads_right(pair):
    """The target drafting for itself accepts one whole path per step: the path acceptance rate is 1, the
    per-node rate is depth / nodes, and the mean acceptance length is depth + 1 (vLLM's, bonus included)."""
    target, _ = pair
    out = minispec.speculative_generate(target, TreeDraft(target, branching=(3, 2)), PROMPTS, max_new_tokens=30)
    s = out.stats
    assert (s.tree_depth, s.tree_nodes) == (2, 9)
    assert s.path_tokens == 2 * s.num_drafts and s.draft_tokens == 9 * s.num_drafts
    assert s.acceptance_rate == 1.0 and s.node_acceptance_rate == pytest.approx(2 / 9)
    assert s.to_dict()["node_acceptance_rate"] == s.node_acceptance_rate
    steps = s.num_drafts / len(PROMPTS)
    assert s.mean_acceptance_length == pytest.approx(3.0, abs=1 / steps)  # a row's last step may be cut short


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_chain_reads_as_before(pair, temperature):
    """For a chain the acceptance rate stays vLLM's accepted / draft tokens, and a one-path tree reads the same."""
    target, draft = pair
    kw = dict(max_new_tokens=30, temperature=temperature, seed=[3, 1, 4, 1])
    chain = minispec.speculative_generate(target, draft, PROMPTS, gamma=4, **kw).stats
    assert chain.tree_depth is None and chain.tree_nodes is None and chain.gamma == 4
    assert chain.path_tokens == chain.draft_tokens
    assert chain.acceptance_rate == chain.node_acceptance_rate == chain.accepted_tokens / chain.draft_tokens
    one = minispec.speculative_generate(target, TreeDraft(draft, branching=(1, 1, 1, 1)), PROMPTS, **kw).stats
    assert (one.acceptance_rate, one.tree_depth, one.tree_nodes) == (chain.acceptance_rate, 4, 4)


def test_a_dynamic_tree_expands_the_k_candidates_of_highest_cumulative_log_q_at_each_level(pair, monkeypatch):
    """EAGLE-2's expansion: at each level below the last, the draft feeds the k candidates whose cumulative log q
    (their path's log probabilities summed) is highest, and a child's score is its parent's plus its own log q. A
    tree that expanded others would stay exact and accept less."""
    target, draft = pair
    seen, select = [], _TreeRun._select

    def spy(self, scores, toks, parents, fed, depth):
        seen.append(([s.clone() for s in scores], [p.clone() for p in parents]))
        return select(self, scores, toks, parents, fed, depth)

    monkeypatch.setattr(_TreeRun, "_select", spy)
    k = 3
    minispec.speculative_generate(target, TreeDraft(draft, budget=10, depth=4, topk=k), [[1, 2, 3], [4, 5, 6, 7, 8]],
                                  max_new_tokens=12)
    assert len(seen) >= 2
    for scores, parents in seen:
        assert [s.shape[1] for s in scores] == [k, k * k, k * k, k * k]
        for i in range(1, len(scores)):
            expanded = parents[i][:, ::k]  # (B, k) the level i - 1 candidates fed, each parent of k children
            if i > 1:
                assert all(set(e) == set(s) for e, s in zip(expanded.tolist(),
                                                            scores[i - 1].topk(k, -1).indices.tolist()))
            assert (scores[i] <= scores[i - 1].gather(1, parents[i])).all()  # a child never scores above its parent


def test_a_static_tree_reserves_one_kv_slot_per_node(pair):
    """A row verifying a static tree takes one lookahead slot per node and no more (the engine reserves blocks by
    it): Medusa-style paths with one wide level have 7 nodes, where a dynamic tree of that depth and top-k would feed
    (depth - 1) x topk = 12."""
    tree = TreeDraft(pair[1], paths=[(0, 0, 0, 0), (1,), (2,), (3,)])
    assert (tree.budget, tree.depth, tree.topk) == (7, 4, 4) and tree.width(4) == 7


class Lags(minispec.ModelDraft):
    """Records how many tokens each catch-up of the draft model re-reads."""

    def start(self, target, state, sampler, features=None):
        run, lags = super().start(target, state, sampler, features), self.lags
        catch_up = run.catch_up

        def recorded(state):
            lags.append(run.lag)
            return catch_up(state)

        run.catch_up = recorded
        return run


def test_a_draft_model_rereads_two_tokens_after_a_speculative_step_and_one_more_per_plain_step(pair):
    """After a speculative step the draft re-reads the last 2 tokens (its last accepted one may never have been fed,
    and the target's own token is new; the rest it wrote while drafting); each plain step adds one. More would be
    the same tokens at more cost, fewer a stale cache. And its last position is usable, one more is refused."""
    target, draft = pair
    d = Lags(draft)
    d.lags = []
    minispec.speculative_generate(target, d, [[1, 2, 3]], gamma=Scripted([4, 0, 3]), max_new_tokens=20)
    assert d.lags[:4] == [2, 2 + 1, 2, 2 + 1]  # the script 4, 0, 3 twice: no catch-up in the plain steps
    with pytest.raises(ValueError, match="maximum length of 256 positions"):
        d.check(target, 257)
    d.check(target, 256)  # the draft's last position is usable
