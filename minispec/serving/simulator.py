"""A small discrete-event simulator of a serving endpoint: continuous batching with speculative decoding.

This is a model, not a measurement. It runs no network and times nothing on the host: every
second in it comes from a step-time source, either the roofline (:class:`RooflineSteps`) or a
table measured with ``minispec bench`` (:class:`MeasuredSteps`), and every accepted token from a
seeded coin. Notation as in :mod:`minispec.roofline`: alpha = acceptance rate of one draft
token, gamma = draft tokens per step, c = draft step cost as a fraction of a target step.

What it models:

- Traffic. Requests arrive as a Poisson process at ``rate`` requests/s. Each draws a traffic
  type by its share (code, chat, creative, ...), and from that type a prompt length, an output
  length (:class:`Lengths`: fixed, uniform or geometric) and an acceptance rate alpha: one rate,
  or one per draft position (see :func:`acceptance`).
- Scheduling, prefill first, as vLLM without chunked prefill (here at most one prefill step
  before each decode step, where vLLM may run several in a row). Before each decode step it admits
  waiting requests first come, first served, while the running batch has fewer than
  ``max_rows`` rows, their prompts fit one prefill step's ``max_batched_tokens`` and their KV
  tokens (prompt + output, reserved whole at admission) fit the KV budget. The admitted requests
  are prefilled together in one step, which gives each its first token; then one decode step
  serves every running row, the new ones included. A prefill step therefore adds to the TTFT of
  the requests it admits and to the gap between tokens (the TPOT) of every request already
  decoding. :class:`Scheduler`'s defaults are vLLM's on an H100 or H200.
- Speculation: off (gamma 0), a fixed gamma, or a :class:`~minispec.policy.GammaPolicy` that
  chooses gamma from the running batch size before each step and observes acceptance after it
  (:class:`~minispec.policy.BatchTablePolicy` is vLLM's batch-size table). In a speculative step
  each row tests its draft tokens in order, each accepted independently at its position's rate,
  until the first rejection; with n accepted it gains n + 1 tokens (the target adds one), capped
  at the tokens it has left. Settings that speculate also prefill the draft on every prompt.
- Step times at the rows' own context: every decode step is charged at each running row's KV,
  its prompt plus the tokens it has so far; :class:`RooflineSteps` reads the target's KV and
  the draft's own (full, or a window), its weights, tensor-parallel all-reduces and any fixed
  overhead per forward pass or per step.

Per request: TTFT = first token - arrival; TPOT = (finish - first token) / (tokens - 1). Per
run: their p50 and p99, throughput (output tokens/s from the first arrival to the last finish,
as vLLM's serving benchmark counts it, so the ramp-up and the drain are in it), ``goodput`` (the
same, counting only requests that meet both a TTFT and a TPOT SLO, so a growing queue shows: SLO-met
tokens/s; DistServe's goodput, arXiv 2401.09670, is instead the highest request rate at which a target
share, e.g. 90 %, of requests meets both, read from ``meets`` over a sweep of rates) and the mean running
batch (time-weighted over decode steps).

What it leaves out: chunked prefill and prefill/decode mixing (vLLM V1's default), preemption
and swapping (the KV reservation is exact, as if the server knew each output length), the
prefill's attention FLOPs, the draft catching up on tokens decoded while a policy had it off,
sampling, detokenisation, networking, and any noise: the same seed gives the same numbers.

Which load hurts depends on what the step time counts. Weights only (``RooflineSteps(kv=False)``,
a lower bound on every step) an 8B target on an H100 breaks even near 187 rows, and a busy
endpoint gets there. Counting the KV reads, a Llama-3.2-1B draft with its own full KV breaks
even near 280 rows at 640 tokens of context, about where this traffic's KV fills the H100, and
a draft whose KV is a 256-token window never does (MagicDec); at short contexts (a 192-token
chat) break-even is back near 185 rows, and vLLM's default of 1,024 rows lets a busy endpoint
pass it. ``tests/serving/test_serving.py`` shows each.

    steps = RooflineSteps(draft=LLAMA_1B)  # 8B target, 1B draft, both with their KV, on the H100 roofline
    requests = poisson_requests(Workload(rate=20.0, duration_s=10.0))
    print(simulate(requests, steps, speculation=4).summary(tpot_slo_s=0.008, ttft_slo_s=1.0))

"""

from __future__ import annotations

import copy
import math
from collections import deque
from dataclasses import dataclass, field, replace
from typing import NamedTuple

import numpy as np

from minispec.decoding.stats import percentile
from minispec.roofline.policy import GammaPolicy
from minispec.serving.steps import RooflineSteps, StepTimes
from minispec.serving.traffic import Request, Workload, acceptance, poisson_requests


@dataclass(frozen=True)
class Scheduler:
    """What the server admits. The defaults are vLLM's engine defaults on a GPU of 70 GiB or more that is
    not an A100 (an H100 or H200): ``max_num_seqs`` 1024 and, for the OpenAI server, ``max_num_batched_tokens``
    8192 (``EngineArgs._set_default_args`` in ``vllm/engine/arg_utils.py``, read at commit 99d7eb5d; other GPUs
    get 256 and 2048, and ``LLM`` offline gets 16384 tokens on the large GPUs, 8192 on the others)."""

    max_rows: int = 1024  # running requests at most (max_num_seqs)
    max_batched_tokens: int = 8192  # prompt tokens a prefill step admits (max_num_batched_tokens); one prompt at least
    kv_tokens: int | None = None  # KV-cache tokens for prompts + outputs; None: the step source's kv_budget

    def __post_init__(self):
        if not self.max_rows >= 1 or not self.max_batched_tokens >= 1:
            raise ValueError(f"need max_rows >= 1 and max_batched_tokens >= 1: {self}")


class Step(NamedTuple):
    kind: str  # "prefill" or "decode"
    end_s: float  # s, when it ended
    seconds: float  # s, how long it took
    batch: int  # rows it served
    gamma: int  # draft tokens per row (0 for plain decoding and for prefill)
    context: float = 0.0  # mean KV tokens per row it read (0 for prefill)


@dataclass
class Run:
    """A simulated run: the requests with their times filled in, every step, and the policy as it ended."""

    requests: list[Request]
    steps: list[Step] = field(repr=False)
    policy: GammaPolicy | None = None  # the simulator's copy, with its running alpha

    @property
    def span_s(self) -> float:
        """s from the first arrival to the last finish (vLLM's serving benchmark's duration)."""
        return max(r.finish_s for r in self.requests) - min(r.arrival_s for r in self.requests)

    def meets(self, tpot_slo_s: float, ttft_slo_s: float = math.inf) -> list[bool]:
        """Per request: whether it met both SLOs (a one-token request has no TPOT, and meets that one)."""
        return [not r.tpot_s > tpot_slo_s and not r.ttft_s > ttft_slo_s for r in self.requests]

    def goodput(self, tpot_slo_s: float, ttft_slo_s: float = math.inf) -> float:
        """Output tokens/s of the requests that met both a TTFT and a TPOT SLO (SLO-met tokens/s; DistServe's goodput
        is a request rate, the highest at which a target share of requests meets both: see the module docstring)."""
        met = self.meets(tpot_slo_s, ttft_slo_s)
        return sum(r.output_tokens for r, m in zip(self.requests, met) if m) / self.span_s

    def summary(self, tpot_slo_s: float, ttft_slo_s: float = math.inf) -> dict:
        """TTFT and TPOT p50/p99 (s), throughput and goodput (output tokens/s), the fraction of requests that met
        both SLOs, the mean running batch, gamma and context (time-weighted over decode steps)."""
        done = self.requests
        if not done:
            raise ValueError("no requests to summarise")
        tpots = [r.tpot_s for r in done if r.output_tokens > 1]
        decode = [s for s in self.steps if s.kind == "decode"]
        decode_s = sum(s.seconds for s in decode)
        mean = (lambda f: sum(f(s) * s.seconds for s in decode) / decode_s) if decode_s else (lambda f: 0.0)
        return {
            "requests": len(done),
            "ttft_p50_s": percentile([r.ttft_s for r in done], 50),
            "ttft_p99_s": percentile([r.ttft_s for r in done], 99),
            "tpot_p50_s": percentile(tpots, 50),
            "tpot_p99_s": percentile(tpots, 99),
            "throughput": sum(r.output_tokens for r in done) / self.span_s,  # tokens/s
            "goodput": self.goodput(tpot_slo_s, ttft_slo_s),  # tokens/s
            "slo_met": sum(self.meets(tpot_slo_s, ttft_slo_s)) / len(done),  # fraction of requests
            "mean_batch": mean(lambda s: s.batch),
            "mean_gamma": mean(lambda s: s.gamma),
            "mean_context": mean(lambda s: s.context),  # KV tokens per row
        }


def simulate(requests: list[Request], steps: StepTimes, speculation: int | GammaPolicy = 0,
             scheduler: Scheduler = Scheduler(), seed: int = 0) -> Run:
    """Serve ``requests`` (copied; the originals are left alone) until every one has finished.

    ``speculation``: 0 = off, a gamma, or a policy (copied, so the caller's is left as it was and
    every run starts from the same state; ``Run.policy`` is the copy as it ended). The policy is told
    the rows' mean context before each choice, unless ``steps`` is a weights-only bound (``kv=False``).
    """
    if not isinstance(speculation, GammaPolicy) and not (speculation >= 0 and speculation == int(speculation)):
        raise ValueError(f"speculation must be a gamma >= 0 or a GammaPolicy, got {speculation!r}")
    policy = copy.deepcopy(speculation) if isinstance(speculation, GammaPolicy) else None
    G = policy.gamma_max if policy is not None else int(speculation)  # the most draft tokens a step may test
    requests = sorted((replace(r) for r in requests), key=lambda r: r.arrival_s)
    rates = {id(r): acceptance(r.alpha, G) for r in requests}  # (G,) per request; checks every alpha first
    drafting = policy is not None or speculation > 0
    budget = scheduler.kv_tokens if scheduler.kv_tokens is not None else steps.kv_budget(drafting)
    budget = math.inf if budget is None else budget
    if any(r.prompt_tokens + r.output_tokens > budget for r in requests):
        raise ValueError(f"a request needs more KV tokens than the budget of {budget}")
    tell_context = not isinstance(steps, RooflineSteps) or steps.kv  # a weights-only bound plans at context 0
    rng = np.random.default_rng(seed)  # the acceptance coins
    arrivals, waiting, running, trace = deque(requests), deque(), [], []
    left, ctx = np.zeros(0, dtype=int), np.zeros(0, dtype=int)  # (B,) tokens each row still owes, KV tokens it holds
    alpha = np.zeros((0, G))  # (B, G) each row's acceptance rate by draft position
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

        admitted, prompt = [], 0  # first come, first served, while rows, prefill tokens and KV tokens last
        while (waiting and len(running) + len(admitted) < scheduler.max_rows
               and (not admitted or prompt + waiting[0].prompt_tokens <= scheduler.max_batched_tokens)
               and kv_used + waiting[0].prompt_tokens + waiting[0].output_tokens <= budget):
            r = waiting.popleft()
            kv_used += r.prompt_tokens + r.output_tokens
            prompt += r.prompt_tokens
            admitted.append(r)
        if admitted:  # one prefill step for all of them; it gives each its first token
            dt = steps.prefill(len(admitted), prompt / len(admitted), drafting)
            t += dt
            trace.append(Step("prefill", t, dt, len(admitted), 0))
            for r in admitted:
                r.first_token_s = t
            finish([r for r in admitted if r.output_tokens == 1])
            admitted = [r for r in admitted if r.output_tokens > 1]
            running += admitted
            left = np.concatenate([left, [r.output_tokens - 1 for r in admitted]])
            ctx = np.concatenate([ctx, [r.prompt_tokens + 1 for r in admitted]]).astype(int)
            alpha = np.concatenate([alpha, [rates[id(r)] for r in admitted]]) if admitted else alpha
        if not running:
            continue

        B = len(running)
        gamma = policy.choose(B, float(ctx.mean()) if tell_context else None) if policy is not None else G
        dt = steps.speculative(ctx, gamma) if gamma else steps.plain(ctx)
        t += dt
        trace.append(Step("decode", t, dt, B, gamma, float(ctx.mean())))
        accept = rng.random((B, gamma)) < alpha[:, :gamma]  # (B, gamma) a coin per draft token at its position's rate
        n = accept.cumprod(axis=1).sum(axis=1)  # (B,) accepted: the run of accepts before the first rejection
        gained = np.minimum(n + 1, left)  # (B,) the target adds one token; a row stops at its output length
        left, ctx = left - gained, ctx + gained
        if policy is not None and gamma:
            policy.observe(int(n.sum()), int(np.minimum(n + 1, gamma).sum()))  # tested: up to the first rejection
        done = left == 0  # (B,)
        if done.any():
            finish([r for r, d in zip(running, done) if d])
            running = [r for r, d in zip(running, done) if not d]
            left, ctx, alpha = left[~done], ctx[~done], alpha[~done]
    return Run(requests, trace, policy)


def sweep(rates, settings: dict[str, int | GammaPolicy], steps: StepTimes, tpot_slo_s: float,
          workload: Workload = Workload(), scheduler: Scheduler = Scheduler(), seed: int = 0,
          ttft_slo_s: float = math.inf) -> list[dict]:
    """One row per (arrival rate, setting): the run's summary with ``setting`` and ``rate`` (requests/s).

    Every setting at one rate serves the same requests. ``settings`` maps a name to what
    :func:`simulate` takes as ``speculation``, e.g. ``{"off": 0, "gamma 4": 4, "gated": RooflinePolicy()}``.
    """
    rows = []
    for rate in rates:
        requests = poisson_requests(replace(workload, rate=rate))
        for name, speculation in settings.items():
            run = simulate(requests, steps, speculation, scheduler, seed)
            rows.append({"setting": name, "rate": rate} | run.summary(tpot_slo_s, ttft_slo_s))
    return rows
