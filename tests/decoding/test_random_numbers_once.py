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
        if temperature == 0:  # greedy plain decoding takes argmaxes and draws nothing
            assert not seen
            return
    else:
        draft = DRAFTS[kind](target, small)
        minispec.speculative_generate(target, draft, prompt, gamma=Scripted([3, 0, 2, 3, 0, 0, 1]), **kw)
    u = torch.cat([s.flatten() for s in seen])  # every number the row drew
    assert len(u) > 30
    assert len(torch.unique(u)) == len(u), f"{len(u) - len(torch.unique(u))} of {len(u)} numbers drawn twice"
