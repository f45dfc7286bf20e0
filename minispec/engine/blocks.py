"""The block manager: KV-cache slots in fixed-size blocks, handed from a free list to each sequence's block table.

The cache is ``num_blocks`` blocks of ``block_size`` slots. A sequence's logical slot s (its
token at position s) lives in block ``block_table[s // block_size]`` at offset ``s % block_size``,
so a sequence grows one block at a time wherever a block is free, and nothing is reserved for
tokens it has not produced yet (on-demand allocation; vLLM's PagedAttention, Kwon et al. 2023).

Speculation adds *lookahead slots*: before a step a decoding row needs room for its last token
and the K draft tokens it will verify (:meth:`BlockManager.grow` to ``num_computed + 1 + K``).
After the step the row keeps the slots of the tokens it accepted; :meth:`BlockManager.shrink`
hands back every block that now holds only rejected tokens' slots. Slots of rejected tokens
inside a kept block are stale and are overwritten later, as rollback does in the static cache.

Physical block ``num_blocks`` (one past the last) is scratch: a block table is padded with it, so
writes past a row's blocks (the padding of a ragged batch) land there and are never read as
anyone's keys. No prefix caching: blocks are never shared.

**Where a block comes from.** Which free block a sequence gets changes nothing the scheduler sees (it counts free
blocks), but it decides whether a row's slots are one run of the pool. A new row *claims* room for its whole
length (prompt + max_new_tokens - 1, and a step's lookahead): it starts at the smallest run of free blocks that no
live row has claimed and that holds it, and grows into its next block while that is free and not another row's
claim. A claim reserves nothing the scheduler counts: a row that finds no such run, or whose next block is taken,
goes to the middle of the longest unclaimed free run (of any free run when none is unclaimed), so that rows placed
one after another leave each other room to grow. A row whose blocks are one run can be attended as a view of the
pool, with no copy (:mod:`minispec.engine.attention`).
"""

from __future__ import annotations

import re

from minispec.engine.request import Sequence


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, lookahead: int = 0):
        """``lookahead``: the most slots a step's draft tokens take past a row's tokens (a claim covers them)."""
        self.num_blocks, self.block_size, self.lookahead = num_blocks, block_size, lookahead
        self.is_free = bytearray(b"\x01") * num_blocks  # 1: block b is free
        self.num_free = num_blocks
        self.claims: dict[int, int] = {}  # a row's first block -> the end of the run it claimed (exclusive)

    @property
    def free(self) -> list[int]:
        """The free blocks, in order."""
        return [b for b, f in enumerate(self.is_free) if f]

    def blocks_for(self, slots: int) -> int:
        """Blocks that hold ``slots`` slots."""
        return -(-slots // self.block_size)

    def can_grow(self, seq: Sequence, slots: int) -> bool:
        """Whether ``seq``'s table can be made to cover ``slots`` slots from the free list."""
        return self.blocks_for(slots) - len(seq.block_table) <= self.num_free

    def grow(self, seq: Sequence, slots: int) -> None:
        """Allocate blocks until ``seq``'s table covers ``slots`` slots (check :meth:`can_grow` first)."""
        table = seq.block_table
        for _ in range(self.blocks_for(slots) - len(table)):
            b = table[-1] + 1 if table else self.num_blocks
            if b == self.num_blocks or not self._open(table[0])[b]:  # the row's next block is taken (or it has none)
                b = self._place(seq)
            self.is_free[b], self.num_free = 0, self.num_free - 1
            table.append(b)

    def _open(self, own: int | None = None) -> bytearray:
        """1 where a block is free and no live row but the one starting at block ``own`` has claimed it."""
        open_ = bytearray(self.is_free)
        for a, end in self.claims.items():
            if a != own:
                open_[a:end] = bytes(end - a)
        return open_

    def _place(self, seq: Sequence) -> int:
        """The block a row starts at (its table empty) or goes on at (its next block taken or claimed)."""
        unclaimed = _runs(self._open())  # (length, start) of each run of free, unclaimed blocks
        need = self.blocks_for(seq.prompt_len + seq.max_new_tokens - 1 + self.lookahead)  # its most slots
        fits = [r for r in unclaimed if r[0] >= need]
        if not seq.block_table and fits:  # a new row: the smallest unclaimed run that holds all of it
            b = min(fits)[1]
            self.claims[b] = b + need
            return b
        n, a = max(unclaimed or _runs(self.is_free), key=lambda r: r[0])  # the longest (the first of equals)
        return a + n // 2 if seq.block_table or a else 0  # a new row at the pool's start: 0

    def shrink(self, seq: Sequence, slots: int) -> None:
        """Free the blocks of ``seq`` past the first ``slots`` slots (a step's rejected lookahead slots)."""
        keep = self.blocks_for(slots)
        while len(seq.block_table) > keep:
            self.is_free[seq.block_table.pop()] = 1
            self.num_free += 1

    def release(self, seq: Sequence) -> None:
        """Free every block of ``seq`` (it finished, or was preempted), and its claim."""
        if seq.block_table:
            self.claims.pop(seq.block_table[0], None)
        self.shrink(seq, 0)


def _runs(free: bytearray) -> list[tuple[int, int]]:
    """(length, first block) of each run of 1s."""
    return [(m.end() - m.start(), m.start()) for m in re.finditer(b"\x01+", free)]
