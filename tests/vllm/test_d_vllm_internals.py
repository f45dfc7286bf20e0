"""vLLM's own functions, called directly (no engine): its n-gram proposer against PromptLookupDraft(rule="vllm"), and
the CPU shim that makes its sampled speculation leave the target's law (docs/VLLM.md)."""

import random
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from test_b_pair_draft_model import CAUSE

import minispec
from minispec.decoding.plain import DecodeState
from minispec.decoding.sampling import Sampler, SamplingParams

pytestmark = pytest.mark.vllm


def test_prompt_lookup_rule_vllm_proposes_what_vllms_ngram_proposer_does():
    """vLLM's ``_find_longest_matched_ngram_and_propose_tokens`` (the numba function its ``ngram`` method runs per
    request) and minispec's rule="vllm" on 600 random rows over small alphabets (many repeats and overlaps), ragged
    in one batch, across n-gram ranges, draft lengths and a maximum length the rows reach."""
    from vllm.v1.spec_decode.ngram_proposer import _find_longest_matched_ngram_and_propose_tokens as vllm_propose

    rng = random.Random(0)
    differ = 0
    for k, max_n, min_n, max_len, alphabet in [(4, 4, 2, 512, 3), (3, 3, 1, 40, 4), (5, 5, 3, 512, 2),
                                              (1, 2, 1, 512, 5), (6, 1, 1, 36, 3), (4, 8, 2, 33, 2)]:
        rows = [[rng.randrange(alphabet) for _ in range(rng.randrange(1, min(max_len, 40) + 1))] for _ in range(100)]
        want = [vllm_propose(np.array(r, dtype=np.int32), min_n, max_n, max_len, k).tolist() for r in rows]
        target = SimpleNamespace(config=SimpleNamespace(vocab_size=alphabet, max_position_embeddings=max_len))
        state = DecodeState(rows, 1, [], "cpu", slack=k + 1)
        draft = minispec.PromptLookupDraft(max_n, min_n, rule="vllm")
        x, q, _ = draft.start(target, state, Sampler(SamplingParams(), None, len(rows), "cpu")).propose(state, k)
        got = [x[b, : int(q.proposed[b].sum())].tolist() for b in range(len(rows))]
        assert got == want, (k, max_n, min_n, max_len)
        latest = minispec.PromptLookupDraft(max_n, min_n).start(target, state, None).propose(state, k)
        differ += sum(latest.x[b, : int(latest.q.proposed[b].sum())].tolist() != want[b] for b in range(len(rows)))
    assert differ > 50  # the default rule would fail this test


def _expand(x: torch.Tensor) -> torch.Tensor:
    """expand_batch_to_tokens (vllm/v1/sample/rejection_sampler.py) with the kernel vLLM's CPU platform registers in
    place of the Triton one (vllm/platforms/cpu.py, register_triton_kernel_overrides): an output tensor of x's dtype
    from ``x.new_empty``, filled by the shim."""
    import vllm._custom_ops  # noqa: F401 loads vLLM's C++ operators (torch.ops._C), as its CPU worker does
    from vllm.utils.cpu_triton_utils import _expand_kernel_impl

    cu = torch.tensor([2, 5, 6], dtype=torch.int32)  # three requests proposing 2, 3 and 1 draft tokens
    out = x.new_empty(6)
    _expand_kernel_impl(out, x, cu, 0, 1, MAX_NUM_TOKENS=128)  # replace 0 (greedy's temperature) by 1
    return out


def test_the_cpu_expand_shim_works_for_int64():
    """The C++ kernel behind the shim expands int64 tensors correctly: what goes wrong is the dtype round trip."""
    assert _expand(torch.tensor([5, 7, 9])).tolist() == [5, 5, 7, 7, 7, 9]


@pytest.mark.xfail(strict=True, raises=AssertionError, reason=CAUSE)
@pytest.mark.parametrize("x", [torch.tensor([0.7, 1.0, 0.5]), torch.tensor([0.9, 0.95, 1.0]),
                               torch.tensor([5, 7, 9], dtype=torch.int32)], ids=["temperature", "top_p", "top_k"])
def test_the_cpu_expand_shim_fills_the_callers_tensor(x):
    """apply_sampling_constraints expands each request's temperature (float32), top-p (float32) and top-k (int32) to
    its draft tokens with this call before dividing the target's logits by the temperature."""
    assert _expand(x).tolist() == x.repeat_interleave(torch.tensor([2, 3, 1])).tolist()
