"""Trees in the roofline: verify cost, expected accepted length, the best tree per budget and per batch, SGLang's
EAGLE arguments; and the LM head in a draft's cost (hot vocabularies, EAGLE heads)."""

import dataclasses
import json
import math
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

import minispec.roofline as rl
from minispec.model.config import ModelConfig
from minispec.roofline import (
    EAGLE_8B,
    GEMMA3_270M,
    GEMMA3_270M_CONFIG,
    LLAMA3_8B_CONFIG,
    LLAMA_1B,
    LLAMA_8B,
    MIXTRAL_8X7B,
    SMOLLM2_135M,
    SMOLLM2_135M_CONFIG,
    ModelShape,
    TreeShape,
    best_gamma,
    best_tree,
    best_tree_budget,
    break_even_batch,
    check_arguments,
    default_profile,
    draft_cost_by_vocab,
    eagle_head_shape,
    max_batch,
    modelled_draft_cost,
    sglang_eagle_args,
    sglang_speculative_config,
    speculative_speedup,
    speculative_step_time,
    step_time,
    tree_expected_tokens,
    tree_speculative_step_time,
    tree_speedup,
    tree_speedup_table,
    tree_step_time,
    vllm_speculative_config,
)
from minispec.roofline.hardware import H100_SXM, H200, HARDWARE

GRID = sorted({round(2 ** (i / 4)) for i in range(4 * 10 + 1)})  # batch 1 .. 1024, 4 points per doubling


def geometric(alpha: float, ranks: int = 64) -> tuple[float, ...]:
    """alpha (1 - alpha)^k: a simple profile whose arithmetic the search tests below work by hand."""
    return tuple(alpha * (1 - alpha) ** k for k in range(ranks))


def rows_of(profile) -> tuple:
    """A single-row or per-depth profile as rows by depth, as the model checks it."""
    return rl.profile.profile_rows(0.8, profile, 3)[0].rows


def accepted_by_recursion(tree: TreeShape, rows) -> float:
    """E[accepted nodes] by total expectation, walking down: at a node of depth d the accepted child is rank k with
    rows[min(d, last)][k]; if that child is in the tree, count it and go on from it, else stop. Written apart from
    roofline's product along each path, which it must equal."""
    children = {}
    for i, (parent, rank) in enumerate(zip(tree.parents, tree.ranks)):
        children.setdefault(parent, {})[rank] = i

    def below(node, depth):
        row = rows[min(depth, len(rows) - 1)]
        return sum(p * (1 + below(children[node][k], depth + 1))
                   for k, p in enumerate(row) if k in children.get(node, {}))

    return below(-1, 0)


def closed_trees(n_max: int, max_rank: int, max_depth: int):
    """Every tree of 1..n_max nodes closed under parents and elder siblings (as rank paths), by brute force."""
    seen, frontier = set(), {frozenset()}
    for _ in range(n_max):
        grown = set()
        for paths in frontier:
            for p in [()] + list(paths):  # a new first child of p, or a new younger sibling below p's parent
                for q in (p + (0,), p[:-1] + (p[-1] + 1,) if p else None):
                    if q and q not in paths and len(q) <= max_depth and q[-1] < max_rank \
                            and (q[-1] == 0 or q[:-1] + (q[-1] - 1,) in paths) and (len(q) == 1 or q[:-1] in paths):
                        grown.add(paths | {q})
        seen |= grown
        frontier = grown
    return seen


# Verification cost of a tree.

def test_tree_verify_is_a_step_over_nodes_plus_the_root():
    """T nodes per row verify as T + 1 query tokens (the root's logits judge the first level).

    8B on the H100: 16e9 B / 3.35e12 B/s = 4.776 ms of weight read. Batch 1, 64 nodes: 65 tokens x 2 x 8e9 FLOP
    / 989e12 FLOP/s = 1.052 ms of compute < 4.776 ms, so the 64-node verify costs what one token does. Batch 8:
    520 tokens need 8.413 ms of compute, 1.76x a plain step.
    """
    assert tree_step_time(1, 64) == step_time(1, 65) == pytest.approx(16e9 / 3.35e12) == step_time(1, 1)
    assert tree_step_time(8, 64) == pytest.approx(2 * 8e9 * 520 / 989e12)
    assert round(1e3 * tree_step_time(8, 64), 3) == 8.413
    for B, T, ctx in [(1, 0, 0), (3, 7, 1024), (64, 4, 4096), (200, 31, 0)]:
        assert tree_step_time(B, T, context=ctx) == step_time(B, T + 1, context=ctx)


@given(st.floats(1, 2048), st.integers(0, 12), st.floats(0, 1), st.sampled_from([0, 1024, 8192]),
       st.sampled_from([None, 256]))
def test_a_chain_tree_costs_and_pays_what_the_chain_model_says(batch, gamma, c, context, window):
    chain = TreeShape.chain(gamma)
    assert chain.nodes == chain.depth == gamma and chain.expanded == (1,) * gamma and chain.is_chain
    assert tree_speculative_step_time(batch, chain, c, context=context) == pytest.approx(
        speculative_step_time(batch, gamma, c, context=context))
    kw = dict(context=context, draft=LLAMA_1B, draft_kv_window=window)
    assert tree_speculative_step_time(batch, chain, **kw) == pytest.approx(speculative_step_time(batch, gamma, **kw))
    assert tree_speedup(batch, chain, 0.7, c, context=context) == pytest.approx(
        speculative_speedup(batch, 0.7, gamma, c, context=context))


def test_a_draft_pass_over_w_nodes_costs_c_times_a_target_step_over_w():
    """A static (4, 2) tree: 4 + 8 = 12 nodes, two passes, over 1 (the root) and 4 tokens per row.

    Batch 128, c = 0.05: plain t(128, 1) = 4.776 ms (128 < 295 tokens: memory-bound); pass 1 is 0.05 x 4.776;
    pass 2 is 0.05 x t(128, 4) = 0.05 x 2 x 8e9 x 512 / 989e12 = 0.05 x 8.284 ms; verify t(128, 13) = 2 x 8e9 x
    1664 / 989e12 = 26.92 ms. Step 26.92 + 0.239 + 0.414 = 27.57 ms.
    """
    tree = TreeShape.from_branching((4, 2))
    assert (tree.nodes, tree.depth, tree.expanded, tree.branching) == (12, 2, (1, 4), (4, 2))
    hand = 2 * 8e9 * 1664 / 989e12 + 0.05 * 16e9 / 3.35e12 + 0.05 * 2 * 8e9 * 512 / 989e12
    assert tree_speculative_step_time(128, tree, 0.05) == pytest.approx(hand)
    assert round(1e3 * hand, 2) == 27.57


# Expected accepted length from a profile.

@given(st.floats(0, 0.999), st.integers(0, 16))
def test_a_chain_with_profile_alpha_is_leviathan(alpha, gamma):
    leviathan = (1 - alpha ** (gamma + 1)) / (1 - alpha)
    chain = TreeShape.chain(gamma)
    assert tree_expected_tokens(chain, profile=(alpha,)) == pytest.approx(leviathan)
    assert tree_expected_tokens(chain, alpha) == pytest.approx(leviathan)  # the default profile's rank 0 is alpha


def test_expected_tokens_of_a_small_tree_by_hand():
    """Root children (0,) and (1,), and (0, 0) below the first; profile (0.6, 0.3).

    E = 1 + 0.6 + 0.3 + 0.6 x 0.6 = 2.26. With a profile per depth [(0.6, 0.3), (0.5,)] the grandchild is
    accepted with 0.6 x 0.5: E = 2.2. Its rank-1 sibling (0, 1) is never accepted at depth 2 there: + 0.
    """
    tree = TreeShape.from_paths([(0,), (1,), (0, 0)])
    assert tree.parents == (-1, -1, 0) and tree.paths == ((0,), (1,), (0, 0))
    assert tree_expected_tokens(tree, profile=(0.6, 0.3)) == pytest.approx(2.26)
    assert tree_expected_tokens(tree, profile=[(0.6, 0.3), (0.5,)]) == pytest.approx(2.2)
    wider = TreeShape.from_paths([(0,), (1,), (0, 0), (0, 1)])
    assert tree_expected_tokens(wider, profile=[(0.6, 0.3), (0.5,)]) == pytest.approx(2.2)


@given(st.integers(0, 2**32), st.integers(1, 12))
def test_expected_tokens_equals_the_walk_down_the_tree(seed, n):
    rng = random.Random(seed)
    rows = []
    for _ in range(rng.randint(1, 3)):
        row = sorted((rng.random() for _ in range(4)), reverse=True)
        rows.append(tuple(p / max(1.0, sum(row)) for p in row))
    paths, frontier = [], [()]
    for _ in range(n):  # grow a random tree closed under parents and elder siblings
        p = rng.choice(frontier)
        q = p + (sum(x[:-1] == p for x in paths),)  # the next rank under p
        if q[-1] < 4:
            paths.append(q)
            frontier.append(q)
    tree = TreeShape.from_paths(paths)
    assert tree_expected_tokens(tree, profile=rows) == pytest.approx(1 + accepted_by_recursion(tree, rows))


def test_expected_tokens_by_simulation():
    """The product rule against 40,000 simulated steps of a static (3, 2, 1) tree (seeded; the standard error of
    the mean accepted length is about 0.005, the bound 0.03)."""
    tree, row = TreeShape.from_branching((3, 2, 1)), (0.6, 0.2, 0.1)
    children = {}
    for i, (parent, rank) in enumerate(zip(tree.parents, tree.ranks)):
        children.setdefault(parent, {})[rank] = i
    rng, total = random.Random(0), 0
    for _ in range(40_000):
        node, tokens = -1, 1
        while True:
            u, k = rng.random(), 0
            while k < len(row) and u >= row[k]:
                u, k = u - row[k], k + 1
            if k == len(row) or k not in children.get(node, {}):
                break
            node, tokens = children[node][k], tokens + 1
        total += tokens
    assert abs(total / 40_000 - tree_expected_tokens(tree, profile=row)) < 0.03


def test_default_profile():
    """Rank 0 is alpha; of the 1 - alpha it misses, rank k takes the embedded pair's measured share (332 of the 906
    positions rank 0 missed went to rank 1), cut to be non-increasing: at 0.8, rank 1 gets 0.2 x 332 / 906."""
    n, counts = rl.profile._EMBEDDED_ALL
    assert default_profile(0.8, 3) == pytest.approx((0.8, 0.2 * 332 / 906, 0.2 * 139 / 906))
    assert default_profile(counts[0] / n, len(counts)) == pytest.approx([c / n for c in counts])  # the pair itself
    for alpha in (0.0, 0.1, 0.3, 0.5, 0.8, 0.95, 1.0):
        row = default_profile(alpha)
        assert row[0] == alpha and all(a >= b for a, b in zip(row, row[1:])) and sum(row) <= 1 + 1e-12
    assert default_profile(0.1, 2) == (0.1, 0.1)  # 0.9 x 0.366 would exceed rank 0: cut to it
    assert default_profile(1.0, 3) == (1.0, 0.0, 0.0)


# The best tree for a budget.

def test_best_tree_at_alpha_0_8_is_a_chain_up_to_11_nodes():
    """Default profile at alpha 0.8: the chain's k-th node has 0.8^k, the root's second child 0.2 x 0.366 = 0.073.
    0.8^11 = 0.086 > 0.073 > 0.8^12 = 0.069, so the 11 most probable nodes are the chain and the 12th is the root's
    rank-1 child. (Under alpha (1 - alpha)^k, rank 1 had 0.16 and the chain stopped at 8.)"""
    side = default_profile(0.8, 2)[1]
    assert 0.8 ** 11 > side > 0.8 ** 12
    assert best_tree(11) == TreeShape.chain(11)
    twelve = best_tree(12)
    assert not twelve.is_chain and (1,) in twelve.paths and twelve.depth == 11
    assert tree_expected_tokens(twelve) == pytest.approx(sum(0.8 ** k for k in range(12)) + side)
    assert best_tree(8, profile=geometric(0.8)) == TreeShape.chain(8) != best_tree(9, profile=geometric(0.8))


def test_best_tree_with_ties_and_a_depth_cap():
    """alpha 0.5: (0,) 0.5, then (1,) and (0, 0) both 0.25: the shallower first. E(3) = 1 + 0.5 + 0.25 + 0.25."""
    half = geometric(0.5)
    assert best_tree(2, profile=half).paths == ((0,), (1,))
    assert tree_expected_tokens(best_tree(3, profile=half), profile=half) == pytest.approx(2.0)
    capped = best_tree(10, 0.8, max_depth=2)
    assert capped.depth == 2 and capped.nodes == 10


def test_best_tree_stops_where_nothing_more_is_accepted():
    assert best_tree(5, profile=(0.9,), max_depth=3) == TreeShape.chain(3)  # rank 1 is never accepted
    assert best_tree(5, 0.0) == TreeShape() and best_tree(0) == TreeShape()
    assert best_tree(6, 1.0) == TreeShape.chain(6)


@pytest.mark.parametrize("profile", [(0.8, 0.16, 0.032), (0.5, 0.3, 0.1), [(0.7, 0.2), (0.5, 0.25, 0.2)]])
def test_best_tree_is_optimal_by_brute_force(profile):
    """Against every tree of up to 7 nodes closed under parents and elder siblings (ranks < 3, depth <= 4)."""
    rows = rows_of(profile)
    by_size = {}
    for paths in closed_trees(7, 3, 4):
        E = accepted_by_recursion(TreeShape.from_paths(paths), rows)
        by_size[len(paths)] = max(by_size.get(len(paths), 0), E)
    for n in range(1, 8):
        assert tree_expected_tokens(best_tree(n, profile=profile, max_depth=4), profile=profile) \
            == pytest.approx(1 + by_size[n])


def test_negative_control_best_first_is_not_optimal_for_a_profile_rising_with_rank():
    """Profile (0.3, 0.05, 0.6): the three root children give 0.95, but best-first takes (0,) 0.3, then (0, 0)
    0.09 before the cheap-looking (1,) 0.05, and never reaches rank 2: 0.44. best_tree refuses such a profile."""
    profile = (0.3, 0.05, 0.6)
    rows = rows_of(profile)
    parents, ranks = rl.tree._greedy_tree(rl.profile.Rows(rows), 3, 4)
    greedy = accepted_by_recursion(TreeShape(parents, ranks), rows)
    brute = max(accepted_by_recursion(TreeShape.from_paths(p), rows) for p in closed_trees(3, 3, 4) if len(p) == 3)
    assert greedy == pytest.approx(0.44) and brute == pytest.approx(0.95)
    with pytest.raises(ValueError, match="non-increasing in rank"):
        best_tree(3, profile=profile)
    with pytest.raises(ValueError, match="non-increasing in rank"):
        best_tree_budget(1, profile=profile)


@given(st.lists(st.floats(0, 1), min_size=1, max_size=5), st.integers(1, 40))
def test_best_tree_nodes_come_in_falling_probability_with_parents_first(raw, budget):
    row = sorted(raw, reverse=True)
    row = [p / max(1.0, sum(row)) for p in row]
    tree = best_tree(budget, profile=row, max_depth=6)
    reached = []
    for parent, rank in zip(tree.parents, tree.ranks):
        assert parent < len(reached)
        reached.append((reached[parent] if parent >= 0 else 1.0) * row[rank])
    assert all(a >= b * (1 - 1e-12) for a, b in zip(reached, reached[1:])) and all(p > 0 for p in reached)


# The best budget per batch.

def test_best_tree_budget_with_every_default():
    """Batch 1: verification is memory-bound, so free, up to 295 tokens per row (the H100's ridge, 295.2), and each
    of the tree's passes costs c t(1, 1) (at most 295 tokens): the speedup is E / (1 + c depth), and the largest
    free tree wins: 294 nodes. The search goes past it until no larger tree can win: the optimum, not a cap."""
    budget = best_tree_budget(batch=1)
    assert type(budget) is int and budget == math.floor(H100_SXM.ridge) - 1 == 294
    row = tree_speedup_table([1])[0]
    assert row["speedup"] == pytest.approx(row["tokens_per_step"] / (1 + 0.05 * row["depth"]))
    assert row["tokens_per_step"] > rl.expected_tokens(0.8, 8) and row["speedup"] > speculative_speedup(1, gamma=8)
    assert not row["capped"] and row["searched"] > 294


@pytest.mark.parametrize("hardware, batch", [(H100_SXM, 1), (H100_SXM, 2), (H100_SXM, 4), (H200, 1), (H200, 2)])
def test_at_small_batch_the_best_tree_is_the_largest_whose_verify_stays_free(hardware, batch):
    """B (n + 1) tokens stay under the ridge up to n = floor(ridge / B) - 1 nodes; the next node makes the verify
    compute-bound and costs more than it adds. The old search stopped at 64 nodes and so missed all of these."""
    free = math.floor(hardware.ridge / batch) - 1
    row = tree_speedup_table([batch], hardware=hardware)[0]
    assert row["budget"] == free > 64 and not row["capped"]
    assert row["speedup"] > tree_speedup_table([batch], hardware=hardware, budgets=range(65))[0]["speedup"]


def test_a_search_cap_that_binds_says_so():
    """budgets=range(65), the old default, binds at batch 1 (64 is the largest allowed and more would pay) and not
    at batch 64; past SEARCH_LIMIT the search gives up and says so too."""
    capped, free = tree_speedup_table([1, 64], budgets=range(65))
    assert (capped["budget"], capped["capped"], capped["searched"]) == (64, True, 64)
    assert free["budget"] < 64 and not free["capped"]
    short = tree_speedup_table([1], profile=(0.9,), budgets=(0, 16), max_depth=4)[0]  # only a chain of 4 accepts
    assert (short["budget"], short["nodes"], short["capped"]) == (16, 4, False)  # no larger tree exists: not capped
    free = rl.Hardware("verification always free", memory_bandwidth=1e12, peak_flops=1e20, memory_bytes=1e12)
    unbounded = tree_speedup_table([1], profile=(0.5, 0.5), hardware=free)[0]  # every level accepted, verify free
    assert unbounded["capped"] and unbounded["searched"] == rl.SEARCH_LIMIT and unbounded["budget"] > 4000


@pytest.mark.parametrize("batch", [1, 8, 16])
def test_the_search_caps_depth_because_each_level_costs_a_draft_pass(batch):
    """The most probable 64 nodes reach depth 12 (E = 7.40) but cost 12 passes: at batch 1, 7.40 / (1 + 12 x 0.05)
    = 4.62x. Capped at depth 8 the best 64 nodes give E = 6.98 for 8 passes: 6.98 / 1.4 = 4.99x. The table takes
    the best over every cap 1..max_depth."""
    geo = dict(profile=geometric(0.8))  # the arithmetic below is that profile's, over budgets 0..64
    row = tree_speedup_table([batch], budgets=range(65), **geo)[0]
    capped = [tree_speedup(batch, best_tree(row["budget"], max_depth=d, **geo), **geo) for d in range(1, 13)]
    assert row["speedup"] == pytest.approx(max(capped)) and row["depth"] < best_tree(row["budget"], **geo).depth
    if batch == 1:
        deepest = best_tree(64, max_depth=12, **geo)
        assert deepest.depth == 12 and tree_expected_tokens(deepest, **geo) / 1.6 == pytest.approx(
            tree_speedup(1, deepest, **geo))
        assert (round(tree_speedup(1, deepest, **geo), 2), round(row["speedup"], 2), row["depth"]) == (4.62, 4.99, 8)


@pytest.mark.parametrize("hardware, last_free", [(H100_SXM, 4), (H200, 3)])
def test_the_64_node_tree_stops_paying_once_its_verify_is_compute_bound(hardware, last_free):
    """64 nodes verify 65 tokens per row: compute-bound past ridge / 65 rows, 295.2 / 65 = 4.54 on the H100 and
    206.0 / 65 = 3.17 on the H200. Up to there the tree is free; one row more and every node costs."""
    assert last_free == math.floor(hardware.ridge / 65)
    kw = dict(hardware=hardware, budgets=range(65))
    assert best_tree_budget(last_free, **kw) == 64 > best_tree_budget(last_free + 1, **kw)


@pytest.mark.parametrize("hardware", [H100_SXM, H200, HARDWARE["a100"], HARDWARE["l4"]])
@pytest.mark.parametrize("alpha, c", [(0.8, 0.05), (0.6, 0.02), (0.9, 0.1), (0.5, 0.05), (0.95, 0.3)])
def test_budget_never_rises_with_batch_and_ends_at_a_chain_then_off(hardware, alpha, c):
    rows = tree_speedup_table(GRID, alpha, draft_cost=c, hardware=hardware)
    budgets = [r["budget"] for r in rows]
    assert budgets == sorted(budgets, reverse=True) and budgets[0] > 1 and budgets[-1] == 0
    paying = [r for r in rows if r["budget"]]
    assert paying[-1]["chain"] and not paying[0]["chain"]
    assert all(r["speedup"] > 1 for r in paying) and all(r["speedup"] == 1 for r in rows if not r["budget"])


def test_negative_control_a_weak_costly_draft_ends_at_a_one_level_star():
    """alpha 0.3, c 0.3 on the A100: the last tree that pays is two root children from one draft pass
    (E = 1 + 0.3 + 0.7 x 0.366 = 1.56), not a chain of one (1.3) at the same pass: the property above can fail."""
    rows = tree_speedup_table(GRID, 0.3, draft_cost=0.3, hardware=HARDWARE["a100"])
    last = [r for r in rows if r["budget"]][-1]
    assert not last["chain"] and last["tree"].paths == ((0,), (1,))
    assert last["tokens_per_step"] == pytest.approx(1 + sum(default_profile(0.3, 2)))


def test_the_chain_end_of_the_tree_table_is_the_chain_table():
    """Where the best tree is a chain its length is best_gamma's, and it switches off one past gamma 1's
    break-even (258.6 rows for the reference: the vLLM table's end)."""
    for B in range(53, 259, 5):
        assert best_tree_budget(B) == best_gamma(B)
    off = math.floor(break_even_batch(0.8, 1, 0.05))
    assert (best_tree_budget(off), best_tree_budget(off + 1)) == (1, 0) and off == 258


def test_the_h200_falls_back_sooner():
    """Same compute, 1.43x the bandwidth: the ridge falls from 295 to 206, and the budget is never larger."""
    h100, h200 = ([r["budget"] for r in tree_speedup_table(GRID, hardware=hw)] for hw in (H100_SXM, H200))
    assert all(a <= b for a, b in zip(h200, h100)) and sum(h200) < sum(h100)


def test_budgets_argument():
    assert best_tree_budget(1, budgets=(0, 4, 16)) == 16
    assert best_tree_budget(100, budgets=(0, 16, 32)) == 0  # at 100 rows even 16 nodes cost more than they give
    assert best_tree_budget(1, budgets=(0,)) == 0
    assert best_tree_budget(1, alpha=0.0) == 0  # nothing is ever accepted


def test_a_draft_shape_prices_each_pass():
    """EAGLE_8B's own passes: at batch 1 and 16 every pass and the target's step read only weights (B w < 295
    tokens), so a pass costs c t(B, w) with c = 0.0531: the same trees and speedups as that constant c."""
    own = tree_speedup_table([1, 16], draft=EAGLE_8B)
    const = tree_speedup_table([1, 16], draft_cost=modelled_draft_cost(1, EAGLE_8B))
    assert [r["budget"] for r in own] == [r["budget"] for r in const]
    assert [r["speedup"] for r in own] == pytest.approx([r["speedup"] for r in const])


# SGLang's EAGLE arguments.

def test_sglang_args_of_trees():
    """num_draft_tokens counts the root: SGLang keeps num_verify_tokens - 1 draft tokens and prepends the verified
    one; with top-k 1 it is num_steps + 1."""
    assert sglang_eagle_args(TreeShape.chain(4)) == {
        "speculative_num_steps": 4, "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 5}
    assert sglang_eagle_args(TreeShape.from_branching((2, 2))) == {
        "speculative_num_steps": 2, "speculative_eagle_topk": 2, "speculative_num_draft_tokens": 7}
    wide = TreeShape.from_paths([(0,), (1,), (2,), (0, 0), (1, 0), (2, 0)])  # 3 frontier nodes, 1 child each
    assert (wide.branching, wide.expanded) == ((3, 1), (1, 3))
    assert sglang_eagle_args(wide)["speculative_eagle_topk"] == 3
    with pytest.raises(ValueError, match="plain decoding"):
        sglang_eagle_args(TreeShape())


@pytest.mark.parametrize("batch", [1, 5, 9, 24, 48, 100])
def test_sglang_settings_have_room_for_the_tree(batch):
    """SGLang expands top-k nodes per pass, top-k children each, and keeps the best num_draft_tokens - 1 of
    top-k + (num_steps - 1) top-k^2 candidates (build_eagle_tree.py): the modelled tree must fit."""
    tree = tree_speedup_table([batch])[0]["tree"]
    args = sglang_eagle_args(tree)
    k, steps = args["speculative_eagle_topk"], args["speculative_num_steps"]
    assert args["speculative_num_draft_tokens"] - 1 == tree.nodes <= k + (steps - 1) * k * k
    assert max(tree.expanded) <= k and max(tree.branching) <= k and steps == tree.depth


def test_sglang_config_for_the_reference():
    config = sglang_speculative_config()
    assert json.loads(json.dumps(config)) == config
    ranges = config["server_args_per_batch_size"]
    assert ranges[0][0] == 1 and all(a[1] + 1 == b[0] for a, b in zip(ranges, ranges[1:]))
    assert all(a[2] != b[2] for a, b in zip(ranges, ranges[1:])) and ranges[-1][2] == {}
    tokens = [args["speculative_num_draft_tokens"] for *_, args in ranges[:-1]]
    assert tokens == sorted(tokens, reverse=True) and tokens[0] == math.floor(H100_SXM.ridge)  # 294 nodes + root
    # Where the tree is a chain (top-k 1), num_steps is vLLM's K for the same batches, and both end at 259.
    vllm = {B: K for s, e, K in vllm_speculative_config()["num_speculative_tokens_per_batch_size"]
            for B in range(s, e + 1)}
    chains = [(s, e, a) for s, e, a in ranges if a and a["speculative_eagle_topk"] == 1]
    assert chains and all(vllm[B] == a["speculative_num_steps"] for s, e, a in chains for B in range(s, e + 1))
    assert ranges[-1][:2] == [259, 259] == [max(vllm)] * 2


def test_sglang_config_clipped_to_memory_and_errors():
    config = sglang_speculative_config(context=4096)
    assert config["server_args_per_batch_size"][-1][1] == max_batch(H100_SXM, LLAMA_8B, 4096) == 104
    with pytest.raises(ValueError, match="weights do not fit"):
        sglang_speculative_config(model=MIXTRAL_8X7B)
    with pytest.raises(ValueError, match="largest_batch"):
        sglang_speculative_config(largest_batch=0)


# The LM head in a draft's cost.

def test_eagle_8b_preset_by_hand():
    """One Llama-3-8B layer: attention 4096 x 48 x 128 + 32 x 128 x 4096 = 41,943,040, MLP 3 x 4096 x 14336 =
    176,160,768, 2 norms 8,192: 218,112,000. EAGLE-3 fusion 3 x 4096^2 = 50,331,648, 2H-wide QKV 25,165,824 and a
    norm 4,096; final norm 4,096; head 32,000 x 4,096 = 131,072,000. Total 424,689,664.

    c at batch 1 and 64 (both steps read their weights: 64 < 295 tokens): 424,689,664 x 2 / 16e9 = 0.0531.
    At 4096 tokens of context, batch 64: the target reads 64 x 4096 x 131,072 B = 34.36 GB of KV (10.257 ms), the
    head's one layer 64 x 4096 x 4,096 B (0.320 ms): c = (0.2535 + 0.3205) / (4.776 + 10.257) = 0.0382.
    """
    assert EAGLE_8B.params == 218_112_000 + 50_331_648 + 25_165_824 + 4_096 + 4_096 + 131_072_000 == 424_689_664
    assert EAGLE_8B.lm_head_params == 131_072_000 and EAGLE_8B.layers == 1 and EAGLE_8B.kv_bytes_per_token == 4096
    assert modelled_draft_cost(1, EAGLE_8B) == modelled_draft_cost(64, EAGLE_8B) == pytest.approx(424_689_664 / 8e9)
    assert round(modelled_draft_cost(1, EAGLE_8B), 4) == 0.0531
    hand = (424_689_664 * 2 + 64 * 4096 * 4096) / (16e9 + 64 * 4096 * 131072)
    assert modelled_draft_cost(64, EAGLE_8B, context=4096) == pytest.approx(hand) and round(hand, 4) == 0.0382


def test_preset_shapes_match_their_configs():
    smol = ModelConfig(**{k: v for k, v in SMOLLM2_135M_CONFIG.items()})
    assert SMOLLM2_135M.params == smol.num_parameters == 134_515_008  # minispec's own counter, tied embedding
    assert ModelShape.from_config(smol).lm_head_params == SMOLLM2_135M.lm_head_params == 49152 * 576
    assert round(SMOLLM2_135M.lm_head_params / SMOLLM2_135M.params, 2) == 0.21  # issue 18's 21 %
    g = GEMMA3_270M_CONFIG  # Gemma-3: 4 norms per layer and Q/K norms of head_dim each
    C, F, H, K, D, V = (g[k] for k in ("hidden_size", "intermediate_size", "num_attention_heads",
                                        "num_key_value_heads", "head_dim", "vocab_size"))
    layer = C * (H + 2 * K) * D + H * D * C + 3 * C * F + 4 * C + 2 * D
    assert GEMMA3_270M.params == 18 * layer + V * C + C == 268_098_176
    assert round(GEMMA3_270M.lm_head_params / GEMMA3_270M.params, 2) == 0.63  # issue 18's 63 %
    # An EAGLE head reads the same from a minispec ModelConfig as from the config.json keys.
    assert eagle_head_shape(ModelConfig(**LLAMA3_8B_CONFIG), 32000, fusion="eagle3").params == EAGLE_8B.params


def test_c_against_vocabulary_by_hand():
    """EAGLE-1 heads (2H x H fusion), batch 1, H100, context 0: c = head params / target params.

    SmolLM2: layer 884,736 + 2,654,208 + 1,152 = 3,540,096; fusion 663,552; norm 576; head 49,152 x 576 =
    28,311,552: 32,515,776 / 134,515,008 = 0.242; hot 32,000 rows: 22,636,224 -> 0.168.
    Gemma-3-270M: layer 1,638,400 + 3,932,160 + 1,280 = 5,571,840; fusion 819,200; norm 640; head 262,144 x 640 =
    167,772,160: 174,163,840 / 268,098,176 = 0.650; hot 32,000 rows: 26,871,680 -> 0.100.
    """
    rows = {r["target"]: r for r in draft_cost_by_vocab()}
    assert rows["SmolLM2-135M"]["draft_params"] == 32_515_776
    assert rows["SmolLM2-135M"]["c_full"] == pytest.approx(32_515_776 / 134_515_008)
    assert rows["SmolLM2-135M"]["c_hot"] == pytest.approx(22_636_224 / 134_515_008)
    assert rows["Gemma-3-270M"]["draft_params"] == 174_163_840
    assert rows["Gemma-3-270M"]["c_full"] == pytest.approx(174_163_840 / 268_098_176)
    assert rows["Gemma-3-270M"]["c_hot"] == pytest.approx(26_871_680 / 268_098_176)
    assert rows["Llama-3-8B"]["c_full"] == pytest.approx(777_007_104 / 8e9)
    for r in rows.values():  # the head is most of the draft; a quarter of the vocabulary is a quarter of the head
        assert r["head_share"] > 0.6 and r["c_fraction"] < r["c_full"] and r["c_hot"] < r["c_full"]
        assert r["fraction_vocab"] == round(r["vocab"] / 4)
    assert [r["target"] for r in sorted(rows.values(), key=lambda r: r["c_full"])] == \
        ["Llama-3-8B", "SmolLM2-135M", "Gemma-3-270M"]


def test_hot_vocab_reads_only_the_hot_rows():
    """A full 128,256-row head told to read 32,000 rows reads what a 32,000-row head reads, but holds 96,256 x
    4,096 x 2 B = 788.5 MB more. On the 8B target: t(1, 1) = (8e9 - 96,256 x 4,096) x 2 B / 3.35e12 B/s."""
    full = eagle_head_shape(LLAMA3_8B_CONFIG)
    told = dataclasses.replace(full, hot_vocab=32000)
    cut = eagle_head_shape(LLAMA3_8B_CONFIG, 32000)
    assert told.weight_bytes_read(1) == cut.weight_bytes_read(1) and told.active_params == cut.active_params
    assert told.weight_bytes - cut.weight_bytes == 96256 * 4096 * 2
    assert modelled_draft_cost(1, told) == pytest.approx(modelled_draft_cost(1, cut))
    hot_target = dataclasses.replace(LLAMA_8B, hot_vocab=32000)
    assert step_time(1, model=hot_target) == pytest.approx((8e9 - 96256 * 4096) * 2 / 3.35e12)
    assert step_time(1, model=hot_target) < step_time(1)


def test_bad_input_raises_value_error_naming_the_problem():
    with pytest.raises(ValueError, match="budgets"):
        best_tree_budget(1, budgets=(0, -1))
    with pytest.raises(ValueError, match="budgets"):
        best_tree_budget(1, budgets=())
    with pytest.raises(ValueError, match="max_depth"):
        best_tree_budget(1, max_depth=0)
    with pytest.raises(ValueError, match="batch"):
        best_tree_budget(0)
    with pytest.raises(ValueError, match="alpha"):
        best_tree_budget(1, alpha=1.5)
    with pytest.raises(ValueError, match="sum <= 1"):
        tree_expected_tokens(TreeShape.chain(2), profile=(0.7, 0.5))
    with pytest.raises(ValueError, match=r"in \[0, 1\]"):
        best_tree(3, profile=[(0.5,), (1.2,)])
    with pytest.raises(ValueError, match="non-empty"):
        best_tree(3, profile=[])
    with pytest.raises(ValueError, match="ranks 0..1"):
        TreeShape((-1, -1), (0, 2))
    with pytest.raises(ValueError, match="earlier node"):
        TreeShape((1, -1), (0, 0))
    with pytest.raises(ValueError, match="parent path"):
        TreeShape.from_paths([(0,), (0, 0, 0)])
    with pytest.raises(ValueError, match="branching"):
        TreeShape.from_branching((2, 0))
    with pytest.raises(ValueError, match="hot_vocab"):
        dataclasses.replace(LLAMA_8B, hot_vocab=200_000)
    with pytest.raises(ValueError, match="hot_vocab"):
        ModelShape(1e9, hot_vocab=10)  # a hot vocabulary needs the head's shape
    with pytest.raises(ValueError, match="LM head"):
        ModelShape(1e6, vocab=128256, hidden=4096)
    with pytest.raises(ValueError, match="fusion"):
        eagle_head_shape(LLAMA3_8B_CONFIG, fusion="medusa")
    with pytest.raises(ValueError, match="hot_vocab"):
        eagle_head_shape(LLAMA3_8B_CONFIG, 0)
    with pytest.raises(ValueError, match="layers"):
        eagle_head_shape(LLAMA3_8B_CONFIG, layers=0)
    with pytest.raises(ValueError, match="hot_fraction"):
        draft_cost_by_vocab(hot_fraction=0)
    with pytest.raises(ValueError, match="alpha"):
        check_arguments(alpha=2)  # the public check policy.py uses


def test_trees_from_branching_and_paths_agree():
    static = TreeShape.from_branching((4, 2, 2, 1))  # issue 17's example
    assert static.nodes == 4 + 8 + 16 + 16 and static.depth == 4 and static.branching == (4, 2, 2, 1)
    assert static.expanded == (1, 4, 8, 16)
    again = TreeShape.from_paths(static.paths)
    assert sorted(again.paths) == sorted(static.paths)
    assert tree_expected_tokens(again) == pytest.approx(tree_expected_tokens(static))
    assert all(TreeShape.from_paths(t.paths).paths == tuple(sorted(t.paths, key=lambda p: (len(p), p)))
               for t in (best_tree(n) for n in (5, 17, 40)))


def test_table_rows_are_consistent():
    for r in tree_speedup_table([1, 8, 64, 300]):
        tree = r["tree"]
        if tree is None:
            assert (r["budget"], r["speedup"], r["depth"]) == (0, 1.0, 0)
            continue
        assert r["nodes"] == tree.nodes <= r["budget"] and r["depth"] == tree.depth and r["chain"] == tree.is_chain
        assert r["tokens_per_step"] == pytest.approx(tree_expected_tokens(tree))
        assert r["speedup"] == pytest.approx(tree_speedup(r["batch"], tree))


def test_closed_tree_enumeration_counts():
    """The brute force's own check: closed trees with ranks < 2 and depth <= 2 are the subsets of {(0,), (1,),
    (0,0), (0,1), (1,0), (1,1)} closed under parents and elder siblings: 1, 2, 3, 3, 2, 1 of 1..6 nodes."""
    counts = [sum(len(t) == n for t in closed_trees(6, 2, 2)) for n in range(1, 7)]
    assert counts == [1, 2, 3, 3, 2, 1]
