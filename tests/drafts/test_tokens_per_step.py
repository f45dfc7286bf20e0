"""Tokens per step, not only exactness: every draft proposes what it would propose from scratch.

A wrong draft side (a stale draft cache after a tree step, a draft mask that lets nodes see their cousins,
a hot-vocabulary id map off by one, EAGLE nodes at the wrong positions) keeps the output exact, because the
accept rule is exact for any q; only acceptance drops. So these tests check the draft itself:

- every proposal of every model-based draft (a draft model, layer skip, an EAGLE head with and without a hot
  vocabulary), in chains and static and dynamic trees, greedy and sampled, in a ragged batch with plain steps
  and rollbacks between, equals a from-scratch computation over the row's tokens and the node's path: dense
  q equals the fresh q, and point masses are the fresh top-k in rank order;
- prompt lookup proposes exactly what an independent n-gram search finds;
- the target drafting for itself accepts every draft token, in chains and trees, greedy and sampled.
"""

import pytest
import torch
from support import Scripted

import minispec
from minispec.decoding.sampling import DRAFT, PointMass, SamplingParams, philox4x32, probabilities, row_keys, sample
from minispec.drafts.eagle import EagleDraft
from minispec.drafts.model import LayerSkipDraft, ModelDraft
from minispec.drafts.tree import TreeDraft
from minispec.model.kv_cache import KVCache

CODE = [b"def parse(argv):\n    ", b"import os\nimport sys\n\n", b"#",
        b"class Stack:\n    def push(self, x):\n        "]
PROMPTS = [list(p) for p in CODE]  # ragged: 1 to 37 bytes


@pytest.fixture(scope="module")
def code():
    return minispec.load("tiny-code-target")[0], minispec.load("tiny-code-draft")[0]


def record(draft):
    """Wrap ``draft`` (on the instance) so that every proposal is kept: each running row's tokens, and x, q,
    the tree. Returns the list the calls go to."""
    calls, start = [], draft.start

    def started(*args, **kw):
        run = start(*args, **kw)
        propose = run.propose

        def recorded(state, gamma):
            out = propose(state, gamma)
            rows = [row[:n] for row, n in zip(state.seq.tolist(), state.total.tolist())]
            calls.append((rows, state.done.tolist(), out))
            return out

        run.propose = recorded
        return run

    draft.start = started
    return calls


# --- what each draft gives from scratch: logits (V,) for the token after a row's tokens and a path ------

def model_from_scratch(model, num_layers=None):
    def fresh(seq, path):
        return model(torch.tensor([seq + path]), num_layers=num_layers)[0, -1]  # (V,)
    return fresh


def eagle_from_scratch(target, draft: EagleDraft):
    """The head over a fresh cache: pairs (f_t, x_{t+1}) of the target's features along the row, then its own
    hidden states along the path, at consecutive positions; a hot vocabulary placed by the head's ranking."""
    model, W = draft.model, target.lm_head.weight  # (V, C) the full head
    hot = None if draft.hot_vocab is None else model.ranking[: draft.hot_vocab]  # the ranking's first N token ids
    cfg = model.config.layer

    def fresh(seq, path):
        x = torch.tensor([seq])  # (1, n)
        _, f = target(x[:, :-1], features=model.config.features)  # (1, n-1, F)
        cache = KVCache(1, 1, cfg.num_key_value_heads, len(seq) + len(path), cfg.head_dim)
        h = model(model.fuse(target.embed(x[:, 1:]), f, True), cache)[:, -1:]  # (1, 1, C)
        for token in path:
            h = model(model.fuse(target.embed(torch.tensor([[token]])), h, False), cache)  # (1, 1, C)
        logits = model.logits(h[0, -1], W)  # (V,) the full head
        if hot is not None:
            logits = torch.full_like(logits, float("-inf")).index_copy_(0, hot, logits[hot])
        return logits

    return fresh


def drawn_with_its_uniform(q_j, seed, position, j):
    """The token a draft draws from q_j (V,) with its own random number: Philox4x32-10 of counter (j, position,
    DRAFT stream, 0) under the row's key (the counter layout minispec.decoding.sampling documents; the uniform's 52
    bits and the inverse CDF are tested on their own in tests/decoding/test_sampling_contract.py)."""
    key = row_keys([seed])  # (1, 2)
    words = philox4x32(torch.tensor([[j, position, DRAFT, 0]]), key)[0].tolist()  # 4 words
    u = ((words[0] << 20 | words[1] >> 12) + 0.5) * 2.0**-52  # 52 random bits, strictly inside (0, 1)
    return int(sample(q_j[None], torch.tensor([u], dtype=torch.float64))[0])


def check_proposals(calls, fresh, params, atol=2e-5, seeds=None):
    """Every running row's proposal in ``calls`` against ``fresh(seq, path)``: a dense q equal to the fresh q
    at each node's parent, and each token x_j the one q_j gives with the row's own uniform of counter (j - 1, the
    step's position, DRAFT) when ``seeds`` (one per row) are given; point masses (greedy, a dynamic tree) the fresh
    top tokens: the children of a node distinct, the i-th the i-th likeliest."""
    assert len(calls) >= 4
    checked = 0
    for rows, done, (x, q, tree) in calls:
        T = x.shape[1]
        parent = torch.arange(T).expand(len(rows), T) if tree is None else tree.parent  # (B, T) a chain's: j - 1
        for b, seq in enumerate(rows):
            if done[b]:
                continue
            paths = {0: []}  # node -> tokens from the root's child down to the node
            for j in range(1, T + 1):
                paths[j] = paths[int(parent[b, j - 1])] + [int(x[b, j - 1])]
            by_parent = {}
            for j in range(1, T + 1):
                by_parent.setdefault(int(parent[b, j - 1]), []).append(j)
            for par, children in by_parent.items():
                logits = fresh(seq, paths[par])  # (V,)
                if isinstance(q, PointMass) or params.greedy:
                    top = logits.sort(descending=True).values  # (V,)
                    tokens = [int(x[b, j - 1]) for j in children]
                    assert len(set(tokens)) == len(tokens), (b, par, tokens)  # siblings are distinct tokens
                    for i, j in enumerate(children):  # the i-th child is the i-th likeliest token
                        assert abs(logits[x[b, j - 1]] - top[i]) <= 1e-4, (b, j, par, i)
                else:
                    expected = probabilities(logits[None], params)[0]  # (V,)
                    for j in children:
                        torch.testing.assert_close(q[b, j - 1], expected, atol=atol, rtol=1e-4)
                        if seeds is not None:  # x_j was drawn from q_j with its own uniform
                            assert int(x[b, j - 1]) == drawn_with_its_uniform(q[b, j - 1], seeds[b], len(seq),
                                                                              j - 1), (b, j)
                checked += len(children)
    return checked


SHAPES = {
    "chain": lambda d: d,
    "static tree": lambda d: TreeDraft(d, branching=(3, 2, 2, 1)),
    "dynamic tree": lambda d: TreeDraft(d, budget=12, depth=4, topk=3),
}
SAMPLED = SamplingParams(0.9, top_k=50)
SCRIPT = [4, 0, 3, 4, 0, 0, 2, 4]  # gammas: plain steps and shorter drafts between full ones


def draft_of(kind, code):
    target, small = code
    if kind == "draft model":
        return ModelDraft(small), model_from_scratch(small)
    if kind == "layer skip":
        return LayerSkipDraft(target, 3), model_from_scratch(target, 3)
    draft = EagleDraft.from_pretrained("tiny-code-eagle", target, hot_vocab=96 if kind == "eagle hot" else None)
    return draft, eagle_from_scratch(target, draft)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("kind", ["draft model", "layer skip", "eagle", "eagle hot"])
@pytest.mark.parametrize("params", [SamplingParams(), SAMPLED], ids=["greedy", "sampled"])
def test_every_proposal_is_the_drafts_from_scratch(code, kind, shape, params):
    target, _ = code
    inner, fresh = draft_of(kind, code)
    draft = SHAPES[shape](inner)
    calls = record(draft)
    out = minispec.speculative_generate(target, draft, PROMPTS, gamma=Scripted(SCRIPT), max_new_tokens=24,
                                        temperature=params.temperature, top_k=params.top_k, seed=[5, 6, 7, 8])
    with torch.inference_mode():
        assert check_proposals(calls, fresh, params, seeds=[5, 6, 7, 8]) > 40
    # some step accepted two draft tokens or more, and proposals came after it: a draft whose cache kept a rejected
    # token's slot, or lost an accepted one, shows only after such a step (one accepted token rewrites no slot)
    assert len(out.stats.accepted_per_position) >= 2 and out.stats.accepted_per_position[1] > 0
    if params.greedy:
        assert out.tokens == minispec.generate(target, PROMPTS, max_new_tokens=24).tokens


def test_a_hot_vocabulary_gives_the_full_heads_logits_at_its_ids(code):
    """The hot head's logits are the full head's at the ranking's first N ids, -inf elsewhere, at the root and
    along a tree (q restricted to the hot set: hot q = full q there, renormalised)."""
    target, _ = code
    full = EagleDraft.from_pretrained("tiny-code-eagle", target, hot_vocab=256)
    hot = EagleDraft.from_pretrained("tiny-code-eagle", target, hot_vocab=64)
    ids = hot.model.ranking[:64]
    assert sorted(ids.tolist()) != list(range(64))  # the ranking is not the identity: a shifted map would show
    runs = {}
    for name, d in (("full", full), ("hot", hot)):
        tree = TreeDraft(d, branching=(2, 2, 1))
        runs[name] = record(tree)
        minispec.speculative_generate(target, tree, PROMPTS, max_new_tokens=16, temperature=1.0, seed=[1, 2, 3, 4])
    # the first step: the same tokens in both runs (the target drew each row's first token with the same seed)
    (rows_f, _, (_, qf, _)), (rows_h, _, (_, qh, _)) = runs["full"][0], runs["hot"][0]
    assert rows_f == rows_h
    cold = torch.ones(256, dtype=torch.bool)
    cold[ids] = False
    root_children = [0, 1]  # nodes 1 and 2 are drawn from the root's q
    for b in range(len(PROMPTS)):
        for j in root_children:
            assert qh[b, j, cold].sum() == 0
            expected = qf[b, j, ids] / qf[b, j, ids].sum()  # the full q on the hot ids, renormalised
            torch.testing.assert_close(qh[b, j, ids], expected, atol=1e-5, rtol=1e-4)


def lookup_from_scratch(seq, gamma, max_ngram=3, min_ngram=1):
    """What prompt lookup should propose: the tokens after the latest earlier occurrence of the longest suffix
    n-gram (n from max_ngram down), up to gamma and the end of the row."""
    for n in range(max_ngram, min_ngram - 1, -1):
        if len(seq) <= n:
            continue
        suffix = seq[-n:]
        starts = [i for i in range(len(seq) - n) if seq[i : i + n] == suffix]
        if starts:
            s = starts[-1] + n
            return seq[s : s + gamma]
    return []


@pytest.mark.parametrize("params", [SamplingParams(), SAMPLED], ids=["greedy", "sampled"])
def test_prompt_lookup_proposes_what_a_search_from_scratch_finds(code, params):
    target, _ = code
    prompts = [list(b"for i in range(10):\n    print(i)\nfor i in range(10):\n"), list(b"aaaa"), list(b"x"),
               list(b"def f():\n    return 1\n\ndef g():\n    return")]
    draft = minispec.PromptLookupDraft()
    calls = record(draft)
    out = minispec.speculative_generate(target, draft, prompts, gamma=Scripted([4, 0, 2, 4]), max_new_tokens=30,
                                        temperature=params.temperature, top_k=params.top_k, seed=[1, 2, 3, 4])
    proposed = 0
    for rows, done, (x, q, _) in calls:
        for b, seq in enumerate(rows):
            if not done[b]:
                want = lookup_from_scratch(seq, x.shape[1])
                n = int(q.proposed[b].sum())
                assert x[b, :n].tolist() == want and q.proposed[b, :n].all(), (b, seq)
                proposed += n
    assert proposed > 20 and out.stats.draft_tokens == proposed


@pytest.mark.parametrize("make", [
    lambda t: t,  # a draft model that is the target
    lambda t: LayerSkipDraft(t, t.config.num_hidden_layers),  # every layer: the target itself
    lambda t: TreeDraft(t, branching=(3, 2, 2, 1)),
    lambda t: TreeDraft(LayerSkipDraft(t, t.config.num_hidden_layers), branching=(2, 2, 2)),
    lambda t: TreeDraft(t, paths=[(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (0, 0, 1), (0, 0, 0, 0)]),
], ids=["chain", "layer-skip chain", "static tree", "layer-skip tree", "paths"])
@pytest.mark.parametrize("params", [SamplingParams(), SamplingParams(1.0), SamplingParams(0.7, top_p=0.9)],
                         ids=["greedy", "T1", "T0.7-top-p"])
def test_the_target_drafting_for_itself_accepts_every_draft_token(code, make, params):
    """q = p at every node on the first-ranked path, so x ~ q is accepted with probability min(1, p/q) = 1: a
    whole path per step (chains: gamma tokens; trees: their depth), greedy and sampled, across plain steps."""
    target, _ = code
    draft = make(target)
    depth = draft.depth if isinstance(draft, TreeDraft) else 4
    out = minispec.speculative_generate(target, draft, PROMPTS, gamma=Scripted([depth, 0, depth, depth, 0]),
                                        max_new_tokens=40, temperature=params.temperature, top_p=params.top_p,
                                        seed=[9, 8, 7, 6])
    s = out.stats
    assert s.num_drafts > 10 and s.acceptance_rate == 1.0  # accepted / drafted along the verified path


def test_a_greedy_dynamic_tree_of_the_target_accepts_its_whole_depth(code):
    """Greedy, the target's own dynamic tree holds its greedy path whenever that path stays in the top-k
    frontier at every level; on these prompts it always does, so every step accepts the whole depth."""
    target, _ = code
    out = minispec.speculative_generate(target, TreeDraft(target, budget=16, depth=4, topk=4), PROMPTS,
                                        max_new_tokens=40)
    assert out.stats.acceptance_rate == 1.0 and out.stats.num_drafts > 10


@pytest.mark.parametrize("lengths", [(2, 1), (80, 3)], ids=["two-token prompts", "past the hidden size"])
def test_an_eagle_heads_proposals_from_scratch_at_the_edges_of_a_batch(lengths):
    """The longest prompt of two tokens (one pair to read before the first step), and positions past the feature
    width (64 here): each proposal of a chain and a tree still equals the head's from-scratch computation."""
    from support import random_model

    from minispec.drafts.eagle import EagleConfig, EagleModel

    target = random_model(seed=0, logit_scale=4.0)
    torch.manual_seed(2)
    model = EagleModel(EagleConfig.for_target(target.config)).requires_grad_(False)
    prompts = [[(7 * i + b) % 64 for i in range(n)] for b, n in enumerate(lengths)]
    for make in (lambda d: d, lambda d: TreeDraft(d, branching=(2, 2))):
        draft = EagleDraft(target, model)
        shaped = make(draft)
        calls = record(shaped)
        minispec.speculative_generate(target, shaped, prompts, gamma=Scripted([2, 0, 2]), max_new_tokens=12,
                                      temperature=1.0, seed=[3, 4])
        with torch.inference_mode():
            assert check_proposals(calls, eagle_from_scratch(target, draft), SamplingParams(1.0), seeds=[3, 4]) > 8
    with pytest.raises(ValueError, match="exceeds the draft's maximum length of 256 positions"):
        EagleDraft(target, model).check(target, 257)
    EagleDraft(target, model).check(target, 256)  # exactly the maximum: fine
