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
as vLLM's serving benchmark counts it, so the ramp-up and the drain are in it), goodput (the
same, counting only requests that meet both a TTFT and a TPOT SLO, DistServe's definition, so a
growing queue shows) and the mean running batch (time-weighted over decode steps).

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
pass it. ``tests/test_serving.py`` shows each.

    steps = RooflineSteps(draft=LLAMA_1B)  # 8B target, 1B draft, both with their KV, on the H100 roofline
    requests = poisson_requests(Workload(rate=20.0, duration_s=10.0))
    print(simulate(requests, steps, speculation=4).summary(tpot_slo_s=0.008, ttft_slo_s=1.0))
"""

from __future__ import annotations

import copy
import math
import random
from collections import deque
from dataclasses import dataclass, field, replace
from typing import NamedTuple, Protocol

import numpy as np

from minispec import roofline
from minispec.hardware import H100_SXM, Hardware
from minispec.policy import GammaPolicy, RooflinePolicy, StepTable
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


def acceptance(alpha: float | tuple[float, ...], positions: int) -> np.ndarray:
    """(positions,) the acceptance rate of each draft position, given the ones before it were accepted.

    ``alpha``: one rate for every position, or a tuple of rates by position (its last rate repeats
    past its end). vLLM's ``Per-position acceptance rate`` is a different number: the share of drafts
    whose position i was accepted, i.e. the product of these rates up to i (see :func:`conditional`).
    """
    rates = tuple(alpha) if isinstance(alpha, (tuple, list)) else (alpha,)
    if not rates or not all(0 <= a <= 1 for a in rates):
        raise ValueError(f"alpha must be a rate in [0, 1] or a non-empty tuple of them, got {alpha!r}")
    return np.array([rates[min(i, len(rates) - 1)] for i in range(positions)], dtype=float)  # (positions,)


def conditional(per_position: tuple[float, ...]) -> tuple[float, ...]:
    """vLLM's per-position acceptance rates (the share of drafts accepted through position i, falling) ->
    the rate at each position given the ones before it were accepted, as :func:`acceptance` takes them."""
    shares = (1.0, *per_position)
    if not all(0 < b <= a <= 1 for a, b in zip(shares, shares[1:])):
        raise ValueError(f"per-position acceptance rates must be in (0, 1] and must not rise, got {per_position}")
    return tuple(b / a for a, b in zip(shares, shares[1:]))


def expected_tokens(alpha: float | tuple[float, ...], gamma: int) -> float:
    """E, tokens a speculative step yields per row: 1 + the sum over positions of P(accepted through i).

    A single alpha gives Leviathan's (1 - alpha^(gamma+1)) / (1 - alpha)."""
    return 1.0 + float(np.cumprod(acceptance(alpha, gamma)).sum())


@dataclass(frozen=True)
class Traffic:
    """One type of request: its acceptance rate, its share of arrivals, its lengths."""

    name: str = "chat"
    alpha: float | tuple[float, ...] = 0.8  # acceptance rate of a draft token; a tuple: by position (see acceptance)
    share: float = 1.0  # relative weight among the workload's types (normalised over the mix)
    prompt: Lengths = Lengths(128)  # prompt tokens
    output: Lengths = Lengths(1024, "uniform")  # output tokens (512..1536), the first (from the prefill) included

    def __post_init__(self):
        acceptance(self.alpha, 1)  # raises on a rate outside [0, 1]
        if not self.share > 0:
            raise ValueError(f"need a positive share: {self}")


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
    alpha: float | tuple[float, ...] = 0.8  # acceptance rate of its draft tokens (a tuple: by position)
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
    """Where the simulator's seconds come from. ``context`` (B,): the KV tokens each running row holds."""

    def plain(self, context: np.ndarray) -> float:
        """Seconds of one plain decode step over len(context) rows."""

    def speculative(self, context: np.ndarray, gamma: int) -> float:
        """Seconds of one speculative step: gamma draft steps, then verify gamma + 1 tokens per row."""

    def prefill(self, batch: int, prompt_tokens: float, draft: bool = False) -> float:
        """Seconds to prefill ``batch`` prompts of ``prompt_tokens`` tokens each (mean), through the
        draft as well if ``draft``."""

    def kv_budget(self, draft: bool = False) -> float | None:
        """KV-cache tokens that fit in memory beside the weights (the draft's too if ``draft``); None: no limit."""


# H100 SXM datasheet: NVLink 900 GB/s per GPU, both directions together; a ring all-reduce sends one way.
NVLINK_BANDWIDTH = 450e9  # B/s


@dataclass(frozen=True)
class RooflineSteps:
    """Step times from :mod:`minispec.roofline`, charged at the running rows' own context.

    The draft is a shape (its own weights, its KV read at min(context, ``draft_kv_window``) per row, its
    memory) or a constant c. ``kv=False`` is the weights-only reference model: it leaves every KV read
    out, so each of its steps is a lower bound on the real one. Tensor parallelism over ``tensor_parallel``
    GPUs is modelled as one device with that many times the bandwidth, FLOP/s and memory, plus two
    all-reduces per layer per forward pass (target and draft alike), each ``allreduce_s`` of latency
    plus a ring's 2 (tp - 1) / tp x tokens x hidden x 2 bytes over NVLink. The overheads are what the
    roofline leaves out: ``pass_overhead_s`` per forward pass of either model (kernel launches and host
    work; a prompt-lookup draft, c = 0 with no shape, makes none), ``step_overhead_s`` once per step
    (scheduling, sampling, the drafter's bookkeeping).
    """

    hardware: Hardware = H100_SXM  # one GPU
    model: ModelShape = LLAMA_8B  # the target
    draft_cost: float = 0.05  # c, one draft step over one plain target step; used when draft is None
    draft: ModelShape | None = None  # the draft's shape: costs its steps and prefill, and its memory; None: c
    draft_kv_window: int | None = None  # KV tokens the draft keeps and reads per row at most (None: all)
    kv: bool = True  # charge each row's KV read at its context; False: weights only, a lower bound on each step
    tensor_parallel: int = 1  # GPUs each model is split over
    allreduce_s: float = 10e-6  # s of latency per all-reduce: an assumption of the order of NCCL on NVLink
    pass_overhead_s: float = 0.0  # s per forward pass of either model
    step_overhead_s: float = 0.0  # s per step (prefill or decode)

    def __post_init__(self):
        tp = self.tensor_parallel
        if not self.draft_cost >= 0 or not tp >= 1 or tp != int(tp):
            raise ValueError(f"need draft_cost >= 0 and an integer tensor_parallel >= 1: {self}")
        if min(self.allreduce_s, self.pass_overhead_s, self.step_overhead_s) < 0:
            raise ValueError(f"allreduce_s, pass_overhead_s and step_overhead_s must be >= 0 seconds: {self}")
        if self.draft_kv_window is not None and not (self.draft is not None and self.draft_kv_window >= 1):
            raise ValueError(f"draft_kv_window must be >= 1 tokens and needs a draft shape: {self}")

    @property
    def device(self) -> Hardware:
        """The tensor-parallel group as one device: tensor_parallel x one GPU's bandwidth, FLOP/s and memory."""
        tp, hw = self.tensor_parallel, self.hardware
        if tp == 1:
            return hw
        return replace(hw, name=f"{tp}x {hw.name}", memory_bandwidth=tp * hw.memory_bandwidth,
                       peak_flops=tp * hw.peak_flops, memory_bytes=tp * hw.memory_bytes)

    def _roof(self, shape: ModelShape, batch: int, tokens_per_row: float, context: float) -> float:
        """One forward pass of ``shape`` on the roofline, its all-reduces included; no overhead."""
        seconds = roofline.step_time(batch, tokens_per_row, self.device, shape, context)
        tp = self.tensor_parallel
        if tp > 1:
            nbytes = batch * tokens_per_row * shape.heads * shape.head_dim * 2  # B: BF16 activations, hidden wide
            seconds += 2 * shape.layers * (self.allreduce_s + 2 * (tp - 1) / tp * nbytes / NVLINK_BANDWIDTH)
        return seconds

    def _mean(self, context: np.ndarray, window: int | None = None) -> float:
        """Mean KV tokens a row reads (at most ``window``); 0 for the weights-only model."""
        if not self.kv or not len(context):
            return 0.0
        return float(np.minimum(context, window).mean() if window else context.mean())

    def draft_step(self, context: np.ndarray) -> float:
        """Seconds of one draft step (one forward pass of the draft, or c of a target step) over these rows."""
        B = len(context)
        if self.draft is None:
            passes = self.pass_overhead_s if self.draft_cost > 0 else 0.0  # prompt lookup runs no forward pass
            return self.draft_cost * self._roof(self.model, B, 1, self._mean(context)) + passes
        return self._roof(self.draft, B, 1, self._mean(context, self.draft_kv_window)) + self.pass_overhead_s

    def plain(self, context: np.ndarray) -> float:
        overhead = self.pass_overhead_s + self.step_overhead_s
        return self._roof(self.model, len(context), 1, self._mean(context)) + overhead

    def speculative(self, context: np.ndarray, gamma: int) -> float:
        verify = self._roof(self.model, len(context), gamma + 1, self._mean(context)) + self.pass_overhead_s
        return verify + gamma * self.draft_step(context) + self.step_overhead_s

    def prefill(self, batch: int, prompt_tokens: float, draft: bool = False) -> float:
        target = self._roof(self.model, batch, prompt_tokens, 0)  # no history to read
        seconds = target + self.pass_overhead_s + self.step_overhead_s
        if draft and self.draft is None and self.draft_cost > 0:
            seconds += self.draft_cost * target + self.pass_overhead_s
        elif draft and self.draft is not None:
            seconds += self._roof(self.draft, batch, prompt_tokens, 0) + self.pass_overhead_s
        return seconds

    def kv_budget(self, draft: bool = False) -> float:
        """KV tokens that fit: max_batch at one token per row (its default share of memory, 90 %).

        A windowed draft's KV (at most ``draft_kv_window`` tokens a row) is left out of it.
        """
        shape = self.draft if draft else None
        if shape is not None and self.draft_kv_window is not None:
            shape = replace(shape, bytes_per_kv=0)
        return roofline.max_batch(self.device, self.model, 1, shape)

    def policy(self, **kw) -> RooflinePolicy:
        """A :class:`~minispec.policy.RooflinePolicy` on this source's device, target and draft (``kw``: alpha0,
        gamma_max, ...). It knows neither the overheads nor the all-reduces: what the simulator charges and the
        policy predicts then differ, as a real policy's model and its server do."""
        return RooflinePolicy(hardware=self.device, model=self.model, draft=self.draft,
                              draft_kv_window=self.draft_kv_window, draft_cost=self.draft_cost, **kw)


@dataclass
class MeasuredSteps:
    """Step times from a table measured on this machine, as :class:`~minispec.policy.MeasuredPolicy` takes it.

    ``target_step_s[(batch, tokens_per_row)]`` and ``draft_step_s[batch]`` in seconds, e.g.
    ``MeasuredSteps(*minispec.bench.step_time_table(target, draft, batches, gamma_max))``;
    interpolated linearly in batch, at the one context the table was measured at (the rows' own
    context is not read). A prefill runs at the best throughput the table shows (the smallest
    seconds per token of any target step) unless ``prefill_s_per_token`` is given, and takes at
    least one plain step; the draft's prefill costs draft / target step times more.
    """

    target_step_s: dict[tuple[int, int], float]
    draft_step_s: dict[int, float]
    prefill_s_per_token: float | None = None  # s per prompt token; None: from the table
    kv_tokens: int | None = None  # KV-cache tokens that fit; None: no memory limit

    def __post_init__(self):
        self.table = StepTable(self.target_step_s, self.draft_step_s)
        if self.prefill_s_per_token is None:
            self.prefill_s_per_token = self.table.best_s_per_token

    def plain(self, context: np.ndarray) -> float:
        return self.table.target(len(context))

    def speculative(self, context: np.ndarray, gamma: int) -> float:
        return self.table.target(len(context), gamma + 1) + gamma * self.table.draft(len(context))

    def prefill(self, batch: int, prompt_tokens: float, draft: bool = False) -> float:
        plain = self.table.target(batch)
        target = max(plain, self.prefill_s_per_token * batch * prompt_tokens)
        return target * (1 + self.table.draft(batch) / plain) if draft else target

    def kv_budget(self, draft: bool = False) -> int | None:
        return self.kv_tokens


# --- the event loop -----------------------------------------------------------------------------


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
        """Output tokens/s of the requests that met both a TTFT and a TPOT SLO (DistServe, arXiv 2401.09670)."""
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
