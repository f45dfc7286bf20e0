"""The vLLM lane's helpers: one ``vllm.LLM`` at a time, token-id prompts, vLLM's spec-decode counters read as deltas,
each request's tokens per engine step, and the statistics both engines' outputs are judged by.

Nothing here imports vLLM at module level: the main environment collects tests/vllm/ and skips it (conftest.py).

Notation (Leviathan et al. 2023): p = the target's sampling distribution, q = the draft's, gamma = K = draft tokens
per step, beta(c) = sum_x min(p(x|c), q(x|c)) = the chance that the draft token at context c is accepted.
"""

from __future__ import annotations

import gc
import itertools
import math
import os
from pathlib import Path

import torch

import minispec
from minispec.decoding.sampling import SamplingParams, probabilities
from minispec.model.load import default_cache_dir

ASSETS = Path(minispec.__file__).parent / "assets"
TARGET, DRAFT, EAGLE = (str(ASSETS / n) for n in ("tiny-code-target", "tiny-code-draft", "tiny-code-eagle"))
SMOLLM2 = default_cache_dir() / "smollm2-135m-instruct"
TV_PROMPT = b"        self"  # a short prompt whose first two tokens' law has a small support ("." and a letter)
SPAWN = os.environ.get("MINISPEC_VLLM_SPAWN") == "1"  # vLLM's default: the engine core in a spawned process

# Every LLM: float32 as minispec, no torch.compile or graphs, the counters on; the engine core in this process unless
# MINISPEC_VLLM_SPAWN=1 (conftest.py sets VLLM_ENABLE_V1_MULTIPROCESSING to match), which saves two process starts
# (two imports of torch and vLLM, 40-80 s on a loaded 2-core machine) per LLM.
COMMON = dict(dtype="float32", enforce_eager=True, disable_log_stats=False, seed=0)
if not SPAWN:
    COMMON["distributed_executor_backend"] = "uni"
PAIR = dict(model=TARGET, skip_tokenizer_init=True, max_model_len=512)  # byte-level: token ids in, token ids out


def draft_model(k: int, draft: str = DRAFT) -> dict:
    """vLLM's speculative_config for a draft model proposing k tokens, sampled from q (not argmax) when T > 0."""
    return {"method": "draft_model", "model": draft, "num_speculative_tokens": k,
            "draft_sample_method": "probabilistic"}


def ngram(k: int, max_n: int, min_n: int) -> dict:
    return {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": max_n, "prompt_lookup_min": min_n}


class OneLLM:
    """Holds one ``vllm.LLM`` at a time (memory is shared): asking for another configuration shuts the current one
    down first; asking for the same one again returns it (start-up is the lane's main cost)."""

    def __init__(self):
        self.key, self.llm = None, None

    def get(self, **kwargs):
        from vllm import LLM

        key = repr(sorted(kwargs.items()))
        if key != self.key:
            self.close()
            self.llm, self.key = LLM(**COMMON, **kwargs), key
        return self.llm

    def close(self):
        if self.llm is not None:
            self.llm.llm_engine.engine_core.shutdown()
            self.llm = self.key = None
            gc.collect()


def counters(llm) -> dict:
    """vLLM's cumulative spec-decode counters: drafts, draft tokens, accepted tokens, accepted per position."""
    names = {"vllm:spec_decode_num_drafts": "num_drafts", "vllm:spec_decode_num_draft_tokens": "draft_tokens",
             "vllm:spec_decode_num_accepted_tokens": "accepted_tokens",
             "vllm:spec_decode_num_accepted_tokens_per_pos": "accepted_per_position"}
    out = {"num_drafts": 0, "draft_tokens": 0, "accepted_tokens": 0, "accepted_per_position": []}
    for m in llm.get_metrics():
        if m.name in names:
            out[names[m.name]] = list(m.values) if hasattr(m, "values") else int(m.value)
    return out


def delta(before: dict, after: dict) -> dict:
    """The counters of what ran between two readings (vLLM's are cumulative over the LLM's life)."""
    d = {k: after[k] - before[k] for k in ("num_drafts", "draft_tokens", "accepted_tokens")}
    b = before["accepted_per_position"] or [0] * len(after["accepted_per_position"])
    d["accepted_per_position"] = [y - x for x, y in zip(b, after["accepted_per_position"])]
    return d


def params(max_tokens: int, temperature: float = 0.0, top_p: float | None = None, seeds=None, n: int = 1):
    """One vllm.SamplingParams per request: token ids out, EOS ignored as minispec does without an eos_token_id.
    The lane leaves vLLM's requests unseeded (its global generator, seeded by LLM(seed=0), draws for them): on the CPU
    a seeded request whose prefill is split across steps (chunked prefill) crashes vLLM 0.32's runner, which rewinds
    the request's generator with ``gen.set_offset(gen.get_offset() - 4)`` ("CPU Generator does not use offset")."""
    from vllm import SamplingParams as VP

    seeds = seeds if seeds is not None else [None] * n
    return [VP(max_tokens=max_tokens, temperature=temperature, top_p=1.0 if top_p is None else top_p, seed=s,
               detokenize=False, ignore_eos=True) for s in seeds]


def generate(llm, prompts, max_tokens, temperature=0.0, top_p=None, seeds=None):
    """vLLM's tokens for each prompt, and the spec-decode counters of this call alone."""
    from vllm.inputs import TokensPrompt

    sp = params(max_tokens, temperature, top_p, seeds, len(prompts))
    before = counters(llm)
    outs = llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p in prompts], sp, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs], delta(before, counters(llm))


_ids = itertools.count()


def step_chunks(llm, prompts, max_tokens, temperature=0.0, top_p=None, seeds=None):
    """Each request's tokens as the engine steps gave them (DELTA outputs, one engine step per ``step()``): the first
    chunk is the prefill's token, each later one a speculative step's accepted draft tokens and the target's own."""
    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import RequestOutputKind

    engine = llm.llm_engine
    ids = [f"lane-{next(_ids)}" for _ in prompts]
    for rid, p, sp in zip(ids, prompts, params(max_tokens, temperature, top_p, seeds, len(prompts))):
        sp.output_kind = RequestOutputKind.DELTA
        engine.add_request(rid, TokensPrompt(prompt_token_ids=list(p)), sp)
    chunks = {rid: [] for rid in ids}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.outputs and out.outputs[0].token_ids:
                chunks[out.request_id].append(list(out.outputs[0].token_ids))
    return [chunks[rid] for rid in ids]


def chunk_flags(chunks: list[list[int]], k: int) -> list[bool | None]:
    """Per output token, from one request's step chunks at draft length k: True an accepted draft token, False a
    token the target drew after a rejection (its position was tested), None not tested (the prefill's token, a bonus
    token after k accepted) or not known: the last token, which max_tokens may have cut from a longer step (a rule
    that reads only the position, never the outcome, so the accepted ones left stay a fair sample)."""
    flags = [None] * len(chunks[0])
    for c in chunks[1:]:
        m = len(c) - 1  # accepted draft tokens; then the target's token
        flags += [True] * m + [None if m >= k else False]
    return flags[:-1] + [None]


def output_flags(accepted: list[bool], k: int) -> list[bool | None]:
    """The same from minispec's per-token ``accepted`` marks at a fixed draft length k (every step proposes k)."""
    flags, run = [None], 0  # token 0: the prefill's
    for a in accepted[1:]:
        if a:
            flags.append(True)
            run += 1
        else:
            flags.append(None if run == k else False)
            run = 0
    return flags[:-1] + [None]


# --- the target's law and the acceptance rate, judged the same way for both engines --------------------------------


@torch.inference_mode()
def distributions(model, prompt: list[int], out: list[int], sp: SamplingParams) -> torch.Tensor:
    """The sampling distribution (T, V) the model gives each of the T output positions of prompt + out."""
    ids = torch.tensor([list(prompt) + list(out)])  # (1, P + T)
    logits = model(ids)[0, len(prompt) - 1 : -1]  # (T, V) the logits that chose each output token
    return probabilities(logits, sp)  # (T, V)


def law(target, prompts, outs, sp: SamplingParams) -> dict:
    """How far an engine's sampled outputs are from the target's law, by one statistic: under the law, log p(x_t) at
    each output position has mean -H(p_t) given the past, so D = sum_t (log p(x_t) + H_t) is a martingale with
    variance sum_t Var_t (Var_t = sum_x p log^2 p - H_t^2). Returns mean log p, mean entropy, z = D / sqrt(var) and
    the tokens the target gives probability 0 (which a correct sampler never draws)."""
    logp, ent, var, impossible = [], [], [], 0
    for prompt, out in zip(prompts, outs):
        p = distributions(target, prompt, out, sp).double()  # (T, V)
        lp = torch.where(p > 0, p.log(), torch.zeros_like(p))  # (T, V) 0 where p = 0 (0 log 0 = 0)
        chosen = p.gather(1, torch.tensor(out)[:, None])[:, 0]  # (T,)
        impossible += int((chosen == 0).sum())
        h = -(p * lp).sum(1)  # (T,)
        logp += lp.gather(1, torch.tensor(out)[:, None])[:, 0].tolist()
        ent += h.tolist()
        var += ((p * lp * lp).sum(1) - h * h).clamp_min(0).tolist()
    n = len(logp)
    z = (sum(logp) + sum(ent)) / math.sqrt(sum(var))
    return {"n": n, "mean_logp": sum(logp) / n, "mean_entropy": sum(ent) / n, "z": z, "impossible": impossible}


def acceptance(target, draft, prompts, outs, flags, sp_p: SamplingParams, sp_q: SamplingParams) -> dict:
    """Accepted draft tokens against their expectation: at a tested position with context c the draft token is
    accepted with probability beta(c) = sum_x min(p(x|c), q(x|c)), whatever happened before, so accepted - sum beta
    over the tested positions has mean 0 and variance sum beta (1 - beta). ``sp_q``: how the draft's q is warped
    (minispec: as p; vLLM: temperature only)."""
    accepted = tested = 0
    expected = var = 0.0
    for prompt, out, fl in zip(prompts, outs, flags):
        t = [i for i, f in enumerate(fl) if f is not None]
        if not t:
            continue
        p, q = distributions(target, prompt, out, sp_p), distributions(draft, prompt, out, sp_q)  # (T, V) each
        beta = torch.minimum(p, q).sum(1).double()[t]  # (tested,)
        accepted += sum(1 for i in t if fl[i])
        tested += len(t)
        expected += float(beta.sum())
        var += float((beta * (1 - beta)).sum())
    return {"accepted": accepted, "tested": tested, "rate": accepted / tested, "expected_rate": expected / tested,
            "z": (accepted - expected) / math.sqrt(var)}


@torch.inference_mode()
def exact_two(target, prompt: list[int], sp: SamplingParams) -> torch.Tensor:
    """The target's exact law of the first two output tokens (V * V,), index t1 * V + t2."""
    p1 = probabilities(target(torch.tensor([prompt]))[0, -1], sp)  # (V,) the first token's law
    V = p1.shape[0]
    seqs = torch.cat([torch.tensor([prompt] * V), torch.arange(V)[:, None]], 1)  # (V, P + 1)
    p2 = probabilities(target(seqs)[:, -1], sp)  # (V, V) the second token's law after each first
    return (p1[:, None] * p2).flatten().double()  # (V * V,)


def tv(samples: list[list[int]], exact: torch.Tensor, V: int) -> float:
    """Total variation between the empirical law of the first two tokens of ``samples`` and ``exact`` (V * V,)."""
    idx = torch.tensor([s[0] * V + s[1] for s in samples])
    freq = torch.bincount(idx, minlength=V * V).double() / len(samples)
    return 0.5 * float((freq - exact).abs().sum())


def tv_bound(exact: torch.Tensor, n: int, sims: int = 400, seed: int = 0) -> float:
    """The largest TV of ``sims`` samples of n draws from ``exact`` itself: what a correct sampler's TV stays under
    (a quantile of about 1 - 1 / sims)."""
    g = torch.Generator().manual_seed(seed)
    V2 = exact.shape[0]
    worst = 0.0
    for _ in range(sims):
        draws = torch.multinomial(exact.float(), n, replacement=True, generator=g)
        freq = torch.bincount(draws, minlength=V2).double() / n
        worst = max(worst, 0.5 * float((freq - exact).abs().sum()))
    return worst


def heldout(n: int, length: int = 64) -> list[list[int]]:
    """n byte-level prompts of ``length`` bytes, each from the start of a line, spread over the held-out code (text
    neither model was trained on, so acceptance is neither 0 nor 1)."""
    text = (ASSETS / "code_heldout.txt").read_bytes()
    lines = [i + 1 for i in range(len(text) - length - 1) if text[i] == 10 and text[i + 1] != 10]
    picks = [lines[round(j * (len(lines) - 1) / max(n - 1, 1))] for j in range(n)]
    return [list(text[s : s + length]) for s in picks]


def fix_expand() -> None:
    """MINISPEC_VLLM_FIX_EXPAND=1 (conftest.py): the CPU shim behind the rejection sampler's expand_batch_to_tokens
    writes its result back in the caller's dtype (what vllm#55006 proposes), in this process: the engine core's too
    when it runs here. The expected failures that name the shim then pass, and strict xfail reports them."""
    import vllm._custom_ops  # noqa: F401 vLLM's C++ operators
    from vllm.utils import cpu_triton_utils
    from vllm.v1.sample import rejection_sampler

    def expand_kernel_impl(output, input_val, cu_num_tokens, replace_from, replace_to, MAX_NUM_TOKENS=None):  # noqa: N803
        counts = torch.diff(cu_num_tokens.long(), prepend=cu_num_tokens.new_zeros(1).long())  # (B,)
        vals = torch.where(input_val == replace_from, torch.as_tensor(replace_to, dtype=input_val.dtype), input_val)
        output[: int(counts.sum())] = vals.repeat_interleave(counts)  # (N,) in output's own dtype

    def expand_batch_to_tokens(x, cu_num_tokens, num_tokens, replace_from=0, replace_to=0):
        out = x.new_empty(num_tokens)  # (N,)
        expand_kernel_impl(out, x, cu_num_tokens, replace_from, replace_to)
        return out

    cpu_triton_utils._expand_kernel_impl = expand_kernel_impl
    rejection_sampler.expand_batch_to_tokens = expand_batch_to_tokens
