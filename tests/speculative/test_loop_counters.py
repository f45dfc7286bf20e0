"""What the loop reports besides tokens: its phase timers, vLLM's per-position acceptance rates, and what a tree's
policy is told each step. Mutation testing found all three unchecked (a renamed timer, rates always empty, a tree
step reporting one level too many to the policy). And what it reads: the target attends over its longest row, not
over every slot a step ever wrote (rejected draft tokens' included)."""

import math

import torch
from support import nudged_pair

import minispec
from minispec.roofline.policy import FixedPolicy
from minispec.speculative import loop

PROMPTS = [[1, 2, 3], [4, 5, 6, 7], [8], [9, 9, 9]]


def test_each_phase_has_its_own_timer():
    target, draft = nudged_pair()
    s = minispec.speculative_generate(target, draft, PROMPTS, gamma=3, max_new_tokens=12).stats
    assert set(s.phase_s) == {"prefill", "draft_prefill", "draft", "verify", "accept"}
    assert all(t > 0 for t in s.phase_s.values())


def test_per_position_rates_are_accepted_counts_over_drafts():
    target, draft = nudged_pair()
    s = minispec.speculative_generate(target, draft, PROMPTS, gamma=3, max_new_tokens=24).stats
    assert s.num_drafts > 0 and len(s.accepted_per_position) >= 2
    assert s.per_position_acceptance_rates == [a / s.num_drafts for a in s.accepted_per_position]
    none = minispec.speculative_generate(target, draft, PROMPTS, gamma=1, max_new_tokens=1).stats  # no step drafts
    assert none.num_drafts == 0 and none.per_position_acceptance_rates == []


class Recording(FixedPolicy):
    """A fixed gamma that keeps what the loop tells it after each step (no prior, no forgetting)."""

    def start(self):
        super().start()
        self.told = []

    def observe(self, accepted, tested):
        self.told.append((accepted, tested))
        super().observe(accepted, tested)


def test_a_tree_step_tells_its_policy_the_levels_it_reached():
    """For a tree, a step tells the policy the levels whose first-ranked child was accepted, and the levels reached:
    min(levels accepted + 1, depth) per row. Summed over the call: accepted_per_rank[0], and every accepted level
    plus one per (row, step) that stopped short of the full depth."""
    target, draft = nudged_pair()
    depth = 3
    policy = Recording(gamma=depth, prior_tokens=0.0, half_life_tokens=math.inf)
    out = minispec.speculative_generate(target, minispec.TreeDraft(draft, branching=(2, 2, 1)), PROMPTS,
                                        gamma=policy, max_new_tokens=24)
    s = out.stats
    at = s.accepted_per_position + [0] * (depth - len(s.accepted_per_position))
    full = at[depth - 1]  # (row, step) pairs that accepted every level
    assert 0 < full < s.num_drafts  # both kinds of step happened
    assert sum(a for a, _ in policy.told) == s.accepted_per_rank[0]
    assert sum(t for _, t in policy.told) == s.accepted_tokens + s.num_drafts - full


def test_each_step_attends_over_the_longest_row_not_every_slot_written(monkeypatch):
    """After each step the target's cache is told the longest row's length (KVCache.trim), so the next step reads
    about that many slots. Skipped, a step would read every slot written so far, rejected draft tokens' included:
    the same tokens, more work each step."""
    target, draft = nudged_pair()
    seen, step = [], loop.speculative_step

    def checked(target, t_cache, *args, **kw):
        seen.append((t_cache.bound, int(t_cache.lengths.max())))  # slots the next pass reads; the longest row's KV
        return step(target, t_cache, *args, **kw)

    monkeypatch.setattr(loop, "speculative_step", checked)
    out = minispec.speculative_generate(target, draft, [[1, 2, 3], [4, 5, 6, 7]], gamma=4, max_new_tokens=40)
    assert len(seen) >= 5 and out.stats.accepted_tokens < 4 * out.stats.num_drafts  # rejections happened
    assert all(bound <= longest + 1 for bound, longest in seen), seen  # + 1: a row's last token, not yet written


def test_the_draft_model_attends_over_the_longest_row_too(monkeypatch):
    """The draft model's own cache is trimmed to the longest row at each catch-up, as the target's is: its
    drafting passes then read about that many slots. Skipped, each draft pass would read every slot a step ever
    wrote (rejected draft tokens' included): the same tokens and proposals, more work each step."""
    from minispec.drafts import model

    target, draft = nudged_pair()
    seen, extend = [], model._ModelRun.extend

    def checked(self, tokens, *args, **kw):
        seen.append((self.cache.bound, int(self.cache.lengths.max())))  # slots this pass reads; the longest row
        return extend(self, tokens, *args, **kw)

    monkeypatch.setattr(model._ModelRun, "extend", checked)
    out = minispec.speculative_generate(target, draft, [[1, 2, 3], [4, 5, 6, 7]], gamma=4, max_new_tokens=40)
    assert len(seen) >= 5 and out.stats.accepted_tokens < 4 * out.stats.num_drafts  # rejections happened
    # + 2: the catch-up trims to the longest row before it re-reads its last 2 tokens (ModelDraft's lag), which adds
    # them to the host-side bound; untrimmed, the bound grows by every slot each step writes
    assert all(bound <= longest + 2 for bound, longest in seen), seen


def test_a_chain_tells_its_draft_the_accepted_path_with_minus_one_past_each_rows_count(monkeypatch):
    """``DraftRun.verified``'s contract: path (B, gamma) holds 1..n for a row's n accepted draft tokens and -1 past
    them (a tree's verifier marks "no node" the same way), whatever n is; some row here stops short of gamma and
    some accepts one or more, so both halves of the path are checked."""
    from minispec.drafts.model import _ModelRun

    told, verified = [], _ModelRun.verified
    monkeypatch.setattr(_ModelRun, "verified", lambda self, path, n, f: (told.append((path, n)),
                                                                          verified(self, path, n, f))[1])
    target, draft = nudged_pair()
    minispec.speculative_generate(target, draft, PROMPTS, gamma=3, max_new_tokens=24)
    assert told
    for path, n in told:
        j = torch.arange(1, path.shape[1] + 1)  # (gamma,)
        assert torch.equal(path, torch.where(j <= n[:, None], j, -1)), (path, n)
    n = torch.cat([n for _, n in told])
    assert (n < 3).any() and (n > 0).any()
