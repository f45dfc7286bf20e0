"""SuffixDraft in minispec.Engine and on the command line.

The engine keeps no per-row state for a suffix draft (the draft holds its trees): its base keeper builds a run each
step with ``draft.start``, and the engine hands each finished request to ``draft.observe(prompt, output)``.
"""

import pytest

import minispec
from minispec.cli import main
from minispec.drafts.suffix import SuffixDraft

CODE = [b"def parse(argv):\n    args = argv[1:]\n    return args\n\ndef parse_all(argv):\n    ",
        b"import os\nimport sys\nimport ", b"#", b"for i in range(3):\n    print(i)\nfor j in range(3):\n",
        b"class Stack:\n    def push(self, x):\n        self.items.append(x)\n\n    def pop(self):\n"]
PROMPTS = [list(p) for p in CODE]
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def target():
    return minispec.load("tiny-code-target")[0]


@pytest.mark.parametrize("tree", [False, True], ids=["chain", "tree"])
@pytest.mark.parametrize("cached", [0, 10000], ids=["own-text", "global"])
def test_engine_tokens_are_plain_greedys(target, tree, cached):
    """Staggered arrivals, ragged prompts and lengths, at most three rows at once (the rest wait), EOS: every
    request's tokens are plain greedy decoding's; afterwards no request is left running in the draft, and the
    global tree holds every output."""
    draft = SuffixDraft(max_cached_requests=cached, use_tree_spec=tree, max_spec_factor=2.0)
    engine = minispec.Engine(target, draft, gamma=6, max_num_seqs=3)
    requests = [minispec.Request(p, 20 + 7 * i, arrival_s=0.002 * i, eos_token_id=ord(")") if i == 3 else None)
                for i, p in enumerate(PROMPTS * 2)]
    outs = engine.run(requests)
    for r, o in zip(requests, outs):
        want = minispec.generate(target, [r.prompt], r.max_new_tokens, eos_token_id=r.eos_token_id).tokens[0]
        assert o.tokens == want
    assert engine.stats.accepted_tokens > 50
    assert not draft._live and not draft._ended and not draft.cache.local  # every request ended, once
    if cached:
        held = list(draft.cache.global_tree._seqs.values())
        assert len(held) == len(requests)
        for o in outs:  # each output, and perhaps what its last step produced past the end
            assert any(h[: len(o.tokens)] == o.tokens for h in held)


def test_engine_learns_as_speculative_generate_does(target):
    """One request at a time through the engine, and one call at a time through speculative_generate, each with its
    own draft: the same drafts every step, so the same counts (vLLM's suffix method gives these too, see
    tests/vllm/test_suffix_vllm.py)."""
    a, b = SuffixDraft(max_cached_requests=3), SuffixDraft(max_cached_requests=3)
    engine = minispec.Engine(target, a, gamma=8)
    counts = [[0, 0, 0], [0, 0, 0]]
    for p in PROMPTS + PROMPTS[:2]:
        engine.run([minispec.Request(p, 40)])
        s = minispec.speculative_generate(target, b, [p], gamma=8, max_new_tokens=40).stats
        for c, x in zip(counts, (engine.stats, s)):
            c[0] += x.num_drafts
            c[1] += x.draft_tokens
            c[2] += x.accepted_tokens
    assert counts[0] == counts[1] and counts[0][2] > 100
    assert list(a.cache.cached) == list(b.cache.cached) == [4, 5, 6]


def test_a_request_that_never_drafts_still_teaches_the_global_tree(target):
    """max_new_tokens=1: the request ends at its prefill's token, before any draft step; observe learns it."""
    draft = SuffixDraft()
    minispec.Engine(target, draft, gamma=4).run([minispec.Request(PROMPTS[0], 1)])
    assert list(draft.cache.global_tree._seqs.values()) == [
        minispec.generate(target, [PROMPTS[0]], 1).tokens[0]]


@pytest.mark.parametrize("name", ["suffix", "suffix:tree"])
def test_generate_with_suffix_decoding(capsys, name):
    assert main(["generate", "def f(x):\n    return x\n\ndef f(", "--draft", name, "--max-new-tokens", "24",
                 "--show-accepted"]) == 0
    printed = capsys.readouterr()
    assert "^" in printed.out  # accepted draft tokens marked
    assert "SuffixDraft(" in printed.err and f"use_tree_spec={name == 'suffix:tree'}" in printed.err


@pytest.mark.parametrize("argv, message", [
    (["--draft", "suffix:chain"], "suffix decoding is --draft suffix"),
    (["--draft", "suffix", "--tree", "budget=4,depth=2"], "grows its own trees"),
])
def test_suffix_names_are_checked(capsys, argv, message):
    assert main(["generate", "x", *argv]) == 2
    assert message in capsys.readouterr().err
