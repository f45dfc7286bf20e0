"""A preallocated, ragged KV cache: one K and one V buffer per layer for the whole batch.

Row b holds ``lengths[b]`` valid slots. A forward pass of T tokens writes row b at slots
``lengths[b] .. lengths[b] + T - 1`` (each row at its own positions) and then advances every
length by T. :meth:`KVCache.rollback` moves lengths back and copies no keys or values: slots
at or past a row's length are stale, and the model's mask never lets a query see a slot
past its own position, so stale slots are invisible until they are overwritten. After a tree of
drafts is verified, :meth:`KVCache.compact` moves the accepted path's few slots next to the prefix.

Shape symbols: L layers, B rows, K key/value heads, S slots, D head dim, T new tokens.
"""

from __future__ import annotations

import torch


class KVCache:
    def __init__(self, num_layers: int, batch_size: int, num_kv_heads: int, max_len: int, head_dim: int,
                 device=None, dtype=torch.float32, static: bool = False):
        """``static=True`` makes attention always span all S slots (fixed shapes for torch.compile)."""
        shape = (num_layers, batch_size, num_kv_heads, max_len, head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)  # (L, B, K, S, D)
        self.v = torch.zeros(shape, device=device, dtype=dtype)  # (L, B, K, S, D)
        self.lengths = torch.zeros(batch_size, dtype=torch.long, device=device)  # (B,)
        self.max_len, self.static = max_len, static
        if static:  # buffers updated in place keep their addresses: CUDA graphs may capture them
            for t in (self.k, self.v, self.lengths):
                torch._dynamo.mark_static_address(t)
        # A host-side upper bound on max(lengths): attention reads slots [0, bound) only.
        # Tracking it on the host keeps the forward pass free of device-to-host syncs.
        self.bound = max_len if static else 0
        self._index = None

    @property
    def nbytes(self) -> int:
        """Bytes held by the K and V buffers."""
        return self.k.numel() * self.k.element_size() * 2

    @property
    def slots_in_use(self) -> int:
        """Slots a forward pass of the current call attends over (S' <= S)."""
        return self.bound

    def begin(self, slots: torch.Tensor) -> None:
        """Prepare to write tokens at slots ``slots`` (B, T) in every layer."""
        B, K, S, D = self.k.shape[1:]
        T = slots.shape[1]
        if not self.static:
            self.bound = min(S, self.bound + T)
        self._index = slots[:, None, :, None].expand(B, K, T, D)  # (B, K, T, D)

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write this call's k, v (B, K, T, D) of one layer; return the slots in use (B, K, S', D)."""
        self.k[layer].scatter_(2, self._index, k)
        self.v[layer].scatter_(2, self._index, v)
        return self.k[layer, :, :, : self.bound], self.v[layer, :, :, : self.bound]

    def end(self, T: int) -> None:
        """Every row now holds T more tokens."""
        self.lengths += T
        self._index = None

    def rollback(self, lengths: torch.Tensor) -> None:
        """Set each row's length (B,), each at most its current one. No K or V is copied."""
        self.lengths.copy_(lengths)

    def compact(self, base: torch.Tensor, src: torch.Tensor) -> None:
        """Move each row's accepted tree path to contiguous slots: slot base + src[b, k] to base + 1 + k.

        base (B,): the slot of the tree's root; src (B, D): the path's nodes (slot offsets from the root,
        in depth order; -1 past a row's path, which copies nothing). Only the D slots of each row move,
        in every layer; a row's other slots are not touched.
        """
        D = src.shape[1]
        dst = base[:, None] + 1 + torch.arange(D, device=src.device)  # (B, D)
        src = torch.where(src >= 0, base[:, None] + src, dst)  # (B, D) past the path: a slot onto itself
        L, B, K, _, Dh = self.k.shape
        src, dst = (i[None, :, None, :, None].expand(L, B, K, D, Dh) for i in (src, dst))  # (L, B, K, D, Dh)
        for buf in (self.k, self.v):
            buf.scatter_(3, dst, buf.gather(3, src))

    def trim(self, max_length: int) -> None:
        """Tell the cache, from the host, that no row is longer than ``max_length``, so later
        calls attend over fewer slots (ignored by a static cache)."""
        if not self.static:
            self.bound = min(self.max_len, max_length)
