"""What the device keeps of each running sequence between steps: its tokens and its block table, in fixed rows.

Each sequence the scheduler admits (or re-admits after a preemption) gets a row of :class:`DeviceRows`
for as long as it runs: its tokens are copied there once, then each step appends only the tokens it
produced, and its block table is written where it changed. A step's inputs are then built on the
device from these rows (:mod:`minispec.engine.runner`): nothing re-sends a sequence's history or
rebuilds its table from Python lists (vLLM V1 keeps its ``InputBatch`` the same way).

Past a row's blocks its table holds the scratch block (:mod:`minispec.engine.blocks`), so a padded
write through it (a draft's catch-up over ragged rows) can never land in another sequence's blocks.
"""

from __future__ import annotations

import torch

from minispec.engine.request import Sequence


class DeviceRows:
    """``rows`` sequences of up to ``length`` tokens and ``blocks`` KV blocks each, kept on ``device``."""

    def __init__(self, rows: int, length: int, blocks: int, scratch: int, device):
        self.scratch = scratch
        self.tokens = torch.zeros(rows, length, dtype=torch.long, device=device)  # (R, L)
        self.tables = torch.full((rows, blocks + 1), scratch, dtype=torch.long, device=device)  # (R, nb+1) + scratch
        self.free = list(range(rows - 1, -1, -1))
        self.row: dict[Sequence, int] = {}  # a running sequence's row
        self.written: dict[Sequence, list[int]] = {}  # the block table as last written to the device

    def admit(self, seq: Sequence) -> None:
        """Give ``seq`` a row and copy its tokens there (a new request's prompt; a preempted one's every token)."""
        if not self.free:
            raise RuntimeError(f"more than {len(self.row)} sequences running at once")
        r = self.row[seq] = self.free.pop()
        self.tokens[r, : seq.num_tokens] = torch.tensor(seq.tokens, device=self.tokens.device)
        self.tables[r] = self.scratch
        self.written[seq] = []

    def release(self, seq: Sequence) -> None:
        """``seq`` finished or was preempted: its row is free (its table back to scratch)."""
        r = self.row.pop(seq, None)
        if r is not None:
            del self.written[seq]
            self.tables[r] = self.scratch
            self.free.append(r)

    def sync(self, seqs: list[Sequence]) -> torch.Tensor:
        """Write each sequence's block table where it changed since the last step; returns their rows (B,).
        Blocks come and go at a table's end only, so what changed is a suffix."""
        for s in seqs:
            old, new, r = self.written[s], s.block_table, self.row[s]
            same = next((j for j, (a, b) in enumerate(zip(old, new)) if a != b), min(len(old), len(new)))
            if same < len(new):
                self.tables[r, same: len(new)] = torch.tensor(new[same:], device=self.tables.device)
            if len(new) < len(old):
                self.tables[r, len(new): len(old)] = self.scratch
            self.written[s] = list(new)
        return torch.tensor([self.row[s] for s in seqs], device=self.tables.device)

    def table_width(self, seqs: list[Sequence]) -> int:
        """Columns of the tables these sequences need: their most blocks, plus one scratch column."""
        return max(len(s.block_table) for s in seqs) + 1
