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
blocks), but it decides whether a row's slots are one run of the pool. A growing row takes the block right after
its last one when that is free; a new row (or one whose next block is taken) starts in the middle of the longest
run of free blocks, so that rows admitted one after another leave each other room to grow. A row whose blocks are
one run can be attended as a view of the pool, with no copy (:mod:`minispec.engine.attention`: ``"views"``, and
``"auto"`` for a row attended alone).
"""

from __future__ import annotations

import re

from minispec.engine.request import Sequence


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int):
        self.num_blocks, self.block_size = num_blocks, block_size
        self.is_free = bytearray(b"\x01") * num_blocks  # 1: block b is free
        self.num_free = num_blocks

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
            if b == self.num_blocks or not self.is_free[b]:  # the row's next block is taken (or it has none)
                run = max(re.finditer(b"\x01+", self.is_free), key=lambda m: m.end() - m.start())  # the longest
                b = (run.start() + run.end()) // 2 if table or run.start() else 0  # a new row at the pool's start: 0
            self.is_free[b], self.num_free = 0, self.num_free - 1
            table.append(b)

    def shrink(self, seq: Sequence, slots: int) -> None:
        """Free the blocks of ``seq`` past the first ``slots`` slots (a step's rejected lookahead slots)."""
        keep = self.blocks_for(slots)
        while len(seq.block_table) > keep:
            self.is_free[seq.block_table.pop()] = 1
            self.num_free += 1

    def release(self, seq: Sequence) -> None:
        """Free every block of ``seq`` (it finished, or was preempted)."""
        self.shrink(seq, 0)
