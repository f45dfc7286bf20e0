"""Prompt lookup's two rules on hand-made sequences, against an independent search written from their definitions.

rule="latest" (the default): the most recent earlier occurrence of the longest suffix n-gram. rule="vllm": vLLM's
``ngram`` proposer (vllm/v1/spec_decode/ngram_proposer.py, 0.32): the earliest occurrence, n in [min, max], and
never past the model's maximum length. tests/vllm/ checks the same rule against vLLM's own function and engine.
"""

import random
from types import SimpleNamespace

import pytest

import minispec
from minispec.decoding.plain import DecodeState
from minispec.decoding.sampling import Sampler, SamplingParams


def reference(seq, k, min_n, max_n, rule, max_len=None):
    """The rule from its definition, by brute force: the longest n in [min_n, max_n] whose suffix n-gram occurs at a
    start s with a token after it (s + n < len), the earliest (vllm) or latest (latest) such s; up to k tokens after."""
    total = len(seq)
    if max_len is not None:
        k = min(k, max_len - total)
    if k <= 0:
        return []
    for n in range(max_n, min_n - 1, -1):
        starts = [s for s in range(total - n) if seq[s : s + n] == seq[total - n :]]
        if starts:
            c = (starts[0] if rule == "vllm" else starts[-1]) + n
            return seq[c : c + k]
    return []


def propose(rows, gamma, max_ngram, min_ngram, rule, max_len=512, vocab=64):
    """What PromptLookupDraft proposes for each row of a batch (ragged rows together), as lists."""
    target = SimpleNamespace(config=SimpleNamespace(vocab_size=vocab, max_position_embeddings=max_len))
    state = DecodeState(rows, 1, [], "cpu", slack=gamma + 1)
    run = minispec.PromptLookupDraft(max_ngram, min_ngram, rule=rule).start(
        target, state, Sampler(SamplingParams(), None, len(rows), "cpu"))
    x, q, tree = run.propose(state, gamma)
    assert tree is None
    n = q.proposed.sum(1)  # (B,)
    assert all(bool(q.proposed[b, : int(n[b])].all()) for b in range(len(rows)))  # a prefix of each row's slots
    return [x[b, : int(n[b])].tolist() for b in range(len(rows))]


# (sequence, gamma, max_ngram, min_ngram, vllm's proposal, latest's proposal): each case says where the rules part
CASES = [
    # [1 2 3] occurs at 0 and at 4: vLLM continues after the first (9 ...), the default after the last (7 ...)
    ([1, 2, 3, 9, 1, 2, 3, 7, 1, 2, 3], 4, 3, 1, [9, 1, 2, 3], [7, 1, 2, 3]),
    # an occurrence may overlap the suffix: [5 5] at 0, 1 (and 2, the suffix itself, has nothing after it);
    # fewer than gamma tokens follow, so fewer are proposed
    ([5, 5, 5, 5], 4, 2, 1, [5, 5], [5]),
    # the longest n-gram wins over an earlier shorter one: [3 4 5] at 3 beats [4 5] at 0 ...
    ([4, 5, 1, 3, 4, 5, 2, 3, 4, 5], 4, 3, 1, [2, 3, 4, 5], [2, 3, 4, 5]),
    # ... unless max_ngram stops at 2: then [4 5] at 0 (vLLM) or at 4 (latest)
    ([4, 5, 1, 3, 4, 5, 2, 3, 4, 5], 4, 2, 1, [1, 3, 4, 5], [2, 3, 4, 5]),
    # min_ngram: only the 1-gram [2] recurs ([9 2] does not), so min 2 proposes nothing
    ([1, 2, 9, 2], 3, 3, 2, [], []),
    ([1, 2, 9, 2], 3, 3, 1, [9, 2], [9, 2]),
    # a row shorter than min_ngram, and a row with no repeat at all
    ([7], 3, 3, 2, [], []),
    ([1, 2, 3, 4], 3, 3, 1, [], []),
    # gamma cuts the continuation
    ([6, 1, 2, 3, 4, 5, 6], 2, 1, 1, [1, 2], [1, 2]),
]


@pytest.mark.parametrize("seq, gamma, max_n, min_n, vllm, latest", CASES)
def test_each_rule_on_hand_made_sequences(seq, gamma, max_n, min_n, vllm, latest):
    assert reference(seq, gamma, min_n, max_n, "vllm") == vllm  # the hand-written answers are the definition's
    assert reference(seq, gamma, min_n, max_n, "latest") == latest
    assert propose([seq], gamma, max_n, min_n, "vllm") == [vllm]
    assert propose([seq], gamma, max_n, min_n, "latest") == [latest]


def test_the_rules_part_at_the_first_case():
    """The cases above are not all the same for both rules (a test of two rules that could not tell them apart)."""
    assert sum(v != la for *_, v, la in CASES) >= 3


@pytest.mark.parametrize("total, want", [(510, [9, 1]), (511, [9]), (512, [])])
def test_vllm_rule_never_proposes_past_the_models_maximum_length(total, want):
    """vLLM: k = min(k, max_model_len - total); nothing at max_model_len. The default rule has no such cap."""
    seq = [1, 2, 3, 9, 1, 2, 3] + [0] * (total - 11) + [4, 1, 2, 3]  # [1 2 3] recurs; 9 1 ... follows it
    assert len(seq) == total
    assert propose([seq], 4, 3, 3, "vllm", max_len=512) == [want]
    assert propose([seq], 4, 3, 3, "latest", max_len=512) == [[0, 0, 0, 0]]  # after [1 2 3] at 4: all 4, no cap
    assert reference(seq, 4, 3, 3, "vllm", max_len=512) == want


@pytest.mark.parametrize("rule", ["vllm", "latest"])
def test_a_ragged_batch_of_random_rows_matches_the_reference(rule):
    """Rows of different lengths over a 3-token alphabet (many repeats, many overlaps) in one batch: each row's
    proposal is the reference's, for several (gamma, max, min); and on these rows the two rules often differ."""
    rng = random.Random(0)
    proposing = differ = rows_seen = 0
    for gamma, max_n, min_n in [(4, 3, 1), (5, 4, 2), (1, 2, 2), (3, 5, 3), (8, 1, 1)]:
        rows = [[rng.randrange(3) for _ in range(rng.randrange(1, 30))] for _ in range(40)]
        got = propose(rows, gamma, max_n, min_n, rule)
        want = [reference(r, gamma, min_n, max_n, rule, 512 if rule == "vllm" else None) for r in rows]
        assert got == want, (gamma, max_n, min_n)
        other = [reference(r, gamma, min_n, max_n, "latest" if rule == "vllm" else "vllm") for r in rows]
        proposing += sum(1 for w in want if w)
        differ += sum(w != o for w, o in zip(want, other))
        rows_seen += len(rows)
    assert proposing > rows_seen // 2 and differ > rows_seen // 4


def test_the_rule_is_checked_before_any_work():
    with pytest.raises(ValueError, match="rule must be one of 'latest', 'vllm', got 'hf'"):
        minispec.PromptLookupDraft(rule="hf")
    want = "PromptLookupDraft(max_ngram=4, min_ngram=2, rule='vllm')"
    assert repr(minispec.PromptLookupDraft(4, 2, rule="vllm")) == want
    assert repr(minispec.PromptLookupDraft()) == "PromptLookupDraft(max_ngram=3, min_ngram=1)"  # unchanged


def test_the_vllm_rule_keeps_greedy_tokens_and_drafts_other_tokens():
    """Through speculative_generate on the embedded target: the same tokens as plain greedy decoding with either
    rule, and a prompt whose n-gram recurs with different continuations drafts different tokens under each."""
    target, tok = minispec.load("tiny-code-target")
    prompt = tok.encode("for i in a:\n    x = 1\nfor i in b:\n    y = 2\nfor i in ")
    plain = minispec.generate(target, [prompt], max_new_tokens=24)
    outs = {rule: minispec.speculative_generate(target, minispec.PromptLookupDraft(4, 1, rule=rule), [prompt],
                                                gamma=4, max_new_tokens=24) for rule in ("vllm", "latest")}
    for out in outs.values():
        assert out.tokens == plain.tokens
        assert out.stats.num_drafts > 0
    assert outs["vllm"].stats.accepted_per_position != outs["latest"].stats.accepted_per_position or \
        outs["vllm"].stats.draft_tokens != outs["latest"].stats.draft_tokens
