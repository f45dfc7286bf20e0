"""Worked solutions to the exercises of lesson 05, when acceptance is low.

Run from the repository root: ``python lessons/solutions/05_when_acceptance_is_low.py``.
Every number a solution claims is asserted; nothing compares two wall-clock times.
"""

import torch

import minispec
from minispec import roofline
from minispec.course.models import course_models
from minispec.model.load import sample_text
from minispec.tools.train import teacher_forced_acceptance


def exercise_1():
    """Low acceptance wants a shorter draft: the k-th draft token is used only if the k - 1 before it were accepted."""
    print("Exercise 1: the best gamma at batch 1 (8B, H100, c 0.05)")
    c, best = 0.05, {a: roofline.best_gamma(1, alpha=a) for a in (0.3, 0.8)}
    for a, g in best.items():
        gains = ", ".join(f"{k}: {roofline.speculative_speedup(1, alpha=a, gamma=k):.2f}x" for k in range(1, 9))
        print(f"  alpha {a}: best gamma {g} ({gains})")
        for k in range(8):  # one more draft token pays iff alpha^(k+1) (1 + k c) > c E(alpha, k): Leviathan's formula
            pays = a ** (k + 1) * (1 + k * c) > c * roofline.expected_tokens(a, k)
            assert pays == (roofline.speculative_speedup(1, alpha=a, gamma=k + 1) > roofline.speculative_speedup(
                1, alpha=a, gamma=k)) == (k < g)
    assert best[0.3] == 2 < best[0.8] == 8  # 8 is the cap: at alpha 0.8 even the 8th token still pays
    print("  Token k + 1 is used only when all k before it were accepted (probability alpha^(k+1)), but it costs c")
    print("  in every step. At alpha 0.3 the third token is accepted 2.7 % of the time: worth less than its cost.")


def exercise_2(m):
    """The prose draft is a draft for prose; but acceptance measures agreement with the target, not with the text."""
    print("Exercise 2: teacher-forced acceptance on held-out prose")
    target, tf = m["target"], {}
    for name, draft in (("prose draft", m["prose_draft"]), ("code draft", m["draft"])):
        for kind in ("code", "prose"):
            text = sample_text(kind)[:8192]  # a third of each held-out sample: 16 windows of 512 bytes
            tf[name, kind] = teacher_forced_acceptance(target, draft, text)["overlap"]
        print(f"  {name}: overlap at T = 1 on code {tf[name, 'code']:.3f}, on prose {tf[name, 'prose']:.3f}")
    assert tf["prose draft", "prose"] > tf["prose draft", "code"] + 0.3  # a draft for other traffic, not a bad one
    assert tf["code draft", "prose"] > tf["prose draft", "prose"]  # yet the code draft agrees better even on prose
    print("  The prose draft is far better on prose than on code: a draft for other traffic. But the target here was")
    print("  trained on code, and acceptance is agreement with the target, not with the text: the code draft, trained")
    print("  on what the target was trained on, imitates it better on prose too. Match a draft to its target first.")


def row_steps(accepted: list[bool]) -> int:
    """Steps a row took: one per token the target added after the prefill's, plus one if its last step was cut."""
    return sum(not a for a in accepted[1:]) + accepted[-1]


def exercise_3(m):
    """A mixed batch: one pooled alpha hides two kinds of traffic, and the slow kind sets the pace."""
    print("Exercise 3: half code, half prose, one batch, the prose draft")
    target, tok = m["target"], m["tokenizer"]
    code_ids, prose_ids = tok.encode(m["code"]), tok.encode(m["prose"])
    prompts = [ids[i * 3000 : i * 3000 + 64] for ids in (code_ids, prose_ids) for i in range(4)]  # rows 0-3 code
    r = minispec.speculative_generate(target, m["prose_draft"], prompts, gamma=4, max_new_tokens=48,
                                      seed=list(range(8)))
    steps = [row_steps(a) for a in r.accepted]
    per_step = [sum(a) / s for a, s in zip(r.accepted, steps)]  # accepted draft tokens per step, each row
    for kind, rows in (("code", range(4)), ("prose", range(4, 8))):
        print(f"  {kind} rows: accepted per step {', '.join(f'{per_step[i]:.2f}' for i in rows)}; "
              f"steps {', '.join(str(steps[i]) for i in rows)}")
    alpha = r.stats.alpha_estimate
    print(f"  the batch's single alpha: {alpha:.2f}, i.e. E = {roofline.expected_tokens(alpha, 4):.2f} tokens per step "
          f"for every row; the batch took {r.stats.num_steps} steps, its prose rows were done after {max(steps[4:])}")
    assert max(per_step[:4]) < 0.25 < 0.8 < min(per_step[4:])  # two populations, not one alpha
    assert max(steps) == r.stats.num_steps == max(steps[:4])  # a code row, the worst-predicted, sets the pace
    assert max(steps[4:]) <= 0.6 * r.stats.num_steps  # prose rows ride along idle for 40 % of the steps or more
    print("  One pooled alpha describes neither kind of traffic: the prose rows gain about 2 tokens a step, the code")
    print("  rows barely more than 1. In a static batch the worst rows set the step count, so the batch runs at the")
    print("  pace of its worst traffic. Measure alpha per traffic type, and gate per request where you can.")


if __name__ == "__main__":
    torch.set_num_threads(1)
    models = course_models("cpu")  # the embedded trio: code target, code draft, prose draft (byte-level)
    exercise_1()
    exercise_2(models)
    exercise_3(models)
