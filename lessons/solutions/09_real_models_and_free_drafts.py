"""Worked solutions to the exercises of lesson 09, real models and free drafts.

Run from the repository root: ``python lessons/solutions/09_real_models_and_free_drafts.py``.
It needs SmolLM2-135M-Instruct in minispec's cache (``minispec fetch smollm2``, once); without it, it says so
and exits. It runs where the lesson runs: on a GPU in bfloat16 (the lesson's SmolLM2 cells on a GPU without a cached
pair), else on the CPU in float32. Every number a solution claims is asserted; nothing compares two wall-clock
times. The replay's counts equal the loop's exactly in float32; in bfloat16 a verify pass and a decode pass can
round a near-tie apart (lesson 00), so that one check runs in float32 only.
"""

import dataclasses
import sys

import torch
import torch.nn.functional as F

import minispec
from minispec import roofline
from minispec.roofline import hardware
from minispec.tools.steps import measure_step_time

GAMMA, NEW_TOKENS, CONTEXT = 4, 32, 0  # as in the lesson (CONTEXT: KV tokens per row in the roofline)
H100 = hardware.H100_SXM
PASSAGE = ("Speculative decoding speeds up the inference of large language models. A small draft model proposes "
           "several tokens, and the large target model checks all of them in one forward pass. Tokens the target "
           "agrees with are kept; at the first disagreement the target's own token is used instead, so the output "
           "follows exactly the distribution of the target model.")
TASKS = {"copy": f"Repeat this paragraph word for word:\n\n{PASSAGE}", "free": "Why is the sky blue?"}


def chat(tok, text: str) -> list[int]:
    msgs = [{"role": "user", "content": text}]
    return tok.encode(tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True),
                      add_special_tokens=False)


def bf16(shape: roofline.ModelShape) -> roofline.ModelShape:
    return dataclasses.replace(shape, bytes_per_param=2, bytes_per_kv=2)


def replay(prompt, output, limit, gamma=GAMMA, max_ngram=3, min_ngram=1):
    """Greedy prompt lookup replayed over the plain greedy ``output`` up to ``limit`` new tokens.

    Returns the counts ``speculative_generate`` reports: (steps, drafts, proposed, accepted). ``output`` must run
    ``gamma`` tokens past ``limit`` (unless it ended): the loop counts the draft tokens a row's last step accepts
    even where the step is cut at ``max_new_tokens``.
    """
    seq, done = list(prompt) + output[:1], 1  # the first token comes from the prefill
    steps = drafts = proposed = accepted = 0
    while done < min(limit, len(output)):
        x = []
        for n in range(max_ngram, min_ngram - 1, -1):  # the longest n-gram with an earlier occurrence wins
            starts = [i for i in range(len(seq) - n) if seq[i : i + n] == seq[-n:]]
            if starts:
                x = seq[starts[-1] + n :][:gamma]  # what followed its most recent occurrence
                break
        k = 0  # greedy: accepted while the proposal is the target's own next token
        while k < len(x) and done + k < len(output) and x[k] == output[done + k]:
            k += 1
        gain = min(k + 1, limit - done)
        seq += output[done : done + gain]
        done += gain
        steps, drafts, proposed, accepted = steps + 1, drafts + bool(x), proposed + len(x), accepted + k
    return steps, drafts, proposed, accepted


def exercise_1a(model, tok, prompts, outputs):
    """Longer n-grams find the right place to copy from; on free text no setting pays, but long ones propose less."""
    print("Exercise 1a: prompt lookup's n-gram sizes")
    eos = tok.eos_token_id
    for mx in (1, 3):  # the replay reproduces the loop's own counts (copy task: fast; with rejections at mx = 1)
        s = minispec.speculative_generate(model, minispec.PromptLookupDraft(mx), [prompts["copy"]], gamma=GAMMA,
                                          max_new_tokens=NEW_TOKENS, eos_token_id=eos).stats
        counts = (s.num_steps, s.num_drafts, s.draft_tokens, s.accepted_tokens)
        assert replay(prompts["copy"], outputs["copy"], NEW_TOKENS, GAMMA, mx) == counts or model.dtype != torch.float32
    print("  the replay gives the same steps, drafts, proposed and accepted tokens as speculative_generate")
    res = {}
    for (mx, mn) in ((1, 1), (3, 1), (5, 3)):
        for task in TASKS:
            steps, drafts, proposed, accepted = replay(prompts[task], outputs[task], NEW_TOKENS, GAMMA, mx, mn)
            res[mx, mn, task] = r = dict(share=drafts / steps, accept=accepted / max(proposed, 1),
                                         per_step=(min(NEW_TOKENS, len(outputs[task])) - 1) / steps)
            print(f"  max_ngram {mx}, min_ngram {mn}, {task}: proposes in {r['share']:4.0%} of {steps} steps, "
                  f"accepts {r['accept']:4.0%} of {proposed} tokens, {r['per_step']:.2f} tokens per step")
    r = lambda mx, mn, task, k: res[mx, mn, task][k]  # noqa: E731
    assert r(1, 1, "copy", "accept") < 0.8 < 0.9 < r(3, 1, "copy", "accept")  # one token: often the wrong place
    assert r(3, 1, "copy", "per_step") > r(1, 1, "copy", "per_step") + 1
    assert r(5, 3, "copy", "per_step") == r(3, 1, "copy", "per_step")  # longer still: as good, once a 3-gram exists
    assert max(r(mx, mn, "free", "per_step") for mx, mn in ((1, 1), (3, 1), (5, 3))) < 1.1  # nothing to find
    assert r(5, 3, "free", "share") < r(1, 1, "free", "share")  # ... but 3-gram matches stop proposing wrong tokens
    print("  On the copy task a single-token match latches on to the most recent occurrence of a common token ('the',")
    print("  ','), the wrong place to copy from: 3-token matches find the right place (4.4 tokens/step, not 3.1). On")
    print("  free text nothing pays: there is nothing to copy. Requiring 3-token matches at least stops proposing")
    print("  tokens that are rejected, which matters wherever verification costs something (exercise 1b).")


@torch.inference_mode()
def agreement_at_every_depth(model, prompt, output):
    """Teacher-forced agreement of the first N layers (+ final norm, LM head) with the full model, N = 1..L-1,
    from one forward pass: each layer's output is caught by a hook and sent through the norm and head."""
    x = torch.tensor([prompt + output], device=model.device)  # (1, T)
    span = slice(len(prompt) - 1, x.shape[1] - 1)  # positions that predict the output
    hidden = []
    hooks = [layer.register_forward_hook(lambda mod, args, out: hidden.append(out[0, span])) for layer in model.layers]
    try:
        full = model(x)[0, span].argmax(-1)  # (n,)
    finally:
        for h in hooks:
            h.remove()
    head = lambda h: model.lm_head(F.rms_norm(h, (h.shape[-1],), model.norm, model.config.rms_norm_eps))  # noqa: E731
    out = {n: (head(hidden[n - 1]).argmax(-1) == full).double().mean().item() for n in range(1, len(hidden))}
    same = torch.equal(head(hidden[7]).argmax(-1), model(x, num_layers=8)[0, span].argmax(-1))
    assert same or model.dtype != torch.float32  # the hook is right (bf16: the norm may round a near-tie apart)
    return out


def exercise_2(model, prompts, outputs):
    """No early-exit depth of this 135M checkpoint pays: agreement grows slowly with N, and c(N) never falls below
    the LM head's share. That is exiting after the first N layers of one small ordinary checkpoint; it does not
    say layer skipping never pays (see the last lines printed)."""
    print("Exercise 2: layer skip at every depth (H100, BF16, batch 1, best gamma 1..8)")
    L, full = model.config.num_hidden_layers, bf16(roofline.ModelShape.from_model(model))
    agree = {t: agreement_at_every_depth(model, prompts[t], outputs[t][:NEW_TOKENS]) for t in TASKS}
    best, cost = {}, {}
    for n in range(1, L):
        draft = bf16(minispec.LayerSkipDraft(model, n).shape)
        a = max(agree[t][n] for t in TASKS)  # the kinder task
        best[n] = max(roofline.speculative_speedup(1, a, g, 0.0, H100, full, CONTEXT, draft=draft) for g in range(1, 9))
        cost[n] = roofline.modelled_draft_cost(1, draft, H100, full, CONTEXT)
        if n in (1, 4, 8, 15, 20, 25, 29):
            print(f"  N {n:2d}: agreement copy {agree['copy'][n]:4.0%}, free {agree['free'][n]:4.0%}; c {cost[n]:.2f}; "
                  f"best speedup {best[n]:.2f}x")
    assert max(best.values()) < 1  # at no depth does this checkpoint's self-speculation pay
    head = model.lm_head.weight.numel() / roofline.ModelShape.from_model(model).params
    assert min(cost.values()) > head > 0.2  # the LM head's share is the floor of c
    draft8 = bf16(minispec.LayerSkipDraft(model, 8).shape)
    pays = lambda a: max(roofline.speculative_speedup(1, a, g, 0.0, H100, full, CONTEXT, draft=draft8)  # noqa: E731
                         for g in range(1, 9)) >= 1.5
    need = min(a / 1000 for a in range(1001) if pays(a / 1000))
    have = max(agree[t][8] for t in TASKS)
    print(f"  the 8-layer draft would need agreement {need:.0%} for 1.5x; it has {have:.0%}")
    assert need > 0.6 and need > 4 * have
    print("  Cost is not the fix (c >= the LM head's share at every N); agreement is. Checkpoints trained for early")
    print("  exit (LayerSkip's recipe) raise it; this ordinary checkpoint's early layers do not predict its output.")
    print("  Skipping intermediate layers instead, keeping the last ones, pays on off-the-shelf LLaMA-2 models")
    print("  of 7-13B and more without training: Draft & Verify (Zhang et al. 2024) reports up to 1.99x, SWIFT")
    print("  (Xia et al. 2025) 1.3-1.6x. And LayerSkip shares the target's cache and verifies with the remaining")
    print("  layers only, where minispec's LayerSkipDraft keeps a cache of its own and verifies with the whole model.")


def exercise_1b(model, prompts, outputs):
    """Skipping the empty verification matters only where verification is not free: large batch, or this CPU."""
    print("Exercise 1b: steps where prompt lookup proposed nothing")
    full = bf16(roofline.ModelShape.from_model(model))
    steps, drafts, _, _ = replay(prompts["free"], outputs["free"], NEW_TOKENS)
    tokens = min(NEW_TOKENS, len(outputs["free"])) - 1  # after the prefill's
    print(f"  free task: {steps} steps, {drafts} with a proposal, {steps - drafts} without, for {tokens} tokens")

    def speedups(t1, tv):
        """(always verify, plain step when nothing was proposed): speedups over plain decoding."""
        return tokens * t1 / (steps * tv), tokens * t1 / (drafts * tv + (steps - drafts) * t1)

    gpu = {B: speedups(roofline.step_time(B, 1, H100, full), roofline.step_time(B, GAMMA + 1, H100, full))
           for B in (1, 256)}
    for B, (always, skip) in gpu.items():
        print(f"  H100, batch {B}: always verify {always:.2f}x, plain step when empty {skip:.2f}x")
    assert abs(gpu[1][1] / gpu[1][0] - 1) < 0.01  # batch 1: a 5-token step costs what a 1-token step costs
    assert gpu[256][1] / gpu[256][0] > 1.5 and gpu[256][0] < 0.5  # compute-bound: empty verification costs ~5x
    t1 = measure_step_time(model, 1, 1, len(prompts["free"]) + NEW_TOKENS)
    tv = measure_step_time(model, 1, GAMMA + 1, len(prompts["free"]) + NEW_TOKENS)
    always, skip = speedups(t1, tv)
    print(f"  this CPU (a {GAMMA + 1}-token step {tv / t1:.2f}x a 1-token step): always verify {always:.2f}x, "
          f"plain step when empty {skip:.2f}x")
    print("  At batch 1 on a GPU the empty verification is free, so a static shape costs nothing. Where verification")
    print("  is compute-bound (large batch, or this CPU) it costs gamma + 1 positions for one token. minispec pads")
    print("  every row to the batch's longest proposal, so it can skip only when no row proposed anything; vLLM")
    print("  verifies each request's own draft (ragged): a request that proposed nothing costs one position.")


def exercise_3(model, prompts, outputs):
    """The KV read, paid by plain and speculative steps alike, dilutes verification's extra compute: a draft that is
    often right pays at every batch that fits; one that is never right still stops where verification turns
    compute-bound, whatever the context."""
    print("Exercise 3: section 4 with the KV cache (H100, BF16)")
    full = bf16(roofline.ModelShape.from_model(model))
    per_step = {}
    for task in TASKS:
        steps, _, _, _ = replay(prompts[task], outputs[task], NEW_TOKENS)
        per_step[task] = (min(NEW_TOKENS, len(outputs[task])) - 1) / steps
    batches = [2 ** (i / 4) for i in range(57)]  # 1 .. 16384
    stops = {}
    for context in (0, 512, 4096):
        fits = roofline.max_batch(H100, full, context)
        for task, E in per_step.items():
            ys = [E * roofline.step_time(B, 1, H100, full, context)
                  / roofline.speculative_step_time(B, GAMMA, 0.0, H100, full, context) for B in batches]
            stops[context, task] = next((B for B, y in zip(batches, ys) if y < 1), float("inf"))
            stop = stops[context, task]
            where = "pays up to batch 16384" if stop > batches[-1] else f"stops paying near batch {stop:.0f}"
            print(f"  context {context:4d}: prompt lookup ({task}, {E:.2f} tokens/step) {where}; the largest batch "
                  f"that fits: {'any' if fits == float('inf') else fits}")
        if context:
            assert stops[context, "copy"] > fits  # pays at every batch that fits
    assert len({stops[c, "free"] for c in (0, 512, 4096)}) == 1 and stops[0, "free"] < 100  # the same, at ~59
    assert 128 < stops[0, "copy"] < 1024
    kv_rows = full.weight_bytes / (512 * full.kv_bytes_per_token)
    intensity = full.attention_flops_per_token * (GAMMA + 1) / full.kv_bytes_per_token  # FLOP per KV byte, verify
    assert round(intensity) == 15 and intensity < H100.ridge / 10
    print(f"  at 512 tokens of context, {kv_rows:.0f} rows' KV cache weigh as much as the weights: beyond that the")
    print("  step reads mostly KV, which plain decoding pays too, and attention stays memory-bound even over gamma + 1")
    print(f"  query tokens ({intensity:.0f} FLOP per KV byte here, far below the {H100.ridge:.0f} ridge). The matmuls'")
    print("  extra compute is then a small share of the step: a draft that gains 4-5 tokens per step pays at any batch")
    print("  that fits.")
    print("  A draft that gains nothing cannot afford even that share: free text stops at ~59 rows at any context.")
    print("  Long, copy-heavy contexts (RAG, code editing) are where prompt lookup pays most, and at large batch too.")


if __name__ == "__main__":
    dev = "cuda" if torch.cuda.is_available() else "cpu"  # the lesson's device, and its dtype there
    if dev == "cpu":
        torch.set_num_threads(1)
    try:
        model, tok = minispec.load("smollm2-135m-instruct", device=dev, dtype=torch.bfloat16 if dev == "cuda" else None)
    except ValueError as e:
        print(f"skipped: {e}")
        sys.exit(0)
    prompts = {t: chat(tok, text) for t, text in TASKS.items()}
    outputs = {t: minispec.generate(model, [p], max_new_tokens=NEW_TOKENS + 2 * GAMMA,  # past the limit: replay
                                    eos_token_id=tok.eos_token_id).tokens[0] for t, p in prompts.items()}
    exercise_1a(model, tok, prompts, outputs)
    exercise_1b(model, prompts, outputs)
    exercise_2(model, prompts, outputs)
    exercise_3(model, prompts, outputs)
