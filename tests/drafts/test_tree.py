"""Tree speculation: one verify pass equals every root-to-leaf chain, and the tree rule is exact."""

import pytest
import torch
from support import V, empirical_tv, random_model

import minispec
from minispec import TreeDraft
from minispec.course.grader import tv_bound
from minispec.decoding.tree import Tree, static_tree, tree_mask

# --- the model verifies a tree in one pass -----------------------------------------------------


def prefilled(model, prefixes, slots=40, static=False):
    """A cache holding each row's prefix (ragged), and the prefixes as a padded tensor."""
    B, P = len(prefixes), max(len(p) for p in prefixes)
    tokens = torch.tensor([p + [0] * (P - len(p)) for p in prefixes])  # (B, P)
    cache = model.new_cache(B, slots, static=static)
    model(tokens, cache)
    cache.rollback(torch.tensor([len(p) for p in prefixes]))
    return cache


TREES = [  # per row: node j's parent at j - 1 (0: the root); rows may differ (dynamic trees)
    [static_tree(branching=(2, 2))] * 3,
    [[0, 1, 2, 3, 0, 5, 1], [0, 0, 0, 1, 2, 3, 4], [0, 1, 1, 2, 2, 3, 6]],
]


@pytest.mark.parametrize("parents", TREES, ids=["static", "per-row"])
@pytest.mark.parametrize("kw, static", [({}, False), ({}, True), (dict(sliding_window=(3, None)), False),
                                        (dict(kv_heads=1), False)], ids=["gqa", "static-cache", "window", "mqa"])
def test_a_tree_pass_gives_every_nodes_chain_logits(parents, kw, static):
    """Node j's logits from the tree pass equal those of its root-to-j path run as a chain, per row,
    with ragged prefixes; the static cache, a sliding window (3 positions on layer 0) and GQA included."""
    model = random_model(seed=3, **kw)
    prefixes = [[5, 6, 7, 8, 9, 10], [11, 12], [13, 14, 15, 16]]
    parent = torch.tensor(parents)  # (B, T)
    B, T = parent.shape
    g = torch.Generator().manual_seed(0)
    root, x = torch.randint(0, 64, (B, 1), generator=g), torch.randint(0, 64, (B, T), generator=g)
    cache = prefilled(model, prefixes, static=static)
    depth = 4
    logits = model(torch.cat([root, x], 1), cache, tree=tree_mask(Tree(parent, depth, 3), cache.lengths.clone()))
    for b in range(B):
        for j in range(T + 1):
            path, node = [], j
            while node:
                path.append(x[b, node - 1].item())
                node = parent[b, node - 1].item()
            chain = torch.tensor([[root[b, 0].item()] + path[::-1]])  # (1, depth + 1)
            ref = model(chain, prefilled(model, [prefixes[b]], static=static))[0, -1]  # (V,)
            torch.testing.assert_close(logits[b, j], ref, atol=2e-5, rtol=1e-4)


def test_compacting_the_accepted_path_leaves_the_cache_of_the_chain():
    """After a tree pass, moving the accepted path next to the prefix gives the cache a chain over that
    path would have left: the next token's logits are the same, row by row (ragged paths)."""
    model = random_model(seed=4)
    prefixes = [[1, 2, 3], [4, 5, 6, 7, 8], [9]]
    parent = torch.tensor([static_tree(branching=(2, 2, 1))] * 3)  # (3, 10)
    x = torch.randint(0, 64, (3, parent.shape[1]), generator=torch.Generator().manual_seed(1))  # (3, T)
    root = torch.tensor([[10], [11], [12]])
    cache = prefilled(model, prefixes)
    base = cache.lengths.clone()
    model(torch.cat([root, x], 1), cache, tree=tree_mask(Tree(parent, 3, 2), base))
    path = torch.tensor([[2, 6, 10], [1, -1, -1], [-1, -1, -1]])  # node ids by depth; -1 past a row's path
    n = (path > 0).sum(1)
    cache.compact(base, path)
    cache.rollback(base + 1 + n)
    nxt = torch.tensor([[20], [21], [22]])
    after = model(nxt, cache)[:, 0]  # (3, V)
    for b in range(3):
        chain = [root[b, 0].item()] + [x[b, j - 1].item() for j in path[b].tolist() if j > 0] + [nxt[b, 0].item()]
        ref = model(torch.tensor([chain]), prefilled(model, [prefixes[b]]))[0, -1]
        torch.testing.assert_close(after[b], ref, atol=2e-5, rtol=1e-4)


# --- greedy trees are plain greedy decoding ---------------------------------------------------

KINDS = [
    lambda d: TreeDraft(d, branching=(4, 2, 2, 1)),
    lambda d: TreeDraft(d, paths=[(0,), (0, 0), (0, 0, 0), (1,), (1, 0), (0, 1), (2,)]),
    lambda d: TreeDraft(d, budget=16, depth=5),
    lambda d: TreeDraft(d, budget=6, depth=3, topk=2),
]
KIND_IDS = ["branching", "paths", "dynamic", "dynamic-small"]


@pytest.fixture(scope="module")
def embedded():
    target, tok = minispec.load("tiny-code-target")
    draft, _ = minispec.load("tiny-code-draft")
    code = minispec.load.__globals__["sample_text"]("code").decode()
    return target, draft, tok, code


@pytest.mark.parametrize("make", KINDS, ids=KIND_IDS)
def test_greedy_tree_decoding_equals_plain_greedy(embedded, make):
    """Batch 1 and a ragged batch of 8, each tree kind, the embedded pair."""
    target, draft, tok, code = embedded
    prompts = [tok.encode(code[i * 500: i * 500 + 20 + 13 * i]) for i in range(8)]
    for batch in (prompts[:1], prompts):
        plain = minispec.generate(target, batch, max_new_tokens=48).tokens
        out = minispec.speculative_generate(target, make(draft), batch, gamma=8, max_new_tokens=48)
        assert out.tokens == plain
        assert out.stats.accepted_tokens == sum(out.stats.accepted_per_rank)  # every accepted node has a rank


@pytest.mark.parametrize("make", KINDS, ids=KIND_IDS)
def test_greedy_trees_of_a_layer_skip_draft_and_a_random_pair(pair, make):
    target, draft = pair
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8, 9, 10, 11], [12], [13, 14, 15, 16, 17]]
    plain = minispec.generate(target, prompts, max_new_tokens=24).tokens
    for d in (draft, minispec.LayerSkipDraft(target, 1)):
        assert minispec.speculative_generate(target, make(d), prompts, gamma=8, max_new_tokens=24).tokens == plain


def test_a_dynamic_tree_accepts_more_per_step_than_a_chain(embedded):
    """The point of a tree: more tokens per target pass at batch 1 (greedy, deterministic here)."""
    target, draft, tok, code = embedded
    prompt = [tok.encode(code[2000:2100])]
    chain = minispec.speculative_generate(target, draft, prompt, gamma=5, max_new_tokens=96).stats
    tree = minispec.speculative_generate(target, TreeDraft(draft, budget=16, depth=5), prompt, max_new_tokens=96).stats
    assert tree.mean_acceptance_length > chain.mean_acceptance_length
    assert tree.num_steps < chain.num_steps
    assert tree.draft_tokens == 16 * tree.num_drafts  # 16 nodes verified per step


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_one_path_tree_is_the_chain(pair, temperature):
    """branching=(1, 1, 1, 1) gives the chain's tokens, accepted flags and stats, sampled too."""
    target, draft = pair
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8, 9, 10, 11], [12], [13, 14, 15, 16, 17]]
    kw = dict(max_new_tokens=30, temperature=temperature, seed=[3, 1, 4, 1])
    chain = minispec.speculative_generate(target, draft, prompts, gamma=4, **kw)
    tree = minispec.speculative_generate(target, TreeDraft(draft, branching=(1, 1, 1, 1)), prompts, gamma=4, **kw)
    assert tree.tokens == chain.tokens and tree.accepted == chain.accepted
    for key in ("num_drafts", "draft_tokens", "accepted_tokens", "tested_tokens", "per_position_acceptance_rates",
                "num_steps"):
        assert getattr(tree.stats, key) == getattr(chain.stats, key), key
    assert tree.stats.accepted_per_rank[0] == tree.stats.accepted_tokens  # every accepted node is a first child


def test_gamma_caps_a_trees_depth(embedded):
    target, draft, tok, code = embedded
    prompt = [tok.encode(code[:60])]
    out = minispec.speculative_generate(target, TreeDraft(draft, branching=(2, 2, 2, 2)), prompt, gamma=2,
                                        max_new_tokens=40)
    assert out.tokens == minispec.generate(target, prompt, max_new_tokens=40).tokens
    assert len(out.stats.accepted_per_position) <= 2 and out.stats.draft_tokens == 6 * out.stats.num_drafts


# --- sampled trees have the target's distribution ----------------------------------------------

@pytest.fixture(scope="module")
def sharp():
    return random_model(seed=5, vocab=V, logit_scale=10), random_model(seed=6, vocab=V, layers=1, logit_scale=10)


TV_CASES = [
    (lambda d: TreeDraft(d, branching=(2, 2)), dict(temperature=1.0)),  # i.i.d. children (SpecInfer)
    (lambda d: TreeDraft(d, branching=(3, 1)), dict(temperature=0.7, top_k=3)),
    (lambda d: TreeDraft(d, budget=6, depth=3, topk=2), dict(temperature=1.0)),  # top-k children: point masses
    (lambda d: TreeDraft(d, budget=4, depth=2, topk=3), dict(temperature=1.3, top_p=0.9)),
]


@pytest.mark.parametrize("make, kw", TV_CASES, ids=["iid", "iid-topk", "dynamic", "dynamic-topp"])
def test_tree_sampling_has_the_target_distribution(sharp, make, kw):
    """The first three tokens of 30,000 rows (two prompts) against the target's exact joint distribution."""
    target, draft = sharp
    params = minispec.SamplingParams(**kw)
    tv, out = empirical_tv(target, make(draft), params, gamma=3, prompts=([1, 3], [2]))
    bound = tv_bound(V**3, 30_000)
    assert tv < bound, f"TV {tv:.4f} >= bound {bound:.4f}"
    assert out.stats.accepted_tokens > 0.2 * 30_000  # the draft's tokens are really used


@pytest.mark.parametrize("make", [TV_CASES[0][0], TV_CASES[2][0]], ids=["iid", "dynamic"])
def test_a_wrong_residual_fails_the_distribution_test(sharp, make, monkeypatch):
    """A negative control: after a rejection, keep r = p instead of norm(max(0, r - q)) (q not removed)."""
    import minispec.decoding.tree

    target, draft = sharp
    monkeypatch.setattr(minispec.speculative.rule, "q_at", lambda q, x, i: torch.zeros(len(x), V))
    tv, _ = empirical_tv(target, make(draft), minispec.SamplingParams(1.0), gamma=3, prompts=([1, 3], [2]))
    assert tv > 2 * tv_bound(V**3, 30_000)


# --- shapes and bad input ------------------------------------------------------------------------

def test_static_tree_shapes():
    assert static_tree(branching=(2, 1)) == [0, 0, 1, 2]
    assert static_tree(branching=(4, 2, 2, 1)).__len__() == 4 + 8 + 16 + 16
    assert static_tree(paths=[(0, 0), (1,), (0, 1)]) == [0, 0, 1, 1]  # nodes (0,), (1,), (0, 0), (0, 1)


@pytest.mark.parametrize("kw, message", [
    (dict(branching=()), "branching"),
    (dict(branching=(2, 0)), "branching"),
    (dict(paths=[(1,)]), "rank 1"),
    (dict(paths=[]), "paths must be a non-empty list"),
    (dict(paths=[()]), "paths must be a non-empty list of non-empty tuples"),
    (dict(paths=[5]), "paths must be"),
    (dict(paths=[(0,), (-1,)]), "child ranks >= 0"),
    (dict(paths=[(True,)]), "child ranks >= 0"),
    (dict(paths=[(0.0,)]), "child ranks >= 0"),
    (dict(branching=(2,), budget=4, depth=2), "not both"),
    (dict(budget=0, depth=2), "^budget must be an integer >= 1, got 0$"),
    (dict(budget=4, depth=2, topk=0), "^topk must be an integer >= 1, got 0$"),
    (dict(budget=4), "^depth must be an integer >= 1, got None$"),  # half a dynamic tree is not a static one
    (dict(depth=3), "^budget must be an integer >= 1, got None$"),
    (dict(), "exactly one"),
])
def test_bad_trees_are_named(pair, kw, message):
    with pytest.raises(ValueError, match=message):
        TreeDraft(pair[1], **kw)


@pytest.mark.parametrize("make", [lambda d: minispec.PromptLookupDraft(), lambda d: minispec.SuffixDraft(),
                                  lambda d: TreeDraft(d, branching=(2,))], ids=["lookup", "suffix", "tree"])
def test_a_tree_needs_a_draft_model(pair, make):
    """A text draft (prompt lookup, suffix decoding) or another tree is refused when the tree is built, not when its
    first step asks the draft for logits it has none of."""
    with pytest.raises(ValueError, match="grows its tree with a draft model"):
        TreeDraft(make(pair[1]), branching=(2,))


def test_the_greedy_shortcut_is_the_walk_with_one_hot_p():
    """verify_greedy (no walk over V) gives the walk's path, ranks and token when p is one-hot, on random
    trees whose siblings sometimes share a token (the first of them must win, as in the walk)."""
    from minispec.decoding.sampling import PointMass
    from minispec.speculative.rule import verify_greedy, verify_tree

    g = torch.Generator().manual_seed(0)
    B, V = 64, 3  # 3 tokens: siblings collide and paths run deep
    for parents in (static_tree(branching=(3, 2, 2)), static_tree(paths=[(0, 0, 0, 0), (1, 0), (0, 1, 0)])):
        T = len(parents)
        parent = torch.tensor(parents).expand(B, T)  # (B, T)
        x = torch.randint(0, V, (B, T), generator=g)  # (B, T)
        p = torch.nn.functional.one_hot(torch.randint(0, V, (B, T + 1), generator=g), V).float()  # (B, T+1, V)
        tree = Tree(parent, max(depths_of(parents)), max(parents.count(v) for v in set(parents)))
        draw = lambda w: w.argmax(-1)  # noqa: E731
        q = PointMass(torch.ones(B, T, dtype=torch.bool), V)
        walk = verify_tree(p, q, x, tree, torch.rand(B, T, generator=g, dtype=torch.float64), draw, greedy=False)
        fast = verify_greedy(p, x, tree, draw)
        for a, b in zip(walk, fast):
            assert torch.equal(a, b)
        assert (walk[0] > 0).sum() > B // 2 and (walk[0][:, 1] > 0).any()  # accepted often, at depth 2 too


def depths_of(parents):
    level = [0]
    for par in parents:
        level.append(level[par] + 1)
    return level
