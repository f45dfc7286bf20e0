"""Synthetic serving traffic: Poisson arrivals with prompt lengths, output lengths and acceptance per traffic type.

A :class:`Workload` mixes :class:`Traffic` types by share; :func:`poisson_requests` draws its
requests, seeded; :func:`acceptance` and :func:`expected_tokens` turn one rate or per-position rates
into tokens per step.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import numpy as np


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
