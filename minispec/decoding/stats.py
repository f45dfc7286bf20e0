"""What a decoding run measured: latency percentiles, throughput, acceptance (vLLM's names).

Acceptance, per draft-verify step of a row (a "draft"):
  acceptance rate         accepted / tokens drafted along one path: vLLM's draft acceptance rate for a chain
                          (accepted / draft tokens); for a tree, as if it drafted one path as deep as the tree.
  node acceptance rate    accepted / every draft token verified: the same for a chain, far lower for a tree,
                          whose nodes mostly lie off the path that is accepted.
  mean acceptance length  1 + accepted / drafts: tokens a row gains per step (vLLM's), chain or tree.

Latency terms, per row (a row is one request):
  TTFT  time to first token: from the call to the first token of the row.
  TPOT  time per output token after the first: (finish time - TTFT) / (tokens - 1).
  ITL   inter-token latency: the gap between consecutive outputs of a row. A speculative step
        hands a row several tokens at once, so ITL is measured per step (per chunk), as vLLM does.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field

import torch

from minispec.decoding.timing import synchronize


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0..100) with linear interpolation; nan for no values."""
    if not values:
        return math.nan
    xs = sorted(values)
    k = (len(xs) - 1) * q / 100
    lo, hi = math.floor(k), math.ceil(k)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


@dataclass
class Stats:
    batch_size: int
    num_output_tokens: int  # all rows together
    wall_s: float  # the whole call, prefill included
    ttft_s: float  # the batch is prefilled together, so every row has this TTFT
    tpot_p50_s: float
    tpot_p99_s: float
    itl_p50_s: float
    itl_p99_s: float
    output_throughput: float  # output tokens per second over the whole call
    num_steps: int  # decode steps after the first token
    phase_s: dict[str, float]  # seconds per timed phase
    row_tokens: list[int] = field(repr=False)  # output tokens of each row
    row_tpot_s: list[float] = field(repr=False)  # TPOT of each row (nan for a one-token row)
    # Speculative decoding only (None for plain decoding):
    gamma: int | str | None = None  # draft length (a tree: the depth it was cut to), or "auto"
    draft: str | None = None  # what drafted, e.g. "PromptLookupDraft(max_ngram=3, min_ngram=1)"
    num_drafts: int | None = None  # (row, step) pairs that proposed at least one token
    draft_tokens: int | None = None  # tokens proposed by the draft (a prompt-lookup row without a match proposes none)
    # draft tokens the rule accepted (in a row's last step, also those cut by max_new_tokens or EOS)
    accepted_tokens: int | None = None
    tested_tokens: int | None = None  # draft tokens the accept test reached (up to each row's first rejection)
    path_tokens: int | None = None  # draft tokens along one path: a chain's draft_tokens; a tree's depth per draft
    accepted_per_position: list[int] | None = None  # draft tokens accepted at position (tree depth) i
    per_position_acceptance_rates: list[float] | None = None  # accepted at position i / num_drafts (vLLM's)
    accepted_per_rank: list[int] | None = None  # trees: accepted nodes that were their parent's k-th child
    gamma_per_step: list[int] | None = field(default=None, repr=False)  # the gamma each step used
    tree_depth: int | None = None  # trees only: the deepest tree verified (gamma cuts it)
    tree_nodes: int | None = None  # trees only: the most draft nodes a row offered in one step
    synthetic: bool = False  # the accept rule was a synthetic one (bench's Bernoulli(alpha) acceptance), not exact

    @property
    def acceptance_rate(self) -> float | None:
        """accepted / tokens drafted along one path: vLLM's draft acceptance rate (accepted / draft tokens)
        for a chain; for a tree, accepted / (its depth x drafts), the rate of a chain as deep as the tree."""
        drafted = self.draft_tokens if self.path_tokens is None else self.path_tokens  # None: counted chains only
        return self.accepted_tokens / drafted if drafted else None

    @property
    def node_acceptance_rate(self) -> float | None:
        """accepted / draft tokens verified: for a tree, the share of its nodes that were accepted (a chain:
        its acceptance rate)."""
        if not self.draft_tokens:
            return None
        return self.accepted_tokens / self.draft_tokens

    @property
    def mean_acceptance_length(self) -> float | None:
        """Tokens a row gains per draft-verify step: 1 + accepted / drafts.

        The 1 is the token the target adds at every step (the resampled one after a rejection,
        or the bonus token when every draft token is accepted), as in vLLM.
        """
        if not self.num_drafts:
            return None
        return 1 + self.accepted_tokens / self.num_drafts

    @property
    def alpha_estimate(self) -> float | None:
        """accepted / tested: the maximum-likelihood per-token acceptance rate alpha of the
        i.i.d. model behind E(alpha, gamma). acceptance_rate is lower: it also counts the
        positions after a rejection, which are never tested."""
        if not self.tested_tokens:
            return None
        return self.accepted_tokens / self.tested_tokens

    @property
    def tpot_mean_s(self) -> float:
        vals = [t for t in self.row_tpot_s if not math.isnan(t)]
        return sum(vals) / len(vals) if vals else math.nan

    def goodput(self, tpot_slo_s: float) -> float:
        """Output tokens per second counting only rows whose TPOT meets the SLO."""
        good = sum(n for n, t in zip(self.row_tokens, self.row_tpot_s) if not t > tpot_slo_s)
        return good / self.wall_s

    def to_dict(self) -> dict:
        """One JSON-ready row: every field and derived metric, per-row lists left out."""
        d = {k: v for k, v in dataclasses.asdict(self).items() if k not in ("row_tokens", "row_tpot_s")}
        d |= {"acceptance_rate": self.acceptance_rate, "node_acceptance_rate": self.node_acceptance_rate,
              "mean_acceptance_length": self.mean_acceptance_length, "alpha_estimate": self.alpha_estimate,
              "tpot_mean_s": self.tpot_mean_s}
        return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in d.items()}


@dataclass
class Timeline:
    """Host timestamps of one call: its start, the first token, and the end of each decode step with the
    rows it served."""

    t0: float = field(default_factory=time.perf_counter)
    t_first: float = math.nan
    step_ends: list[float] = field(default_factory=list)
    step_active: list[int] = field(default_factory=list)

    def first_token(self, device) -> None:
        """The first tokens exist: time to first token ends here."""
        synchronize(torch.device(device))  # host sync: TTFT is the moment the first token exists
        self.t_first = time.perf_counter()

    def step(self, active: int) -> None:
        """A decode step that served ``active`` rows has ended (the loop has just synchronised)."""
        self.step_ends.append(time.perf_counter())
        self.step_active.append(active)

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0


def latency_stats(timeline: Timeline, row_tokens: list[int], row_finish_step: list[int]) -> dict:
    """TTFT, TPOT and ITL from a call's timeline: ``row_tokens[b]`` tokens in row b, whose last came
    at decode step ``row_finish_step[b]`` (-1: the first token)."""
    t_first, step_active = timeline.t_first, timeline.step_active
    ends = [t_first] + timeline.step_ends
    row_tpot = [(ends[f + 1] - t_first) / (n - 1) if n > 1 else math.nan for n, f in zip(row_tokens, row_finish_step)]
    itl = [g for s, g in enumerate(b - a for a, b in zip(ends, ends[1:])) for _ in range(step_active[s])]
    tpots = [t for t in row_tpot if not math.isnan(t)]
    return {
        "ttft_s": t_first - timeline.t0,
        "tpot_p50_s": percentile(tpots, 50),
        "tpot_p99_s": percentile(tpots, 99),
        "itl_p50_s": percentile(itl, 50),
        "itl_p99_s": percentile(itl, 99),
        "row_tpot_s": row_tpot,
        "row_tokens": row_tokens,
        "num_steps": len(timeline.step_ends),
    }
