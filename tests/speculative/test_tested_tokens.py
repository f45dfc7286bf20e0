"""The loop's tested-token counter (Stats.tested_tokens, what alpha_estimate and a policy read) and gamma="auto" with a
dynamic tree. Mutation testing found both unchecked: a counter that added one token too many per rejection, or
subtracted instead of adding, and a dynamic tree's budget passed to the roofline policy under another name."""

from support import nudged_pair, random_model

import minispec


def test_tested_tokens_count_up_to_each_rows_first_rejection():
    """A chain of G always offers G tokens, so a row's step tests min(accepted + 1, G): summed over steps, every
    accepted token plus one rejected token per step that did not accept all G."""
    target, draft = nudged_pair()  # some steps accept all G, most stop earlier
    G = 3
    prompts = [[1, 2, 3], [4, 5, 6, 7], [8], [9, 9, 9]]
    s = minispec.speculative_generate(target, draft, prompts, gamma=G, max_new_tokens=24).stats
    at = s.accepted_per_position + [0] * (G - len(s.accepted_per_position))
    full = at[G - 1]  # (row, step) pairs that accepted all G
    assert 0 < full < s.num_drafts and s.accepted_tokens > 0  # both kinds of step happened
    assert s.tested_tokens == s.accepted_tokens + s.num_drafts - full


def test_gamma_auto_prices_a_dynamic_tree():
    target, draft = random_model(seed=0), random_model(seed=1, layers=1, hidden=32, heads=2, kv_heads=1)
    tree = minispec.TreeDraft(draft, budget=6, depth=3)
    prompts = [[1, 2, 3], [4, 5]]
    out = minispec.speculative_generate(target, tree, prompts, gamma="auto", max_new_tokens=8)
    assert out.tokens == minispec.generate(target, prompts, max_new_tokens=8).tokens
