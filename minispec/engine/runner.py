"""The model runner: one engine step on the models, over whichever rows the scheduler chose.

A step is at most two forward passes of the target (vLLM flattens both into one pass with
variable-length attention; here each is a padded batch, so a 500-token prefill chunk does not pad
64 decoding rows to 500):

- **prefill**: the rows in prefill compute their chunk's KV (and the draft reads it too); a row
  whose prompt is now complete draws its first token from the last position's logits, exactly as
  :func:`minispec.decoding.plain.prefill` and :func:`~minispec.decoding.plain.first_token` do.
- **decode**: the decoding rows run :func:`minispec.speculative.loop.speculative_step` (draft,
  verify, accept, roll back), the package's own step, on a batch view: a
  :class:`BatchState` (the rows' tokens as one call's :class:`~minispec.decoding.plain.DecodeState`), a
  :class:`~minispec.engine.paged.PagedCache` over their block tables, a draft run assembled from
  the blocks (:mod:`minispec.engine.drafting`), and a :class:`~minispec.decoding.sampling.Sampler` keyed by
  each row's own seed. gamma 0 is a plain :func:`~minispec.decoding.plain.decode_step`.

Rows with different sampling settings (temperature, top-k, top-p) run as separate groups, one
pass each: the package's sampler applies one setting to a batch (a per-row sampler is where vLLM
differs). A row's random numbers are keyed by its seed and positions only, and its tokens depend
on no other row wherever its logits do not (float32 on a CPU; see :mod:`minispec.decoding.sampling`).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import torch

from minispec.decoding.plain import DecodeState, decode_step
from minispec.decoding.sampling import Sampler, probabilities
from minispec.decoding.timing import PhaseTimer
from minispec.drafts.base import Draft
from minispec.engine.drafting import Chunk, paged_draft
from minispec.engine.paged import PagedPool
from minispec.engine.request import Sequence
from minispec.engine.scheduler import StepPlan
from minispec.model.llama import Model
from minispec.speculative.loop import speculative_step
from minispec.speculative.rule import accept_reject


class BatchState(DecodeState):
    """One step's rows as a :class:`~minispec.decoding.plain.DecodeState`: their tokens, lengths and per-row limits.

    Per-row EOS is left to the engine (each row's own set, on the host, after the step), so ``eos`` is None here;
    ``max_new`` is a tensor (B,), so each row stops at its own max_new_tokens.
    """

    def __init__(self, rows: list[Sequence], slack: int, device):
        totals = [s.num_tokens for s in rows]
        self.device, self.longest, self.slots = torch.device(device), max(totals), max(totals) + slack
        seq = torch.zeros(len(rows), self.slots, dtype=torch.long)  # (B, S) tokens, then padding
        for b, s in enumerate(rows):
            seq[b, : totals[b]] = torch.tensor(s.tokens)
        self.seq = seq.to(self.device)
        self.prompt_len = torch.tensor([s.prompt_len for s in rows], device=self.device)  # (B,)
        self.max_new = torch.tensor([s.max_new_tokens for s in rows], device=self.device)  # (B,)
        self.total = torch.tensor(totals, device=self.device)  # (B,)
        self.done = torch.zeros(len(rows), dtype=torch.bool, device=self.device)  # (B,)
        self.finish_step = torch.full((len(rows),), -1, dtype=torch.long, device=self.device)  # (B,)
        self.from_draft = torch.zeros(len(rows), self.slots, dtype=torch.bool, device=self.device)  # (B, S)
        self.eos, self.step = None, 0


@dataclass
class StepResult:
    """What a step produced: new tokens per row, and its acceptance counts (vLLM's names)."""

    new: dict[int, tuple[list[int], list[bool]]] = field(default_factory=dict)  # id(seq) -> tokens, accepted flags
    num_drafts: int = 0  # rows that proposed at least one token
    draft_tokens: int = 0  # tokens proposed
    accepted_tokens: int = 0  # draft tokens accepted (in a row's last step, also those max_new_tokens cut)
    tested_tokens: int = 0  # draft tokens the accept test reached (up to each row's first rejection)
    accepted_per_position: list[int] = field(default_factory=list)  # draft tokens accepted at position (depth) i


class ModelRunner:
    """Runs a :class:`~minispec.engine.scheduler.StepPlan` on the target and draft, KV in ``num_blocks`` blocks."""

    def __init__(self, target: Model, draft: Draft | None, num_blocks: int, block_size: int, rule=accept_reject):
        cfg = target.config
        self.target, self.draft, self.rule = target, draft, rule
        self.pool = PagedPool(cfg.num_hidden_layers, num_blocks, block_size, cfg.num_key_value_heads, cfg.head_dim,
                              target.device, target.dtype)
        self.drafter = None if draft is None else paged_draft(draft, target, num_blocks, block_size)
        self.features = () if draft is None else self.drafter.features
        self.scratch = num_blocks  # the padding block
        self.timer = PhaseTimer(target.device)

    @property
    def nbytes(self) -> int:
        """Bytes of KV (and draft state) the runner holds."""
        return self.pool.nbytes + (0 if self.drafter is None else self.drafter.nbytes)

    def tables(self, rows: list[Sequence]) -> torch.Tensor:
        """Block tables (B, nb + 1), each padded with the scratch block (at least one column of it)."""
        nb = max(len(s.block_table) for s in rows) + 1
        return torch.tensor([s.block_table + [self.scratch] * (nb - len(s.block_table)) for s in rows],
                            device=self.target.device)

    @torch.inference_mode()
    def execute(self, plan: StepPlan) -> StepResult:
        result = StepResult()
        if plan.prefill:
            with self.timer("prefill"):
                self._prefill(plan.prefill, result)
        for rows in _groups(plan.decode).values():
            self._decode(rows, plan.gamma, plan.width, result)
        return result

    def _prefill(self, chunks: list[tuple[Sequence, int]], result: StepResult) -> None:
        rows, n = [s for s, _ in chunks], [k for _, k in chunks]
        dev, starts = self.target.device, [s.num_computed for s in rows]
        state = BatchState(rows, 1, dev)
        tokens = torch.zeros(len(rows), max(n), dtype=torch.long)  # (B, T) each row's chunk, right-padded
        for b, s in enumerate(rows):
            tokens[b, : n[b]] = torch.tensor(s.tokens[starts[b]: starts[b] + n[b]])
        chunk = Chunk(self.tables(rows), torch.tensor(starts, device=dev), max(starts), tokens.to(dev),
                      torch.tensor(n, device=dev) - 1, state.seq)
        cache = self.pool.view(chunk.tables, chunk.starts)
        cache.trim(chunk.bound)
        last = chunk.last[:, None]  # (B, 1)
        if self.features:  # as minispec.decoding.plain.prefill: every position's features, then the last logits
            logits, h = self.target(chunk.tokens, cache, features=self.features)  # (B, T, V), (B, T, F)
            logits = logits.gather(1, last[..., None].expand(-1, -1, logits.shape[-1]))[:, 0]  # (B, V)
        else:
            logits, h = self.target(chunk.tokens, cache, output_index=last)[:, 0], None  # (B, V)
        if self.drafter is not None:
            self.drafter.prefill(chunk, h)  # the draft reads the chunk too
            for s in rows:
                s.lag = self.drafter.start_lag
        first = [b for b, s in enumerate(rows) if s.num_computed + n[b] == s.prompt_len and s.num_output == 0]
        for params, idx in _groups([rows[b] for b in first], first).items():
            sampler = Sampler(params, [rows[b].seed for b in idx], len(idx), dev)
            at = torch.tensor(idx, device=dev)
            t = sampler.draw(probabilities(logits[at], params), state.total[at])  # (b,) position: the prompt's length
            for b, tok in zip(idx, t.tolist()):  # host sync: the first tokens
                result.new[id(rows[b])] = ([tok], [False])

    def _decode(self, rows: list[Sequence], gamma: int, width: int, result: StepResult) -> None:
        dev = self.target.device
        state = BatchState(rows, 1 + width + 1, dev)  # room for the row's last token's successors and emit's scratch
        tables = self.tables(rows)
        cache = self.pool.view(tables, state.total - 1)
        cache.trim(state.longest - 1)
        sampler = Sampler(rows[0].params, [s.seed for s in rows], len(rows), dev)
        start = state.total.clone()  # (B,)
        run = None if self.drafter is None else self.drafter.run(state, sampler, rows, tables)
        if gamma == 0:
            with self.timer("decode"):
                h = decode_step(self.target, cache, state, sampler, self.features)
            if run is not None:
                run.skipped(h)
            n = offered = torch.zeros_like(start)  # (B,)
        else:
            path, _, offered = speculative_step(self.target, cache, run, state, sampler, gamma, self.timer, self.rule)
            n = (path > 0).sum(1)  # (B,) draft tokens accepted
        j = torch.arange(1 + width, device=dev)
        at = (start[:, None] + j).clamp_max(state.slots - 1)  # (B, 1 + width) the row's new tokens' positions
        # host sync: the step's tokens, once. Per row: count, 1 + width tokens, 1 + width flags, accepted, offered
        out = torch.cat([(state.total - start)[:, None], state.seq.gather(1, at), state.from_draft.gather(1, at).long(),
                         n[:, None], offered[:, None]], 1).tolist()
        for s, r in zip(rows, out):
            k, acc, off = r[0], r[-2], r[-1]
            result.new[id(s)] = (r[1: 1 + k], [bool(f) for f in r[2 + width: 2 + width + k]])
            result.num_drafts += off > 0
            result.draft_tokens += off
            result.accepted_tokens += acc
            result.tested_tokens += min(acc + 1, off)
            at = result.accepted_per_position
            at.extend([0] * (acc - len(at)))
            for i in range(acc):
                at[i] += 1
        if self.drafter is not None:
            self.drafter.after(run, rows, speculative=gamma > 0)


def _groups(rows: list[Sequence], keys: list | None = None) -> dict:
    """Rows (or their ``keys``) grouped by sampling settings, in order."""
    groups = defaultdict(list)
    for s, k in zip(rows, keys if keys is not None else rows):
        groups[s.params].append(k)
    return groups
