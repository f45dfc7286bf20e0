"""Worked solutions to the exercises of lesson 04, the large-batch slowdown.

Run from the repository root: ``python lessons/solutions/04_the_large_batch_slowdown.py``.
Every number a solution claims is asserted; nothing compares two wall-clock times.
"""

import math
import random

import torch

from minispec import roofline, speculative_generate
from minispec.course import plots
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


def exercise_2():
    """4096 tokens of KV per row: the KV read keeps decode memory-bound, but batch 256 no longer fits."""
    print("Exercise 2: context 4096, then a 1B draft shape")
    H100, T8B, D1B = hardware.H100_SXM, roofline.LLAMA_8B, roofline.LLAMA_1B
    weights_only, long = roofline.speculative_speedup(256), roofline.speculative_speedup(256, context=4096)
    fits = roofline.max_batch(H100, T8B, 4096)  # rows whose KV fits in 90 % of 80 GB after the weights
    at_fit = roofline.speculative_speedup(fits, context=4096)
    print(f"  batch 256: {weights_only:.2f}x weights only, {long:.2f}x with 4096 tokens of KV per row; "
          f"break-even: {roofline.break_even_batch(context=4096)}")
    print(f"  but only {fits} rows of 4096 tokens fit on the H100; at batch {fits}: {at_fit:.2f}x")
    assert round(weights_only, 2) == 0.74 and long > 2 and roofline.break_even_batch(context=4096) == math.inf
    assert fits == 104 < 256 and at_fit > 2
    fig = plots.roofline_figure(context=4096)  # what the explorer draws for this setting
    assert fig.axes[0].get_title() == "pays at every batch; memory holds 104 rows"
    c1 = roofline.modelled_draft_cost(1, D1B)  # weights only: its weight bytes over the 8B's
    s1 = roofline.speculative_speedup(1, draft=D1B)
    print(f"  the Llama-3.2-1B shape as the draft: c = {c1:.3f} at batch 1 (1.24 / 8 of the weight bytes), "
          f"so {s1:.2f}x at batch 1 instead of 2.80x")
    assert math.isclose(c1, D1B.weight_bytes / T8B.weight_bytes) and round(c1, 3) == 0.155
    assert round(s1, 2) == 2.08 and math.isclose(s1, roofline.leviathan_speedup(0.8, 4, c1))
    c_long = roofline.modelled_draft_cost(fits, D1B, context=4096)
    print(f"  at batch {fits} and 4096 tokens of context its c is {c_long:.3f}: its KV is 25 % of the target's per "
          f"token, a larger share than its weights")
    assert c_long > c1


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
    torch.set_num_threads(1)
    m = course_models("cpu")
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
    assert measured[1] == simulated[1] == 1.0  # one row: no one to wait for
    assert simulated[32] > simulated[8] + 0.05 > 1.05  # chance alone: more rows, a slower slowest row
    assert measured[32] > simulated[32]  # real rows differ in how predictable their text is: more lag still
    print("  Even rows that all accept with the same alpha lag by chance, more so the more rows there are;")
    print("  real rows lag more, because some text is harder for the draft than the average.")


if __name__ == "__main__":
    exercise_1()
    exercise_2()
    exercise_3()
