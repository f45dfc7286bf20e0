"""vLLM's ``ngram`` method against ``PromptLookupDraft(rule="vllm")``: the same tokens, the same drafts and the same
accepted counts per position, through ``speculative_generate`` and through ``Engine``; on the embedded target
(byte-level code, which repeats itself often) and on SmolLM2-135M (the issue's real checkpoint, plain and ngram).

Away from the model's maximum length only: within K tokens of it vLLM's runner replaces every request's drafts in
the batch by K zero tokens (gpu_model_runner.py, ``_input_fits_in_drafter``), which no proposer rule reproduces
(docs/VLLM.md).
"""

import pytest
import vllm_lane as lane

import minispec

pytestmark = pytest.mark.vllm

K, MAX_N, MIN_N = 4, 4, 2  # vLLM: num_speculative_tokens, prompt_lookup_max, prompt_lookup_min


def padded(counts, k=K):
    return list(counts) + [0] * (k - len(counts))


def both_engines(target, prompts, new, v_counts, rule="vllm"):
    """minispec's counts through speculative_generate and Engine with the given rule, and vLLM's; tokens too."""
    draft = minispec.PromptLookupDraft(MAX_N, MIN_N, rule=rule)
    out = minispec.speculative_generate(target, draft, prompts, gamma=K, max_new_tokens=new)
    engine = minispec.Engine(target, draft, gamma=K)
    served = engine.run([minispec.Request(p, max_new_tokens=new) for p in prompts])
    got = [(s.num_drafts, padded(s.accepted_per_position)) for s in (out.stats, engine.stats)]
    return out.tokens, [o.tokens for o in served], got, (v_counts["num_drafts"], v_counts["accepted_per_position"])


@pytest.fixture(scope="module")
def pair_target():
    return minispec.load("tiny-code-target")[0]


def test_embedded_target_ngram_counts_are_vllms(pair_target, llms):
    llm = llms.get(**lane.PAIR, speculative_config=lane.ngram(K, MAX_N, MIN_N))
    prompts = lane.heldout(8)
    tokens, v = lane.generate(llm, prompts, 48)
    assert tokens == minispec.generate(pair_target, prompts, max_new_tokens=48).tokens
    assert 0 < v["accepted_tokens"] < v["draft_tokens"], v
    spec, served, got, want = both_engines(pair_target, prompts, 48, v)
    assert spec == tokens and served == tokens
    assert got == [want, want]
    _, _, latest, _ = both_engines(pair_target, prompts, 48, v, rule="latest")
    assert latest != [want, want]  # the default rule is another rule: this comparison can tell them apart


@pytest.fixture(scope="module")
def smollm2():
    if not (lane.SMOLLM2 / "config.json").is_file():
        pytest.skip(f"SmolLM2-135M-Instruct is not fetched ({lane.SMOLLM2}): run minispec fetch smollm2")
    target, tok = minispec.load("smollm2-135m-instruct")
    text = (lane.ASSETS / "code_heldout.txt").read_text()
    prompts = [tok.encode(text[i : i + 400])[:64] for i in (0, 3000, 9000, 15000)]  # held-out code, 64 tokens each
    return target, prompts


NEW = 32


def test_smollm2_greedy_tokens_are_equal(smollm2, llms):
    target, prompts = smollm2
    llm = llms.get(model=str(lane.SMOLLM2), skip_tokenizer_init=True)
    tokens, _ = lane.generate(llm, prompts, NEW)
    assert tokens == minispec.generate(target, prompts, max_new_tokens=NEW).tokens


def test_smollm2_ngram_tokens_and_counts_are_vllms(smollm2, llms):
    target, prompts = smollm2
    llm = llms.get(model=str(lane.SMOLLM2), skip_tokenizer_init=True, speculative_config=lane.ngram(K, MAX_N, MIN_N))
    tokens, v = lane.generate(llm, prompts, NEW)
    assert 0 < v["accepted_tokens"] < v["draft_tokens"], v
    spec, served, got, want = both_engines(target, prompts, NEW, v)
    assert spec == tokens and served == tokens
    assert got == [want, want]
