"""Suffix decoding in minispec beside Arctic Inference's own trees and vLLM's ``method: "suffix"``.

- minispec's SuffixCache against Arctic Inference's C++ ``SuffixDecodingCache`` (what vLLM calls): every draft on
  random request histories, paths (vLLM's) and trees, tokens, parents, float32 probabilities, score and match
  length, with the global tree's first-in-first-out eviction;
- vLLM's suffix method on the embedded target (token-id prompts, greedy): the same tokens and the same spec-decode
  counters (drafts, draft tokens, accepted tokens, accepted per position) as minispec's SuffixDraft, from the
  prompts alone (no global tree: a batch of 8) and across requests (the global tree, one request after another);
  through ``speculative_generate`` and through the ``Engine``.

Arctic Inference 0.3.0 is an sdist only on this platform (a C++20 nanobind extension built with CMake; its build
requires torch, which an isolated pip build takes from the index, the CUDA build on Linux). scripts/vllm_env.sh
builds it without isolation in a throwaway environment that has the CPU torch, nanobind 2.9.2, cmake, ninja and
grpcio-tools (``CMAKE_ARGS="-DPython_EXECUTABLE=$(which python) -Dnanobind_DIR=$(python -m nanobind --cmake_dir)"
pip wheel --no-build-isolation --no-deps arctic-inference``) and installs the wheel into .venv-vllm. Skipped, saying
why, where vLLM or arctic_inference is missing.
"""

import importlib.util

import pytest
from support import suffix_histories

import minispec
from minispec.drafts.suffix import SuffixDraft
from minispec.drafts.suffix_tree import SuffixCache

lane = pytest.importorskip("vllm_lane", reason="the vLLM lane's helpers (tests/vllm/vllm_lane.py) are not here")
pytestmark = pytest.mark.vllm
NEW, K = 48, 8


@pytest.fixture(scope="module")
def arctic():
    if importlib.util.find_spec("arctic_inference") is None:
        pytest.skip("arctic_inference is not installed (vLLM's suffix method needs it; scripts/vllm_env.sh builds it)")
    from arctic_inference.suffix_decoding import SuffixDecodingCache

    return SuffixDecodingCache


def histories(arctic, seed: int, tree: bool, vocab: int, depth: int, max_cached: int, steps: int = 300) -> int:
    """Random requests through both caches: prompts that copy earlier ones, outputs that copy earlier stretches (so
    that counts tie and grow); every draft compared. Returns how many drafts had tokens."""
    theirs, ours, drafted = arctic(depth, max_cached), SuffixCache(depth, max_cached), 0
    for k, context, kw in suffix_histories((theirs, ours), seed, vocab, depth, tree, steps, 30, 8, 12):
        a, b = theirs.speculate(k, context, **kw), ours.speculate(k, context, **kw)
        assert (b.token_ids, b.parents, b.probs, b.score, b.match_len) == \
            (list(a.token_ids), list(a.parents), list(a.probs), a.score, a.match_len), (seed, kw)
        drafted += bool(b.token_ids)
    return drafted


@pytest.mark.parametrize("tree", [False, True], ids=["path", "tree"])
@pytest.mark.parametrize("vocab, depth, max_cached", [(3, 6, 0), (4, 8, 3), (8, 24, 10000), (2, 5, 2)])
def test_every_draft_is_arctics(arctic, tree, vocab, depth, max_cached):
    assert sum(histories(arctic, seed, tree, vocab, depth, max_cached) for seed in range(5)) > 500


def test_ties_go_where_arctic_puts_them(arctic):
    """The hand example of tests/drafts/test_suffix_reference.py (3 leads 2 after 9 3 9 3 9 2) in Arctic's tree."""
    cache = arctic(8, 0)
    cache.start_request(0, [9, 1, 9, 2, 9, 3, 9, 3, 9, 2])
    assert list(cache.speculate(0, [5, 9], max_spec_tokens=1, min_token_prob=0.0).token_ids) == [3]
    cache.add_active_response(0, [9, 2])
    assert list(cache.speculate(0, [5, 9], max_spec_tokens=1, min_token_prob=0.0).token_ids) == [2]


def suffix(max_cached: int) -> dict:
    return {"method": "suffix", "num_speculative_tokens": K, "suffix_decoding_max_cached_requests": max_cached}


def counts(stats) -> dict:
    return {"num_drafts": stats.num_drafts, "draft_tokens": stats.draft_tokens,
            "accepted_tokens": stats.accepted_tokens,
            "accepted_per_position": list(stats.accepted_per_position) + [0] * (K - len(stats.accepted_per_position))}


def summed(rows: list[dict]) -> dict:
    out = {k: sum(r[k] for r in rows) for k in ("num_drafts", "draft_tokens", "accepted_tokens")}
    out["accepted_per_position"] = [sum(col) for col in zip(*(r["accepted_per_position"] for r in rows))]
    return out


@pytest.fixture(scope="module")
def target():
    return minispec.load("tiny-code-target")[0]


def test_drafts_from_the_prompt_as_vllm_does(arctic, llms, target):
    """No global tree (max_cached_requests 0): 8 held-out code prompts in one batch."""
    prompts = lane.heldout(8)
    tokens, theirs = lane.generate(llms.get(**lane.PAIR, speculative_config=suffix(0)), prompts, NEW)
    out = minispec.speculative_generate(target, SuffixDraft(max_cached_requests=0), prompts, gamma=K,
                                        max_new_tokens=NEW)
    assert out.tokens == tokens == minispec.generate(target, prompts, NEW).tokens
    assert counts(out.stats) == theirs and theirs["accepted_tokens"] > theirs["num_drafts"]


def test_learns_across_requests_as_vllm_does(arctic, llms, target):
    """The global tree on, three outputs cached: 8 prompts, one request after another, each drafting from the
    earlier outputs too (vLLM's tree updates within a batch in its own row order, so requests go one at a time)."""
    prompts = lane.heldout(8)
    llm = llms.get(**lane.PAIR, speculative_config=suffix(3))
    theirs = [lane.generate(llm, [p], NEW) for p in prompts]
    draft = SuffixDraft(max_cached_requests=3)
    ours = [minispec.speculative_generate(target, draft, [p], gamma=K, max_new_tokens=NEW) for p in prompts]
    assert [o.tokens[0] for o in ours] == [t[0][0] for t in theirs]
    assert summed([counts(o.stats) for o in ours]) == summed([t[1] for t in theirs])
    alone = summed([counts(minispec.speculative_generate(target, SuffixDraft(max_cached_requests=0), [p], gamma=K,
                                                         max_new_tokens=NEW).stats) for p in prompts])
    assert summed([t[1] for t in theirs])["accepted_tokens"] > alone["accepted_tokens"]  # the global tree helped


def test_the_engine_drafts_as_vllm_does(arctic, llms, target):
    """Through minispec.Engine, one request after another, four outputs cached."""
    prompts = lane.heldout(8)
    llm = llms.get(**lane.PAIR, speculative_config=suffix(4))  # a fresh LLM: its global tree starts empty
    theirs = [lane.generate(llm, [p], NEW) for p in prompts]
    engine, rows = minispec.Engine(target, SuffixDraft(max_cached_requests=4), gamma=K), []
    for p, t in zip(prompts, theirs):
        assert engine.run([minispec.Request(p, NEW)])[0].tokens == t[0][0]
        rows.append(counts(engine.stats))
    assert summed(rows) == summed([t[1] for t in theirs])
