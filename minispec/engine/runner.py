"""The model runner: one engine step on the models, over whichever rows the scheduler chose, in one target pass.

A step (vLLM V1's ``gpu_model_runner``, nano-vllm's ``model_runner``), read top to bottom in :meth:`execute`:

1. **Rows.** A request admitted this step gets a row of :class:`~minispec.engine.batch.DeviceRows` (its tokens
   copied once); every scheduled row's block table is written where it changed.
2. **Draft.** The decoding rows' draft proposes (a chain, or a tree), over a
   :class:`~minispec.decoding.plain.DecodeState` of those rows and a
   :class:`~minispec.decoding.sampling.Sampler` with each row's own settings (:class:`RowParams`) and seed. A
   row whose draft the scheduler cut to fit the token budget verifies only its first k tokens; a row that
   proposed fewer (prompt lookup without a match) feeds only what it proposed.
3. **One forward pass.** Every prefill chunk and every decoding row's last token and draft tokens, flattened
   into one (N,) vector with per-token positions and KV slots (:mod:`minispec.engine.attention`); the LM head
   runs only where logits are needed (decoding rows, and the last token of a prompt that completes).
4. **Accept.** The decoding rows go through :func:`minispec.speculative.loop.accept`, the package's own rule
   (a plain step draws one token per row); a prompt that completed draws its first token.
5. **The draft reads the prefill chunks** (its own KV; an EAGLE head's features), a cost in TTFT.
6. **One host sync**: each row's new tokens, which were draft tokens, and the step's acceptance counts.

Rows with any mix of temperature, top-k, top-p and seed share the pass. A static tree's children depend on
whether a row is greedy (the draft's top-k) or sampled (i.i.d. from q), so it drafts greedy and sampled rows
as two groups; they still share the one target pass. A dynamic tree takes the top-k for every row: one group.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from minispec.decoding.plain import DecodeState
from minispec.decoding.sampling import PointMass, RowParams, Sampler, argmax, probabilities, proposed
from minispec.decoding.timing import PhaseTimer
from minispec.decoding.tree import tree_mask
from minispec.drafts.base import Draft, Proposal
from minispec.drafts.tree import TreeDraft
from minispec.engine.attention import PagedStep, by_length, group, group_cost, reads_sparse, span
from minispec.engine.batch import DeviceRows
from minispec.engine.drafting import Chunk, paged_draft
from minispec.engine.paged import PagedPool
from minispec.engine.request import Sequence
from minispec.engine.scheduler import StepPlan
from minispec.model.llama import Model, attention_masks
from minispec.speculative.loop import accept, target_p


@dataclass
class StepResult:
    """What a step produced: new tokens per row, and its acceptance counts (vLLM's names)."""

    new: dict[Sequence, tuple[list[int], list[bool]]] = field(default_factory=dict)  # tokens, accepted flags
    num_drafts: int = 0  # rows that proposed at least one token
    draft_tokens: int = 0  # tokens proposed (and verified)
    accepted_tokens: int = 0  # draft tokens accepted, up to an EOS (in a row's last step, also those max_new cut)
    tested_tokens: int = 0  # draft tokens the accept test reached (up to each row's first rejection)
    accepted_per_position: list[int] = field(default_factory=list)  # draft tokens accepted at position (depth) i


class ModelRunner:
    """Runs a :class:`~minispec.engine.scheduler.StepPlan` on the target and draft, KV in ``num_blocks`` blocks;
    ``rows`` sequences at once of at most ``length`` tokens; ``rule``: the accept rule; ``attention``: see
    :mod:`minispec.engine.attention` (the engine passes its own)."""

    def __init__(self, target: Model, draft: Draft | None, num_blocks: int, block_size: int, rows: int,
                 length: int, rule, attention: str):
        cfg, dev = target.config, target.device
        self.target, self.draft, self.rule, self.attention = target, draft, rule, attention
        self.pool = PagedPool(cfg.num_hidden_layers, num_blocks, block_size, cfg.num_key_value_heads, cfg.head_dim,
                              dev, target.dtype)
        self.rows = DeviceRows(rows, length, -(-length // block_size), num_blocks, dev)
        self.drafter = None if draft is None else paged_draft(draft, target, num_blocks, block_size)
        self.features = () if draft is None else self.drafter.features
        self.timer = PhaseTimer(dev)

    @property
    def nbytes(self) -> int:
        """Bytes of KV (and draft state) the runner holds."""
        return self.pool.nbytes + (0 if self.drafter is None else self.drafter.nbytes)

    def release(self, seqs: list[Sequence]) -> None:
        """These rows finished or were preempted: their device rows are free."""
        for s in seqs:
            self.rows.release(s)

    @torch.inference_mode()
    def execute(self, plan: StepPlan) -> StepResult:
        self.release(plan.preempted)
        for s, _ in plan.prefill:
            if s.num_computed == 0:
                self.rows.admit(s)  # a new request, or a preempted one recomputed: its tokens, once
        decs, pre = self._decoding(plan), _Prefill.of(self, plan.prefill)
        with self.timer("forward"):  # the one target pass
            step, out = self._flatten(decs, pre)
            logits = self.target(step.tokens, step, output_index=out, features=self.features)
            logits, h = logits if self.features else (logits, None)  # (1, M, V), (1, N, F)
        with self.timer("accept"):
            for d in decs:
                d.finish(logits[0], h, self.rule)
            first = pre.first_tokens(logits[0, step.decoding:])  # (P',) or None
        if pre.rows and self.drafter is not None:
            with self.timer("draft_prefill"):
                pre.draft_reads(self.drafter, None if h is None else h[0, step.decoding:])
        if not decs and first is None and self.target.device.type == "cuda":
            torch.cuda.synchronize(self.target.device)  # host sync: only middle prefill chunks ran; the engine reads
            #                                             the step's time next, so the step must have ended
        return _collect(decs, pre, first)  # the one host sync

    def _decoding(self, plan: StepPlan) -> list[_Decoding]:
        """The decoding rows as one group; a static tree over greedy and sampled rows as two (a greedy row's children
        are the draft's top-k, a sampled row's are drawn from q), each drafted apart, verified in the same pass."""
        rows, k = plan.decode, plan.k
        if not rows:
            return []
        greedy = [s.params.greedy for s in rows]
        if not (isinstance(self.draft, TreeDraft) and self.draft.parents is not None and plan.gamma
                and 0 < sum(greedy) < len(rows)):
            return [_Decoding(self, rows, k, plan.gamma, 0)]
        parts = [[i for i, g in enumerate(greedy) if g == want] for want in (True, False)]
        first = _Decoding(self, [rows[i] for i in parts[0]], [k[i] for i in parts[0]], plan.gamma, 0)
        return [first, _Decoding(self, [rows[i] for i in parts[1]], [k[i] for i in parts[1]], plan.gamma, first.n)]

    def _flatten(self, decs: list[_Decoding], pre: _Prefill) -> tuple[PagedStep, torch.Tensor]:
        """The step's tokens as one (1, N) pass: decoding rows first (root, then each fed draft token), then each
        prefill chunk; their positions, KV slots and attention groups; and the positions whose logits are
        needed (1, M): every decoding token, and the last token of each prompt that completes."""
        groups, tokens, positions, slots = [], [], [], []
        bs, tables, dev = self.pool.block_size, self.rows.tables, self.rows.tables.device
        for d in decs:
            groups += d.groups(bs, self.target.windows)
            tokens.append(d.tokens[d.valid])
            positions.append(d.positions[d.valid])
            slots.append(d.physical[d.valid])
        decoding = sum(d.n for d in decs)  # tokens of the decoding rows, first in the pass
        for i, (r, start, n) in enumerate(zip(pre.index.tolist(), pre.starts, pre.n)):
            new = torch.arange(start, start + n, device=dev)[None]  # (1, n) the chunk's slots = positions
            _, masks = attention_masks(new, start + n, None, self.target.windows)
            row = tables[r: r + 1, : pre.width]  # (1, nb)
            a = decoding + pre.offsets[i]  # the chunk's first token in the pass
            at = a + torch.arange(n, device=dev)  # (n,) the chunk's tokens in the pass
            groups.append(group(at[None], torch.ones_like(new, dtype=torch.bool), row, masks, bs,
                                slice(a, a + n) if start == 0 else None,  # a first chunk attends to itself alone
                                (span(pre.rows[i].block_table, start + n, bs),)))
            tokens.append(self.rows.tokens[r, start: start + n])
            positions.append(new[0])
            slots.append(row[0, new[0] // bs] * bs + new[0] % bs)
        step = PagedStep(self.pool, torch.cat(positions)[None], torch.cat(slots), groups, self.attention)
        step.tokens, step.decoding = torch.cat(tokens)[None], decoding  # (1, N)
        last = torch.tensor(pre.last, dtype=torch.long, device=dev)  # (P',) in the pass, past the decoding rows
        return step, torch.cat([torch.arange(decoding, device=dev), decoding + last])[None]  # (1, M)


class _Decoding:
    """Decoding rows of the step: their state, sampler, draft run and proposal, and where their tokens go in the
    pass (from ``base``)."""

    def __init__(self, runner: ModelRunner, rows: list[Sequence], k: list[int], gamma: int, base: int):
        self.runner, self.rows, self.gamma, dev = runner, rows, gamma, runner.target.device
        self.index = runner.rows.sync(rows)  # (B,) their device rows
        self.width = runner.rows.table_width(rows)
        self.tables = runner.rows.tables[self.index, : self.width]  # (B, nb)
        totals = [s.num_tokens for s in rows]
        S = max(totals) + 2 + (runner.draft.width(gamma) if gamma else 0)  # room for the step's new tokens
        self.state = DecodeState.of_rows(
            runner.rows.tokens[self.index, :S], torch.tensor(totals, device=dev),  # (B, S), (B,)
            torch.tensor([s.prompt_len for s in rows], device=dev),  # (B,)
            torch.tensor([s.max_new_tokens for s in rows], device=dev), max(totals))  # (B,)
        self.sampler = Sampler(RowParams.of([s.params for s in rows], dev), [s.seed for s in rows], len(rows), dev)
        self.run = None if runner.drafter is None else runner.drafter.run(self.state, self.sampler, rows, self.tables)
        self.proposal = None
        if gamma:
            with runner.timer("draft"):
                self.proposal = self.propose(torch.tensor(k, device=dev))
        self.build(base)

    def propose(self, k: torch.Tensor) -> Proposal:
        """The draft's proposal, cut to each row's k (B,) lookahead slots: nothing past a row's k is proposed (q = 0),
        so nothing past it is fed or accepted. A chain loses its last tokens; a tree whose nodes outnumber the slots
        (a suffix tree, which the scheduler prices as a chain) its last nodes, which are never an earlier node's
        ancestors (parents come first)."""
        x, q, tree = self.run.propose(self.state, self.gamma)
        keep = torch.arange(x.shape[1], device=x.device) < k[:, None]  # (B, T)
        q = PointMass(q.proposed & keep, q.vocab_size) if isinstance(q, PointMass) else q * keep[..., None]
        return Proposal(x, q, tree)

    def build(self, base: int) -> None:
        """Each row's tokens in the pass (B, 1 + T): its last token, then the draft tokens it feeds."""
        st, x = self.state, None if self.proposal is None else self.proposal.x
        T, bs = 0 if x is None else x.shape[1], self.runner.pool.block_size
        self.root = st.total - 1  # (B,) the root's slot: every token but the last has its KV
        fed = torch.zeros_like(self.root) if x is None else self._fed()  # (B,) draft tokens each row feeds
        self.tokens = st.last(1) if x is None else torch.cat([st.last(1), x], 1)  # (B, 1 + T)
        j = torch.arange(1 + T, device=self.root.device)  # (1 + T,)
        self.valid = j <= fed[:, None]  # (B, 1 + T)
        self.new = self.root[:, None] + j  # (B, 1 + T) logical slots: the root, then the draft tokens (tree nodes)
        tree = None if self.proposal is None else self.proposal.tree
        self.mask = None if tree is None else tree_mask(tree, self.root)
        self.positions = self.new if self.mask is None else self.mask.positions[:, -(1 + T):]  # (B, 1 + T)
        block = self.tables.gather(1, (self.new // bs).clamp_max(self.width - 1))  # (B, 1 + T)
        self.physical = block * bs + self.new % bs  # (B, 1 + T)
        counts = 1 + fed  # (B,)
        self.base = base
        offsets = base + counts.cumsum(0) - counts  # (B,) each row's first token in the pass
        self.query = offsets[:, None] + torch.minimum(j, fed[:, None])  # (B, 1 + T) padding repeats a real one
        self.fed = fed.tolist()  # host sync: the pass's shape (its length, and which rows feed draft tokens)
        self.n = len(self.fed) + sum(self.fed)

    def _fed(self) -> torch.Tensor:
        """Draft tokens each row feeds (B,): up to its last proposed one (past it q is zero: nothing to verify)."""
        x, q, _ = self.proposal
        j = torch.arange(1, x.shape[1] + 1, device=x.device)  # (T,)
        return (proposed(q) * j).amax(1) if x.shape[1] else torch.zeros(len(x), dtype=torch.long, device=x.device)

    def groups(self, block_size: int, windows) -> list:
        """The rows' attention groups. A row that feeds no draft token (prompt lookup without a match) has one query,
        not 1 + T. Where the sparse path reads such rows (:func:`reads_sparse`: on a CPU, a float32 pool) every row is
        one group: it reads only real queries, so nothing is padded to 1 + T, and one group's calls a layer replace
        those of 2-5 (results/cpu/engine_merged.txt). Elsewhere such rows are grouped apart from those that feed
        draft tokens, so their queries are not padded to 1 + T, and rows of similar length go together
        (:func:`by_length`), so that a short row's keys and values are not padded to the longest row's."""
        T = self.tokens.shape[1] - 1
        S = [s.num_tokens + f for s, f in zip(self.rows, self.fed)]  # each row's slots to read: its tokens and the
        #   draft tokens it feeds, all inside its blocks
        _, masks = attention_masks(self.new, max(S), self.mask, windows)  # {window: (B, 1, 1 + T, S)}
        spans = [span(s.block_table, n, block_size) for s, n in zip(self.rows, S)]
        pool, out = self.runner.pool, []
        roots = [r for r, f in enumerate(self.fed) if f == 0]  # rows whose one query is their root
        feeding = [r for r, f in enumerate(self.fed) if f > 0]
        sets = [(roots, 1), (feeding, 1 + T)]
        if roots and feeding and reads_sparse(self.runner.attention, pool, 1):
            sets = [(list(range(len(self.rows))), 1 + T)]  # every row, read sparse: one group
        for rows, width in sets:
            if not rows:
                continue
            fewest = 1 + min(self.fed[r] for r in rows)  # the fewest real queries a row of the set has
            if reads_sparse(self.runner.attention, pool, fewest):  # no padding read: the rows one group
                parts = [(rows, max(S[r] for r in rows))]
            else:
                parts = by_length([S[r] for r in rows], group_cost(pool))
                parts = [([rows[j] for j in part], longest) for part, longest in parts]
            for part, longest in parts:
                i = torch.tensor(part, device=self.new.device)  # (R,)
                out.append(group(self.query[i, :width], self.valid[i, :width], self.tables[i],
                                 {w: m[i, :, :width, :longest] for w, m in masks.items()}, block_size,
                                 spans=tuple(spans[r] for r in part), fewest=fewest,
                                 tokens=slice(self.base, self.base + self.n) if part == list(range(len(self.rows)))
                                 else None))  # every row, in order: the real queries are the pass's tokens
        return out

    def finish(self, logits: torch.Tensor, h: torch.Tensor | None, rule) -> None:
        """Accept (or, on a plain step, draw) given the pass's logits (M, V) and features (1, N, F)."""
        if not self.rows:
            return
        runner, st, sampler = self.runner, self.state, self.sampler
        feats = None if h is None else h[0][self.query]  # (B, 1 + T, F)
        self.start = st.total.clone()  # (B,)
        if self.proposal is None:  # a plain step: one token a row, the pass's tokens [base, base + B)
            z = logits[self.base: self.base + self.n]  # (B, V)
            # all greedy: the argmax itself (what drawing from its one-hot gives, without building it)
            t = argmax(z) if sampler.params.greedy else sampler.draw(probabilities(z, sampler.params), st.total)
            st.emit(t[:, None], torch.ones_like(st.total))
            if self.run is not None:
                self.run.skipped(feats)
            self.accepted = self.offered = torch.zeros_like(st.total)  # (B,)
        else:
            p = target_p(logits, sampler.params, self.proposal, rule, self.query)  # (B, 1 + T, V) or Argmax
            view = runner.pool.view(self.tables, self.root)
            path, _ = accept(self.proposal, p, feats, self.run, st, sampler, rule, lambda path: view.compact(
                self.root, path))
            self.accepted, self.offered = (path > 0).sum(1), proposed(self.proposal.q).sum(1)  # (B,) each
        runner.rows.tokens[self.index, : st.slots] = st.seq  # the step's new tokens, kept for the next step
        if runner.drafter is not None:
            runner.drafter.after(self.run, self.rows, speculative=self.proposal is not None)


class _Prefill:
    """The step's prefill chunks: rows, where each starts, how many slots each computes, and which complete."""

    @classmethod
    def of(cls, runner: ModelRunner, chunks: list[tuple[Sequence, int]]) -> _Prefill:
        p = cls()
        p.runner, p.rows, p.n = runner, [s for s, _ in chunks], [k for _, k in chunks]
        p.starts = [s.num_computed for s in p.rows]
        p.index = runner.rows.sync(p.rows) if p.rows else torch.zeros(0, dtype=torch.long)  # (P,)
        p.width = runner.rows.table_width(p.rows) if p.rows else 1
        p.offsets = [sum(p.n[:i]) for i in range(len(p.n))]
        p.completing = [b for b, s in enumerate(p.rows) if p.starts[b] + p.n[b] == s.prompt_len and s.num_output == 0]
        p.last = [p.offsets[b] + p.n[b] - 1 for b in p.completing]  # in the pass, past the decoding rows' tokens
        return p

    def first_tokens(self, logits: torch.Tensor) -> torch.Tensor | None:
        """Each completing prompt's first token (P',), from its last position's logits (the rows after the decoding
        rows' in ``logits``), drawn at position = the prompt's length, as :func:`~minispec.decoding.plain.first_token`
        draws it."""
        if not self.completing:
            return None
        rows, dev = [self.rows[b] for b in self.completing], logits.device
        sampler = Sampler(RowParams.of([s.params for s in rows], dev), [s.seed for s in rows], len(rows), dev)
        total = torch.tensor([s.prompt_len for s in rows], device=dev)  # (P',)
        t = sampler.draw(probabilities(logits, sampler.params), total)  # (P',)
        self.runner.rows.tokens[self.index[self.completing], total] = t
        return t

    def draft_reads(self, drafter, h: torch.Tensor | None) -> None:
        """The draft reads the chunks (padded, one pass of its own), given the target's features h (N', F) there."""
        runner, dev = self.runner, self.index.device
        T, starts = max(self.n), torch.tensor(self.starts, device=dev)  # (P,)
        j = torch.arange(T, device=dev)  # (T,)
        cols = starts[:, None] + j  # (P, T) the chunk's positions; past a row's chunk: padding
        S = max(a + n for a, n in zip(self.starts, self.n)) + 2
        seq = runner.rows.tokens[self.index, :S]  # (P, S)
        tokens = seq.gather(1, cols.clamp_max(S - 1))  # (P, T)
        tables = runner.rows.tables[self.index, : self.width]  # (P, nb)
        n = torch.tensor(self.n, device=dev)
        feats = None
        if h is not None:
            at = (torch.tensor(self.offsets, device=dev)[:, None] + torch.minimum(j, n[:, None] - 1))  # (P, T)
            feats = h[at]  # (P, T, F)
        drafter.prefill(Chunk(tables, starts, max(self.starts), tokens, n - 1, seq), feats)
        for s in self.rows:
            s.lag = drafter.start_lag


def _collect(decs: list[_Decoding], pre: _Prefill, first: torch.Tensor | None) -> StepResult:
    """The one host sync: each decoding row's new tokens, flags and counts, and the completing prompts' firsts."""
    parts = []
    for d in decs:
        st, W = d.state, d.tokens.shape[1]
        at = (d.start[:, None] + torch.arange(W, device=st.total.device)).clamp_max(st.slots - 1)  # (B, W)
        parts += [torch.stack([st.total - d.start, d.accepted, d.offered], 1), st.seq.gather(1, at),
                  st.from_draft.gather(1, at).long()]  # (B, 3), (B, W), (B, W)
    if first is not None:
        parts.append(first[:, None])  # (P', 1)
    values = [t.tolist() for t in parts] if parts else []  # host sync: the step's tokens and counts, once
    result = StepResult()
    for d, (counts, toks, flags) in zip(decs, zip(values[0::3], values[1::3], values[2::3])):
        for s, (k, acc, off), new, drafted in zip(d.rows, counts, toks, flags):
            new, drafted = new[:k], [bool(f) for f in drafted[:k]]
            stop = next((i for i, t in enumerate(new) if t in s.eos), None)
            if stop is not None and stop < acc:  # an accepted draft token was an EOS: nothing after it counts
                acc = tested = stop + 1
            else:
                tested = min(acc + 1, off)  # up to the first rejection
            result.new[s] = (new, drafted)
            result.num_drafts += off > 0
            result.draft_tokens += off
            result.accepted_tokens += acc
            result.tested_tokens += tested
            at = result.accepted_per_position
            at.extend([0] * (acc - len(at)))
            for i in range(acc):
                at[i] += 1
    if first is not None:
        for b, (t,) in zip(pre.completing, values[-1]):
            result.new[pre.rows[b]] = ([t], [False])
    return result
