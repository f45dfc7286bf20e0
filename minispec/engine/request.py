"""A request's life in the engine: what it asks for, where it has got to (Sequence), what it got (RequestOutput).

A :class:`Request` is what a caller hands in. The engine turns each into a :class:`Sequence`,
the scheduler's unit of work, which counts what the block manager and the scheduler need:

  tokens         prompt, then output (the scheduler reads only its length)
  num_computed   KV slots that hold this sequence's keys and values: all its tokens but the last
                 while it decodes (the last one is fed at the next step), 0 after a preemption
  block_table    the physical blocks holding those slots, in order (16 slots each by default)

Status: WAITING (queued, or preempted and waiting to be recomputed), RUNNING (in prefill or
decoding), FINISHED. A sequence is *prefilling* while num_computed < prefill_end, the slots it
must compute before it can decode: its prompt for a new request, all its tokens but the last for
a preempted one being recomputed.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from enum import Enum, auto

from minispec.decoding.sampling import SamplingParams


@dataclass
class Request:
    """One generation request. Nothing is checked here; :meth:`Engine.run` checks every request before any work."""

    prompt: list[int]  # token ids
    max_new_tokens: int
    temperature: float = 0.0  # 0 = greedy
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None  # the request's own Philox key: its draws depend on it and on positions only
    arrival_s: float = 0.0  # s after the start of Engine.run; the request joins once the engine's clock passes it
    eos_token_id: int | list[int] | None = None  # stop after this token (included in the output)


@dataclass
class RequestOutput:
    """What one request got. Times are seconds on the engine's clock (see :meth:`Engine.run`)."""

    tokens: list[int]  # generated tokens, EOS included when it stopped there
    ttft_s: float  # time to first token: first token - arrival
    tpot_s: float  # time per output token after the first: (finish - first token) / (tokens - 1); nan for one token
    itl_s: list[float]  # inter-token latency: the gap before each later step that gave this request tokens
    accepted: list[bool]  # per token: was it a draft token the target accepted (the rest the target drew itself)
    finish_reason: str  # "stop" (EOS), "length" (max_new_tokens) or "error" (refused before any work)
    error: str | None = None  # why it was refused
    arrival_s: float = 0.0
    first_token_s: float = math.nan
    finish_s: float = math.nan
    preemptions: int = 0  # times its KV was dropped and recomputed

    @property
    def num_accepted(self) -> int:
        return sum(self.accepted)


class Status(Enum):
    WAITING = auto()
    RUNNING = auto()
    FINISHED = auto()


@dataclass(eq=False)
class Sequence:
    """A request as the scheduler sees it: token counts, KV slots, blocks, and timing."""

    prompt_len: int
    max_new_tokens: int
    arrival_s: float = 0.0
    tokens: list[int] | None = field(default=None, repr=False)  # prompt then output (None: counts only, the simulator)
    num_tokens: int = 0  # prompt + output so far
    num_computed: int = 0  # KV slots holding this sequence's keys and values
    prefill_end: int = 0  # slots to compute before decoding (set when it is queued)
    block_table: list[int] = field(default_factory=list)
    status: Status = Status.WAITING
    # Filled in by an executor (the engine's runner or the simulator):
    params: SamplingParams = field(default_factory=SamplingParams)
    seed: int = 0  # 64-bit; fixed when the request is queued, so a preemption does not change its draws
    eos: frozenset[int] = frozenset()
    lag: int = 0  # tokens (pairs, for EAGLE) the draft re-reads at its next catch-up
    index: int = 0  # its place in the caller's list
    # Record:
    accepted: list[bool] = field(default_factory=list, repr=False)  # per output token
    token_times: list[float] = field(default_factory=list, repr=False)  # clock at each step that gave it tokens
    finish_reason: str | None = None
    preemptions: int = 0
    first_token_s: float = math.nan
    finish_s: float = math.nan

    @property
    def num_output(self) -> int:
        return self.num_tokens - self.prompt_len

    @property
    def prefilling(self) -> bool:
        return self.num_computed < self.prefill_end

    def queue(self) -> None:
        """Waiting to be (re)computed: a new request computes its prompt; a preempted one every token but its last."""
        self.status, self.num_computed = Status.WAITING, 0
        self.prefill_end = self.prompt_len if self.num_output == 0 else self.num_tokens - 1

    def append(self, new: list[int], accepted: list[bool], now: float) -> None:
        """Add a step's tokens (at most max_new_tokens in all), cut after the first EOS; finish if it is done."""
        new, accepted = new[: self.max_new_tokens - self.num_output], accepted[: self.max_new_tokens - self.num_output]
        stop = next((i for i, t in enumerate(new) if t in self.eos), None)
        if stop is not None:
            new, accepted = new[: stop + 1], accepted[: stop + 1]
        if self.tokens is not None:
            self.tokens.extend(new)
        self.num_tokens += len(new)
        self.accepted.extend(accepted)
        self.token_times.append(now)
        if self.num_output == len(new):
            self.first_token_s = now
        if stop is not None or self.num_output >= self.max_new_tokens:
            self.finish_reason, self.finish_s = ("stop" if stop is not None else "length"), now

    def output(self) -> RequestOutput:
        n = self.num_output
        tpot = (self.finish_s - self.first_token_s) / (n - 1) if n > 1 else math.nan
        itl = [b - a for a, b in zip(self.token_times, self.token_times[1:])]
        return RequestOutput(self.tokens[self.prompt_len:], self.first_token_s - self.arrival_s, tpot, itl,
                             list(self.accepted), self.finish_reason, None, self.arrival_s, self.first_token_s,
                             self.finish_s, self.preemptions)


def fresh_seed() -> int:
    """A 64-bit seed from the OS for a request without one (drawn once, so a preemption keeps it)."""
    return random.SystemRandom().getrandbits(64)
