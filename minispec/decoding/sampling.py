"""Turn logits into the sampling distribution (temperature, top-k, top-p) and draw from it exactly.

Plain and speculative decoding share these functions, so speculative sampling applies exactly
the same warping to the target's p and the draft's q (the warped p is the distribution the
output must follow).

**Random numbers: Philox4x32-10** (Salmon et al. 2011, "Parallel random numbers: as easy as 1,
2, 3"; the generator of Random123, cuRAND and JAX's ``threefry`` sibling), written in integer
tensor ops: no host sync, one kernel sequence for the whole batch. A row's 64-bit seed is the
key; the counter is (index, position, stream, 0): ``position`` is where the row's step starts,
``stream`` keeps the draft's draws, the accept test's uniforms and the target's draws apart,
and ``index`` numbers the draws of one step (a draft position, a tree node). What is guaranteed:

- the numbers of a (seed, counter) pair are Philox4x32-10's: the known-answer vectors of
  Random123's ``tests/kat_vectors`` are tested;
- within one decoding call a row never uses a counter twice: every step of a running row starts
  at a larger position than the last, and within a step each draw has its own (stream, index);
- a row's numbers depend only on its own seed and counters, not on the batch around it. With
  one seed per row (``seed=[...]``), a request's draws are the same alone and in any batch; an
  int seed derives row b's seed from (seed, b), so there a row's draws depend on its index b.
  The *tokens* are batch-invariant only where the logits are too: in float32 with deterministic
  kernels (this package on a CPU). In bf16 on a GPU, a row's logits depend on the batch's shape
  (vLLM promises batch invariance only with batch-invariant kernels), so tokens can differ.

Distinct counters under one key give distinct outputs (Philox is a bijection of the counter);
independence beyond that is Philox's statistical quality (it passes TestU01's BigCrush), not a
proof.

**Sampling: one uniform per row and an inverse CDF in float64.** ``sample`` takes u in (0, 1),
forms the cumulative sum of the weights in float64 and returns the first token whose cumulative
weight exceeds u * total, with u * total held strictly below the total. The weights are scaled
to integers first (a power of two brings the total to about 2^52, then they are rounded), so the
cumulative sum is exact whatever order it is added in, on any device: a token of weight zero adds
exactly nothing, so it can never be the first to exceed anything, and no zero-weight token is ever
drawn, at any vocabulary size. Uniforms have 52 random bits, (k + 0.5) / 2^52, so they lie
strictly inside (0, 1) by construction.
Chosen by measurement (``scripts/sampler_bench.py``): at V = 128k and B = 64 on a 2-core CPU it is
several times faster than ``torch.multinomial`` and than an exponential race, which needs V random
numbers per draw (the race in float32 is also what picked zero-weight tokens before: u rounded to
1.0 made -log(u) = -0 and 0 / -0 = NaN).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import NamedTuple

import torch

# The smallest temperature taken: 1 / T must be a float32 number (1 / 3.4e38 = 2.9e-39). Below it the tempered
# distribution is, to float32, the argmax; but greedy decoding is temperature 0 here, a mode of its own (no random
# numbers, a tree's children are the draft's top-k, ties go to the lowest id), so such a T is refused, not switched.
MIN_TEMPERATURE = 1 / torch.finfo(torch.float32).max


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0 = greedy (argmax); otherwise logits are divided by it (>= MIN_TEMPERATURE)
    top_k: int | None = None  # keep the k most likely tokens
    top_p: float | None = None  # keep the smallest set of most likely tokens with mass >= top_p

    def __post_init__(self):
        if isinstance(self.temperature, bool) or not isinstance(self.temperature, (int, float)) or \
                not self.temperature >= 0:
            raise ValueError(f"temperature must be a number >= 0, got {self.temperature!r}")
        if 0 < self.temperature < MIN_TEMPERATURE:
            raise ValueError(f"temperature {self.temperature!r} is below {MIN_TEMPERATURE:.3g}: 1 / temperature "
                             "overflows float32; use temperature=0 for greedy decoding, its limit")
        if self.top_k is not None and (isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or
                                       self.top_k < 1):
            raise ValueError(f"top_k must be an integer >= 1 or None, got {self.top_k!r}")
        if self.top_p is not None and not (0 < self.top_p <= 1):
            raise ValueError(f"top_p must be in (0, 1] or None, got {self.top_p!r}")
        idle = [f"{k}={v!r}" for k, v in (("top_k", self.top_k), ("top_p", self.top_p)) if v is not None]
        if self.temperature == 0 and idle:
            import warnings

            # stacklevel 1: one location for every caller (generate, the loop, the engine's requests), so Python's
            # default filter shows a setting's warning once per process, not once per request or step
            it = "them" if len(idle) > 1 else "it"
            warnings.warn(f"{' and '.join(idle)} cannot act at temperature 0: greedy decoding takes the argmax of "
                          f"the whole distribution; give a temperature > 0 to sample with {it}", UserWarning,
                          stacklevel=1)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


class RowParams(NamedTuple):
    """Sampling settings per row, for a batch whose rows differ (the engine's): what :class:`SamplingParams` holds,
    as tensors (B,), so one pass serves any mix. Build it with :meth:`of`. Row b's distribution is, bit for bit,
    what ``probabilities`` gives that row's own :class:`SamplingParams` (tested)."""

    temperature: torch.Tensor  # (B,) float32, 0 = greedy
    top_k: torch.Tensor | None  # (B,) int64, 0 = off; None: no row has one
    top_p: torch.Tensor | None  # (B,) float32, 1 = off; None: no row has one
    greedy: bool  # every row greedy (host-side: a greedy batch draws no random numbers)

    @classmethod
    def of(cls, params: list[SamplingParams], device=None) -> RowParams:
        t = torch.tensor([p.temperature for p in params], dtype=torch.float32, device=device)  # (B,)
        k = [p.top_k or 0 for p in params] if any(p.top_k for p in params) else None
        top = [1.0 if p.top_p is None else p.top_p for p in params] if any(p.top_p for p in params) else None
        return cls(t, None if k is None else torch.tensor(k, device=device),
                   None if top is None else torch.tensor(top, dtype=torch.float32, device=device),
                   all(p.greedy for p in params))


def argmax(x: torch.Tensor) -> torch.Tensor:
    """``x.argmax(-1)``: the index of each row's largest value, the first one on ties (NaN counts as the largest,
    as argmax counts it), taken from ``x.max(-1)``: torch 2.13's CPU kernel for max over the last dimension is
    faster than argmax's (160 x 49,152 float32 logits, a speculative step's at batch 32: 2.1 against 5.8 ms on 2
    threads, 4.3 against 19.9 on one)."""
    return x.max(-1).indices


def probabilities(logits: torch.Tensor, params: SamplingParams | RowParams) -> torch.Tensor:
    """The sampling distribution (..., V), float32, for logits (..., V).

    Temperature 0 gives the one-hot distribution of the argmax, so greedy decoding is the
    temperature-0 case of the same code and nothing is ever divided by zero. The logits' maximum is
    subtracted before dividing by the temperature, so no temperature overflows them (logits / 1e-38
    would be inf, and softmax of inf is NaN): what is divided is <= 0, and the argmax gets exactly 0.
    Tokens that top-k or top-p remove have probability exactly 0. With :class:`RowParams` (B,) the
    first dimension of ``logits`` is the row.
    """
    if isinstance(params, RowParams):
        return _row_probabilities(logits, params)
    if params.greedy:
        return _one_hot(logits)
    logits = logits.float()  # (..., V)
    if params.temperature != 1:
        logits = (logits - logits.amax(-1, keepdim=True)).div_(params.temperature)  # (..., V) each <= 0
    if params.top_k is not None and params.top_k < logits.shape[-1]:
        kth = (logits.amax(-1, keepdim=True) if params.top_k == 1
               else logits.topk(params.top_k, dim=-1).values[..., -1:])  # (..., 1) the k-th largest
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = logits.softmax(-1)  # (..., V)
    if params.top_p is not None and params.top_p < 1:
        sorted_p, order = probs.sort(-1, descending=True)  # (..., V) each
        drop = sorted_p.cumsum(-1) - sorted_p >= params.top_p  # mass before a token already reaches top_p
        probs = probs.scatter(-1, order, sorted_p.masked_fill(drop, 0.0))  # (..., V)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def _one_hot(logits: torch.Tensor) -> torch.Tensor:
    """The temperature-0 distribution (..., V), float32: 1 at each row's argmax."""
    return one_hot(argmax(logits), logits.shape[-1])


def one_hot(top: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """The temperature-0 distribution (..., V), float32, of argmax indices ``top`` (...) already taken."""
    return torch.zeros(*top.shape, vocab_size, device=top.device).scatter_(-1, top[..., None], 1.0)


def _row_probabilities(logits: torch.Tensor, params: RowParams) -> torch.Tensor:
    """:func:`probabilities` with each row's own settings: the same operations, row by row, in one batch.
    Each row takes the same operations as alone (a temperature of 1 leaves the logits as they are), so a row gets
    exactly what its own :class:`SamplingParams` gives."""
    shape = (-1,) + (1,) * (logits.dim() - 1)  # broadcast (B,) over (B, ..., V)
    t = params.temperature.view(shape)  # (B, 1...)
    greedy = t == 0  # (B, 1...)
    onehot = _one_hot(logits)  # (..., V)
    if params.greedy:
        return onehot
    z = logits.float()  # (..., V)
    z = torch.where(t == 1, z, (z - z.amax(-1, keepdim=True)) / torch.where(greedy, 1.0, t))  # (..., V) as alone
    if params.top_k is not None:
        k = params.top_k.view(shape)  # (B, 1...) 0: off
        kmax = min(int(params.top_k.max()), z.shape[-1])  # host sync: a shape (topk's k)
        top = z.topk(kmax, dim=-1).values  # (..., kmax) descending
        kth = top.gather(-1, (k.clamp(1, kmax) - 1).expand(*z.shape[:-1], 1))  # (..., 1) row b's k-th largest
        z = z.masked_fill((z < kth) & (k > 0) & (k < z.shape[-1]), float("-inf"))
    probs = z.softmax(-1)  # (..., V)
    if params.top_p is not None:
        top_p = params.top_p.view(shape)  # (B, 1...) 1: off
        sorted_p, order = probs.sort(-1, descending=True)  # (..., V) each
        drop = (sorted_p.cumsum(-1) - sorted_p >= top_p) & (top_p < 1)  # mass before a token reaches top_p
        cut = probs.scatter(-1, order, sorted_p.masked_fill(drop, 0.0))  # (..., V)
        probs = torch.where(top_p < 1, cut / cut.sum(-1, keepdim=True), probs)  # (..., V)
    return torch.where(greedy, onehot, probs)  # (..., V)


def sample(weights: torch.Tensor, u: torch.Tensor | None = None) -> torch.Tensor:
    """One token per row (...,) from non-negative weights (..., V), normalised or not.

    ``u`` (...,): one uniform in (0, 1) per row (see :func:`uniforms`); the token is the first
    whose cumulative weight exceeds u * total (an inverse CDF). The weights are first put on an
    integer grid: scaled by a power of two that brings the row's total to about 2^52, and rounded.
    Integers below 2^53 add exactly in float64, in any order, so the cumulative sum is the same
    from a left-to-right scan and from a parallel one (which, over raw floats, rounds a zero
    weight's entry apart from its neighbour's), and a zero weight, still exactly 0, leaves it
    unchanged: a zero-weight token is never drawn, on any device. The grid moves each token's
    probability by at most 2^-52 (a float64 cumulative sum's own resolution); a token below
    2^-53 of the total is never drawn either.
    ``u=None`` means the weights are one-hot (temperature 0): take the argmax and spend no
    randomness. All-zero weights have no distribution, and a total past float32's range has no
    exponent; the caller passes neither.
    """
    if u is None:
        return argmax(weights)
    _, e = torch.frexp(weights.sum(-1, keepdim=True))  # (..., 1) total < 2^e (float32: only its exponent counts)
    scale = torch.ldexp(torch.ones_like(e, dtype=torch.float64), 52 - e)  # (..., 1) a power of two: exact
    cdf = weights.double().mul_(scale).round_().cumsum(-1)  # (..., V) integers < 2^53: exact in any order
    total = cdf[..., -1:]  # (..., 1)
    below = torch.minimum(u[..., None] * total, torch.nextafter(total, torch.zeros_like(total)))  # (..., 1) < total
    return torch.searchsorted(cdf, below, right=True)[..., 0].clamp_max(weights.shape[-1] - 1)  # (...,)


def take(t: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
    """Row b's slice ``t[b, n[b]]`` (B, ...) of t (B, N, ...), for n (B,)."""
    idx = n.view(-1, *([1] * (t.dim() - 1))).expand(-1, 1, *t.shape[2:])  # (B, 1, ...)
    return t.gather(1, idx)[:, 0]


class Argmax(NamedTuple):
    """p of rows that are all greedy: each position's temperature-0 distribution (a one-hot) held as its argmax
    (B, T+1) instead of a dense (B, T+1, V) one-hot, which at SmolLM2's batch of 32 with 4 draft tokens is 31 MB
    written and read again every step to compare tokens. :func:`~minispec.speculative.rule.accept_reject` takes it."""

    top: torch.Tensor  # (B, T+1) long: each position's argmax (the first on ties)


# --- the draft's distribution q of its proposed tokens ----------------------------------------------

class PointMass(NamedTuple):
    """q of a draft that proposes tokens deterministically (prompt lookup, a tree's top-k children): a
    point mass on each proposed token x, held in O(B * T) memory instead of a dense (B, T, V) one-hot.
    The accept rule reads it through :func:`q_of` and :func:`q_at`, as it reads a dense q."""

    proposed: torch.Tensor  # (B, T) bool: q_i = onehot(x_i) where True; q_i = 0 (nothing proposed) where False
    vocab_size: int


def q_of(q: torch.Tensor | PointMass, x: torch.Tensor) -> torch.Tensor:
    """q_i(x_i) (B, T), float32, for q dense (B, T, V) or point masses, and tokens x (B, T)."""
    if isinstance(q, PointMass):
        return q.proposed.float()
    return q.gather(-1, x[..., None])[..., 0]


def q_at(q: torch.Tensor | PointMass, x: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
    """Row b's distribution q_{i[b]} (B, V), all zero where i[b] is past the draft (i >= T)."""
    T = x.shape[1]
    if T == 0:  # nothing proposed at all (a prompt-lookup step with no match): q is zero
        return torch.zeros(len(x), q.vocab_size if isinstance(q, PointMass) else q.shape[-1], device=x.device)
    inside, j = i < T, i.clamp_max(T - 1)  # (B,) each
    if isinstance(q, PointMass):
        mass = (take(q.proposed, j) & inside).float()  # (B,)
        return torch.zeros(len(x), q.vocab_size, device=x.device).scatter_(1, take(x, j)[:, None], mass[:, None])
    return take(q, j) * inside[:, None]


def proposed(q: torch.Tensor | PointMass) -> torch.Tensor:
    """(B, T) bool: where a token was proposed (q is not all zero)."""
    return q.proposed if isinstance(q, PointMass) else q.amax(-1) > 0


# --- Philox4x32-10 --------------------------------------------------------------------------------

DRAFT, ACCEPT, TARGET = 1, 2, 3  # streams: the draft's draws, the accept test's uniforms, the target's draws
_MASK = 0xFFFFFFFF  # words are 32-bit, held in int64 so every product below stays under 2^63
_MASK64 = 2**64 - 1
_M = (0xD2511F53, 0xCD9E8D57)  # Philox4x32's multipliers (Random123, philox.h)
_W = (0x9E3779B9, 0xBB67AE85)  # its Weyl key increments: the golden ratio and sqrt(3) - 1, in 32 bits


def philox4x32(counter: torch.Tensor, key: torch.Tensor, rounds: int = 10) -> torch.Tensor:
    """Philox4x32-``rounds``: 4 words (..., 4) from counters (..., 4) and keys (..., 2), int64 holding 32-bit words.

    The pair (c0, c2) is multiplied in one op each round, as a stacked (2, ...) tensor; mulhilo is
    done in 16-bit halves of the multiplier so that every product fits in int64.
    """
    batch = torch.broadcast_shapes(counter.shape[:-1], key.shape[:-1])
    c = counter.expand(*batch, 4).movedim(-1, 0)  # (4, ...)
    k = key.expand(*batch, 2).movedim(-1, 0)  # (2, ...) (k0, k1)
    even, odd = c[0::2], c[1::2]  # (2, ...) (c0, c2) and (c1, c3)
    shape = (2,) + (1,) * (c.dim() - 1)
    m_lo = torch.tensor([m & 0xFFFF for m in _M], device=c.device).view(shape)  # (2, 1...)
    m_hi = torch.tensor([m >> 16 for m in _M], device=c.device).view(shape)  # (2, 1...)
    bump = torch.tensor(_W, device=c.device).view(shape)  # (2, 1...)
    for r in range(rounds):
        if r:
            k = (k + bump) & _MASK
        t1, t2 = even * m_lo, even * m_hi  # (2, ...) each < 2^48
        lo = (t1 + ((t2 & 0xFFFF) << 16)) & _MASK  # (2, ...) the low word of even * M
        hi = (t2 + (t1 >> 16)) >> 16  # (2, ...) the high word
        even, odd = hi.flip(0) ^ odd ^ k, lo.flip(0)  # (hi1 ^ c1 ^ k0, hi0 ^ c3 ^ k1), (lo1, lo0)
    return torch.stack([even[0], odd[0], even[1], odd[1]], -1)  # (..., 4)


def _splitmix64(x: int) -> int:
    """Steele et al.'s SplitMix64 finaliser, on the host: a 64-bit seed to a well-mixed 64-bit seed."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


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


def row_keys(seeds: list[int], device=None) -> torch.Tensor:
    """Each row's Philox key (B, 2), int64: the low and high 32 bits of its 64-bit seed."""
    return torch.tensor([[s & _MASK, (s >> 32) & _MASK] for s in seeds], dtype=torch.long, device=device)


def uniforms(keys: torch.Tensor, stream: int, position: torch.Tensor, n: int) -> torch.Tensor:
    """n uniforms (B, n), float64, strictly inside (0, 1), for rows with keys (B, 2) at ``position`` (B,).

    Draw j of row b is Philox4x32-10 of counter (j, position[b], stream, 0) under row b's key:
    two of its words give 52 random bits k, and u = (k + 0.5) / 2^52 (so 2^-53 <= u <= 1 - 2^-53).
    """
    j = torch.arange(n, device=keys.device)  # (n,)
    counter = torch.stack([j.expand(len(keys), n), position[:, None].expand(-1, n),
                           torch.full_like(position[:, None], stream).expand(-1, n),
                           torch.zeros_like(position[:, None]).expand(-1, n)], -1)  # (B, n, 4)
    words = philox4x32(counter, keys[:, None, :])  # (B, n, 4)
    bits = (words[..., 0] << 20) | (words[..., 1] >> 12)  # (B, n) 52 random bits
    return (bits.double() + 0.5) * 2.0**-52


class Sampler:
    """How one call's rows draw: the sampling parameters and each row's Philox key (see the module doc)."""

    def __init__(self, params: SamplingParams, seed: int | list[int] | None, batch_size: int, device=None):
        self.params = params
        self.keys = row_keys(row_seeds(seed, batch_size), device)  # (B, 2)

    def uniforms(self, stream: int, position: torch.Tensor, n: int) -> torch.Tensor | None:
        """n uniforms per row (B, n) of ``stream`` for the step that starts at ``position`` (B,); None when greedy
        (an argmax needs none)."""
        return None if self.params.greedy else uniforms(self.keys, stream, position, n)

    def accept_uniforms(self, position: torch.Tensor, n: int, exact: bool = False) -> torch.Tensor:
        """The accept test's n uniforms per row (B, n). When every row is greedy and the rule is ``exact``, 1/2 each,
        drawn from nothing: p and q are one-hot, so every u in (0, 1) gives the exact rule the same answer (the
        Philox pass cost 0.4 ms of a 7 ms step on the embedded pair's batch of 1). A synthetic rule draws from them,
        greedy or not."""
        if exact and self.params.greedy:
            return torch.full((len(self.keys), n), 0.5, dtype=torch.float64, device=self.keys.device)  # (B, n)
        return uniforms(self.keys, ACCEPT, position, n)

    def draw(self, weights: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
        """One token per row (B,) from weights (B, V): the target's draw of the step at ``position`` (B,)."""
        u = self.uniforms(TARGET, position, 1)  # (B, 1) or None
        return sample(weights, None if u is None else u[:, 0])
