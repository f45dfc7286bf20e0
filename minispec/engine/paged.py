"""The KV pool in blocks, with the padded view of it the drafts read: a KV cache whose slots live anywhere in one pool.

:class:`PagedPool` holds the keys and values of every sequence, block by block:
``k[layer]`` is (K, P, D) with P = (num_blocks + 1) x block_size physical slots (the last block is
the scratch block, see :mod:`minispec.engine.blocks`): head-major, so one KV head's slots are one (P, D) matrix,
which the sparse attention reads in place. The target reads and writes it in one flattened pass per step
(:mod:`minispec.engine.attention`). A draft that keeps KV of its own (a draft model, an
EAGLE head) keeps it in a pool of its own, and runs on a :class:`PagedCache` *view* of it over the
step's rows: their block tables (B, nb) and KV lengths (B,). The view speaks the protocol of
:class:`minispec.model.kv_cache.KVCache` (``lengths``, ``begin``, ``update``, ``end``, ``rollback``,
``trim``, ``compact``), so the model, the speculative step and every draft run on it unchanged, padded
to the longest row as a static batch is.

The view's gather: in each layer, :meth:`PagedCache.update` writes the step's keys and values into
their physical slots, then gathers the blocks that hold each row's logical slots 0..S'-1 into a dense
(B, K, S', D) tensor for ``scaled_dot_product_attention`` (the target's step does the same per row group,
reads a plain step's rows with sparse matmuls, or reads the pool with FlexAttention). A draft runs several forwards
a step over the same rows, so its view is *kept* (``keep=True``): each layer's rows are copied at its first call
and each later call writes only its new slots into that copy (results/cpu/draft_copy.txt).

:class:`PagedRows` is the same idea for one vector per position (an EAGLE head's record of the
target's features): a (B, S, F) tensor's ``gather`` and ``scatter_`` on dimension 1, through the
tables.
"""

from __future__ import annotations

import torch


def read_blocks(pool: torch.Tensor, blocks: torch.Tensor, block_size: int) -> torch.Tensor:
    """The copy: rows' whole blocks (R, nb) of one layer's pool (K, P, D), as (R, K, nb x block_size, D). A block a
    copy (index_select): in a microbenchmark here, 1.2-1.6x faster than a slot a copy for 8-64 rows of 256-512
    slots (and a slot of one head is only D values)."""
    K, _, D = pool.shape
    rows = pool.view(K, -1, block_size, D).index_select(1, blocks.flatten())  # (K, R nb, bs, D)
    return rows.view(K, len(blocks), -1, D).transpose(0, 1)  # (R, K, nb bs, D)


class PagedPool:
    """Keys and values of ``num_layers`` layers for ``num_blocks`` blocks of ``block_size`` slots (+1 scratch block)."""

    def __init__(self, num_layers: int, num_blocks: int, block_size: int, kv_heads: int, head_dim: int,
                 device=None, dtype=torch.float32):
        P = (num_blocks + 1) * block_size
        # zeros, not empty: a masked slot still multiplies its value by a weight of 0, and 0 * NaN is NaN
        self.k = torch.zeros(num_layers, kv_heads, P, head_dim, device=device, dtype=dtype)  # (L, K, P, D)
        self.v = torch.zeros(num_layers, kv_heads, P, head_dim, device=device, dtype=dtype)  # (L, K, P, D)
        self.block_size = block_size

    @property
    def nbytes(self) -> int:
        return 2 * self.k.numel() * self.k.element_size()

    def view(self, tables: torch.Tensor, lengths: torch.Tensor, keep: bool = False) -> PagedCache:
        """A cache over the rows with these block tables (B, nb), padded with the scratch block, and KV lengths (B,);
        ``keep``: copy each layer's rows out of the pool once and keep the copy (:meth:`PagedCache.update`)."""
        return PagedCache(self, tables, lengths, keep)


class PagedCache:
    """One step's rows of a :class:`PagedPool`, as a :class:`~minispec.model.kv_cache.KVCache`."""

    static = False

    def __init__(self, pool: PagedPool, tables: torch.Tensor, lengths: torch.Tensor, keep: bool):
        self.pool, self.tables, self.lengths = pool, tables, lengths.clone()  # (B, nb), (B,)
        self.bound = 0  # host-side bound on max(lengths): attention reads slots [0, bound)
        self._write = self._read = self._at = None
        self._kept = {} if keep else None  # (layer, 0 for K / 1 for V) -> (B, K, nb bs, D) the rows' slots, kept

    def physical(self, slots: torch.Tensor) -> torch.Tensor:
        """Physical slots (B, ...) of logical slots (B, ...); past a row's blocks (any slot, however far), the scratch
        block, so padding never needs a table wide enough for it."""
        bs, nb = self.pool.block_size, self.tables.shape[1]
        flat = slots.reshape(len(slots), -1)  # (B, n)
        block = self.tables.gather(1, (flat // bs).clamp(0, nb - 1))  # (B, n) the last column is the scratch block
        return (block * bs + flat % bs).view(slots.shape)

    @property
    def slots_in_use(self) -> int:
        return self.bound

    def begin(self, slots: torch.Tensor) -> None:
        """Prepare to write at logical slots (B, T); the next :meth:`update` calls gather slots [0, bound), whole
        blocks (:func:`read_blocks`), past a row's blocks the scratch block."""
        self.bound += slots.shape[1]
        self._write, self._at = self.physical(slots).flatten(), slots  # (B T,), (B, T)
        nb, width = -(-self.bound // self.pool.block_size), self.tables.shape[1]
        if self._kept is not None:
            nb = max(nb, width)  # a kept copy holds every block of the tables: the later calls' new slots fit
        self._read = self.tables[:, torch.arange(nb, device=slots.device).clamp_max(width - 1)]  # (B, nb)

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write k, v (B, K, T, D) of one layer into the pool; return each row's slots in use (B, K, S', D). A kept
        view (a draft's, which runs several forwards a step over the same rows) copies each layer's rows once, then
        writes each later call's new slots into that copy as well as into the pool."""
        B, K, T, D = k.shape
        out = []
        for i, (pool, new) in enumerate(((self.pool.k[layer], k), (self.pool.v[layer], v))):  # pool (K, P, D)
            pool.index_copy_(1, self._write, new.transpose(0, 1).reshape(K, B * T, D))  # into their physical slots
            kept = None if self._kept is None else self._kept.get((layer, i))
            if kept is not None and kept.shape[2] >= self.bound:  # a later call of a kept view: its new slots only
                out.append(kept.scatter_(2, self._at[:, None, :, None].expand(-1, K, -1, D), new)[:, :, : self.bound])
                continue
            # The gather: a fused paged-attention kernel would read the pool through self.tables instead of copying.
            rows = read_blocks(pool, self._read, self.pool.block_size)  # (B, K, nb bs, D)
            if self._kept is not None:
                self._kept[layer, i] = rows
            out.append(rows[:, :, : self.bound])  # (B, K, S', D)
        return out[0], out[1]

    def end(self, T: int) -> None:
        self.lengths += T
        self._write = self._read = self._at = None

    def rollback(self, lengths: torch.Tensor) -> None:
        self.lengths.copy_(lengths)

    def trim(self, max_length: int) -> None:
        self.bound = max_length

    def compact(self, base: torch.Tensor, src: torch.Tensor) -> None:
        """As :meth:`minispec.model.kv_cache.KVCache.compact`: slot base + src[b, k] goes to base + 1 + k."""
        D = src.shape[1]
        dst = base[:, None] + 1 + torch.arange(D, device=src.device)  # (B, D)
        src = torch.where(src >= 0, base[:, None] + src, dst)  # (B, D)
        pd, ps = self.physical(dst), self.physical(src)  # (B, D) each
        for buf in (self.pool.k, self.pool.v):
            buf[:, :, pd] = buf[:, :, ps]  # (L, K, B, D, Dh) gathered first, then written
        if self._kept is not None:
            self._kept.clear()  # the slots moved: the next call copies them again


class PagedRows:
    """One vector per position, kept in blocks: it stands in for a (B, S, F) tensor's ``gather(1, ...)`` and
    ``scatter_(1, ...)``, reading and writing ``pool`` (P, F) through a :class:`PagedCache`'s tables."""

    def __init__(self, pool: torch.Tensor, cache: PagedCache, S: int):
        self.pool, self.cache = pool, cache  # (P, F)
        self.shape = (len(cache.tables), S, pool.shape[-1])  # (B, S, F)

    def gather(self, dim: int, index: torch.Tensor) -> torch.Tensor:
        """Rows' vectors at positions index[..., 0] (B, w, F) -> (B, w, F)."""
        return self.pool[self.cache.physical(index[..., 0])]

    def scatter_(self, dim: int, index: torch.Tensor, src: torch.Tensor) -> PagedRows:
        """Write src (B, w, F) at positions index[..., 0] (B, w, F)."""
        self.pool[self.cache.physical(index[..., 0])] = src
        return self
