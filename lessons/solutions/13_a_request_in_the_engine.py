"""Worked solutions to the exercises of lesson 13, a request's life in an engine and the load sweep measured.

Run from the repository root: ``python lessons/solutions/13_a_request_in_the_engine.py``.
It runs the lesson's pair: the device's, or the embedded pair on the CPU where the device's pair is random weights
(which agree on nothing, so no draft token is ever accepted). Every number a solution claims is asserted, through
the engine's public API and ``minispec.course.trace`` (the engine's scheduler driven again from a run's outputs).
Exercises 1 and 2 count blocks and compare tokens, which no timing changes (greedy and seeded sampling are exact in
float32 on a CPU; in bf16 on a GPU the token checks are skipped, a near-tie can round apart); exercise 3 counts engine
steps, which depend on how requests happened to batch, and checks them with a wide margin. Its times are printed,
not asserted.
"""

import torch

import minispec
from minispec.course import trace
from minispec.course.models import course_models
from minispec.engine import Engine, Request
from minispec.serving import Lengths
from minispec.tools import bench
from minispec.tools.serve_bench import LoadConfig, serve_bench

BS, NEW = 4, 24  # slots per block; new tokens per request (the lesson's section 1)


def blocks_for(slots: int) -> int:
    return -(-slots // BS)


def peak_blocks(target, draft, prompts, K: int) -> int:
    """The most blocks the requests hold together going into any step, in a cache too large to run out: the engine
    runs them, and the replay of its steps reads each row's blocks after the scheduler handed out the lookahead."""
    engine = Engine(target, draft, gamma=K, block_size=BS, num_blocks=1000, max_num_seqs=8, max_num_batched_tokens=64)
    outs = engine.run([Request(p, NEW) for p in prompts])
    steps, batches, _ = trace.replay(prompts, outs, K, BS, 1000, 8, 64)
    assert batches == engine.stats.batch_per_step  # the engine's own steps
    return max(sum(t["blocks_in"] for t in rows) for rows in steps)


def preemptions(target, draft, prompts, K: int, blocks: int) -> int:
    engine = Engine(target, draft, gamma=K, block_size=BS, num_blocks=blocks, max_num_seqs=8,
                    max_num_batched_tokens=64)
    engine.run([Request(p, NEW) for p in prompts])
    return engine.stats.preemptions


def exercise_1(m, prompts):
    print("Exercise 1: blocks going into a step and after it; the smallest cache with no preemption")
    kv = 40  # a row holding 40 slots of KV
    for K in (4, 8):
        going_in, after = blocks_for(kv + 1 + K), blocks_for(kv + 1 + 2)  # feeds 1 + K; accepting 2 keeps 1 + 2 new
        print(f"  K = {K}: a row holding {kv} slots goes in with {going_in} blocks and keeps {after} after accepting 2")
    assert (blocks_for(kv + 1 + 4), blocks_for(kv + 1 + 8), blocks_for(kv + 3)) == (12, 13, 11)
    for K in (4, 8):
        peak = peak_blocks(m["target"], m["draft"], prompts, K)
        found = (preemptions(m["target"], m["draft"], prompts, K, peak),
                 preemptions(m["target"], m["draft"], prompts, K, peak - 1))
        print(f"  K = {K}: the three requests hold at most {peak} blocks together; with {peak} blocks "
              f"{found[0]} preemptions, with {peak - 1} {found[1]}")
        assert found[0] == 0 < found[1]  # the peak is exactly the smallest cache that never preempts
    print("  The smallest cache that never preempts is the peak of what the rows hold going into a step, lookahead")
    print("  included. A larger K takes more lookahead per row but finishes rows in fewer steps, so its peak need")
    print("  not be higher: the rows overlap for less time.")


def exercise_2(m, prompts):
    print("Exercise 2: sampled, seeded, preempted: the same tokens as the request alone")
    target, draft = m["target"], m["draft"]
    reqs = [Request(p, NEW, temperature=1.0, seed=100 + i) for i, p in enumerate(prompts)]
    engine = Engine(target, draft, gamma=4, block_size=BS, num_blocks=18, max_num_seqs=8, max_num_batched_tokens=64)
    outs = engine.run(reqs)
    alone = [minispec.speculative_generate(target, draft, [r.prompt], gamma=4, max_new_tokens=NEW, temperature=1.0,
                                           seed=[r.seed]).tokens[0] for r in reqs]
    print(f"  {engine.stats.preemptions} preemptions; preempted requests: {[o.preemptions for o in outs]}")
    assert engine.stats.preemptions > 0 and ([o.tokens for o in outs] == alone or not m["batch_invariant"])
    print("  Every request's random numbers are keyed by its own seed and positions, so recomputing its KV after a")
    print("  preemption, and sharing steps with other rows, changes nothing it draws (in float32 on a CPU).")


def exercise_3(m, text):
    print("Exercise 3: steps and batch per rate")
    cfg = LoadConfig(rates=(4, 16, 64), min_requests=24, max_requests=24, prompt=Lengths(48, "uniform"),
                     output=Lengths(32, "uniform"), max_num_seqs=16, tpot_slo_s=0.03)
    rows = serve_bench(m["target"], {"plain": {}, "gamma 4": dict(draft=m["draft"], gamma=4)}, cfg, text,
                       simulate_too=False, progress=lambda line: None)
    for plain, spec in zip(rows[::2], rows[1::2]):
        ratio = plain["steps"] / spec["steps"]
        tokens = spec["output_tokens"] / spec["requests"]
        print(f"  {plain['rate']:>2g}/s: plain {plain['steps']} steps at batch {plain['mean_batch']:.1f}, gamma 4 "
              f"{spec['steps']} at {spec['mean_batch']:.1f}: {ratio:.1f}x fewer; TTFT p99 {plain['ttft_p99_s']:.2f} "
              f"against {spec['ttft_p99_s']:.2f} s (this run's clock)")
        assert ratio > 1.5 and abs(plain["output_tokens"] - spec["output_tokens"]) == 0 and tokens > 1
    E = rows[1]["per_position_acceptance_rates"]
    print(f"  per-position acceptance {', '.join(f'{a:.2f}' for a in E)}: {1 + sum(E):.2f} tokens a row per step")
    assert 1 + sum(E) > 1.5
    print("  A speculative step gives each row about 1 + sum of the per-position rates tokens, so the same requests")
    print("  need that many times fewer steps; rows finish sooner and hand their slots to waiting requests sooner,")
    print("  which is what keeps the queue, and TTFT under load, short. At a light rate the draft's own prefill of")
    print("  each prompt can make the first token come a little later instead.")


if __name__ == "__main__":
    models = course_models()  # the lesson's device
    models = models if models["synthetic_alpha"] is None else course_models(embedded=True)  # random GPU weights
    if models["device"].type == "cpu":
        torch.set_num_threads(1)
    code = models["tokenizer"].encode(models["code"])
    lesson = bench.prompts_for(3, 20, models["target"].config.vocab_size, code)  # the lesson's three prompts
    exercise_1(models, lesson)
    exercise_2(models, lesson)
    exercise_3(models, code)
