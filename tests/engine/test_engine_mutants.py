"""The engine's bookkeeping, step by step: what exactness tests cannot see (issue 33's engine mutants).

Each wrong version below keeps every token exact, so the tests that compare tokens pass on it; scripts/hand_mutants.py
makes each one and checks that a test here fails:

- a scheduler that keeps the blocks of rejected tokens' lookahead slots (``Scheduler.update`` without its shrink):
  after every step, each running row must hold exactly the blocks its kept tokens' KV needs, and the free list the
  rest;
- a scheduler that admits waiting requests in a step that preempted one (vLLM V1 admits none then: the preempted
  request would be the first admitted, and recomputed at once);
- an engine whose EAGLE state is one position off, or whose draft model skips a token it has not read: a draft's
  proposals in the engine must be its proposals in ``speculative_generate`` for the same row (its tokens so far),
  step by step.
"""

import pytest

import minispec
from minispec.drafts.base import DraftRun
from minispec.engine import Engine, Request
from minispec.engine.scheduler import Scheduler


@pytest.fixture
def steps(monkeypatch):
    """Every step of the scheduler, recorded: per step the plan's preempted and newly admitted requests, and after
    :meth:`Scheduler.update` each running row's blocks against the blocks its KV needs, and the free list."""
    log = []
    schedule, update = Scheduler.schedule, Scheduler.update

    def scheduled(self):
        running = {id(s) for s in self.running}
        plan = schedule(self)
        preempted = {id(s) for s in plan.preempted}
        # admitted: a request that was waiting, or was preempted in this very step, and is prefilled in it
        admitted = [s for s, _ in plan.prefill if id(s) not in running or id(s) in preempted]
        log.append({"preempted": len(plan.preempted), "admitted": len(admitted), "waiting": len(self.waiting)})
        return plan

    def updated(self, plan, new, now):
        before = {id(s): len(s.block_table) for s in plan.decode}
        done = update(self, plan, new, now)
        log[-1]["handed_back"] = sum(before[id(s)] - len(s.block_table) for s in plan.decode
                                       if all(s is not d for d in done))
        log[-1]["held"] = [len(s.block_table) for s in self.running]
        log[-1]["needed"] = [self.blocks.blocks_for(s.num_computed) for s in self.running]
        log[-1]["free"] = self.blocks.num_free
        log[-1]["total"] = self.blocks.num_blocks
        log[-1]["rows"] = len(self.running)
        return done

    monkeypatch.setattr(Scheduler, "schedule", scheduled)
    monkeypatch.setattr(Scheduler, "update", updated)
    return log


def test_after_every_step_each_row_holds_the_blocks_its_kept_tokens_need(code_pair, steps):
    """Blocks of 4 slots and 4 lookahead slots a row: a row that rejects drafts hands back every block holding only
    rejected tokens' slots at once, not when it finishes. A run that never rejected across a block would prove
    nothing, so the test also asserts that lookahead blocks were handed back."""
    target, draft, prompts = code_pair
    engine = Engine(target, draft, gamma=4, block_size=4, num_blocks=200)
    outs = engine.run([Request(p, 32) for p in prompts])
    assert all(o.finish_reason == "length" for o in outs) and engine.stats.draft_tokens > engine.stats.accepted_tokens
    for i, s in enumerate(steps):
        assert s["held"] == s["needed"], (i, s)  # no row keeps a block of rejected slots past its step
        assert s["free"] == s["total"] - sum(s["held"]), (i, s)  # and what no row holds is free
    assert engine.blocks.num_free == 200
    assert sum(s["handed_back"] for s in steps) >= 5  # the scenario happened: lookahead blocks went back mid-run


def test_no_request_is_admitted_in_a_step_that_preempted(code_pair, steps):
    """14 blocks of 16 slots hold about three of these requests: the youngest are preempted. In such a step nothing
    waiting is admitted, not even the request just preempted (it would be recomputed at once)."""
    target, draft, prompts = code_pair
    mixed = [Request(p, 40, seed=i, temperature=0.0 if i % 2 else 1.0) for i, p in enumerate(prompts)]
    engine = Engine(target, draft, gamma=4, num_blocks=14)
    outs = engine.run(mixed)
    assert all(o.finish_reason == "length" for o in outs)
    preempting = [s for s in steps if s["preempted"]]
    assert len(preempting) >= 2 and engine.stats.preemptions >= 2  # the scenario happened
    assert all(s["waiting"] > 0 for s in preempting)  # with requests waiting (the preempted ones at least)
    assert [s["admitted"] for s in preempting] == [0] * len(preempting)
    assert any(s["admitted"] for s in steps)  # admissions did happen, in other steps


@pytest.fixture
def proposals(monkeypatch):
    """Every chain proposal of a model-based draft (a draft model, an EAGLE head), in speculative_generate and in the
    engine: row tokens -> the tokens x proposed."""
    log = []
    propose = DraftRun.propose

    def recorded(self, state, gamma):
        out = propose(self, state, gamma)
        for b, (row, n) in enumerate(zip(state.seq.tolist(), state.total.tolist())):
            if not bool(state.done[b]):
                log.append((tuple(row[:n]), tuple(out.x[b].tolist())))
        return out

    monkeypatch.setattr(DraftRun, "propose", recorded)
    return log


@pytest.mark.parametrize("name", ["eagle", "model"])
def test_a_drafts_proposals_in_the_engine_are_its_proposals_alone(code_pair, proposals, name):
    """Greedy, gamma 4, rows that join a batch already decoding: for every row and step, the draft proposes in the
    engine what it proposes for the same row's tokens in speculative_generate: its state kept in the engine's blocks
    (an EAGLE head's features at the right positions, a draft model's KV), each row's lag its own. A head that reads
    its features one position off, or a draft model that skips a token it has not read, still gives exact tokens,
    with other proposals."""
    target, small, prompts = code_pair
    draft = minispec.EagleDraft.from_pretrained("tiny-code-eagle", target) if name == "eagle" else small
    minispec.speculative_generate(target, draft, prompts, gamma=4, max_new_tokens=32)
    alone = dict(proposals)
    proposals.clear()
    engine = Engine(target, draft, gamma=4, max_num_seqs=3)  # at most 3 rows: the others join as rows finish
    outs = engine.run([Request(p, 32) for p in prompts])
    assert [o.tokens for o in outs] == minispec.generate(target, prompts, 32).tokens
    in_engine = dict(proposals)
    assert len(in_engine) > 30 and engine.stats.accepted_tokens > 0
    missing = [len(row) for row in in_engine if row not in alone]  # a row state speculative_generate never reached
    differ = [(len(row), x, alone[row]) for row, x in in_engine.items() if row in alone and x != alone[row]]
    assert not missing and not differ, (missing[:3], differ[:3])
