"""Choose gamma, the draft length, for the next speculative step; 0 turns speculation off.

Notation as in :mod:`minispec.roofline`: alpha = acceptance rate of one draft token, gamma =
draft tokens per step, c = draft step cost as a fraction of a target step.

The loop calls ``start()`` at the beginning of each call (which forgets the running estimate
unless ``carry``), ``choose(batch_size, context)`` before each step (context: the running rows' mean
KV tokens) and ``observe(accepted, tested)`` after it. A policy's ``speedup(batch, gamma)`` is what it
predicts for one gamma; ``choose`` takes the best, and :func:`minispec.roofline.vllm_config_from_speedup`
turns it into vLLM's table.

Each row tests its draft tokens in order until the first rejection, so a step's likelihood is
alpha^accepted * (1 - alpha)^(tested - accepted), maximised by alpha = accepted / tested. The
running estimate keeps those two counts with exponential decay (old evidence halves every
``half_life_tokens`` tested tokens, so it follows a change of traffic) and adds a prior of
``prior_tokens`` pseudo-tokens at ``alpha0``:

    alpha = (accepted + alpha0 * prior_tokens) / (tested + prior_tokens)
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from minispec.roofline import LLAMA_8B, ModelShape, expected_tokens, speculative_speedup
from minispec.roofline import check_arguments as _check
from minispec.roofline.hardware import H100_SXM, Hardware
from minispec.roofline.profile import RankProfile, default_profile
from minispec.roofline.tree import TreeShape, best_tree, tree_speedup


@dataclass(kw_only=True)
class GammaPolicy:
    """Base: the running alpha estimate and the choice among gammas; subclasses define ``speedup`` (or ``choose``)."""

    gamma_max: int = 8  # longest draft considered
    alpha0: float = 0.8  # prior acceptance rate, before anything is observed
    prior_tokens: float = 16.0  # weight of the prior, in tested draft tokens
    half_life_tokens: float = 1000.0  # tested tokens after which old evidence counts half (inf: never forget)
    margin: float = 0.0  # hysteresis: keep the last gamma unless another's speedup beats it by this fraction
    carry: bool = False  # keep the running estimate from one generate call to the next (same traffic)
    accepted: float = field(default=0.0, init=False)  # decayed count of accepted draft tokens
    tested: float = field(default=0.0, init=False)  # decayed count of tested draft tokens
    last_gamma: int | None = field(default=None, init=False)  # the previous choice

    def __post_init__(self):
        _check(alpha=self.alpha0, gamma=self.gamma_max)
        if self.prior_tokens < 0 or not self.half_life_tokens > 0 or self.margin < 0:
            raise ValueError(f"need prior_tokens >= 0, half_life_tokens > 0, margin >= 0: {self}")

    def start(self) -> None:
        """At the start of a generate call: back to the prior (alpha0, no last gamma), unless ``carry``."""
        if not self.carry:
            self.accepted, self.tested, self.last_gamma = 0.0, 0.0, None

    @property
    def alpha(self) -> float:
        """The running acceptance-rate estimate."""
        n = self.tested + self.prior_tokens
        return (self.accepted + self.alpha0 * self.prior_tokens) / n if n else self.alpha0

    def observe(self, accepted: int, tested: int) -> None:
        """After a step: draft tokens accepted and tested (accepted + 1 per rejecting row), over active rows."""
        if not 0 <= accepted <= tested:
            raise ValueError(f"need 0 <= accepted <= tested, got accepted={accepted}, tested={tested}")
        keep = 0.5 ** (tested / self.half_life_tokens)
        self.accepted = self.accepted * keep + accepted
        self.tested = self.tested * keep + tested

    def speedup(self, batch: float, gamma: int, alpha: float | None = None, context: float | None = None) -> float:
        """Predicted speedup of gamma at this batch, ``alpha`` (None: the running estimate) and ``context`` (tokens
        of KV per row; None: the policy's own default); gamma 0 gives 1."""
        raise NotImplementedError

    def gammas(self) -> list[int]:
        """The gammas ``choose`` considers."""
        return list(range(self.gamma_max + 1))

    def choose(self, batch_size: int, context: float | None = None) -> int:
        """gamma for the next step at this batch size and the running rows' mean ``context`` (tokens each
        row's cache holds; the loop passes it every step); 0 = speculation off."""
        _check(batch=batch_size, context=context or 0)
        alpha = self.alpha
        return self._pick(lambda g: self.speedup(batch_size, g, alpha, context), self.gammas())

    def _pick(self, speedup, gammas) -> int:
        """The gamma with the highest ``speedup(gamma)`` (the smallest on a tie; gamma 0 has speedup 1)."""
        best = max(gammas, key=lambda g: (speedup(g), -g))
        if self.margin and self.last_gamma in gammas and speedup(best) <= speedup(self.last_gamma) * (1 + self.margin):
            best = self.last_gamma
        self.last_gamma = best
        return best


@dataclass
class FixedPolicy(GammaPolicy):
    """Always the same gamma (0 = plain decoding); still keeps the running alpha."""

    gamma: int

    def __post_init__(self):
        self.gamma_max = self.gamma
        super().__post_init__()

    def choose(self, batch_size: int, context: float | None = None) -> int:
        _check(batch=batch_size)
        return self.gamma


@dataclass(kw_only=True)
class RooflinePolicy(GammaPolicy):
    """The gamma the roofline model predicts fastest at this batch and the running alpha.

    The draft costs ``draft_cost`` = c of a plain target step, or, given a ``draft`` shape, its own
    step time (at most ``draft_kv_window`` KV tokens per row), as in :func:`~minispec.roofline.speculative_speedup`.
    """

    draft_cost: float = 0.05  # c, used when draft is None
    hardware: Hardware = H100_SXM
    model: ModelShape = LLAMA_8B  # the target
    context: float = 0  # tokens in each row's KV cache when choose() is not told the running context
    draft: ModelShape | None = None  # the draft's shape; c then follows from it at each batch and context
    draft_kv_window: int | None = None  # KV tokens the draft reads per row at most (None: all)

    def __post_init__(self):
        super().__post_init__()
        _check(draft_cost=self.draft_cost, context=self.context, draft=self.draft,
               draft_kv_window=self.draft_kv_window)

    def speedup(self, batch: float, gamma: int, alpha: float | None = None, context: float | None = None) -> float:
        return speculative_speedup(batch, self.alpha if alpha is None else alpha, gamma, self.draft_cost,
                                   self.hardware, self.model, self.context if context is None else context,
                                   draft=self.draft, draft_kv_window=self.draft_kv_window)


def _interp(points: list[tuple[float, float]], x: float) -> float:
    """Linear in x between points sorted by x; flat below the first, along the last segment beyond the last."""
    if len(points) == 1 or x <= points[0][0]:
        return points[0][1]
    i = min(bisect.bisect_left([p[0] for p in points], x), len(points) - 1)
    (x0, y0), (x1, y1) = points[i - 1], points[i]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


class StepTable:
    """Step times measured on one device, interpolated linearly in batch (flat below the first batch,
    along the last segment beyond the last).

    ``target_step_s[(batch, tokens_per_row)]``: seconds of one target step (``tokens_per_row = 1``
    required); ``draft_step_s[batch]``: seconds of one draft step. ``minispec.tools.steps.step_time_table``
    measures both.
    """

    def __init__(self, target_step_s: dict[tuple[int, int], float], draft_step_s: dict[int, float]):
        self._target: dict[int, list[tuple[int, float]]] = {}  # tokens_per_row -> [(batch, s)] sorted
        for (B, T), s in sorted(target_step_s.items()):
            self._target.setdefault(T, []).append((B, s))
        self._draft = sorted(draft_step_s.items())
        if 1 not in self._target or not self._draft:
            raise ValueError("the table needs target steps with tokens_per_row = 1 and at least one draft step")
        self.tokens_per_row = sorted(self._target)  # the measured verify widths
        self.best_s_per_token = min(s / (B * T) for (B, T), s in target_step_s.items())

    def target(self, batch: float, tokens_per_row: int = 1) -> float:
        """Seconds of one target step over ``tokens_per_row`` tokens in each of ``batch`` rows."""
        if tokens_per_row not in self._target:
            raise ValueError(f"no target steps with tokens_per_row = {tokens_per_row} were measured "
                             f"(measured: {self.tokens_per_row})")
        return _interp(self._target[tokens_per_row], batch)

    def draft(self, batch: float) -> float:
        """Seconds of one draft step at ``batch`` rows."""
        return _interp(self._draft, batch)


@dataclass
class MeasuredPolicy(GammaPolicy):
    """The gamma that measured step times predict fastest.

    ``target_step_s[(batch, tokens_per_row)]``: seconds of one target step; ``draft_step_s[batch]``:
    seconds of one draft step. Times are interpolated linearly in batch. A gamma is considered
    when ``tokens_per_row = gamma + 1`` was measured (``tokens_per_row = 1`` is required); its
    speedup is E(alpha, gamma) * target(B, 1) / (target(B, gamma + 1) + gamma * draft(B)).
    """

    target_step_s: dict[tuple[int, int], float]
    draft_step_s: dict[int, float]

    def __post_init__(self):
        super().__post_init__()
        self.table = StepTable(self.target_step_s, self.draft_step_s)

    def gammas(self) -> list[int]:
        return [g for g in range(self.gamma_max + 1) if g + 1 in self.table.tokens_per_row]

    def speedup(self, batch: float, gamma: int, alpha: float | None = None, context: float | None = None) -> float:
        """As measured at the table's own context (``context`` is not used)."""
        _check(batch=batch, gamma=gamma)
        plain, verify = self.table.target(batch), self.table.target(batch, gamma + 1)
        return expected_tokens(self.alpha if alpha is None else alpha, gamma) * plain / (
            verify + gamma * self.table.draft(batch))


@dataclass(kw_only=True)
class TreePolicy(RooflinePolicy):
    """For a tree draft, whose depth gamma caps: the depth whose tree the roofline predicts fastest.

    Gamma g verifies the tree's nodes down to depth g, after g draft passes: a static ``tree`` cut at depth g
    (:meth:`TreeShape.truncated`), or a dynamic tree (EAGLE-2) of ``budget`` nodes chosen among topk + (g - 1)
    topk^2 candidates, drafted in passes over 1, topk, ..., topk tokens per row, and credited with the best tree of
    that many nodes, depth <= g and ranks < ``topk`` (the most a dynamic tree can accept, as the draft ranks nodes
    by its own q). Each is priced by :func:`~minispec.roofline.tree_speedup`: every row verifies every node. The
    running alpha is the first-ranked child's acceptance per level reached (what the loop reports for a tree), and
    ``profile`` (None: :func:`default_profile` of it) gives the other ranks.
    """

    tree: TreeShape | None = None  # a static tree, whole
    budget: int | None = None  # or a dynamic tree: nodes verified per row
    topk: int = 4  # ... and children per expanded node, nodes expanded per pass
    profile: tuple | list | RankProfile | None = None  # acceptance by child rank; None: default_profile(alpha)

    def __post_init__(self):
        super().__post_init__()
        if (self.tree is None) == (self.budget is None):
            raise ValueError("a TreePolicy needs a static tree= or a dynamic tree's budget=, not both or neither")
        if self.budget is not None and not (self.budget >= 1 and self.topk >= 1):
            raise ValueError(f"budget and topk must be >= 1, got budget={self.budget}, topk={self.topk}")
        if self.tree is not None:
            self._cut = {g: self.tree.truncated(g) for g in range(1, self.gamma_max + 1)}

    def verified(self, gamma: int, alpha: float) -> tuple[TreeShape, tuple[int, ...] | None]:
        """The tree gamma verifies and its draft passes (None: the tree's own ``expanded``)."""
        if self.tree is not None:
            return self._cut[gamma], None
        k, nodes = self.topk, min(self.budget, self.topk + (gamma - 1) * self.topk ** 2)
        return best_tree(nodes, alpha, profile=_first_ranks(self.profile, alpha, k), max_depth=gamma), \
            (1,) + (k,) * (gamma - 1)

    def speedup(self, batch: float, gamma: int, alpha: float | None = None, context: float | None = None) -> float:
        if gamma == 0:
            return 1.0
        alpha = self.alpha if alpha is None else alpha
        tree, passes = self.verified(gamma, alpha)
        return tree_speedup(batch, tree, alpha, self.draft_cost, self.hardware, self.model,
                            self.context if context is None else context, profile=self.profile, draft=self.draft,
                            draft_kv_window=self.draft_kv_window, passes=passes)


def _first_ranks(profile, alpha: float, k: int):
    """``profile`` (None: the default one of alpha) with ranks k and past never accepted: a top-k tree's."""
    if profile is None:
        return default_profile(alpha, k)
    if isinstance(profile, RankProfile):
        return RankProfile(profile.after_first[:k], profile.after_other[:k])
    rows = list(profile)
    return [tuple(r)[:k] for r in rows] if rows and hasattr(rows[0], "__len__") else tuple(rows)[:k]


def auto_policy(target: ModelShape, draft: ModelShape | None, hardware: Hardware, gamma_max: int = 8,
                **kw) -> RooflinePolicy:
    """The policy behind ``speculative_generate(..., gamma="auto")``: a :class:`RooflinePolicy` for this pair, or
    for a tree draft (``tree=`` a static :class:`TreeShape`, or ``budget=`` and ``topk=`` of a dynamic one) a
    :class:`TreePolicy`, which prices the nodes every row verifies at each depth, not a chain.

    ``target`` and ``draft`` are shapes (:meth:`ModelShape.from_model`), ``hardware`` the ceilings
    of their device (the caller picks: a datasheet preset or a calibration); c follows from the
    draft's own weights and KV at each batch and context. ``draft=None`` is a draft that costs
    nothing (prompt lookup: c = 0), unless ``kw`` sets ``draft_cost``. ``kw`` goes to the policy (alpha0,
    context, ...).
    """
    kw = ({"draft": draft} if draft is not None else {"draft_cost": 0.0}) | kw
    tree = "tree" in kw or "budget" in kw
    return (TreePolicy if tree else RooflinePolicy)(gamma_max=gamma_max, model=target, hardware=hardware, **kw)


@dataclass(kw_only=True)
class BatchTablePolicy(GammaPolicy):
    """vLLM's ``num_speculative_tokens_per_batch_size`` table as a policy: K from the running batch alone.

    ``ranges``: [[start_bs, end_bs, K], ...], vLLM's key as :func:`~minispec.roofline.vllm_speculative_config`
    writes it (:meth:`from_config` takes that whole dict). As vLLM expands it (``build_dynamic_sd_schedule_lookup`` in
    ``vllm/v1/spec_decode/dynamic/utils.py``, read at commit 14b450ca): the first range starts at batch 1, ranges
    are sorted and do not overlap, a batch in a gap between ranges gets the K of the range before it, and a batch
    past the last range gets the last K. The running alpha is kept but never consulted: the table is fixed.
    """

    ranges: list[list[int]]  # [[start_bs, end_bs, K], ...], inclusive

    def __post_init__(self):
        ranges = [list(r) for r in self.ranges]
        if not ranges or any(len(r) != 3 or any(int(x) != x for x in r) for r in ranges):
            raise ValueError(f"ranges must be a non-empty list of [start_bs, end_bs, K] integers, got {self.ranges}")
        if ranges[0][0] != 1 or any(not 1 <= s <= e for s, e, _ in ranges) or any(K < 0 for *_, K in ranges):
            raise ValueError(f"ranges must start at batch 1, with 1 <= start_bs <= end_bs and K >= 0: {self.ranges}")
        if any(b[0] <= a[1] for a, b in zip(ranges, ranges[1:])):
            raise ValueError(f"ranges must be sorted and must not overlap: {self.ranges}")
        self.ranges = ranges
        self.gamma_max = max(K for *_, K in ranges)
        super().__post_init__()

    @classmethod
    def from_config(cls, config: dict, **kw) -> BatchTablePolicy:
        """From the keys of vLLM's ``--speculative-config`` (as :func:`~minispec.roofline.vllm_speculative_config`)."""
        return cls(ranges=config["num_speculative_tokens_per_batch_size"], **kw)

    def choose(self, batch_size: int, context: float | None = None) -> int:
        _check(batch=batch_size)
        i = bisect.bisect_right([s for s, _, _ in self.ranges], batch_size) - 1  # the last range starting at or below
        self.last_gamma = self.ranges[i][2]
        return self.last_gamma
