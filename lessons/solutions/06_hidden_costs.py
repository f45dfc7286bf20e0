"""Worked solutions to the exercises of lesson 06, hidden costs.

Run from the repository root: ``python lessons/solutions/06_hidden_costs.py``.
Every number a solution claims is asserted; nothing compares two wall-clock times.
"""

import torch

import minispec
from minispec import H100_SXM, roofline
from minispec.course.models import course_models
from minispec.tools import bench

T8B, D1B, GAMMA = roofline.LLAMA_8B, roofline.LLAMA_1B, 4
MAX_NUM_SEQS = 1024  # vLLM's default max_num_seqs on a GPU of >= 70 GiB that is not an A100 (as in the lesson)


def full_memory_tps(context, draft=None, window=None, alpha=0.8):
    """The lesson's function: rows and tokens/s of the whole server at the largest batch that fits and vLLM runs."""
    B = min(MAX_NUM_SEQS, roofline.max_batch(H100_SXM, T8B, context, draft, draft_kv_window=window))
    if draft is None:
        return B, B / roofline.step_time(B, 1, H100_SXM, T8B, context)
    step = roofline.speculative_step_time(B, GAMMA, hardware=H100_SXM, model=T8B, context=context, draft=draft,
                                          draft_kv_window=window)
    return B, B * roofline.expected_tokens(alpha, GAMMA) / step


def exercise_1():
    """A draft that keeps only the last 512 tokens of KV: most of the rows come back, and its steps get cheaper."""
    print("Exercise 1: the 1B draft with a 512-token KV window, 4096 tokens of context, H100")
    (b0, plain), (b1, full), (b2, windowed) = (full_memory_tps(4096), full_memory_tps(4096, D1B),
                                               full_memory_tps(4096, D1B, 512))
    print(f"  plain {b0} rows {plain:.0f} tok/s; 1B draft {b1} rows {full:.0f} tok/s; with the window {b2} rows "
          f"{windowed:.0f} tok/s")
    c_full, c_win = (roofline.modelled_draft_cost(b, D1B, context=4096, draft_kv_window=w) for b, w in ((b1, None),
                                                                                                      (b2, 512)))
    print(f"  c at full memory: {c_full:.3f} with all 4096 tokens of draft KV, {c_win:.3f} with 512")
    assert (b0, b1, b2) == (104, 79, 96)  # 17 of the 25 lost rows come back
    assert windowed > full > plain and round(windowed / plain, 2) == 2.37 and c_win < c_full
    print("  The draft's KV per row shrinks 8x, so most of the rows come back, and each draft step reads 8x less KV.")
    print("  Not modelled: a draft that sees only 512 tokens may accept less; measure alpha before trusting this.")


def row_waste(stats, gamma):
    """Share of drafted tokens rejected; target positions scored by running rows per emitted token."""
    emitted = stats.num_output_tokens - stats.batch_size
    return 1 - stats.acceptance_rate, stats.num_drafts * (gamma + 1) / emitted


def exercise_2(m):
    """A longer draft wastes more: every token after the first rejection is thrown away, and there are more of them."""
    print(f"Exercise 2: part 1 with gamma 2, 4 and 8 ({m['name']}, greedy)")
    tokens = m["tokenizer"].encode(m["code"]) if m["tokenizer"] else None  # random weights: random ids
    prompts = bench.prompts_for(8, 64, m["target"].config.vocab_size, tokens)  # the lesson's prompts
    waste = {}
    for gamma in (2, 4, 8):
        s = minispec.speculative_generate(m["target"], m["draft"], prompts, gamma=gamma, max_new_tokens=64,
                                          rule=m["rule"], seed=0).stats
        waste[gamma] = row_waste(s, gamma)
        E = roofline.expected_tokens(s.alpha_estimate, gamma)
        print(f"  gamma {gamma}: {waste[gamma][0]:.0%} of drafted tokens rejected, {waste[gamma][1]:.2f} target "
              f"positions per token (alpha {s.alpha_estimate:.2f}: i.i.d. model {1 - (E - 1) / gamma:.0%} and "
              f"{(gamma + 1) / E:.2f})")
    assert waste[2][0] < waste[4][0] < waste[8][0] and waste[2][1] < waste[4][1] < waste[8][1]
    iid = {g: (g + 1) / roofline.expected_tokens(0.75, g) for g in (2, 4, 8)}
    assert iid[2] < iid[4] < iid[8]  # (gamma + 1) / E grows with gamma whenever alpha < 1
    print("  Token k is kept only if it and the k - 1 before it are accepted (alpha^k), yet it is drafted and")
    print("  scored in every step: each extra position adds a full cost and a shrinking expected gain.")


def exercise_3(m):
    """Prompt lookup reads nothing before the first token. minispec's layer-skip draft reads the prompt again
    through its N layers, because minispec gives it a cache of its own; that is minispec's choice, not the
    method's. LayerSkip (Elhoushi et al. 2024) shares the target's cache for those layers, which the target's
    prefill has just filled, and verifies by running only the remaining layers: it adds nothing to TTFT either."""
    print("Exercise 3: forward passes before the first token, by draft")
    target, tokens = m["target"], m["tokenizer"].encode(m["code"]) if m["tokenizer"] else None
    prompts = bench.prompts_for(2, 384, target.config.vocab_size, tokens)
    calls = []
    hook = target.register_forward_pre_hook(
        lambda mod, args, kwargs: calls.append((args[0].numel(), kwargs.get("num_layers"))), with_kwargs=True)
    found = {}
    for name, draft in (("prompt lookup", minispec.PromptLookupDraft()), ("layer skip, 1 layer",
                                                                           minispec.LayerSkipDraft(target, 1))):
        calls.clear()
        minispec.speculative_generate(target, draft, prompts, gamma=GAMMA, max_new_tokens=1)
        found[name] = list(calls)
        print(f"  {name}: target forward passes (tokens, layers): {calls}")
    hook.remove()
    assert found["prompt lookup"] == [(768, None)]  # the target's prefill only: TTFT as plain decoding's
    assert found["layer skip, 1 layer"] == [(768, None), (768, 1)]  # the prompt again, through the first layer
    L = target.config.num_hidden_layers
    print("  Prompt lookup has no model and no cache: it adds nothing before the first token. minispec's layer skip")
    print("  shares the target's weights but keeps a cache of its own, so it re-reads every prompt token through 1 of")
    print(f"  {L} layers. LayerSkip itself shares the target's cache (filled by the prefill) and adds nothing here.")


if __name__ == "__main__":
    models = course_models()  # the lesson's device and pair
    if models["device"].type == "cpu":
        torch.set_num_threads(1)
    alpha = models["synthetic_alpha"]  # random GPU weights: the lesson's stated synthetic acceptance, as it runs them
    models["rule"] = minispec.accept_reject if alpha is None else bench.SyntheticAcceptance(alpha)
    exercise_1()
    exercise_2(models)
    exercise_3(models)
