"""Logits to probabilities (temperature, top-k, top-p), and seeded sampling that needs no host sync.

Plain and speculative decoding share these functions, so speculative sampling applies exactly
the same warping to the target's p and the draft's q (the warped p is the distribution the
output must follow).

Randomness is counter-based, in the spirit of Philox (Salmon et al. 2011): every random number
is a hash of (the row's seed, a stream, a position in the row, an index), not the next draw of
a generator shared by the batch. So a row's random numbers do not depend on which other rows
share its batch or where it sits in it, and a seeded request gives the same tokens alone and at
batch 64, as vLLM's per-request seeds do. The hash is a few integer operations on tensors: no
host sync, no kernel per row. Streams keep the draft's draws, the accept test's uniforms and the
target's draws apart; each step of a row keys its draws by the position where the step starts,
which only grows, so no number is ever used twice.
"""

from __future__ import annotations

import random
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


# --- counter-based random numbers ---------------------------------------------------------------

DRAFT, ACCEPT, TARGET = 1, 2, 3  # streams: the draft's draws, the accept test's uniforms, the target's draws
_MASK = 0xFFFFFFFF  # values are 32-bit, held in int64 so every product below stays under 2^63
_MASK64 = 2**64 - 1


def _splitmix64(x: int) -> int:
    """Steele et al.'s SplitMix64 finaliser, on the host: a 64-bit seed to a well-mixed 64-bit seed."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def _mix(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash (values in [0, 2^32), int64), three xor-shift-multiply rounds."""
    for _ in range(3):
        x = ((x >> 16) ^ x) * 0x45D9F3B & _MASK
    return (x >> 16) ^ x


def row_seeds(seed: int | list[int] | None, batch_size: int) -> list[int]:
    """One 64-bit seed per row: ``seed`` itself if a list (one per row); for an int, row b's seed
    is derived from (seed, b); for None, fresh OS randomness."""
    if isinstance(seed, (list, tuple)):
        if len(seed) != batch_size:
            raise ValueError(f"seed has {len(seed)} entries for {batch_size} prompts; give one per prompt")
        if not all(isinstance(s, int) and not isinstance(s, bool) for s in seed):
            raise ValueError(f"every per-row seed must be an integer, got {seed!r}")
        return [s & _MASK64 for s in seed]
    if seed is None:
        return [random.SystemRandom().getrandbits(64) for _ in range(batch_size)]
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise ValueError(f"seed must be an integer, a list of integers (one per prompt) or None, got {seed!r}")
    return [_splitmix64(_splitmix64(seed & _MASK64) + b) for b in range(batch_size)]


def row_keys(seeds: list[int], device) -> torch.Tensor:
    """The 32-bit hash key of each row's seed (B,), int64. Keys are 32-bit: two draws share their
    numbers with probability 2^-32 per pair, far below what any test here can see."""
    lo = torch.tensor([s & _MASK for s in seeds], dtype=torch.long, device=device)  # (B,)
    hi = torch.tensor([s >> 32 for s in seeds], dtype=torch.long, device=device)  # (B,)
    return _mix(_mix(lo) ^ hi)


def keys_at(rows: torch.Tensor, stream: int, position: torch.Tensor) -> torch.Tensor:
    """Keys (B, *) for draws of ``stream`` at ``position`` (B, *) of each row; rows (B,) from :func:`row_keys`."""
    rows = rows.view(-1, *([1] * (position.dim() - 1)))  # (B, 1...)
    return _mix((_mix(rows ^ stream) + position) & _MASK)


def subkeys(keys: torch.Tensor, n: int) -> torch.Tensor:
    """n independent keys (..., n) from each key (...,)."""
    return _mix((keys[..., None] + torch.arange(n, device=keys.device) * 0x9E3779B1) & _MASK)


def uniform(keys: torch.Tensor, n: int | None = None) -> torch.Tensor:
    """Uniforms in (0, 1), float32, 24 bits each: one per key (...,), or n per key (..., n) when n is given."""
    if n is not None:
        keys = subkeys(keys, n)  # (..., n)
    return ((_mix(keys) >> 8).float() + 0.5) / 2**24


def sample(weights: torch.Tensor, keys: torch.Tensor | None = None) -> torch.Tensor:
    """One token per row (...,) from non-negative weights (..., V), normalised or not.

    The exponential race: argmax_v w_v / E_v with E_v ~ Exp(1) picks v with probability
    w_v / sum(w); E_v = -log U_v with U_v the uniform of (key, v). It needs no normalisation,
    no host sync and no torch.multinomial. ``keys=None`` means the weights are one-hot
    (temperature 0): the race would pick the hot token, so take it and spend no randomness.
    """
    if keys is None:
        return weights.argmax(-1)
    race = -uniform(keys, weights.shape[-1]).log()  # (..., V) Exp(1) draws
    return (weights / race).argmax(-1)  # (...,)
