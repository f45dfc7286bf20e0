"""Worked solutions to the exercises of lesson 04, the large-batch slowdown.

Run from the repository root: ``python lessons/solutions/04_the_large_batch_slowdown.py``.
Every number a solution claims is asserted; nothing compares two wall-clock times.
"""

import math
import random

import torch

from minispec import roofline, speculative_generate
from minispec.course.models import course_models
from minispec.roofline import hardware
from minispec.tools import bench


def exercise_1():
    """A longer draft breaks even at a smaller batch."""
    print("Exercise 1: break-even batch on the H100 (8B, alpha 0.8, c 0.05)")
    ridge, be = hardware.H100_SXM.ridge, {}
    for gamma in (2, 4, 8):
        be[gamma] = roofline.break_even_batch(gamma=gamma)
        bound = roofline.compute_bound_batch(gamma=gamma)  # ridge / (gamma + 1)
        f = roofline.expected_tokens(0.8, gamma) - gamma * 0.05  # verify/decode ratio at break-even
        print(f"  gamma {gamma}: verification compute-bound from batch {bound:5.1f}, break-even where f = E - gamma c"
              f" = {f:.2f}, i.e. batch {f:.2f} x {bound:.1f} = {be[gamma]:.1f}")
        assert math.isclose(bound, ridge / (gamma + 1)) and math.isclose(be[gamma], f * bound)
    assert be[8] < be[4] < be[2]  # 129 < 187 < 230
    assert (round(be[2]), round(be[4]), round(be[8])) == (230, 187, 129)
    print("  Longer drafts send more tokens per row, so verification turns compute-bound sooner (1 / (gamma + 1));")
    print("  E - gamma c grows more slowly than that (E saturates at 1 / (1 - alpha) = 5), so break-even comes sooner.")


def pays_at_every_batch_from(**kw):
    """The least context (tokens per row) from which speculation never breaks even, by bisection (as the lesson)."""
    lo, hi = 0, 32768
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if roofline.break_even_batch(context=mid, **kw) == math.inf else (mid, hi)
    return hi


def exercise_2():
    """A 512-token KV window for the 1B draft: below 512 tokens it changes nothing (the draft reads at most the whole
    context, which is shorter than the window); at 4096 tokens the draft's cache is an eighth of its size, so 17 of the
    25 rows it cost come back, and its c stops growing with the context, so the speedup at the frontier rises."""
    print("Exercise 2: the 1B draft with a 512-token KV window (H100, 8B, alpha 0.8, gamma 4)")
    H100, T8B, D1B = hardware.H100_SXM, roofline.LLAMA_8B, roofline.LLAMA_1B
    found = {}
    for n in (256, 4096):
        for W in (None, 512):
            fits = roofline.max_batch(H100, T8B, n, D1B, draft_kv_window=W)
            at = roofline.speculative_speedup(fits, context=n, draft=D1B, draft_kv_window=W)
            found[n, W] = (fits, at, roofline.break_even_batch(context=n, draft=D1B, draft_kv_window=W))
            print(f"  context {n:>4}, window {W}: memory holds {fits} rows, {at:.2f}x there; break-even at "
                  f"{found[n, W][2]:.1f} rows")
    assert found[256, None] == found[256, 512]  # 256 tokens < the window: nothing changes
    assert (found[4096, None][0], found[4096, 512][0]) == (79, 96)  # 17 of the 25 lost rows (104 plain) return
    assert (round(found[4096, None][1], 2), round(found[4096, 512][1], 2)) == (1.69, 2.42)
    never = pays_at_every_batch_from(draft=D1B), pays_at_every_batch_from(draft=D1B, draft_kv_window=512)
    print(f"  it never breaks even from {never[0]} tokens of context with its full cache, {never[1]} with the window")
    assert never == (686, 613)  # a cheaper draft pays at every batch from a shorter context
    print("  The window caps what the draft reads and stores per row, so its cost stops growing with the context;")
    print("  whether it still proposes as well over only 512 tokens is a question for a measurement, not the model.")


def row_steps(accepted: list[bool]) -> int:
    """Steps a row took: one per token the target added (not an accepted draft), after the prefill's first
    token; plus one if the row ends on an accepted draft token (its last step was cut at max_new_tokens)."""
    return sum(not a for a in accepted[1:]) + accepted[-1]


def simulated_lag(B: int, alpha: float, gamma: int, tokens: int, trials: int = 1000, seed: int = 0) -> float:
    """Mean over trials of (slowest row's steps) / (mean row's steps), rows accepting i.i.d. with alpha."""
    rng, total = random.Random(seed), 0.0
    for _ in range(trials):
        steps = []
        for _ in range(B):
            n = s = 0
            while n < tokens:
                k = 0
                while k < gamma and rng.random() < alpha:
                    k += 1
                n, s = n + k + 1, s + 1
            steps.append(s)
        total += max(steps) / (sum(steps) / B)
    return total / trials


def exercise_3():
    """The lag counted on the embedded pair, against i.i.d. chance; the slowest row sets the step count."""
    print("Exercise 3: the slowest row")
    m = course_models()  # the lesson's device and pair
    if m["synthetic_alpha"] is not None:  # random GPU weights accept nothing: the embedded pair has an alpha
        m = course_models(embedded=True)  # random GPU weights force the embedded pair (stated above)
    if m["device"].type == "cpu":
        torch.set_num_threads(1)
    target, draft, tok = m["target"], m["draft"], m["tokenizer"]
    tokens, GAMMA, MAX_NEW = tok.encode(m["code"]), 4, 32
    measured, simulated = {}, {}
    for B in (1, 8, 32):
        prompts = bench.prompts_for(B, 64, target.config.vocab_size, tokens, 0)  # the lesson's sweep prompts
        r = speculative_generate(target, draft, prompts, gamma=GAMMA, max_new_tokens=MAX_NEW, seed=0)
        s, steps = r.stats, [row_steps(a) for a in r.accepted]
        assert max(steps) == s.num_steps and sum(steps) == s.num_drafts  # the batch steps until its slowest row ends
        measured[B] = max(steps) / (sum(steps) / B)
        simulated[B] = simulated_lag(B, s.alpha_estimate, GAMMA, MAX_NEW - 1)
        print(f"  batch {B:>2}: rows took {min(steps)}..{max(steps)} steps, alpha {s.alpha_estimate:.2f}; lag "
              f"counted {measured[B]:.2f}, i.i.d. rows at that alpha {simulated[B]:.2f}")
    assert simulated[32] > simulated[8] + 0.05 > 1.05  # chance alone: more rows, a slower slowest row
    if m["embedded"]:  # the pair the prose describes; another pair prints its own figures
        assert measured[32] > simulated[32]  # real rows differ in how predictable their text is: more lag still
    print("  Even rows that all accept with the same alpha lag by chance, more so the more rows there are;")
    print("  real rows lag more, because some text is harder for the draft than the average.")


if __name__ == "__main__":
    exercise_1()
    exercise_2()
    exercise_3()
