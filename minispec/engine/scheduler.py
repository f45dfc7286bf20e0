"""The scheduler: which rows run each step and how many tokens each feeds, within a token budget.

One scheduler, two executors: :class:`~minispec.engine.runner.ModelRunner` runs a step's plan on
the models and measures it; :func:`minispec.serving.simulate` charges it a modelled time and draws
acceptance from a coin. Both hand the scheduler back each row's new tokens through
:meth:`Scheduler.update`, so the simulator and the engine cannot disagree on scheduling.

Each step (vLLM V1's scheduler, Kwon et al. 2023 and vllm/v1/core/sched/scheduler.py):

1. gamma for the step comes from the running batch: the policy sees how many rows decode and
   their mean context (a fixed gamma, the roofline policy, or vLLM's batch-size table; 0 = off).
2. Running rows first, oldest first, each charged to a token budget of ``max_num_batched_tokens``:
   a decoding row costs 1 + K tokens (its last token and K = gamma draft tokens: the target
   verifies them all; where fewer are left, a chain's draft is cut to fit, as vLLM cuts it, and a
   tree's row waits a step; a chain never drafts more than max_new_tokens - 1, what a step can emit, as
   ``speculative_generate`` caps it), a row still in prefill costs its next chunk of prompt (chunked prefill).
   Each gets KV slots for what it will write (:meth:`BlockManager.grow`); a decoding row's K are
   its *lookahead slots*.
3. Out of blocks: the youngest running request is preempted (its blocks freed, its KV to be
   recomputed later, its tokens kept) until the row fits, or the row itself was the youngest.
4. Then, if nothing was preempted, waiting requests first come, first served, while the budget,
   ``max_num_seqs`` and the free blocks allow: each takes a prefill chunk of what is left of the
   budget (a long prompt spreads over several steps).

After the step, :meth:`Scheduler.update` adds each row's tokens, keeps the KV slots of the tokens
it accepted and frees the blocks that held only rejected ones, and retires finished rows.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from minispec.engine.blocks import BlockManager
from minispec.engine.request import Sequence, Status
from minispec.roofline.policy import GammaPolicy


@dataclass
class StepPlan:
    """What one step runs."""

    decode: list[Sequence] = field(default_factory=list)  # rows that decode: row i feeds 1 + k[i] tokens
    k: list[int] = field(default_factory=list)  # lookahead slots of each decoding row: width, or fewer where a
    #                                             chain's draft was shortened to fit the token budget (vLLM's rule)
    gamma: int = 0  # draft tokens per decoding row (0: a plain step)
    width: int = 0  # lookahead slots per decoding row (gamma for a chain; a tree's node budget)
    prefill: list[tuple[Sequence, int]] = field(default_factory=list)  # rows in prefill and the slots each computes
    preempted: list[Sequence] = field(default_factory=list)

    @property
    def tokens(self) -> int:
        """Tokens the target reads this step: vLLM's count against max_num_batched_tokens."""
        return sum(1 + k for k in self.k) + sum(n for _, n in self.prefill)


class Scheduler:
    def __init__(self, blocks: BlockManager, max_num_seqs: int, max_num_batched_tokens: int,
                 policy: GammaPolicy | None = None, width: Callable[[int], int] = lambda gamma: gamma,
                 context: bool = True):
        """``policy`` chooses gamma each step (None: plain decoding); ``width(gamma)`` is the lookahead a row needs;
        ``context``: tell the policy the decoding rows' mean context (False: it plans at its own default)."""
        self.blocks, self.policy, self.width, self.context = blocks, policy, width, context
        self.max_num_seqs, self.max_num_batched_tokens = max_num_seqs, max_num_batched_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # in admission order: the last is the youngest
        self.preemptions = 0

    def add(self, seq: Sequence) -> None:
        seq.queue()
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> StepPlan:
        budget = self.max_num_batched_tokens
        decoding = [s for s in self.running if not s.prefilling]
        plan = StepPlan()
        if decoding and self.policy is not None:
            context = sum(s.num_computed for s in decoding) / len(decoding)  # mean KV tokens per decoding row
            plan.gamma = g = self.policy.choose(len(decoding), context if self.context else None)
            if isinstance(g, bool) or not isinstance(g, int):  # as speculative_generate checks it
                raise TypeError(f"{type(self.policy).__name__}.choose must return an int gamma, got {g!r}")
            if not 0 <= g <= self.policy.gamma_max:
                raise ValueError(f"{type(self.policy).__name__} chose gamma {g}, outside 0..gamma_max="
                                 f"{self.policy.gamma_max}: the cache keeps lookahead slots for gamma_max")
            plan.width = self.width(plan.gamma) if plan.gamma else 0
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            chain = plan.width == plan.gamma
            n = (min(seq.prefill_end - seq.num_computed, budget) if seq.prefilling else
                 1 + min(plan.width, seq.max_new_tokens - 1) if chain else 1 + plan.width)  # no more than it can use
            if n > budget and chain:  # a chain's draft is cut to what is left of the budget (vLLM's rule)
                n = budget
            elif n > budget:  # a tree's nodes do not fit what is left of the budget: the row waits a step
                i += 1
                continue
            while not self.blocks.can_grow(seq, seq.num_computed + n):
                victim = self.running.pop()  # the youngest; never one scheduled already (those are before i)
                self._preempt(victim)
                plan.preempted.append(victim)
                if victim is seq:
                    break
            else:
                self.blocks.grow(seq, seq.num_computed + n)
                if seq.prefilling:
                    plan.prefill.append((seq, n))
                else:
                    plan.decode.append(seq)
                    plan.k.append(n - 1)
                budget -= n
                i += 1
        while (self.waiting and budget > 0 and not plan.preempted and len(self.running) < self.max_num_seqs):
            seq = self.waiting[0]
            n = min(seq.prefill_end, budget)
            if not self.blocks.can_grow(seq, n):
                break
            self.blocks.grow(seq, n)
            self.running.append(self.waiting.popleft())
            seq.status = Status.RUNNING
            plan.prefill.append((seq, n))
            budget -= n
        return plan

    def _preempt(self, seq: Sequence) -> None:
        """Drop ``seq``'s KV (recomputed when it runs again) and queue it first; its tokens stay."""
        self.blocks.release(seq)
        seq.queue()
        seq.preemptions += 1
        self.preemptions += 1
        self.waiting.appendleft(seq)

    def update(self, plan: StepPlan, new: dict[Sequence, tuple[list[int], list[bool]]], now: float) -> list[Sequence]:
        """After a step: ``new[seq]`` = (tokens, accepted flags) for each row that gained tokens (decoding rows,
        and rows whose prefill just ended with their first token). Returns the rows that finished."""
        for seq, n in plan.prefill:
            seq.num_computed += n
        done = []
        for seq in plan.decode + [s for s, _ in plan.prefill]:
            if seq in new:
                seq.append(*new[seq], now)
            if not seq.prefilling:
                seq.num_computed = seq.num_tokens - 1  # the KV of every token but the last
                self.blocks.shrink(seq, seq.num_computed)  # blocks of rejected tokens' lookahead slots go back
            if seq.finish_reason is not None:
                self.blocks.release(seq)
                seq.status = Status.FINISHED
                self.running.remove(seq)
                done.append(seq)
        return done
