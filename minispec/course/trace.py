"""A request's life in the engine, step by step: the engine's scheduler driven again with what a run produced.

:meth:`minispec.engine.Engine.run` returns each request's tokens and which of them were accepted draft tokens, and
``engine.stats`` what every step ran; neither says which blocks a row held at each step. :func:`replay` gets that
from the scheduler itself (:class:`minispec.engine.Scheduler`, the one the engine and the serving simulator run, on
a :class:`~minispec.engine.blocks.BlockManager` of the same size): it drives it as ``Engine.run`` does, and gives
each row, at each of its steps, the tokens its own run gained at that step (a run of accepted draft tokens and the
target's token: the output's ``accepted`` flags, cut where each ``False`` falls). Greedy, a row's steps do not depend
on what else runs (float32 on a CPU), so the scheduler makes the engine's decisions again; ``replay`` returns the
decoding rows of every step, which the caller compares with ``engine.stats.batch_per_step`` to check exactly that.

A third executor beside the engine's runner and the simulator, for the course: it runs no model.
"""

from __future__ import annotations

from collections import deque

from minispec.engine import Scheduler
from minispec.engine.blocks import BlockManager
from minispec.engine.request import Sequence
from minispec.roofline.policy import FixedPolicy


def step_gains(accepted: list[bool]) -> list[int]:
    """Tokens a request gained at each step after its first (the prefill's): each step's accepted draft tokens and the
    target's own (``False``); a last step cut by ``max_new_tokens`` may end on accepted tokens."""
    gains, run = [], 0
    for a in accepted[1:]:
        run += 1
        if not a:
            gains.append(run)
            run = 0
    return gains + ([run] if run else [])


def replay(prompts: list[list[int]], outputs, gamma: int, block_size: int, num_blocks: int, max_num_seqs: int,
           max_num_batched_tokens: int) -> tuple[list[list[dict]], list[int], int]:
    """Serve ``prompts`` (all arriving at once) through a fresh scheduler, each row gaining at each step what its
    ``outputs`` (``Engine.run``'s, in order) say it gained. Returns, per step, one record per request (``req``,
    ``decoding``, ``blocks_in`` and ``kv_in`` going into the step after the scheduler grew its table, ``blocks_out``,
    ``kv_out``, ``gained``, ``accepted``, ``preempted``, ``status``), the decoding rows of each step, and the
    preemptions."""
    blocks = BlockManager(num_blocks, block_size)
    scheduler = Scheduler(blocks, max_num_seqs, max_num_batched_tokens, FixedPolicy(gamma), lambda g: g)
    seqs = [Sequence(len(p), len(o.tokens), 0.0, list(p), len(p), index=i) for i, (p, o) in enumerate(zip(prompts,
                                                                                                       outputs))]
    todo = [deque(step_gains(o.accepted)) for o in outputs]  # each row's gains, step by step
    done = [0] * len(seqs)  # output tokens handed out so far
    for s in seqs:
        scheduler.add(s)
    trace, batches = [], []
    while scheduler.has_work():
        plan = scheduler.schedule()
        held = [(len(s.block_table), s.num_computed) for s in seqs]
        new = {}
        for s in plan.decode:
            g = todo[s.index].popleft()
            new[s] = outputs[s.index].tokens[done[s.index]:done[s.index] + g], \
                outputs[s.index].accepted[done[s.index]:done[s.index] + g]
        for s, n in plan.prefill:  # a prompt's last chunk gives its first token (a recomputed row's gives none)
            if s.num_computed + n == s.prompt_len == s.num_tokens:
                new[s] = outputs[s.index].tokens[:1], [False]
        for s, (tokens, _) in new.items():
            done[s.index] += len(tokens)
        decoding = {s.index for s in plan.decode}
        scheduler.update(plan, new | {id(s): v for s, v in new.items()}, float(len(trace)))  # keyed either way
        batches.append(len(plan.decode))
        trace.append([dict(req=s.index, decoding=s.index in decoding, blocks_in=held[s.index][0],
                           kv_in=held[s.index][1], blocks_out=len(s.block_table), kv_out=s.num_computed,
                           gained=len(new.get(s, ((), ()))[0]), accepted=sum(new.get(s, ((), ()))[1]),
                           preempted=any(s is v for v in plan.preempted), status=s.status.name) for s in seqs])
    if blocks.num_free != num_blocks or any(todo):
        raise RuntimeError("the replay did not end as the run did: blocks leaked or gains left over")
    return trace, batches, scheduler.preemptions
