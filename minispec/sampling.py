"""Logits to probabilities (temperature, top-k, top-p) and sync-free sampling.

Plain and speculative decoding share these functions, so speculative sampling applies exactly
the same warping to the target's p and the draft's q (the warped p is the distribution the
output must follow).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0 = greedy (argmax); otherwise logits are divided by it
    top_k: int | None = None  # keep the k most likely tokens
    top_p: float | None = None  # keep the smallest set of most likely tokens with mass >= top_p

    def __post_init__(self):
        if not isinstance(self.temperature, (int, float)) or not self.temperature >= 0:
            raise ValueError(f"temperature must be a number >= 0, got {self.temperature!r}")
        if self.top_k is not None and (not isinstance(self.top_k, int) or self.top_k < 1):
            raise ValueError(f"top_k must be an integer >= 1 or None, got {self.top_k!r}")
        if self.top_p is not None and not (0 < self.top_p <= 1):
            raise ValueError(f"top_p must be in (0, 1] or None, got {self.top_p!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def probabilities(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The sampling distribution (..., V), float32, for logits (..., V).

    Temperature 0 gives the one-hot distribution of the argmax, so greedy decoding is the
    temperature-0 case of the same code and nothing is ever divided by zero.
    """
    if params.greedy:
        return torch.zeros_like(logits, dtype=torch.float32).scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
    logits = logits.float() / params.temperature  # (..., V)
    if params.top_k is not None and params.top_k < logits.shape[-1]:
        kth = logits.topk(params.top_k, dim=-1).values[..., -1:]  # (..., 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = logits.softmax(-1)  # (..., V)
    if params.top_p is not None and params.top_p < 1:
        sorted_p, order = probs.sort(-1, descending=True)  # (..., V) each
        drop = sorted_p.cumsum(-1) - sorted_p >= params.top_p  # mass before a token already reaches top_p
        probs = probs.scatter(-1, order, sorted_p.masked_fill(drop, 0.0))  # (..., V)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def sample(weights: torch.Tensor, generator: torch.Generator | None = None, greedy: bool = False) -> torch.Tensor:
    """One token per row (...,) from non-negative weights (..., V), normalised or not.

    The exponential race: argmax_v w_v / E_v with E_v ~ Exp(1) picks v with probability
    w_v / sum(w). It needs no normalisation, no host sync and no torch.multinomial, and each
    row and position gets its own independent draws from ``generator``. ``greedy=True`` says
    the weights are one-hot (temperature 0): the race would pick the hot token, so take it
    directly and spend no random numbers.
    """
    if greedy:
        return weights.argmax(-1)
    race = torch.empty_like(weights, dtype=torch.float32).exponential_(generator=generator)  # (..., V)
    return (weights / race.clamp_min_(1e-30)).argmax(-1)  # (...,)
