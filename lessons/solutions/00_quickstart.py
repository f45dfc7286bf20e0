"""Lesson 00, worked solutions to the exercises. Run from the repository root:

    python lessons/solutions/00_quickstart.py

Each exercise prints what it finds and asserts what its answer claims (counts and token equality,
never a comparison of two wall-clock times).
"""

import re

import torch

import minispec
from minispec.course.models import course_models
from minispec.tools import bench

GAMMA, MAX_NEW, N_PROMPTS = 4, 64, 3  # as in the lesson


def setup():
    """The lesson's models, its three held-out code prompts, and its accept rule: the exact one, or for
    random weights (a GPU without a cached pair) the stated synthetic acceptance the lesson uses."""
    m = course_models()
    if m["device"].type == "cpu":
        torch.set_num_threads(1)
    encode = m["tokenizer"].encode if m["tokenizer"] else lambda text: list(text.encode())
    defs = re.findall(r"^ *def .*\n.*\n", m["code"], re.M)
    prompts = [encode(t) for t in defs[:: len(defs) // N_PROMPTS][:N_PROMPTS]]
    alpha = m["synthetic_alpha"]
    m["rule"] = minispec.accept_reject if alpha is None else bench.SyntheticAcceptance(alpha)
    return m, prompts


def exercise_1(m, prompts):
    """gamma 1, 4 and 8. A step yields its accepted draft tokens plus one from the target, so at most
    gamma + 1 tokens; longer drafts save target passes, but each extra position is accepted less often,
    so the acceptance rate (accepted / drafted) falls much more than alpha (accepted / tested). At gamma 1
    the two are equal: the one draft token is always tested."""
    print("exercise 1: gamma against tokens per step and target passes")
    plain = minispec.generate(m["target"], prompts, max_new_tokens=MAX_NEW)
    stats = {}
    for g in (1, 4, 8):
        out = minispec.speculative_generate(m["target"], m["draft"], prompts, gamma=g, max_new_tokens=MAX_NEW,
                                            rule=m["rule"])
        if m["rule"] is minispec.accept_reject and m["target"].dtype == torch.float32:  # bf16: lesson 00
            assert out.tokens == plain.tokens  # every gamma: the target's greedy tokens
        s = stats[g] = out.stats
        print(f"  gamma {g}: mean acceptance length {s.mean_acceptance_length:.2f} (at most {g + 1}), "
              f"{s.num_steps} target passes (plain {plain.stats.num_steps}), acceptance rate "
              f"{s.acceptance_rate:.2f}, alpha {s.alpha_estimate:.2f}")
        assert s.mean_acceptance_length <= g + 1
    assert stats[1].acceptance_rate == stats[1].alpha_estimate
    if m["embedded"]:
        assert stats[8].num_steps < stats[4].num_steps < stats[1].num_steps < plain.stats.num_steps
        assert stats[8].mean_acceptance_length < (8 + 1) / 2  # far from the cap: later positions rarely survive
        rate_drop = stats[1].acceptance_rate - stats[8].acceptance_rate
        assert rate_drop > 2 * abs(stats[1].alpha_estimate - stats[8].alpha_estimate)
    return stats


def exercise_2(m, prompts):
    """A draft trained on prose proposes code badly: both acceptance figures collapse, the target does
    nearly all the work (almost one pass per token), and the output is still the target's."""
    print("exercise 2: the prose draft on code")
    if m["prose_draft"] is None:
        print("  (no prose draft shares this target's vocabulary; skipped)")
        return None
    plain = minispec.generate(m["target"], prompts, max_new_tokens=MAX_NEW)
    runs = {name: minispec.speculative_generate(m["target"], m[name], prompts, gamma=GAMMA, max_new_tokens=MAX_NEW)
            for name in ("draft", "prose_draft")}
    for name, out in runs.items():
        s = out.stats
        green = sum(sum(a) for a in out.accepted)
        print(f"  {name:11s}: acceptance rate {s.acceptance_rate:.2f}, alpha {s.alpha_estimate:.2f}, "
              f"{s.num_steps} target passes (plain {plain.stats.num_steps}), {green} green tokens")
        if m["target"].dtype == torch.float32:
            assert out.tokens == plain.tokens  # exactness does not depend on the draft
    code, prose = runs["draft"].stats, runs["prose_draft"].stats
    assert prose.acceptance_rate < code.acceptance_rate / 3 and prose.alpha_estimate < code.alpha_estimate / 2
    assert prose.num_steps > 1.5 * code.num_steps
    return runs


def exercise_3(m, prompts):
    """A seed fixes the output; another seed or none changes the tokens but not what they are drawn
    from. A list of seeds gives each row its own random numbers, which depend only on its seed, never on the
    other rows (an int seed derives row b's seed from (seed, b), so a row's numbers move with its place).
    Whether its *tokens* stay the same alone and in a batch also needs logits that do not depend on the
    batch: true in float32 on this CPU (m["batch_invariant"]), not in bf16 on a GPU, where the kernels, and
    so the order of each sum, change with the batch's shape and a near-tie between two tokens can flip."""
    print("exercise 3: seeds")
    run = lambda rows, seed: minispec.speculative_generate(m["target"], m["draft"], rows, gamma=GAMMA,  # noqa: E731
                                                           max_new_tokens=MAX_NEW, temperature=0.8, seed=seed,
                                                           rule=m["rule"])
    zero, again, one, none_a, none_b = (run(prompts, s) for s in (0, 0, 1, None, None))
    assert zero.tokens == again.tokens  # same seed, same tokens
    assert zero.tokens != one.tokens and none_a.tokens != none_b.tokens  # other randomness, other tokens
    for name, r in (("seed 0", zero), ("seed 1", one), ("None", none_a), ("None", none_b)):
        print(f"  {name:7s}: acceptance rate {r.stats.acceptance_rate:.2f}, first row {r.tokens[0][:8]}...")
    batch, alone = run(prompts, [10, 11, 12]), run(prompts[:1], [10])
    same = alone.tokens[0] == batch.tokens[0]
    print(f"  prompt 0 with seed 10, alone and in the batch of 3: {'the same' if same else 'different'} tokens "
          f"({m['target'].dtype} on {m['device'].type})")
    if m["batch_invariant"]:  # float32 on a CPU: a row's logits do not depend on its batch
        assert same
    return zero, one


if __name__ == "__main__":
    m, prompts = setup()
    exercise_1(m, prompts)
    exercise_2(m, prompts)
    exercise_3(m, prompts)
