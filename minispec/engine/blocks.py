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
"""

from __future__ import annotations

from minispec.engine.request import Sequence


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int):
        self.num_blocks, self.block_size = num_blocks, block_size
        self.free: list[int] = list(range(num_blocks - 1, -1, -1))  # a stack: the block freed last is reused first

    @property
    def num_free(self) -> int:
        return len(self.free)

    def blocks_for(self, slots: int) -> int:
        """Blocks that hold ``slots`` slots."""
        return -(-slots // self.block_size)

    def can_grow(self, seq: Sequence, slots: int) -> bool:
        """Whether ``seq``'s table can be made to cover ``slots`` slots from the free list."""
        return self.blocks_for(slots) - len(seq.block_table) <= len(self.free)

    def grow(self, seq: Sequence, slots: int) -> None:
        """Allocate blocks until ``seq``'s table covers ``slots`` slots (check :meth:`can_grow` first)."""
        for _ in range(self.blocks_for(slots) - len(seq.block_table)):
            seq.block_table.append(self.free.pop())

    def shrink(self, seq: Sequence, slots: int) -> None:
        """Free the blocks of ``seq`` past the first ``slots`` slots (a step's rejected lookahead slots)."""
        keep = self.blocks_for(slots)
        while len(seq.block_table) > keep:
            self.free.append(seq.block_table.pop())

    def release(self, seq: Sequence) -> None:
        """Free every block of ``seq`` (it finished, or was preempted)."""
        self.shrink(seq, 0)
