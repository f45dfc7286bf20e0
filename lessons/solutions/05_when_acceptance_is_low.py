"""Worked solutions to the exercises of lesson 05, when acceptance is low.

Run from the repository root: ``python lessons/solutions/05_when_acceptance_is_low.py``.
Every number a solution claims is asserted; nothing compares two wall-clock times.
"""

import torch

import minispec
from minispec import roofline
from minispec.course.models import course_models
from minispec.decoding.sampling import SamplingParams, probabilities
from minispec.model.load import sample_text
from minispec.tools.train import teacher_forced_acceptance


def lookup_acceptance(model, ids):
    """Part 1 of the lesson for prompt lookup alone: teacher-forced, the mean p_T(x) of the token x that followed the
    latest earlier occurrence of the last 1-3 tokens, at T = 0 (argmax agreement) and T = 1."""
    props = {}
    for i in range(len(ids) - 1):
        for n in range(min(3, i + 1), 0, -1):
            hit = next((j for j in range(i - n, -1, -1) if ids[j : j + n] == ids[i + 1 - n : i + 1]), None)
            if hit is not None:
                props[i] = ids[hit + n]
                break
    with torch.inference_mode():
        logits = model(torch.tensor([ids], device=model.device))[0].float()  # (T, V)
    at, x = (torch.tensor(v, device=logits.device) for v in (sorted(props), [props[i] for i in sorted(props)]))
    return {T: probabilities(logits, SamplingParams(temperature=T))[at, x].mean().item() for T in (0, 1.0)}


def exercise_1(m):
    """Low acceptance wants a shorter draft: the k-th draft token is used only if the k - 1 before it were accepted.
    And a fall in alpha costs even a free draft: with c = 0 the speedup is E(alpha, gamma) itself."""
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
    real, name = m["real"], m["real_name"]
    tok = m["real_tokenizer"]
    alpha = lookup_acceptance(real, tok.encode(m["code"])[:512])
    free = {T: roofline.speculative_speedup(1, alpha=a, draft_cost=0) for T, a in alpha.items()}  # c = 0: E itself
    print(f"  prompt lookup on {name}: alpha {alpha[0]:.2f} greedy, {alpha[1.0]:.2f} at T = 1; with c = 0 at batch 1 "
          f"that is {free[0]:.2f}x and {free[1.0]:.2f}x")
    assert all(abs(free[T] - roofline.expected_tokens(alpha[T], 4)) < 1e-9 for T in free)  # free verify, free draft
    if name == "SmolLM2-135M-Instruct" and real.dtype == torch.float32:  # the figures the lesson's part 1 printed
        assert abs(alpha[0] - 0.41) < 0.03 and abs(alpha[1.0] - 0.33) < 0.03 and free[1.0] < free[0] - 0.1
    print("  Even a draft that costs nothing loses speed with temperature: the speedup is the tokens per step.")


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


def models() -> dict:
    """The lesson's models: its device's pair, and the real model of its part 1 (the pair's target on a GPU with a
    cached real pair, else SmolLM2-135M-Instruct where `minispec fetch smollm2` has run, else the embedded target).
    Exercises 2 and 3 compare the code draft with the prose draft, which exists only beside the byte-level target:
    where the device's pair has none (a real GPU pair, or random weights), they run on the embedded trio."""
    m = course_models()
    if m["device"].type == "cpu":
        torch.set_num_threads(1)
    if not m["embedded"] and m["tokenizer"] is not None:
        real, tok, name = m["target"], m["tokenizer"], m["name"].split(" / ")[0]
    else:
        try:
            real, tok = minispec.load("smollm2-135m-instruct", device=m["device"],
                                      dtype=torch.bfloat16 if m["device"].type == "cuda" else None)
            name = "SmolLM2-135M-Instruct"
        except ValueError as e:  # not fetched on this machine
            print(f"no real model here ({e}): exercise 1 uses the embedded target")
            real, tok, name = *minispec.load("tiny-code-target"), "tiny-code-target"
    if m["prose_draft"] is None:  # no prose draft shares this pair's vocabulary: the embedded trio has one
        m = course_models(embedded=True)  # forced: exercises 2 and 3 need the prose draft (see the docstring)
    return m | {"real": real, "real_tokenizer": tok, "real_name": name}


if __name__ == "__main__":
    m = models()
    exercise_1(m)
    exercise_2(m)
    exercise_3(m)
