"""``train_eagle(minutes=M)`` bounds the whole call: data, training and the held-out evaluations (issue 23)."""

import math
import types

import pytest

from minispec.tools import train_eagle as te


def schedule_cost(total, step, plain_s, unrolled_s, eval_s, cfg):
    """The seconds the training loop spends after ``step`` to reach ``total``, walked step by step as it runs."""
    first = max(step, math.ceil(cfg.ttt_from * total))
    seconds = 0.0
    for s in range(step, total):
        seconds += unrolled_s if s >= first else plain_s
        if (s + 1) % cfg.eval_every == 0 or s + 1 == total:
            seconds += eval_s
    return seconds


@pytest.mark.parametrize("seconds", [0.0, 1.0, 7.3, 30.0, 300.0])
@pytest.mark.parametrize("eval_s", [0.1, 2.0])
def test_the_plan_is_the_most_steps_whose_steps_and_evaluations_fit(seconds, eval_s):
    """Before, the plan left evaluations out and never went below 21 steps, whatever the time left."""
    cfg = te.EagleTrainConfig(ttt=2, ttt_from=0.8, eval_every=25)
    total, first = te._plan(seconds, te.PROBE_STEPS, 0.2, 0.5, eval_s, cfg, None)
    assert total >= te.PROBE_STEPS and first == max(te.PROBE_STEPS, math.ceil(0.8 * total))
    if total > te.PROBE_STEPS:
        assert schedule_cost(total, te.PROBE_STEPS, 0.2, 0.5, eval_s, cfg) <= seconds
    assert schedule_cost(total + 1, te.PROBE_STEPS, 0.2, 0.5, eval_s, cfg) > seconds
    if seconds < 4:
        assert total < 21


def test_a_budget_spent_before_training_stops_after_the_probe(tmp_path):
    """0.6 s cannot even load the models: the run still makes its data (one batch of windows), the five probe
    steps and one evaluation, and stops there (before, it ran at least 21 steps)."""
    rec = te.train_eagle("tiny-code-target", tmp_path, minutes=0.01, threads=1, progress=False)
    assert rec["steps"] == te.PROBE_STEPS and [c["step"] for c in rec["curve"]] == [te.PROBE_STEPS]
    assert rec["windows"] == 4 and rec["budget_seconds"] == 0.6


class Clock:
    def __init__(self):
        self.now = 0.0

    def perf_counter(self):
        return self.now


def test_self_distillation_stops_at_its_deadline(monkeypatch):
    """Before, every prompt got its whole answer whatever the budget (1,141 s for SmolLM2). Now answers grow a piece
    at a time, each piece as long as the last one's prefill and step times say fits: a fake target whose prefill
    costs 2 s and each further token 0.5 s, with 20 s to go, gets 2, then as many tokens as fit, and ends by 20 s."""
    import minispec.decoding.plain as plain

    clock = Clock()
    pieces = []

    def generate(target, prompts, n, temperature, seed, eos_token_id):
        assert isinstance(seed, list) and len(seed) == len(prompts)  # one seed per row: pieces join seamlessly
        pieces.append(n)
        clock.now += 2.0 + 0.5 * (n - 1)
        stats = types.SimpleNamespace(ttft_s=2.0, wall_s=2.0 + 0.5 * (n - 1))
        return types.SimpleNamespace(tokens=[[7] * n for _ in prompts], stats=stats)

    monkeypatch.setattr(te, "time", clock)
    monkeypatch.setattr(plain, "generate", generate)
    tok = types.SimpleNamespace(eos_token_id=0, apply_chat_template=lambda c, **k: {"input_ids": [1, 2, 3]})
    docs = te._self_distill(None, tok, 160, 0, 20.0, lambda *a: None)
    assert clock.now <= 20.0 and pieces[0] == 2 and sum(pieces) > 2 and len(pieces) >= 2
    assert len(docs) == len(te._TASKS) * len(te._SUBJECTS) and all(d[:3] == [1, 2, 3] for d in docs)
    assert all(len(d) == 3 + sum(pieces) for d in docs)
