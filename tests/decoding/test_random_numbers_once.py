"""No random number is used twice within a row: across streams (the draft's draws, the accept test, the target's
draws), positions and steps, for every kind of draft, with policies that mix plain steps in.

Philox is a bijection of its counter, so two equal 52-bit uniforms in one row mean a counter was reused (the
chance of a collision among n honest draws is about n^2 / 2^53). A counter layout that folds the position into
another word, or drops the stream, keeps every output exact and passes every distribution test, yet makes a
row's draws dependent on each other; this test sees it.
"""

import pytest
import torch
from support import Scripted

import minispec
from minispec.decoding import sampling
from minispec.drafts.eagle import EagleDraft
from minispec.drafts.tree import TreeDraft


@pytest.fixture(scope="module")
def code():
    return minispec.load("tiny-code-target")[0], minispec.load("tiny-code-draft")[0]


DRAFTS = {
    "draft model": lambda t, d: d,
    "layer skip": lambda t, d: minispec.LayerSkipDraft(t, 3),
    "prompt lookup": lambda t, d: minispec.PromptLookupDraft(),
    "eagle": lambda t, d: EagleDraft.from_pretrained("tiny-code-eagle", t),
    "static tree": lambda t, d: TreeDraft(d, branching=(3, 2, 1)),
    "dynamic tree": lambda t, d: TreeDraft(d, budget=8, depth=3, topk=2),
    "eagle tree": lambda t, d: TreeDraft(EagleDraft.from_pretrained("tiny-code-eagle", t), branching=(2, 2, 1)),
    "plain": None,
}


def drawn(monkeypatch):
    """Record every uniform the package draws: a list of (B, n) float64 tensors."""
    seen, uniforms = [], sampling.uniforms

    def recorded(keys, stream, position, n):
        u = uniforms(keys, stream, position, n)
        seen.append(u.clone())
        return u

    monkeypatch.setattr(sampling, "uniforms", recorded)
    return seen


@pytest.mark.parametrize("kind", DRAFTS)
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_row_never_draws_the_same_number_twice(code, kind, temperature, monkeypatch):
    target, small = code
    prompt = [list(b"def main(argv):\n    for arg in argv:\n        print(arg)\n    for arg in ")]  # one row
    seen = drawn(monkeypatch)
    kw = dict(max_new_tokens=60, temperature=temperature, seed=[12345])
    if DRAFTS[kind] is None:
        minispec.generate(target, prompt, **kw)
    else:
        draft = DRAFTS[kind](target, small)
        minispec.speculative_generate(target, draft, prompt, gamma=Scripted([3, 0, 2, 3, 0, 0, 1]), **kw)
    if temperature == 0:  # greedy decoding takes argmaxes and draws nothing; so does the exact accept test, where p
        assert not seen   # and q are one-hot and every u gives the same answer
        return
    u = torch.cat([s.flatten() for s in seen])  # every number the row drew
    assert len(u) > 30
    assert len(torch.unique(u)) == len(u), f"{len(u) - len(torch.unique(u))} of {len(u)} numbers drawn twice"


def test_the_engine_draws_nothing_for_a_greedy_batch_but_a_synthetic_rule_still_draws(code, monkeypatch):
    """A greedy batch through the engine with a draft model and a tree: no uniform drawn (a Philox pass per step
    saved). A synthetic rule (a benchmark's Bernoulli(alpha)) accepts by the accept test's uniforms, so it still
    draws them at temperature 0, and its rows accept about alpha of their draft tokens."""
    from minispec.engine import Engine, Request
    from minispec.tools.bench import SyntheticAcceptance

    target, small = code
    prompts = [list(b"def main(argv):\n    for arg in argv:\n")[: 20 + 5 * i] for i in range(3)]
    seen = drawn(monkeypatch)
    for draft in (small, TreeDraft(small, branching=(2, 1))):
        Engine(target, draft, gamma=3).run([Request(p, 16) for p in prompts])
        assert not seen
    engine = Engine(target, small, gamma=3, rule=SyntheticAcceptance(0.5))
    engine.run([Request(p, 40) for p in prompts])
    assert seen and engine.stats.synthetic
    assert 0.3 < engine.stats.alpha_estimate < 0.7  # Bernoulli(0.5) by the drawn uniforms, not a constant
