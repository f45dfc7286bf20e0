"""Why vLLM's sampled speculation leaves the target's law on its CPU build: the smallest reproduction.

Run it in the vLLM lane's environment (bash scripts/vllm_env.sh):

    . .venv-vllm/bin/activate
    python scripts/vllm_sampled_repro.py              # the shim alone, then the target drafting for itself
    python scripts/vllm_sampled_repro.py --trace      # ... and what the rejection sampler sees, step by step
    python scripts/vllm_sampled_repro.py --fix        # the same with the shim's output written back: all accepted
    python scripts/vllm_sampled_repro.py --spawn      # vLLM's default engine-core process (no --trace, no --fix)

1. The shim. Without a Triton CPU backend, vLLM 0.32's CPU platform replaces the rejection sampler's Triton kernels
   by C++ ones (vllm/platforms/cpu.py, register_triton_kernel_overrides). The one behind expand_batch_to_tokens,
   vllm/utils/cpu_triton_utils.py's _expand_kernel_impl, passes _ensure_int64(output) to an int64-only kernel. For an
   output that is not int64 that is a new tensor; the kernel fills it and it is dropped, unlike every sibling shim,
   which copies back. expand_batch_to_tokens allocates its output with x.new_empty, so the float32 temperature
   (and top-p, and the int32 top-k) it returns is whatever the allocator left there.
2. The effect. apply_sampling_constraints (vllm/v1/sample/rejection_sampler.py) divides the target's logits at the
   draft positions by that tensor, so the p the rejection sampler tests draft tokens against is softmax(logits /
   garbage): near one-hot, or NaN when the garbage is 0. Greedy requests never reach it (all_greedy returns before),
   nor does plain sampling (vLLM's Sampler does not expand). With the target as its own draft (q = p), every draft
   token must be accepted; vLLM accepts a few percent.
Upstream: vllm-project/vllm#55005 (open), fix proposed in #55006.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

ASSETS = Path(__file__).resolve().parent.parent / "minispec" / "assets"
TARGET = str(ASSETS / "tiny-code-target")
PROMPT = list(b"        for (i, row) in enumerate(self.")  # byte-level tokens: the embedded target's vocabulary


def shim() -> None:
    """Step 1 alone: the CPU shim on three requests' temperatures (2, 3 and 1 draft tokens)."""
    import torch
    import vllm._custom_ops  # noqa: F401 loads vLLM's C++ operators, as its CPU worker does
    from vllm.utils.cpu_triton_utils import _expand_kernel_impl

    cu = torch.tensor([2, 5, 6], dtype=torch.int32)
    for x in (torch.tensor([0.7, 1.0, 0.5]), torch.tensor([5, 7, 9]), torch.tensor([5, 7, 9], dtype=torch.int32)):
        out = x.new_empty(6)
        _expand_kernel_impl(out, x, cu, 0, 1)
        print(f"expand {x.tolist()} ({x.dtype}): {out.tolist()}; expected "
              f"{x.repeat_interleave(torch.tensor([2, 3, 1])).tolist()}")


def fixed_expand_batch_to_tokens(x, cu_num_tokens, num_tokens, replace_from=0, replace_to=0):
    """expand_batch_to_tokens as the Triton kernel computes it, in x's dtype (what vllm#55006 does in the shim)."""
    import torch

    counts = torch.diff(cu_num_tokens.long(), prepend=cu_num_tokens.new_zeros(1).long())
    vals = torch.where(x == replace_from, torch.as_tensor(replace_to, dtype=x.dtype), x)
    out = x.new_zeros(num_tokens)
    out[: int(counts.sum())] = vals.repeat_interleave(counts)
    return out


def trace() -> None:
    """At every speculative step: the expanded temperature, then p(x), q(x) and the uniform u of each draft token
    (x is kept while u <= p(x) / q(x)), and the tokens the step kept."""
    import torch
    from vllm.v1.sample import rejection_sampler as rs

    expand, sample, uniforms = rs.expand_batch_to_tokens, rs.rejection_sample, rs.generate_uniform_probs

    def traced_uniforms(*a, **k):
        u = uniforms(*a, **k)
        print(f"  u {[round(v, 4) for v in u.tolist()]}")
        return u

    def traced_expand(x, cu, n, replace_from=0, replace_to=0):
        out = expand(x, cu, n, replace_from, replace_to)
        print(f"  expand({x.tolist()}) -> {out.tolist()}")
        return out

    def traced_sample(draft_ids, num_draft, max_spec, cu, draft_probs, target_logits, bonus, meta, *a, **k):
        p = target_logits.softmax(-1, dtype=torch.float32)  # the p the kernel tests against (logits / temperature)
        rows = torch.arange(len(draft_ids))
        q = draft_probs[rows, draft_ids.long()] if draft_probs is not None else torch.ones(len(draft_ids))
        print(f"  draft tokens {draft_ids.tolist()}: p(x) {[round(v, 4) for v in p[rows, draft_ids.long()].tolist()]}"
              f" q(x) {[round(v, 4) for v in q.tolist()]}")
        out = sample(draft_ids, num_draft, max_spec, cu, draft_probs, target_logits, bonus, meta, *a, **k)
        print(f"  kept {[t for t in out[0].tolist() if t >= 0]}")
        return out

    rs.expand_batch_to_tokens, rs.rejection_sample, rs.generate_uniform_probs = traced_expand, traced_sample, \
        traced_uniforms


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", action="store_true", help="print what the rejection sampler sees (in-process only)")
    ap.add_argument("--fix", action="store_true", help="write the expansion back in x's dtype (in-process only)")
    ap.add_argument("--spawn", action="store_true", help="vLLM's default: the engine core in a process of its own")
    ap.add_argument("--tokens", type=int, default=16)
    args = ap.parse_args()
    if args.spawn and (args.trace or args.fix):
        ap.error("--trace and --fix patch this process, so they need the engine core in it (leave out --spawn)")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    if not args.spawn:
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    import torch

    torch.set_num_threads(1)  # vLLM binds this process's OpenMP threads to one core when its worker runs here
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.v1.sample import rejection_sampler as rs

    print("1. the CPU shim behind expand_batch_to_tokens")
    shim()
    if args.fix:
        rs.expand_batch_to_tokens = fixed_expand_batch_to_tokens
    if args.trace:
        trace()
    llm = LLM(model=TARGET, skip_tokenizer_init=True, max_model_len=512, dtype="float32", enforce_eager=True,
              disable_log_stats=False, seed=0, **({} if args.spawn else {"distributed_executor_backend": "uni"}),
              speculative_config={"method": "draft_model", "model": TARGET, "num_speculative_tokens": 3,
                                  "draft_sample_method": "probabilistic"})
    print("2. the target drafting for itself (q = p), 3 tokens a step, one prompt,", args.tokens, "tokens",
          "(--fix: expansion written back)" if args.fix else "")
    for temperature in (0.0, 1.0):
        print(f" temperature {temperature}")
        before = {m.name: getattr(m, "value", 0) for m in llm.get_metrics()}
        llm.generate([TokensPrompt(prompt_token_ids=PROMPT)], SamplingParams(
            max_tokens=args.tokens, temperature=temperature, detokenize=False, ignore_eos=True), use_tqdm=False)
        after = {m.name: getattr(m, "value", 0) for m in llm.get_metrics()}
        acc, drafted = (after[f"vllm:spec_decode_num_{n}"] - before.get(f"vllm:spec_decode_num_{n}", 0)
                        for n in ("accepted_tokens", "draft_tokens"))
        print(f" accepted {acc} of {drafted} draft tokens ({acc / drafted:.2f}; q = p, so it must be 1.00)")
    llm.llm_engine.engine_core.shutdown()


if __name__ == "__main__":
    main()
