"""DeviceRows, the engine's per-sequence device state, against what it must mirror: after any admit, release and sync
each running row's table is exactly its sequence's block table padded with the scratch block, its tokens are the
sequence's, and every row can be used at once. (Mutation testing found these cases unchecked: a shrinking table, a
release of a sequence never admitted, all rows in use, the table's width.)"""

import pytest
import torch

import minispec
from minispec.engine import Engine, Request
from minispec.engine.batch import DeviceRows
from minispec.engine.request import Sequence

SCRATCH = 99


def seq(tokens, table):
    return Sequence(len(tokens), 8, tokens=list(tokens), num_tokens=len(tokens), block_table=list(table))


def check(rows: DeviceRows, running: list[Sequence]):
    """Each running sequence's row mirrors it; every other row holds only the scratch block."""
    used = set()
    for s in running:
        r = rows.row[s]
        used.add(r)
        want = s.block_table + [SCRATCH] * (rows.tables.shape[1] - len(s.block_table))
        assert rows.tables[r].tolist() == want
        assert rows.tokens[r, : s.num_tokens].tolist() == s.tokens
    for r in set(range(len(rows.tables))) - used:
        assert rows.tables[r].tolist() == [SCRATCH] * rows.tables.shape[1]


def test_rows_mirror_their_sequences_as_tables_grow_shrink_and_rows_come_and_go():
    rows = DeviceRows(rows=3, length=16, blocks=4, scratch=SCRATCH, device="cpu")
    assert rows.tables.shape == (3, 5) and rows.tables.dtype == torch.long  # every block, then a scratch column
    a, b, c = seq([1, 2, 3], [7]), seq([4, 5], [2, 8]), seq([6], [])
    for s in (a, b, c):  # all three rows at once
        rows.admit(s)
    assert sorted(rows.row.values()) == [0, 1, 2]
    rows.sync([a, b, c])
    check(rows, [a, b, c])
    with pytest.raises(RuntimeError, match="at once"):
        rows.admit(seq([9], []))
    a.block_table += [3, 4, 5]  # grows: the new entries are written
    b.block_table.pop()  # a rejected draft's lookahead block handed back: the entry goes back to scratch
    c.block_table = [0, 1, 10, 11]  # every block it may hold
    rows.sync([a, b, c])
    check(rows, [a, b, c])
    assert rows.table_width([a, b]) == 4 + 1 and rows.table_width([c]) == 5  # its most blocks and a scratch column
    rows.release(b)
    rows.release(seq([1], [1]))  # never admitted (a request preempted before it ran): nothing happens
    check(rows, [a, c])
    d = seq([5, 5, 5, 5], [6, 9])  # takes the freed row
    rows.admit(d)
    rows.sync([d, a])
    check(rows, [a, c, d])
    assert rows.sync([c, a, d]).tolist() == [rows.row[c], rows.row[a], rows.row[d]]


def test_a_sync_sends_the_device_only_the_entries_that_changed(monkeypatch):
    """Between steps a table changes at its end only, so a sync copies that suffix to the device and nothing else
    (vLLM's InputBatch appends the same way). Rewriting every table every step would mirror the same tables: only
    what is sent shows the difference."""
    rows = DeviceRows(rows=3, length=16, blocks=4, scratch=SCRATCH, device="cpu")
    a, b, c = seq([1, 2, 3], [7]), seq([4, 5], [2, 8]), seq([6], [0, 1])
    for s in (a, b, c):
        rows.admit(s)
    rows.sync([a, b, c])
    sent, tensor = [], torch.tensor

    def spy(data, *args, **kw):
        sent.append(list(data))
        return tensor(data, *args, **kw)

    monkeypatch.setattr(torch, "tensor", spy)
    a.block_table += [3, 4]  # two new blocks; b hands one back (written as scratch on the device); c is unchanged
    b.block_table.pop()
    index = rows.sync([a, b, c])
    monkeypatch.undo()
    assert sent == [[3, 4], index.tolist()]
    check(rows, [a, b, c])


def test_a_prompt_read_in_chunks_is_sent_to_the_device_once(monkeypatch):
    """The runner admits a request's tokens to its device row when its first chunk runs (num_computed 0), not again
    with each later chunk: a 90-token prompt under a 32-token budget runs in three chunks and one admit. (Admitting
    at every chunk re-sends the whole prompt each time and keeps every token the same.)"""
    target = minispec.load("tiny-code-target")[0]
    admitted = []
    admit = DeviceRows.admit
    monkeypatch.setattr(DeviceRows, "admit", lambda self, s: (admitted.append(s.index), admit(self, s))[1])
    engine = Engine(target, None, max_num_batched_tokens=32)
    out = engine.run([Request(list(range(40, 130)), 4), Request(list(range(50, 60)), 4)])
    assert [len(o.tokens) for o in out] == [4, 4] and engine.stats.preemptions == 0
    assert sum(1 for p in engine.stats.prefill_per_step if p) >= 3  # the long prompt took three chunks
    assert sorted(admitted) == [0, 1]  # each request sent once
