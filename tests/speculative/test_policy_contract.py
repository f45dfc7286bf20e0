"""What the loop asks of a gamma policy, and what ``gamma="auto"`` prices (issue 23)."""

import pytest
from support import PROMPTS

import minispec
from minispec.roofline.policy import FixedPolicy
from minispec.speculative.loop import speculative_generate


@pytest.mark.parametrize("gamma", [2.0, True, "2"])
def test_a_policy_must_return_an_int_gamma(pair, gamma):
    """A float gamma used to fail deep inside the draft with "'float' object cannot be interpreted as an integer"."""
    target, draft = pair

    class Loose(FixedPolicy):
        def choose(self, batch_size, context=None):
            return gamma

    with pytest.raises(TypeError, match=rf"Loose.choose must return an int gamma, got {gamma!r}"):
        speculative_generate(target, draft, [[1, 2, 3]], gamma=Loose(2), max_new_tokens=8)


def test_auto_gamma_prices_the_tree_a_tree_draft_verifies(pair, monkeypatch):
    """gamma="auto" with TreeDraft((4, 2, 2, 1)): gamma caps the depth, and every row verifies every node down to it.
    On a device whose verify turns compute-bound past about 40 tokens, 8 rows afford a chain of 4 (40 tokens) but
    not the 44-node tree (360 tokens): priced as a chain, the policy chose the whole tree."""
    import minispec.speculative.loop as loop
    from minispec.roofline import ModelShape, TreeShape, tree_speedup
    from minispec.roofline.hardware import Hardware
    from minispec.roofline.policy import RooflinePolicy

    target, draft = pair
    hw = Hardware("compute-poor", memory_bandwidth=1e12, peak_flops=2e13, memory_bytes=1e12)  # ridge 20 FLOP/byte
    built, seen = [], []

    def build(*args, **kw):
        policy = real(*args, **kw)
        choose = policy.choose
        policy.choose = lambda batch, context=None: seen.append(context) or choose(batch, context)
        built.append((policy, args, kw))
        return policy

    real = loop.auto_policy
    monkeypatch.setattr(loop, "device_hardware", lambda *a: hw)
    monkeypatch.setattr(loop, "is_calibrated", lambda *a: True)  # no calibration warning: the ceilings are given
    monkeypatch.setattr(loop, "auto_policy", build)
    tree_draft = minispec.TreeDraft(draft, branching=(4, 2, 2, 1))
    out = speculative_generate(target, tree_draft, PROMPTS, gamma="auto", max_new_tokens=4)
    policy, (target_shape, draft_shape, _), _ = built[0]
    assert target_shape == ModelShape.from_model(target) and draft_shape == ModelShape.from_model(draft)
    tree, ctx = TreeShape.from_branching((4, 2, 2, 1)), seen[0]
    priced = {g: tree_speedup(8, tree.truncated(g), 0.8, hardware=hw, model=target_shape, context=ctx,
                              draft=draft_shape) for g in range(1, 5)}
    assert [policy.speedup(8, g, 0.8, ctx) for g in range(1, 5)] == pytest.approx(list(priced.values()))
    depth = max([0, *priced], key=lambda g: (priced.get(g, 1.0), -g))
    as_chain = RooflinePolicy(draft=draft_shape, model=target_shape, hardware=hw).choose(8, ctx)
    assert out.stats.gamma_per_step[0] == depth < 4 <= as_chain


def test_a_tree_reports_its_first_ranked_acceptance_to_the_policy(pair):
    """A model drafting its own tree has its first-ranked child accepted at every level it reaches: the policy's
    alpha must come out 1 (it came out depth / (depth + 1), the tree's depth counted as one more level tested)."""
    target, _ = pair

    class Recording(FixedPolicy):
        def observe(self, accepted, tested):
            self.seen = getattr(self, "seen", []) + [(accepted, tested)]
            super().observe(accepted, tested)

    policy = Recording(3, prior_tokens=0)
    speculative_generate(target, minispec.TreeDraft(target, branching=(2, 2, 1)), PROMPTS, gamma=policy,
                         max_new_tokens=9)
    assert policy.seen and all(a == t > 0 for a, t in policy.seen) and policy.alpha == 1.0
