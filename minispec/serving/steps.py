"""Step times for the serving simulator: from the roofline at each row's own context, or measured.

:class:`RooflineSteps` charges every step at the running rows' KV (target and draft), weights,
tensor-parallel all-reduces and fixed overheads; :class:`MeasuredSteps` reads a table of forward passes
measured with ``minispec bench``; :class:`EngineSteps` reads whole engine steps measured through
:class:`minispec.engine.Engine` (``minispec serve-bench``). All satisfy :class:`StepTimes`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Protocol

import numpy as np

from minispec import roofline
from minispec.roofline import LLAMA_8B, ModelShape
from minispec.roofline.hardware import H100_SXM, Hardware
from minispec.roofline.policy import RooflinePolicy, StepTable, _interp


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
        """A :class:`~minispec.roofline.policy.RooflinePolicy` on this source's device, target and draft
        (``kw``: alpha0, gamma_max, ...). It knows neither the overheads nor the all-reduces: what the simulator
        charges and the policy predicts then differ, as a real policy's model and its server do."""
        return RooflinePolicy(hardware=self.device, model=self.model, draft=self.draft,
                              draft_kv_window=self.draft_kv_window, draft_cost=self.draft_cost, **kw)


@dataclass
class MeasuredSteps:
    """Step times from a table measured on this machine, as :class:`~minispec.roofline.policy.MeasuredPolicy` takes it.

    ``target_step_s[(batch, tokens_per_row)]`` and ``draft_step_s[batch]`` in seconds, e.g.
    ``MeasuredSteps(*minispec.tools.steps.step_time_table(target, draft, batches, gamma_max))``;
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


@dataclass
class EngineSteps:
    """Step times of the engine itself, measured whole (scheduling, the paged gather, drafting, sampling and
    the host's bookkeeping included), as :func:`minispec.tools.serve_bench.engine_step_table` measures them.

    ``step_s[context][(batch, gamma + 1)]``: seconds of a decode step with every row at about ``context`` KV
    tokens, interpolated linearly in batch and in gamma, and, between the two smallest contexts measured, in the
    batch's *longest* row (the engine pads every row's attention to it; beyond them, along the same line).
    ``prefill_s[kind]``: (tokens, seconds) of prefill passes, ``"plain"`` and ``"draft"`` (the draft reading the
    prompt too), interpolated in the pass's tokens. A step that decodes and prefills costs both, as in the engine.
    """

    step_s: dict[int, dict[tuple[int, int], float]]
    prefill_s: dict[str, list[tuple[int, float]]]

    def __post_init__(self):
        self.contexts = sorted(self.step_s)
        self.tables = [StepTable(self.step_s[c], {1: 0.0}) for c in self.contexts]
        if not self.prefill_s.get("plain"):
            raise ValueError("EngineSteps needs plain prefill times")

    def _width(self, table: StepTable, batch: int, tokens_per_row: int) -> float:
        """A step at this batch, interpolated linearly between the widths measured (1 + gamma tokens a row)."""
        widths = table.tokens_per_row
        if tokens_per_row in widths:
            return table.target(batch, tokens_per_row)
        return _interp([(w, table.target(batch, w)) for w in widths], tokens_per_row)

    def _decode(self, context: np.ndarray, tokens_per_row: int) -> float:
        at = [self._width(t, len(context), tokens_per_row) for t in self.tables]
        if len(at) == 1:
            return at[0]
        (c0, c1), (s0, s1) = self.contexts[:2], at[:2]
        return max(min(s0, s1), s0 + (s1 - s0) * (float(np.max(context)) - c0) / (c1 - c0))

    def plain(self, context: np.ndarray) -> float:
        return self._decode(context, 1)

    def speculative(self, context: np.ndarray, gamma: int) -> float:
        return self._decode(context, gamma + 1)

    def prefill(self, batch: int, prompt_tokens: float, draft: bool = False) -> float:
        return _interp(self.prefill_s["draft" if draft and self.prefill_s.get("draft") else "plain"],
                       batch * prompt_tokens)

    def kv_budget(self, draft: bool = False) -> None:
        return None

    @classmethod
    def fit(cls, records: list[tuple[int, int, int, float]]) -> EngineSteps:
        """Step times fitted to an engine's own steps (decoding rows B, gamma, prompt tokens P, seconds): per gamma
        a line in B through the decode-only steps, and a line in P through what steps with a prefill took more.

        P counts prompt tokens only: a step's tokens less each decoding row's last token and its lookahead (gamma
        for a chain, the node budget for a tree), so a tree's steps count as decode steps here, not as prefill."""
        lines, extra = {}, []
        for g in sorted({g for b, g, p, _ in records if b and not p}):
            pts = np.array([(b, t) for b, gg, p, t in records if b and not p and gg == g], dtype=float)  # (n, 2)
            if len(pts) >= 3:
                lines[g] = (np.polyfit(pts[:, 0], pts[:, 1], 1) if len(set(pts[:, 0])) > 1
                            else (0.0, np.median(pts[:, 1])))
        if not lines:
            only = sum(1 for b, _, p, _ in records if b and not p)
            raise ValueError(f"EngineSteps.fit needs at least 3 steps that only decoded, at one gamma; {only} of these "
                             f"{len(records)} did (P counts prompt tokens alone): serve more requests")
        extra = [(p, t - (np.polyval(lines[g], b) if b else 0.0)) for b, g, p, t in records
                 if p and (not b or g in lines)]
        slope, icpt = np.polyfit(*np.array(extra, dtype=float).T, 1) if len(extra) > 1 else (0.0, 0.0)
        top = max(b for b, *_ in records)
        grid = sorted({1, top} | {x for x in (2, 4, 8, 16, 32, 64, 128, 256) if x < top})
        floor = 1e-4  # s: a line fitted through noisy points must not reach zero
        table = {(B, g + 1): max(floor, float(np.polyval(line, B))) for g, line in lines.items() for B in grid}
        if 0 not in lines:  # StepTable needs plain steps; a setting that never ran one never asks for them
            table |= {(B, 1): t for (B, w), t in table.items() if w == min(lines) + 1}
        return cls({0: table}, {"plain": [(n, max(floor, icpt + slope * n)) for n in (1, 64, 256, 1024, 4096)]})
