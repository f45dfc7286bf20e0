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
- Scheduling: the engine's own scheduler (:mod:`minispec.engine.scheduler`; :func:`simulate` is its second
  executor, beside the engine's model runner, so the two cannot disagree). Each step charges a token budget of
  ``max_batched_tokens``: every decoding row its 1 + K tokens first (vLLM V1's accounting), then prompts, first
  come, first served, a long one in chunks over several steps, while ``max_rows`` rows run at most. KV slots
  are handed out in blocks as rows grow (nothing is reserved for tokens not yet produced), with K lookahead
  slots a decoding row for its draft tokens; out of blocks, the youngest row is preempted and recomputed later.
  A step that decodes and prefills costs both passes, as the engine runs them (vLLM flattens them into one).
  A prompt's prefill gives its first token at the end of its last chunk. :class:`Scheduler`'s defaults are
  vLLM's on an H100 or H200.
- Speculation: off (gamma 0), a fixed gamma, or a :class:`~minispec.policy.GammaPolicy` that
  chooses gamma from the running batch size before each step and observes acceptance after it
  (:class:`~minispec.policy.BatchTablePolicy` is vLLM's batch-size table). In a speculative step
  each row tests its draft tokens in order, each accepted independently at its position's rate,
  until the first rejection; with n accepted it gains n + 1 tokens (the target adds one), capped
  at the tokens it has left. Settings that speculate also prefill the draft on every prompt.
- Step times at the rows' own context: every decode step is charged at each running row's KV,
  every token it has but the last; :class:`RooflineSteps` reads the target's KV and
  the draft's own (full, or a window), its weights, tensor-parallel all-reduces and any fixed
  overhead per forward pass or per step.

Per request: TTFT = first token - arrival; TPOT = (finish - first token) / (tokens - 1). Per
run: their p50 and p99, throughput (output tokens/s from the first arrival to the last finish,
as vLLM's serving benchmark counts it, so the ramp-up and the drain are in it), ``goodput`` (the
same, counting only requests that meet both a TTFT and a TPOT SLO, so a growing queue shows: SLO-met
tokens/s; DistServe's goodput, arXiv 2401.09670, is instead the highest request rate at which a target
share, e.g. 90 %, of requests meets both, read from ``meets`` over a sweep of rates) and the mean running
batch (time-weighted over decode steps).

What it leaves out: prefill and decode fused into one pass, swapping and prefix caching, the
prefill's attention FLOPs, the draft catching up on tokens decoded while a policy had it off,
sampling, detokenisation, networking, and any noise: the same seed gives the same numbers.
``minispec serve-bench`` puts it beside the engine measured on the same traffic.

Which load hurts depends on what the step time counts. Weights only (``RooflineSteps(kv=False)``,
a lower bound on every step) an 8B target on an H100 breaks even near 187 rows, and a busy
endpoint gets there. Counting the KV reads, a Llama-3.2-1B draft with its own full KV breaks
even near 280 rows at 640 tokens of context, about where this traffic's KV fills the H100, and
a draft whose KV is a 256-token window never does (MagicDec); at short contexts (a 192-token
chat) break-even is back near 185 rows, and vLLM's default of 1,024 rows lets a busy endpoint
pass it. Memory shows as preemptions: at 35 requests/s plain decoding holds ~340 rows, while a
draft with its own full KV runs out of blocks. ``tests/serving/test_serving.py`` shows each.

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
from minispec.engine.blocks import BlockManager
from minispec.engine.request import Sequence
from minispec.engine.scheduler import Scheduler as EngineScheduler
from minispec.roofline.policy import FixedPolicy, GammaPolicy
from minispec.serving.steps import RooflineSteps, StepTimes
from minispec.serving.traffic import Request, Workload, acceptance, poisson_requests


@dataclass(frozen=True)
class Scheduler:
    """What the server admits. The defaults are vLLM's engine defaults on a GPU of 70 GiB or more that is
    not an A100 (an H100 or H200): ``max_num_seqs`` 1024 and, for the OpenAI server, ``max_num_batched_tokens``
    8192 (``EngineArgs._set_default_args`` in ``vllm/engine/arg_utils.py``, read at commit 99d7eb5d; other GPUs
    get 256 and 2048, and ``LLM`` offline gets 16384 tokens on the large GPUs, 8192 on the others)."""

    max_rows: int = 1024  # running requests at most (max_num_seqs)
    max_batched_tokens: int = 8192  # tokens the target reads a step (max_num_batched_tokens): 1 + K per decoding row
    kv_tokens: int | None = None  # KV-cache slots; None: the step source's kv_budget (None there: no limit)
    block_size: int = 16  # KV slots per block (vLLM's default)

    def __post_init__(self):
        if not self.max_rows >= 1 or not self.max_batched_tokens >= 1 or not self.block_size >= 1:
            raise ValueError(f"need max_rows, max_batched_tokens and block_size >= 1: {self}")


class Step(NamedTuple):
    kind: str  # "decode" (rows decoded, and maybe prompts were prefilled beside them) or "prefill" (prompts only)
    end_s: float  # s, when it ended
    seconds: float  # s, how long it took
    batch: int  # rows it decoded (a "prefill" step: rows it prefilled)
    gamma: int  # draft tokens per row (0 for plain decoding and for prefill)
    context: float = 0.0  # mean KV tokens per decoding row (0 for prefill)
    prefill_tokens: int = 0  # prompt tokens (chunks of them) it prefilled


@dataclass
class Run:
    """A simulated run: the requests with their times filled in, every step, and the policy as it ended."""

    requests: list[Request]
    steps: list[Step] = field(repr=False)
    policy: GammaPolicy | None = None  # the simulator's copy, with its running alpha
    preemptions: int = 0  # requests whose KV was dropped, to be recomputed

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
    policy = copy.deepcopy(speculation) if isinstance(speculation, GammaPolicy) else (
        FixedPolicy(int(speculation)) if speculation else None)
    G = 0 if policy is None else policy.gamma_max  # the most draft tokens a step may test: lookahead slots
    requests = sorted((replace(r) for r in requests), key=lambda r: r.arrival_s)
    seqs = [Sequence(r.prompt_tokens, r.output_tokens, r.arrival_s, num_tokens=r.prompt_tokens) for r in requests]
    alphas = {s: acceptance(r.alpha, G) for r, s in zip(requests, seqs)}  # each row's rate by position; checks each
    budget = scheduler.kv_tokens if scheduler.kv_tokens is not None else steps.kv_budget(policy is not None)
    bs = scheduler.block_size
    need = max(r.prompt_tokens + r.output_tokens - 1 + G for r in requests)  # KV slots a request holds at most
    blocks = (sum(-(-(r.prompt_tokens + r.output_tokens + G) // bs) for r in requests) if budget in (None, math.inf)
              else int(budget // bs))
    if need > blocks * bs:
        raise ValueError(f"a request needs {need} KV tokens (with {G} lookahead slots), more than the budget of "
                         f"{budget} ({blocks} blocks of {bs})")
    if scheduler.max_batched_tokens < 1 + G:
        raise ValueError(f"max_batched_tokens ({scheduler.max_batched_tokens}) must hold a decoding row's 1 + {G}")
    tell_context = not isinstance(steps, RooflineSteps) or steps.kv  # a weights-only bound plans at context 0
    engine = EngineScheduler(BlockManager(blocks, bs), scheduler.max_rows, scheduler.max_batched_tokens, policy,
                             context=tell_context)
    if policy is not None:
        policy.start()
    rng = np.random.default_rng(seed)  # the acceptance coins
    arrivals, trace, t = deque(zip(requests, seqs)), [], 0.0
    while arrivals or engine.has_work():
        while arrivals and arrivals[0][0].arrival_s <= t:
            engine.add(arrivals.popleft()[1])
        if not engine.has_work():
            t = arrivals[0][0].arrival_s  # idle until the next arrival
            continue
        plan = engine.schedule()
        B, gamma, prompt = len(plan.decode), plan.gamma, sum(n for _, n in plan.prefill)
        ctx = np.array([s.num_computed for s in plan.decode], dtype=float)  # (B,) KV tokens each decoding row holds
        dt = (steps.speculative(ctx, gamma) if gamma else steps.plain(ctx)) if B else 0.0
        if plan.prefill:  # a second pass in the same step, as the engine runs it
            dt += steps.prefill(len(plan.prefill), prompt / len(plan.prefill), policy is not None)
        t += dt
        trace.append(Step("decode" if B else "prefill", t, dt, B if B else len(plan.prefill), gamma if B else 0,
                          float(ctx.mean()) if B else 0.0, prompt))
        alpha = np.array([alphas[s][:gamma] for s in plan.decode]).reshape(B, gamma)  # (B, gamma) by position
        n = (rng.random((B, gamma)) < alpha).cumprod(axis=1).sum(axis=1)  # (B,) accepted: the run before a rejection
        n = np.minimum(n, plan.k) if B else n  # (B,) a chain cut to the budget or to max_new_tokens - 1 drafted k
        new = {s: ([0] * (k + 1), [True] * k + [False]) for s, k in zip(plan.decode, n.tolist())}  # + the target's
        new |= {s: ([0], [False]) for s, k in plan.prefill if s.num_computed + k == s.prompt_len == s.num_tokens}
        engine.update(plan, new, t)  # adds the tokens (up to each request's output length), frees blocks
        if policy is not None and gamma and B:
            policy.observe(int(n.sum()), int(np.minimum(n + 1, plan.k).sum()))  # tested: up to the first rejection
    for r, s in zip(requests, seqs):
        r.first_token_s, r.finish_s = s.first_token_s, s.finish_s
    return Run(requests, trace, policy, engine.preemptions)


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
