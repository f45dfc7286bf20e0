"""SuffixDraft through minispec.speculative_generate: exact (greedy tokens, the sampled law through the chain and
the tree verifier), and what it proposes, step by step, equals the brute-force reference's draft for the row's
tokens (and, across calls, for the earlier calls' outputs); the tokens per step follow from those proposals."""

import pytest
import torch
from support import Scripted, V, empirical_tv, random_model
from test_suffix_reference import NaiveCache, check

import minispec
from minispec.course.grader import tv_bound
from minispec.decoding.sampling import PointMass
from minispec.decoding.tree import Tree
from minispec.drafts.suffix import SuffixDraft
from minispec.speculative.rule import verify_greedy

CODE = [b"def parse(argv):\n    args = argv[1:]\n    return args\n\ndef parse_all(argv):\n    ",
        b"import os\nimport sys\nimport ", b"#", b"for i in range(3):\n    print(i)\nfor j in range(3):\n"]
PROMPTS = [list(p) for p in CODE]  # ragged: 1 to 73 bytes
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def target():
    return minispec.load("tiny-code-target")[0]


@pytest.fixture(scope="module")
def longer(target):
    """Greedy decoding, 56 tokens: 48 as the runs make, and what a last step's accepted drafts continue with."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield minispec.generate(target, PROMPTS, max_new_tokens=56).tokens
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def plain(longer):
    return [t[:48] for t in longer]


def record(draft):
    """Keep every proposal (on the instance): each row's tokens and done flag, and x, q, tree."""
    calls, start = [], draft.start

    def started(*args, **kw):
        run = start(*args, **kw)
        propose = run.propose

        def recorded(state, gamma):
            out = propose(state, gamma)
            rows = [row[:n] for row, n in zip(state.seq.tolist(), state.total.tolist())]
            calls.append((rows, state.prompt_len.tolist(), state.done.tolist(), gamma, out))
            return out

        run.propose = recorded
        return run

    draft.start = started
    return calls


def drafted(out, b: int):
    """Row b's draft from a proposal: (tokens, parents as SuffixCache gives them)."""
    x, q, tree = out
    k = int(q.proposed[b].sum()) if x.shape[1] else 0
    assert q.proposed[b, :k].all() and not q.proposed[b, k:].any()  # a row's nodes first, then padding
    parents = tree.parent[b, :k].tolist() if tree is not None else list(range(k))
    return x[b, :k].tolist(), [p - 1 for p in parents]


def same_draft(tokens, parents, want, tree: bool) -> None:
    """A proposal is the reference's draft: a path exactly; a tree through its nodes' probabilities."""
    ref, cands = want
    if not tree:
        assert tokens == ref.token_ids
        return
    paths = []
    for t, p in zip(tokens, parents):
        paths.append((paths[p] if p >= 0 else ()) + (t,))
    probs = [cands[p] for p in paths]  # KeyError: not a continuation the history holds
    check(ref._replace(token_ids=tokens, parents=parents, probs=probs, score=ref.score), want, tree)


ARGS = dict(max_spec_factor=2.0, min_token_prob=0.1)


@pytest.mark.parametrize("tree", [False, True], ids=["chain", "tree"])
@pytest.mark.parametrize("params", [minispec.SamplingParams(), minispec.SamplingParams(0.8)], ids=["greedy", "T0.8"])
def test_every_proposal_is_the_references_draft_for_the_rows_tokens(target, tree, params):
    """No global tree (max_cached_requests=0): each row drafts from its own prompt and output only, so the reference
    rebuilt from the row's tokens alone must give the same draft, at every step of a ragged batch with plain steps
    between (the row's tokens then grow by more than one step's)."""
    draft = SuffixDraft(max_cached_requests=0, use_tree_spec=tree, **ARGS)
    calls = record(draft)
    out = minispec.speculative_generate(target, draft, PROMPTS, gamma=Scripted([6, 0, 3, 6]), max_new_tokens=48,
                                        temperature=params.temperature, seed=[1, 2, 3, 4])
    proposed = 0
    for rows, plens, done, gamma, prop in calls:
        for b, row in enumerate(rows):
            if done[b]:
                continue
            ref = NaiveCache(draft.max_tree_depth, 0)
            ref.start_request(0, row[: plens[b]])
            ref.add_active_response(0, row[plens[b] :])
            want = ref.speculate(0, row, gamma, 2.0, 0.0, 0.1, tree)
            same_draft(*drafted(prop, b), want, tree)
            proposed += len(drafted(prop, b)[0])
    assert proposed > 100 and out.stats.draft_tokens == proposed
    if tree:  # the trees branch: more nodes than levels
        assert out.stats.draft_tokens > out.stats.path_tokens


@pytest.mark.parametrize("tree", [False, True], ids=["chain", "tree"])
def test_later_calls_draft_from_earlier_outputs_as_the_reference_does(target, tree):
    """One row per call, one call after another, with the global tree: each call drafts from its prompt, its own
    output and the earlier calls' outputs (as the reference replays them: the earlier outputs, then this call's as it
    grows); two outputs cached, so the oldest is evicted. The learned outputs are the calls' outputs, plus what the
    last step produced past max_new_tokens, which is greedy decoding's next tokens."""
    draft = SuffixDraft(max_cached_requests=2, use_tree_spec=tree, **ARGS)
    calls = record(draft)
    ref, learned, proposed = NaiveCache(draft.max_tree_depth, 2), [], 0
    for rid, prompt in enumerate(PROMPTS + PROMPTS[:2]):
        start = len(calls)
        out = minispec.speculative_generate(target, draft, [prompt], gamma=6, max_new_tokens=40)
        ref.start_request(rid, prompt)
        seen = 0
        for rows, plens, _, gamma, prop in calls[start:]:
            ref.add_active_response(rid, rows[0][plens[0] + seen :])
            seen = len(rows[0]) - plens[0]
            same_draft(*drafted(prop, 0), ref.speculate(rid, rows[0], gamma, 2.0, 0.0, 0.1, tree), tree)
            proposed += len(drafted(prop, 0)[0])
        whole = draft.cache.global_tree._seqs[rid]  # what the global tree learned of this call
        longer = minispec.generate(target, [prompt], max_new_tokens=len(whole)).tokens[0]
        assert whole[:40] == out.tokens[0] and whole == longer
        ref.add_active_response(rid, whole[seen:])
        ref.stop_request(rid)
        learned.append(len(whole) - 40)
    assert proposed > 100 and any(learned)  # some last steps ran past max_new_tokens
    assert list(draft.cache.cached) == [4, 5] and not draft.cache.local


def test_tokens_per_step_follow_from_the_proposals(target, plain, longer):
    """Greedy, a chain's row gains the longest prefix of its draft that greedy decoding continues with, plus one:
    from the recorded proposals and the plain greedy tokens, every step's accepted count, summed per position, is
    the run's accepted_per_position."""
    draft = SuffixDraft(**ARGS)
    calls = record(draft)
    out = minispec.speculative_generate(target, draft, PROMPTS, gamma=6, max_new_tokens=48)
    at = [0] * 6
    for rows, plens, done, _, prop in calls:
        for b, row in enumerate(rows):
            if done[b]:
                continue
            tokens, _ = drafted(prop, b)
            after = longer[b][len(row) - plens[b] :]  # greedy's next tokens
            n = next((i for i, (t, g) in enumerate(zip(tokens, after)) if t != g), min(len(tokens), len(after)))
            for i in range(n):
                at[i] += 1
    assert out.tokens == plain
    assert out.stats.accepted_per_position == [a for a in at if a] and sum(at) > 50


@pytest.mark.parametrize("tree", [False, True], ids=["chain", "tree"])
@pytest.mark.parametrize("cached", [0, 10000], ids=["own-text", "global"])
def test_greedy_tokens_are_plain_greedys(target, plain, tree, cached):
    """Ragged rows, plain steps between speculative ones, EOS, and a second call that drafts from the first's
    outputs: the tokens are plain greedy decoding's every time. Without a global tree the second call drafts
    exactly as the first; with one it accepts more."""
    draft, runs = SuffixDraft(max_cached_requests=cached, use_tree_spec=tree), []
    for _ in range(2):
        runs.append(minispec.speculative_generate(target, draft, PROMPTS, gamma=Scripted([4, 0, 8]),
                                                  max_new_tokens=48))
        assert runs[-1].tokens == plain
    first, second = (r.stats for r in runs)
    if cached:
        assert second.accepted_tokens > first.accepted_tokens + 20
    else:
        assert (second.draft_tokens, second.accepted_per_position) == (first.draft_tokens, first.accepted_per_position)
    eos = ord("\n")
    want = minispec.generate(target, PROMPTS, max_new_tokens=48, eos_token_id=eos).tokens
    assert minispec.speculative_generate(target, draft, PROMPTS, gamma=8, max_new_tokens=48,
                                         eos_token_id=eos).tokens == want
    assert not draft._live and not draft.cache.local  # every row's request ended with its row


# --- the sampled law, through the chain rule and the tree verifier -------------------------------------------

@pytest.fixture(scope="module")
def sharp():
    return random_model(seed=5, vocab=V, logit_scale=3)


SUFFIX_TV = dict(min_token_prob=0.0, max_spec_factor=4.0)  # every continuation seen, a full draft from a 1-token match


@pytest.mark.slow
@pytest.mark.parametrize("tree", [False, True], ids=["chain", "tree"])
def test_sampling_has_the_target_distribution(sharp, tree):
    """30,000 rows of two prompts in one call: each row drafts from the outputs of the rows before it (the global
    tree), so the trees branch; the first three tokens against the target's exact joint distribution."""
    draft = SuffixDraft(use_tree_spec=tree, **SUFFIX_TV)
    tv, out = empirical_tv(sharp, draft, minispec.SamplingParams(1.0), gamma=2, prompts=([1, 3], [2]))
    assert tv < tv_bound(V**3, 30_000), f"TV {tv:.4f}"
    assert out.stats.accepted_tokens > 0.15 * 30_000  # the drafts are really used
    if tree:
        assert out.stats.accepted_per_rank[1] > 1000  # the trees branch: second children are accepted


@pytest.mark.slow
@pytest.mark.parametrize("tree", [False, True], ids=["chain", "tree"])
def test_a_wrong_residual_fails_the_distribution_test(sharp, tree, monkeypatch):
    """A negative control: after a rejection, keep r = p (the rejected point mass not removed)."""
    import minispec.speculative.rule

    monkeypatch.setattr(minispec.speculative.rule, "q_at", lambda q, x, i: torch.zeros(len(x), V))
    tv, _ = empirical_tv(sharp, SuffixDraft(use_tree_spec=tree, **SUFFIX_TV), minispec.SamplingParams(1.0), gamma=2,
                         prompts=([1, 3], [2]))
    assert tv > 2 * tv_bound(V**3, 30_000)


def test_greedy_tree_verification_skips_padding_nodes():
    """Row 0 drafts one node, row 1 three; row 0's two padding nodes (q = 0) hold the target's argmax at the root,
    token 2: never accepted. Without q (the verifier before per-row trees) the padding would be."""
    p = torch.zeros(2, 4, 5)
    p[:, :, 2] = 1.0  # the target always says 2
    x = torch.tensor([[4, 2, 2], [2, 2, 1]])  # row 0: node 1 (token 4), then padding; row 1: 2 -> 2, and 1
    tree = Tree(torch.tensor([[0, 0, 0], [0, 1, 0]]), 2, 2)
    q = PointMass(torch.tensor([[True, False, False], [True, True, True]]), 5)
    draw = lambda w: w.argmax(-1)  # noqa: E731
    path, _, t = verify_greedy(p, x, tree, draw, q)
    assert path.tolist() == [[-1, -1], [1, 2]] and t.tolist() == [2, 2]
    assert verify_greedy(p, x, tree, draw)[0].tolist()[0] == [2, -1]


# --- the finish hook and bad input -------------------------------------------------------------------------

def test_observe_ends_a_request_once():
    draft = SuffixDraft()
    draft.observe([1, 2, 3], [4, 5])  # never seen drafting: learned as a new request
    assert draft.cache.global_tree._seqs == {0: [4, 5]} and not draft.cache.local
    draft2 = SuffixDraft()
    req = draft2._begin([1, 2, 3])
    draft2._learn(req, [4])
    draft2._list(req)
    draft2.observe([1, 2, 3], [4, 5, 6])  # running: the rest of its output learned, then ended
    assert draft2.cache.global_tree._seqs == {0: [4, 5, 6]} and not draft2._live and not draft2.cache.local
    draft2._end(draft2._begin([7]), emitted=(7, 8))  # ended by a run: the engine's call confirms it, nothing more
    draft2.observe([7], [8])
    assert draft2.cache.global_tree._seqs == {0: [4, 5, 6], 1: []} and not draft2._ended


@pytest.mark.parametrize("kw, message", [
    (dict(max_tree_depth=0), "max_tree_depth must be an integer >= 1"),
    (dict(max_tree_depth=2.0), "max_tree_depth must be an integer"),
    (dict(max_cached_requests=-1), "max_cached_requests must be an integer >= 0"),
    (dict(max_cached_requests=True), "max_cached_requests must be an integer"),
    (dict(max_spec_factor=-0.5), "max_spec_factor must be >= 0"),
    (dict(max_spec_factor=float("nan")), "max_spec_factor must be a finite number"),
    (dict(min_token_prob=1.5), r"min_token_prob must be in \[0, 1\]"),
    (dict(max_spec_offset="1"), "max_spec_offset must be a finite number"),
    (dict(use_tree_spec=1), "use_tree_spec must be True or False"),
])
def test_bad_settings_are_refused(kw, message):
    with pytest.raises(ValueError, match=message):
        SuffixDraft(**kw)


@pytest.mark.parametrize("prompt, output, message", [
    ([1, 2], [3, -1], "output must be a list of token ids"),
    ("abc", [1], "prompt must be a list of token ids"),
    ([1, True], [1], "prompt must be a list of token ids"),
])
def test_observe_refuses_what_is_not_token_ids(prompt, output, message):
    draft = SuffixDraft()
    with pytest.raises(ValueError, match=message):
        draft.observe(prompt, output)
    assert not draft.cache.cached  # refused before any work
