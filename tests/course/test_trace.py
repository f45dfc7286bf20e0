"""minispec.course.trace: the engine's scheduler driven again from a run's outputs takes the engine's own steps."""

import torch

import minispec
from minispec.course import trace
from minispec.engine import Engine, Request
from minispec.tools import bench


def test_step_gains_cut_each_step_after_the_targets_token():
    assert trace.step_gains([False, True, True, False, False, True, False]) == [3, 1, 2]
    assert trace.step_gains([False, True, True]) == [2]  # a last step cut by max_new_tokens
    assert trace.step_gains([False]) == []


def test_the_replay_takes_the_engines_steps_and_preemption():
    torch.set_num_threads(1)
    target, draft = (minispec.load(n)[0] for n in ("tiny-code-target", "tiny-code-draft"))
    text = list(minispec.model.load.sample_text("code"))
    prompts = bench.prompts_for(3, 20, 256, text)
    engine = Engine(target, draft, gamma=4, block_size=4, num_blocks=22, max_num_seqs=8, max_num_batched_tokens=64)
    outs = engine.run([Request(p, 24) for p in prompts])
    steps, batches, preempted = trace.replay(prompts, outs, 4, 4, 22, 8, 64)
    assert batches == engine.stats.batch_per_step and preempted == engine.stats.preemptions > 0
    assert len(steps) == engine.stats.steps and all(len(rows) == 3 for rows in steps)
    gained = [sum(rows[i]["gained"] for rows in steps) for i in range(3)]
    assert gained == [len(o.tokens) for o in outs]  # every token handed out once
