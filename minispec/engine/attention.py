"""The engine's step in one target pass: every token of the step flattened, attention through the block tables.

A step's tokens (each prefill chunk, each decoding row's last token and its draft tokens) are one vector
(N,), as vLLM V1 and nano-vllm run them: the model's matmuls see N tokens and no padding. Each token
carries its position and its physical KV slot (``slots``, the slot mapping), so the new keys and values go
straight into the pool. Attention is per row, over the row's own slots: rows are *groups* (decoding rows
of similar length together, :func:`by_length`; each prefill chunk alone, so a 500-token chunk never pads 64
decoding rows to 500), and a group's queries are gathered from the N tokens into (R, T) (padding repeats a
real token; its output is dropped), its keys and values read through its block tables.

How the keys and values are read is the ``attention`` backend (:data:`ATTENTION`):

  auto    the default. A group of one row whose blocks are one run of the pool is read in place, as ``views``
          reads it (the same one SDPA call, and no copy); a batch of one is always such a group (its step's whole
          pass: read without gathering its queries or scattering its outputs, :meth:`PagedStep._one`), and so is a
          long prompt's later chunk (results/cpu/engine_auto.txt). On a CPU with a float32 pool a plain step's decoding
          rows are one group, read ``sparse`` (nothing padded, nothing copied; :func:`reads_sparse`), and so are a
          speculative step's rows where one of them feeds no draft token (prompt lookup without a match); any other
          group, and a lone row that is not one run, is read as ``gather`` reads it
  gather  copy each row's blocks into a dense (R, K, S, D) tensor and call SDPA: the reference. The copy costs
          more than the attention that reads it: 20 of a 115 ms step of SmolLM2-135M's batch of 32 on 2 threads,
          against 12 for SDPA (torch.profiler)
  sparse  attention as two sparse matmuls over the pool, read in place: the scores are a sampled matmul (SDDMM,
          q . k only at the slots each real query sees, a CSR pattern built once a step), a softmax over each
          query's entries, and the weights times the values a sparse-dense matmul (SpMM). No copy, no padding, one
          call for the step's decoding rows. torch's CPU kernels read one KV head's (P, D) slots in place, so the
          pool is head-major (:mod:`minispec.engine.paged`). Faster than the copy where the copy is large, slower
          where a few calls' overhead is the cost: results/cpu/engine_sparse.txt (through the engine) and
          results/cpu/engine_attention.txt (one layer); 4-7x slower than SDPA over a lone row's view
  flex    FlexAttention over the whole pool with a block mask built from the tables (PyTorch's own route to
          paged attention: no copy; ``torch.compile`` it on a GPU, where it becomes one fused kernel; on this CPU
          compiled 1.4-2.2x slower than the gather, eager 11-240x: results/cpu/engine_attention.txt)
  views   row by row: a row whose blocks are one run of the pool (the block manager places rows so that they
          mostly are, :mod:`minispec.engine.blocks`) is a *view* of it, (1, K, S, D) with no copy, and SDPA reads
          it in place; the group's other rows are copied together, as ``gather`` copies a group, and attended in
          one call. One SDPA call a row instead of one a group: through the engine on its CPU 1.00-1.04x of
          ``auto`` on speculative steps, 0.88x of its sparse products on plain ones (results/cpu/engine_views.txt),
          so only ``auto``'s lone rows read this way

All are tested equal to each other (logits within float tolerance, greedy tokens identical) on steps that
mix prefill chunks, decoding rows, draft tokens and trees.
"""

from __future__ import annotations

import functools
import math
import warnings
from typing import NamedTuple

import torch
import torch.nn.functional as F

from minispec.engine.paged import PagedPool, read_blocks

ATTENTION = ("auto", "gather", "flex", "views", "sparse")
TINY = 2.0 ** -100  # a softmax denominator under this may have lost its largest term to underflow: _sparse
GROUP_BYTES = 1 << 18  # what one more group of rows costs (its kernel calls each layer), in KV bytes read: by_length


class Group(NamedTuple):
    """Rows whose queries are attended together: (R, T) queries over S logical slots each."""

    query: torch.Tensor  # (R, T) each query's index among the step's N tokens (padding: a real one, repeated)
    tables: torch.Tensor  # (R, nb) block tables, the scratch block past each row's blocks
    masks: dict  # {window: (R, 1, T, S) bool} what each query sees, by logical slot
    blocks: torch.Tensor  # (R, nb) the blocks that hold each row's logical slots 0..S-1 (nb = S / block size, up)
    dest: torch.Tensor  # (M,) the step indices of the real queries, row by row
    keep: torch.Tensor  # (M,) where they are in the group's flattened (R T) queries
    fresh: slice | None = None  # a prompt's first chunk: its queries are the step's tokens [a, b) and its keys theirs
    spans: tuple = ()  # per row, (its first physical slot, its slots) where its slots are one run of the pool, or None
    tokens: slice | None = None  # where the real queries are the step's tokens [a, b), in order: dest as a slice
    fewest: int = 1  # the fewest real queries a row of the group has (:func:`reads_sparse`)


def group(query: torch.Tensor, valid: torch.Tensor, tables: torch.Tensor, masks: dict, block_size: int,
          fresh: slice | None = None, spans: tuple = (), tokens: slice | None = None,
          fewest: int | None = None) -> Group:
    """A :class:`Group` of rows: their queries (R, T) and validity, block tables (R, nb) and masks over S slots
    (inside the tables: S <= nb x block_size, else ValueError);
    ``fresh``: the group is a prompt's first chunk, the step's tokens [a, b) (attended causally, nothing read);
    ``spans``: :func:`span` of each row (for ``views``); ``tokens``: the real queries are the step's tokens [a, b)
    in order (the caller knows it on the host), so ``sparse`` reads them as a slice; ``fewest``: the fewest real
    queries a row has (the caller knows it on the host; default T, every query real)."""
    nb = -(-next(iter(masks.values())).shape[-1] // block_size)
    if nb > tables.shape[1]:
        raise ValueError(f"the masks read {nb} blocks a row but the tables hold {tables.shape[1]}")
    flat = valid.flatten()  # (R T,)
    blocks = tables[:, :nb].contiguous()  # (R, nb) once per step: every layer's copy flattens it, a view now
    return Group(query, tables, masks, blocks, query.flatten()[flat], flat.nonzero()[:, 0], fresh, spans, tokens,
                 query.shape[1] if fewest is None else fewest)


def span(table: list[int], slots: int, block_size: int) -> tuple[int, int] | None:
    """(first physical slot, slots) of a row's first ``slots`` logical slots, read from its host block ``table``,
    when they are one run of the pool; else None. Slots past the table are never visible and are left out."""
    nb = min(-(-slots // block_size), len(table))
    a = table[0]  # a row in a step has blocks
    if table[:nb] != list(range(a, a + nb)):
        return None
    return a * block_size, min(slots, nb * block_size)


def by_length(S: list[int], cost: int) -> list[tuple[list[int], int]]:
    """Rows of lengths ``S`` (slots each reads) split into groups of similar length, each (its rows, its longest):
    a group reads R x its longest row's slots, so one group of all rows pays for padding every short row to the
    longest. The split minimises the slots read plus ``cost`` (:func:`group_cost`) per group: an optimal partition
    of the rows sorted by length, each group a run of them."""
    order = sorted(range(len(S)), key=lambda r: -S[r])
    s = [S[r] for r in order]  # longest first: a group starting at j reads s[j] slots a row
    best, cut = [0] + [None] * len(s), [0] * (len(s) + 1)  # best[i]: the rows order[:i] grouped; cut[i]: its last group
    for i in range(1, len(s) + 1):
        best[i], cut[i] = min((best[j] + cost + (i - j) * s[j], j) for j in range(i))
    groups, i = [], len(s)
    while i:
        groups.append(([order[r] for r in range(cut[i], i)], s[cut[i]]))
        i = cut[i]
    return groups[::-1]


def reads_sparse(attention: str, pool: PagedPool, fewest: int) -> bool:
    """Whether a group of several rows, the fewest of whose real queries a row is ``fewest``, is read by the sparse
    path (:meth:`PagedStep._sparse`): always with ``sparse``; with ``auto`` where it measured faster than the copy, on a
    CPU with a float32 or float64 pool (torch's CPU SDDMM takes no other dtype), a group with a row of one query: a
    plain step's rows, or a speculative step's where a row feeds no draft token (prompt lookup without a match). A step
    whose decoding rows are read sparse puts them in one group: the sparse path reads no padding, so a row of one query
    beside rows of 1 + 4 costs its one (results/cpu/engine_merged.txt). Through the engine on 2 threads
    (results/cpu/engine_sparse.txt) it served plain steps 1.11-1.30x as fast as the gather; a speculative step's
    1 + 4 queries a row 1.03x for SmolLM2's batch of 32 with prompt lookup but 0.93x for the embedded pair's 8 with its
    draft model, whose small copies cost less than the sparse calls. One layer alone (engine_attention.txt): 5 queries
    a row at 2,048 slots read sparse in 0.6-0.8x the gather's time, at 256 slots in 1.1-1.5x; pass
    ``attention="sparse"`` for long-context speculation."""
    fits = pool.k.device.type == "cpu" and pool.k.dtype in (torch.float32, torch.float64)
    return attention == "sparse" or (attention == "auto" and fits and fewest == 1)


def group_cost(pool: PagedPool) -> int:
    """One more group's price in rows x slots: :data:`GROUP_BYTES` over a slot's keys and values in one layer. The
    calls cost the same time whatever the model; a slot costs its bytes, so a small model splits less. Measured on
    this project's CPU (scripts/engine_groups.py, results/cpu/engine_groups.txt; static batches through the engine,
    one torch thread): 256 KiB served SmolLM2-135M's batch of 32 1.30x as fast as one group and the embedded
    pair's 1.12x (1 MiB: 1.16x and 1.13x; 4 MiB: 1.05x and 1.08x); the pair's batch of 8 with its draft model
    was within its own noise at every price (0.91-0.96x, rounds 531-698 tok/s)."""
    _, K, _, D = pool.k.shape
    return GROUP_BYTES // (2 * K * D * pool.k.element_size())


class PagedStep:
    """The step's attention, as a cache :meth:`minispec.model.llama.Model.forward` accepts (``attends``): it brings
    each token's position, writes every layer's new keys and values into their slots, and attends each group."""

    attends = True

    def __init__(self, pool: PagedPool, positions: torch.Tensor, slots: torch.Tensor, groups: list[Group],
                 attention: str, compiled: bool | None = None):
        """``attention``: one of :data:`ATTENTION` (the engine's default is its runner's); ``compiled``: compile
        FlexAttention (default: on a GPU)."""
        if attention not in ATTENTION:
            raise ValueError(f"attention must be one of {ATTENTION}, got {attention!r}")
        self.pool, self.positions, self.slots, self.groups = pool, positions, slots, groups  # (1, N), (N,)
        self.read = {"auto": self._auto, "gather": self._gather, "flex": self._flex, "views": self._views,
                     "sparse": None}[attention]
        self.attention = attention
        self.compiled = positions.device.type == "cuda" if compiled is None else compiled
        self._blocks = {}  # each (group, window)'s mask (gather), block mask (flex) or CSR pattern (sparse): per step
        g = groups[0] if len(groups) == 1 else None
        self.lone = g.spans[0] if g is not None and attention in ("auto", "views") and len(g.spans) == 1 \
            and g.tokens is not None else None  # a batch of one row, its queries the pass's tokens, one run: _one

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int | None):
        """q (1, H, N, D), k and v (1, K, N, D) of one layer: write k, v into the pool, return (1, H, N, D)."""
        _, H, N, D = q.shape
        for buf, new in ((self.pool.k[layer], k), (self.pool.v[layer], v)):
            buf.index_copy_(1, self.slots, new[0])  # (K, P, D) <- (K, N, D): the new slots
        if self.lone is not None:
            return self._one(layer, q, window)  # (1, H, N, D)
        out = q.new_empty(N, H, D)  # (N, H, D)
        for i, g in enumerate(self.groups):
            if g.fresh is not None and (window is None or g.fresh.stop - g.fresh.start <= window):
                # a prompt's first chunk sees only itself: causal attention over the step's own k, v (no read, no
                # mask: the kernel skips the masked half), the same arithmetic as a plain prefill
                f = g.fresh
                y = F.scaled_dot_product_attention(q[:, :, f], k[:, :, f], v[:, :, f], is_causal=True,
                                                   enable_gqa=H != k.shape[1])  # (1, H, n, D)
                out[f] = y[0].transpose(0, 1)
                continue
            if self.sparse(g):  # the real queries only, read in place: no padding, no copy
                at = g.dest if g.tokens is None else g.tokens  # a slice of the pass where the caller knows one
                out[at] = self._sparse(layer, q[0][:, at], g, window, i)
                continue
            qg = q[0][:, g.query].transpose(0, 1)  # (R, H, T, D)
            y = self.read(layer, qg, g, window, i)  # (R, H, T, D)
            out.index_copy_(0, g.dest, y.transpose(1, 2).flatten(0, 1)[g.keep])  # the real queries' outputs
        return out.transpose(0, 1)[None]  # (1, H, N, D)

    def sparse(self, g: Group) -> bool:
        """Whether group ``g`` (not a first chunk) is read by :meth:`_sparse`: with ``sparse``, every one; with
        ``auto``, a group of several rows where :func:`reads_sparse` says so (a lone row, SDPA over its view or its
        copy, was 4-7x faster than the sparse products in a microbenchmark here)."""
        return self.attention == "sparse" or (len(g.query) > 1 and reads_sparse(self.attention, self.pool, g.fewest))

    def _auto(self, layer, q, g, window, i):
        """The default: a group of one row whose blocks are one run is read in place (``views``: the same one SDPA
        call, no copy); any other group is copied (``gather``: one call for all its rows)."""
        one = len(g.spans) == 1 and g.spans[0] is not None
        return (self._views if one else self._gather)(layer, q, g, window, i)

    def _gather(self, layer, q, g, window, i):
        """The reference: copy each row's blocks into a dense tensor, then SDPA."""
        R, H, T, D = q.shape
        k, v = (self._rows(p[layer], g.blocks) for p in (self.pool.k, self.pool.v))  # (R, K, S', D) each
        G = H // k.shape[1]  # query heads per KV head: folded into the queries, so each K, V is read once, not G times
        mask = self._head_mask(g, window, i, G, q.dtype)  # (R, 1, G T, S)
        S = mask.shape[-1]
        y = F.scaled_dot_product_attention(q.reshape(R, H // G, G * T, D), k[:, :, :S], v[:, :, :S],
                                           attn_mask=mask)  # (R, K, G T, D)
        return y.reshape(R, H, T, D)

    def _rows(self, pool: torch.Tensor, blocks: torch.Tensor) -> torch.Tensor:
        """The copy of rows' blocks (R, nb) of one layer's pool (K, P, D): (R, K, S, D), :func:`read_blocks`."""
        return read_blocks(pool, blocks, self.pool.block_size)

    def _head_mask(self, g, window, i, G, dtype, T=None):
        """Group ``i``'s mask for ``window``, repeated for the G query heads folded into each KV head's queries
        (R, 1, G T, S), as SDPA adds it (0 where seen, -inf where not): built once per step, read by every layer
        (SDPA would convert a bool mask to this at every call). ``T``: each row's first T queries only (default all)."""
        if (i, window, T) not in self._blocks:
            m = g.masks[window][:, :, :T].repeat(1, 1, G, 1)  # (R, 1, G T, S) the same for each head
            self._blocks[i, window, T] = torch.zeros(m.shape, dtype=dtype, device=m.device).masked_fill_(~m, -math.inf)
        return self._blocks[i, window, T]

    def _one(self, layer, q, window):
        """A batch of one row (``auto`` and ``views``) whose slots are one run of the pool, its N queries the pass's
        tokens: ``views``' one SDPA call over views of the pool, without the group's gather of its queries and scatter
        of its outputs (a few calls a layer, what a batch of one pays most for). q (1, H, N, D) -> (1, H, N, D)."""
        _, H, N, D = q.shape
        K = self.pool.k.shape[1]
        if N == 1 and window is None:  # a lone query sees all its row's slots: no mask, no copy
            return self._run(layer, q.view(1, K, H // K, D), self.lone, None).view(1, H, 1, D)  # (1, K, G, D)
        mask = self._head_mask(self.groups[0], window, 0, H // K, q.dtype, N)  # (1, 1, G N, S)
        y = self._run(layer, q[0].reshape(1, K, H // K * N, D), self.lone, mask)  # (1, K, G N, D)
        return y.view(H, N, D).transpose(0, 1).contiguous().transpose(0, 1)[None]  # (1, H, N, D) laid out as q is

    def _run(self, layer, q, span, mask):
        """One SDPA call of a row's queries q (1, K, G T, D) over its slots, one run of the pool (``span``: its first
        physical slot, its slots n), read in place as views; ``mask`` (1, 1, G T, >= n), or None where every query
        sees every slot. -> (1, K, G T, D)."""
        a, n = span
        k, v = (p[layer][None, :, a: a + n] for p in (self.pool.k, self.pool.v))  # (1, K, n, D) views of the pool
        return F.scaled_dot_product_attention(q, k, v, attn_mask=None if mask is None else mask[..., :n])

    def _views(self, layer, q, g, window, i):
        """Row by row: a row of one run is a view of the pool, read in place (no copy); the other rows are copied
        together, as the gather copies a group, and attended in one call."""
        R, H, T, D = q.shape
        pk, pv = self.pool.k[layer], self.pool.v[layer]  # (K, P, D) each
        K = pk.shape[0]
        G = H // K
        mask, q = self._head_mask(g, window, i, G, q.dtype), q.reshape(R, K, G * T, D)  # (R, 1, G T, S), (R, K, G T, D)
        y = torch.empty_like(q)  # (R, K, G T, D)
        copied = [r for r, sp in enumerate(g.spans) if sp is None]  # not one run: copied, as the gather copies rows
        if copied:
            if ("copied", i, window) not in self._blocks:
                at = torch.tensor(copied, device=q.device)  # (C,)
                self._blocks["copied", i, window] = at, g.blocks[at], mask[at]  # (C,), (C, nb), (C, 1, G T, S)
            at, blocks, m = self._blocks["copied", i, window]
            k, v = (self._rows(pool, blocks)[:, :, : m.shape[-1]] for pool in (pk, pv))  # (C, K, S, D) each
            y[at] = F.scaled_dot_product_attention(q[at], k, v, attn_mask=m)  # (C, K, G T, D)
        for r, sp in enumerate(g.spans):
            if sp is None:  # copied above
                continue
            m = None if T == 1 and window is None else mask[r: r + 1]  # (1, 1, G T, S); a lone query sees all
            y[r] = self._run(layer, q[r: r + 1], sp, m)[0]  # (K, G T, D): one run, read in place
        return y.reshape(R, H, T, D)

    def _flex(self, layer, q, g, window, i):
        """FlexAttention over the whole pool (1, K, P, D): a block mask from the tables visits each row's own blocks
        only, and a mask_mod maps a physical slot back to the row's logical slot for the causal or tree mask."""
        if (i, window) not in self._blocks:
            self._blocks[i, window] = _block_mask(g, g.masks[window], self.pool)
        k = self.pool.k[layer][None].expand(len(q), -1, -1, -1)  # (R, K, P, D) a view, no copy
        v = self.pool.v[layer][None].expand(len(q), -1, -1, -1)  # (R, K, P, D)
        return flex_function(self.compiled)(q, k, v, block_mask=self._blocks[i, window],
                                            enable_gqa=q.shape[1] != k.shape[1])

    def _sparse(self, layer, q, g, window, i):
        """Attention as two sparse products over the pool, read in place (no copy, no padding): the scores of each
        real query against the slots it sees are a sampled matmul (SDDMM: q . k only where the pattern has an entry),
        the softmax runs over each query's entries, and the weights times the values are a sparse-dense matmul
        (SpMM), which reads only the slots in the pattern. q (H, M, D): the group's M real queries -> (M, H, D).

        The softmax takes each KV head's largest score out of its scores, not each query's own: one pass over them
        where each query's needs a scatter and a gather (SmolLM2's batch of 32 with prompt lookup, prompts of 64-512
        tokens: its target pass in 0.92x the time, 0.88-0.94x a step: results/cpu/engine_softmax.txt). The weights
        are the same up to float rounding, and exp cannot overflow. A query whose scores all lie far below its head's
        largest would lose its weights to underflow; a denominator under :data:`TINY` says it may have, and then the
        layer takes each query's own largest out, as SDPA does."""
        pk, pv = self.pool.k[layer], self.pool.v[layer]  # (K, P, D) each
        K, P, D = pk.shape
        H, M, _ = q.shape
        crow, seg, w = self._pattern(g, window, i, H // K)  # (Q + 1,), (n,), CSR (Q, K P) over the pattern: Q = H M
        qs = q.reshape(K, H // K, M, D).transpose(1, 2).reshape(-1, D)  # (Q, D) by KV head, query, head

        def scores():  # (n,) w's values: the layer's scratch (the pattern's values, overwritten each layer)
            return torch.sparse.sampled_addmm(w, qs, pk.view(K * P, D).t(), beta=0.0, alpha=D ** -0.5, out=w).values()

        s = scores()  # (n,) KV head by KV head (the pattern's entries are in that order)
        cpu = s.device.type == "cpu"  # the check below is a host read a layer: free on a CPU only
        if cpu:
            s.view(K, -1).sub_(s.view(K, -1).amax(1, keepdim=True)).exp_()  # (K, n / K) each head's largest out
            total = torch.segment_reduce(s, "sum", offsets=crow)  # (Q,) the softmax's denominators
        if not cpu or bool((total < TINY).any()):  # elsewhere, or a query far below its head's largest: each query's
            s = scores() if cpu else s  # own largest out instead, as SDPA (on a CPU the scores again: exp took them)
            top = s.new_full((len(qs),), -math.inf).scatter_reduce_(0, seg, s, "amax")  # (Q,) each query's largest
            s.sub_(top.index_select(0, seg)).exp_()  # (n,) the numerators, in place
            total = torch.segment_reduce(s, "sum", offsets=crow)  # (Q,)
        y = (w @ pv.view(K * P, D)) / total[:, None]  # (Q, D)
        return y.view(K, M, H // K, D).transpose(0, 1).reshape(M, H, D)  # (M, H, D)

    def _pattern(self, g, window, i, G):
        """Group ``i``'s CSR pattern for ``window``, built once per step: row (h, m, j) is real query m's query head
        h G + j, its entries the pool slots the query sees, as columns of the layer's (K P, D) keys: KV head h's
        slot s is column h P + s."""
        if ("csr", i, window) not in self._blocks:
            K, P, _ = self.pool.k.shape[1:]
            R, T = g.query.shape
            bs = self.pool.block_size
            seen = g.masks[window][:, 0].reshape(R * T, -1)[g.keep]  # (M, S) by logical slot
            seen = seen[:, None].expand(-1, G, -1).reshape(-1, seen.shape[-1])  # (M G, S) once per query head
            row, at = seen.nonzero().unbind(1)  # (n1,) each, row by row: a host sync (nonzero's length), once a step
            slot = g.blocks[g.keep[row // G] // T, at // bs] * bs + at % bs  # (n1,) physical slots
            heads = torch.arange(K, device=slot.device)[:, None]  # (K, 1)
            col = (heads * P + slot).flatten()  # (n,) n = K n1
            seg = (heads * len(seen) + row).flatten()  # (n,) each entry's row of the CSR
            counts = seen.sum(1).repeat(K)  # (Q,)
            crow = torch.cat([counts.new_zeros(1), counts.cumsum(0)]).int()  # (Q + 1,) int32: as MKL's SpMM reads them
            with warnings.catch_warnings():  # torch calls CSR tensors beta, once a process: they are what runs here
                warnings.simplefilter("ignore")
                w = torch.sparse_csr_tensor(crow, col.int(), self.pool.k.new_zeros(len(col)), (len(counts), K * P),
                                            check_invariants=False)
            self._blocks["csr", i, window] = crow, seg, w
        return self._blocks["csr", i, window]

    def end(self, T: int) -> None:
        """The model's end of a call: nothing to move (the scheduler keeps each row's length)."""


@functools.cache
def flex_function(compiled: bool):
    """``flex_attention``, compiled (one fused kernel: the engine compiles it on a GPU) or eager (on this project's
    CPU compiling takes minutes, and the compiled kernel was slower than the gather at every size but the largest
    measured: results/cpu/engine_attention.txt)."""
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False) if compiled else flex_attention


def _block_mask(g: Group, mask: torch.Tensor, pool: PagedPool):
    """The flex block mask of a group: row r visits the blocks of its table; within them, physical slot s is
    logical slot index(r, s // bs) * bs + s % bs, visible where ``mask`` (R, 1, T, S) says."""
    from torch.nn.attention.flex_attention import BlockMask

    R, bs, nb = len(g.tables), pool.block_size, g.tables.shape[1]
    P = pool.k.shape[2]
    S = mask.shape[-1]
    index = torch.full((R, P // bs), -1, dtype=torch.long, device=mask.device)  # (R, blocks) a block's index in r
    index.scatter_(1, g.tables, torch.arange(nb, device=mask.device).expand(R, -1))
    index[:, -1] = -1  # the scratch block belongs to no row
    T = mask.shape[2]

    def mask_mod(b, h, qi, kv):
        logical = index[b, kv // bs] * bs + kv % bs  # the row's logical slot, < 0 outside its blocks
        ok = (logical >= 0) & (logical < S)
        return ok & mask[b, 0, qi, logical.clamp(0, S - 1)]

    used = (index >= 0).sum(1)  # (R,)
    order = torch.sort((index < 0).long(), dim=1, stable=True).indices  # (R, blocks) the row's blocks first
    return BlockMask.from_kv_blocks(used[:, None, None].int(), order[:, None, None].int(), BLOCK_SIZE=(max(T, 1), bs),
                                    mask_mod=mask_mod, seq_lengths=(T, P))
