"""A small discrete-event simulator of a serving endpoint: continuous batching with speculative decoding.

This is a model, not a measurement. It runs no network and times nothing on the host: every
second in it comes from a step-time source, either the roofline (:class:`RooflineSteps`) or a
table measured with ``minispec bench`` (:class:`MeasuredSteps`), and every accepted token from a
seeded coin. Notation as in :mod:`minispec.roofline`: alpha = acceptance rate of one draft
token, gamma = draft tokens per step, c = draft step cost as a fraction of a target step.

What it models:

- Traffic. Requests arrive as a Poisson process at ``rate`` requests/s. Each draws a traffic
  type by its share (code, chat, creative, ...), and from that type a prompt length, an output
  length (:class:`Lengths`: fixed, uniform or geometric) and an acceptance rate alpha.
- Scheduling, prefill first, as vLLM without chunked prefill (here at most one prefill step
  before each decode step, where vLLM may run several in a row). Before each decode step it admits
  waiting requests first come, first served, while the running batch has fewer than
  ``max_rows`` rows and their KV tokens (prompt + output, reserved whole at admission) fit the
  KV budget. The admitted requests are prefilled together in one step, which gives each its
  first token; then one decode step serves every running row, the new ones included. A prefill
  step therefore adds to the TTFT of the requests it admits and to the gap between tokens (the
  TPOT) of every request already decoding.
- Speculation: off (gamma 0), a fixed gamma, or a :class:`~minispec.policy.GammaPolicy` that
  chooses gamma from the running batch size before each step and observes acceptance after it.
  In a speculative step each row tests its draft tokens in order, each accepted with
  probability alpha independently, until the first rejection; with n accepted it gains n + 1
  tokens (the target adds one), capped at the tokens it has left. Settings that speculate also
  prefill the draft on every prompt.

Per request: TTFT = first token - arrival; TPOT = (finish - first token) / (tokens - 1). Per
run: their p50 and p99, throughput (output tokens/s from the first arrival to the last finish,
as vLLM's serving benchmark counts it, so the ramp-up and the drain are in it), goodput (the
same, counting only requests whose TPOT meets an SLO) and the mean running batch
(time-weighted over decode steps).

What it leaves out: chunked prefill and prefill/decode mixing, preemption and swapping (the
KV reservation is exact, as if the server knew each output length), per-row context in the
step time (:class:`RooflineSteps` reads a fixed ``context`` of KV per row; 0 is the reference
model, weights only), the prefill's attention FLOPs, the draft catching up on tokens decoded
while a policy had it off, sampling, detokenisation, networking, and any noise: the same seed
gives the same numbers.

Which load hurts depends on what the step time counts. On the weights-only reference model
(``context=0``) an 8B target on an H100 breaks even near 187 rows, and a busy endpoint gets
there; count each row's KV read at more than ~350 tokens of context and it never breaks even
(MagicDec), so speculation pays at every load. ``tests/test_serving.py`` shows both.

    steps = RooflineSteps()  # 8B target on the H100 roofline, c = 0.05
    requests = poisson_requests(Workload(rate=20.0, duration_s=10.0))
    print(simulate(requests, steps, speculation=4).summary(tpot_slo_s=0.005))
"""

from __future__ import annotations

import copy
import functools
import math
import random
from collections import deque
from dataclasses import dataclass, field, replace
from typing import NamedTuple, Protocol

import numpy as np

from minispec import roofline
from minispec.hardware import H100_SXM, Hardware
from minispec.policy import GammaPolicy, StepTable
from minispec.roofline import LLAMA_8B, ModelShape
from minispec.stats import percentile

# --- traffic ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Lengths:
    """A distribution of token counts, all with mean ``mean``.

    ``fixed``: always ``mean``. ``uniform``: integers in [mean - mean // 2, mean + mean // 2].
    ``geometric``: 1, 2, 3, ... as if a stop token came after each token with probability 1 / mean.
    """

    mean: int = 256  # tokens
    kind: str = "fixed"  # "fixed", "uniform" or "geometric"

    def __post_init__(self):
        if self.mean < 1 or self.kind not in ("fixed", "uniform", "geometric"):
            raise ValueError(f"need mean >= 1 and kind fixed, uniform or geometric: {self}")

    def sample(self, rng: random.Random) -> int:
        if self.kind == "uniform":
            return rng.randint(self.mean - self.mean // 2, self.mean + self.mean // 2)
        if self.kind == "geometric" and self.mean > 1:
            return 1 + math.floor(math.log(1 - rng.random()) / math.log(1 - 1 / self.mean))
        return self.mean


@dataclass(frozen=True)
class Traffic:
    """One type of request: its acceptance rate, its share of arrivals, its lengths."""

    name: str = "chat"
    alpha: float = 0.8  # acceptance rate of this traffic's draft tokens
    share: float = 1.0  # relative weight among the workload's types (normalised over the mix)
    prompt: Lengths = Lengths(128)  # prompt tokens
    output: Lengths = Lengths(1024, "uniform")  # output tokens (512..1536), the first (from the prefill) included

    def __post_init__(self):
        if not 0 <= self.alpha <= 1 or not self.share > 0:
            raise ValueError(f"need alpha in [0, 1] and a positive share: {self}")


# Acceptance rates by traffic type, as an illustration (code is predictable, creative text is not).
MIX = (Traffic("code", 0.8, 0.3), Traffic("chat", 0.6, 0.5), Traffic("creative", 0.3, 0.2))


@dataclass(frozen=True)
class Workload:
    rate: float = 10.0  # requests/s, Poisson arrivals
    duration_s: float = 25.0  # s of arrivals; the run goes on until the last request has finished
    mix: tuple[Traffic, ...] = (Traffic(),)  # the traffic types, drawn by share
    seed: int = 0

    def __post_init__(self):
        if not self.rate > 0 or not self.duration_s > 0 or not self.mix:
            raise ValueError(f"need a positive rate and duration and at least one traffic type: {self}")


@dataclass
class Request:
    """One request: what it asks for, and (filled in by :func:`simulate`) when it was served."""

    arrival_s: float  # s
    prompt_tokens: int
    output_tokens: int  # the first token, from the prefill, included
    alpha: float = 0.8  # acceptance rate of its draft tokens
    kind: str = ""  # its traffic type's name
    first_token_s: float = math.nan  # s, the end of its prefill step
    finish_s: float = math.nan  # s, the end of the step that gave its last token

    @property
    def ttft_s(self) -> float:
        return self.first_token_s - self.arrival_s

    @property
    def tpot_s(self) -> float:
        """Seconds per output token after the first; nan for a one-token output."""
        n = self.output_tokens - 1
        return (self.finish_s - self.first_token_s) / n if n else math.nan


def poisson_requests(workload: Workload) -> list[Request]:
    """Poisson arrivals over ``duration_s``, lengths and alpha drawn per traffic type.

    The same seed at another rate draws the same sequence of requests, with every arrival time
    scaled by the ratio of the rates (so a higher rate fits more of them in the duration).
    """
    rng = random.Random(workload.seed)
    shares = [t.share for t in workload.mix]
    t, requests = 0.0, []
    while (t := t + rng.expovariate(1.0) / workload.rate) <= workload.duration_s:  # s, exponential gaps
        kind = rng.choices(workload.mix, shares)[0]
        requests.append(Request(t, kind.prompt.sample(rng), kind.output.sample(rng), kind.alpha, kind.name))
    return requests


# --- step times ---------------------------------------------------------------------------------


class StepTimes(Protocol):
    """Where the simulator's seconds come from."""

    def plain(self, batch: int) -> float:
        """Seconds of one plain decode step of ``batch`` rows."""

    def speculative(self, batch: int, gamma: int) -> float:
        """Seconds of one speculative step: gamma draft steps, then verify gamma + 1 tokens per row."""

    def prefill(self, batch: int, prompt_tokens: float, draft: bool = False) -> float:
        """Seconds to prefill ``batch`` prompts of ``prompt_tokens`` tokens each (mean), through the
        draft as well if ``draft``."""

    def kv_budget(self, draft: bool = False) -> float | None:
        """KV-cache tokens that fit in memory beside the weights (the draft's too if ``draft``); None: no limit."""


@dataclass(frozen=True)
class RooflineSteps:
    """Step times from :mod:`minispec.roofline`: any hardware, target shape, and a draft given by its
    shape (its own weights and KV read, and its memory) or by a constant c."""

    hardware: Hardware = H100_SXM
    model: ModelShape = LLAMA_8B  # the target
    draft_cost: float = 0.05  # c, one draft step over one plain target step; used when draft is None
    context: float = 0  # KV tokens each row reads per decode step; 0 = the reference model (weights only)
    draft: ModelShape | None = None  # the draft's shape: costs its steps and prefill, and its memory; None: c

    def plain(self, batch: int) -> float:
        return roofline.step_time(batch, 1, self.hardware, self.model, self.context)

    def speculative(self, batch: int, gamma: int) -> float:
        return roofline.speculative_step_time(batch, gamma, self.draft_cost, self.hardware, self.model, self.context,
                                              draft=self.draft)

    def prefill(self, batch: int, prompt_tokens: float, draft: bool = False) -> float:
        target = roofline.step_time(batch, prompt_tokens, self.hardware, self.model)  # no history to read
        if not draft:
            return target
        if self.draft is None:
            return target * (1 + self.draft_cost)
        return target + roofline.step_time(batch, prompt_tokens, self.hardware, self.draft)

    def kv_budget(self, draft: bool = False) -> float:
        """KV tokens that fit: max_batch at one token per row (its default share of memory, 90 %)."""
        return roofline.max_batch(self.hardware, self.model, 1, self.draft if draft else None)


@dataclass
class MeasuredSteps:
    """Step times from a table measured on this machine, as :class:`~minispec.policy.MeasuredPolicy` takes it.

    ``target_step_s[(batch, tokens_per_row)]`` and ``draft_step_s[batch]`` in seconds, e.g.
    ``MeasuredSteps(*minispec.bench.step_time_table(target, draft, batches, gamma_max))``;
    interpolated linearly in batch. A prefill runs at the best throughput the table shows
    (the smallest seconds per token of any target step) unless ``prefill_s_per_token`` is given,
    and takes at least one plain step; the draft's prefill costs draft / target step times more.
    """

    target_step_s: dict[tuple[int, int], float]
    draft_step_s: dict[int, float]
    prefill_s_per_token: float | None = None  # s per prompt token; None: from the table
    kv_tokens: int | None = None  # KV-cache tokens that fit; None: no memory limit

    def __post_init__(self):
        self.table = StepTable(self.target_step_s, self.draft_step_s)
        if self.prefill_s_per_token is None:
            self.prefill_s_per_token = self.table.best_s_per_token

    def plain(self, batch: int) -> float:
        return self.table.target(batch)

    def speculative(self, batch: int, gamma: int) -> float:
        return self.table.target(batch, gamma + 1) + gamma * self.table.draft(batch)

    def prefill(self, batch: int, prompt_tokens: float, draft: bool = False) -> float:
        plain = self.plain(batch)
        target = max(plain, self.prefill_s_per_token * batch * prompt_tokens)
        return target * (1 + self.table.draft(batch) / plain) if draft else target

    def kv_budget(self, draft: bool = False) -> int | None:
        return self.kv_tokens


# --- the event loop -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Scheduler:
    max_rows: int = 256  # running requests at most (vLLM's default max_num_seqs)
    kv_tokens: int | None = None  # KV-cache tokens for prompts + outputs; None: the step source's kv_budget


class Step(NamedTuple):
    kind: str  # "prefill" or "decode"
    end_s: float  # s, when it ended
    seconds: float  # s, how long it took
    batch: int  # rows it served
    gamma: int  # draft tokens per row (0 for plain decoding and for prefill)


@dataclass
class Run:
    """A simulated run: the requests with their times filled in, every step, and the policy as it ended."""

    requests: list[Request]
    steps: list[Step] = field(repr=False)
    policy: GammaPolicy | None = None  # the simulator's copy, with its running alpha

    def summary(self, tpot_slo_s: float) -> dict:
        """TTFT and TPOT p50/p99 (s), throughput and goodput (output tokens/s), mean running batch.

        A one-token request has no TPOT, so it counts as meeting the SLO.
        """
        done = self.requests
        if not done:
            raise ValueError("no requests to summarise")
        span = max(r.finish_s for r in done) - min(r.arrival_s for r in done)  # s
        tpots = [r.tpot_s for r in done if r.output_tokens > 1]
        decode = [s for s in self.steps if s.kind == "decode"]
        decode_s = sum(s.seconds for s in decode)
        return {
            "requests": len(done),
            "ttft_p50_s": percentile([r.ttft_s for r in done], 50),
            "ttft_p99_s": percentile([r.ttft_s for r in done], 99),
            "tpot_p50_s": percentile(tpots, 50),
            "tpot_p99_s": percentile(tpots, 99),
            "throughput": sum(r.output_tokens for r in done) / span,  # tokens/s
            "goodput": sum(r.output_tokens for r in done if not r.tpot_s > tpot_slo_s) / span,  # tokens/s
            "slo_met": sum(not r.tpot_s > tpot_slo_s for r in done) / len(done),  # fraction of requests
            "mean_batch": sum(s.batch * s.seconds for s in decode) / decode_s if decode_s else 0.0,
            "mean_gamma": sum(s.gamma * s.seconds for s in decode) / decode_s if decode_s else 0.0,
        }


def simulate(requests: list[Request], steps: StepTimes, speculation: int | GammaPolicy = 0,
             scheduler: Scheduler = Scheduler(), seed: int = 0) -> Run:
    """Serve ``requests`` (copied; the originals are left alone) until every one has finished.

    ``speculation``: 0 = off, a gamma, or a policy (copied, so the caller's is left as it was and
    every run starts from the same state; ``Run.policy`` is the copy as it ended).
    """
    if not isinstance(speculation, GammaPolicy) and not (speculation >= 0 and speculation == int(speculation)):
        raise ValueError(f"speculation must be a gamma >= 0 or a GammaPolicy, got {speculation!r}")
    rng = np.random.default_rng(seed)  # the acceptance coins
    plain, speculative = functools.cache(steps.plain), functools.cache(steps.speculative)  # pure: compute once
    policy = copy.deepcopy(speculation) if isinstance(speculation, GammaPolicy) else None
    drafting = policy is not None or speculation > 0
    budget = scheduler.kv_tokens if scheduler.kv_tokens is not None else steps.kv_budget(drafting)
    budget = math.inf if budget is None else budget
    requests = sorted((replace(r) for r in requests), key=lambda r: r.arrival_s)
    if any(r.prompt_tokens + r.output_tokens > budget for r in requests):
        raise ValueError(f"a request needs more KV tokens than the budget of {budget}")
    arrivals, waiting, running, trace = deque(requests), deque(), [], []
    left, alpha = np.zeros(0, dtype=int), np.zeros(0)  # (B,) tokens each running row still owes, its alpha
    kv_used, t = 0, 0.0  # tokens reserved, s

    def finish(done: list[Request]):
        nonlocal kv_used
        for r in done:
            r.finish_s = t
            kv_used -= r.prompt_tokens + r.output_tokens

    while arrivals or waiting or running:
        if not waiting and not running:
            t = max(t, arrivals[0].arrival_s)  # idle until the next arrival
        while arrivals and arrivals[0].arrival_s <= t:
            waiting.append(arrivals.popleft())

        admitted = []  # first come, first served, while rows and KV tokens last
        while (waiting and len(running) + len(admitted) < scheduler.max_rows
               and kv_used + waiting[0].prompt_tokens + waiting[0].output_tokens <= budget):
            r = waiting.popleft()
            kv_used += r.prompt_tokens + r.output_tokens
            admitted.append(r)
        if admitted:  # one prefill step for all of them; it gives each its first token
            dt = steps.prefill(len(admitted), sum(r.prompt_tokens for r in admitted) / len(admitted), drafting)
            t += dt
            trace.append(Step("prefill", t, dt, len(admitted), 0))
            for r in admitted:
                r.first_token_s = t
            finish([r for r in admitted if r.output_tokens == 1])
            admitted = [r for r in admitted if r.output_tokens > 1]
            running += admitted
            left = np.concatenate([left, [r.output_tokens - 1 for r in admitted]])
            alpha = np.concatenate([alpha, [r.alpha for r in admitted]])
        if not running:
            continue

        B = len(running)
        gamma = policy.choose(B) if policy is not None else speculation
        dt = speculative(B, gamma) if gamma else plain(B)
        t += dt
        trace.append(Step("decode", t, dt, B, gamma))
        accept = rng.random((B, gamma)) < alpha[:, None]  # (B, gamma) a Bernoulli(alpha) coin per draft token
        n = accept.cumprod(axis=1).sum(axis=1)  # (B,) accepted: the run of accepts before the first rejection
        left -= np.minimum(n + 1, left)  # the target adds one token; a row stops at its output length
        if policy is not None and gamma:
            policy.observe(int(n.sum()), int(np.minimum(n + 1, gamma).sum()))  # tested: up to the first rejection
        done = left == 0  # (B,)
        if done.any():
            finish([r for r, d in zip(running, done) if d])
            running = [r for r, d in zip(running, done) if not d]
            left, alpha = left[~done], alpha[~done]
    return Run(requests, trace, policy)


def sweep(rates, settings: dict[str, int | GammaPolicy], steps: StepTimes, tpot_slo_s: float,
          workload: Workload = Workload(), scheduler: Scheduler = Scheduler(), seed: int = 0) -> list[dict]:
    """One row per (arrival rate, setting): the run's summary with ``setting`` and ``rate`` (requests/s).

    Every setting at one rate serves the same requests. ``settings`` maps a name to what
    :func:`simulate` takes as ``speculation``, e.g. ``{"off": 0, "gamma 4": 4, "gated": RooflinePolicy()}``.
    """
    rows = []
    for rate in rates:
        requests = poisson_requests(replace(workload, rate=rate))
        for name, speculation in settings.items():
            run = simulate(requests, steps, speculation, scheduler, seed)
            rows.append({"setting": name, "rate": rate} | run.summary(tpot_slo_s))
    return rows
