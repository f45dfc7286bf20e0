"""The paged cache's contract where the engine's tests do not reach it (written from mutation testing): slots past a
row's blocks, however far, land in the scratch block; the pool keeps the model's dtype; paged rows of vectors have
the shape of the tensor they stand in for."""

import torch

from conftest import random_model
from minispec.engine import Engine, Request
from minispec.engine.paged import PagedPool, PagedRows


def test_slots_past_a_rows_blocks_go_to_the_scratch_block_however_far():
    pool = PagedPool(1, 4, 2, 1, 8)  # 4 blocks of 2 slots; block 4 is scratch
    tables = torch.tensor([[3, 0, 2, 4], [1, 4, 4, 4]])  # row 0 holds 3 blocks, row 1 one; padded with the scratch
    view = pool.view(tables, torch.zeros(2, dtype=torch.long))
    slots = torch.tensor([[0, 1, 2, 5, 6, 7, 8, 100], [0, 1, 2, 3, 6, 9, 40, 1001]])
    assert view.physical(slots)[0].tolist() == [6, 7, 0, 5] + [8, 9, 8, 8]
    assert view.physical(slots)[1].tolist() == [2, 3] + [8, 9, 8, 9, 8, 9]
    assert set(view.physical(slots)[:, 4:].flatten().tolist()) == {8, 9}  # block 4's two slots


def test_the_engine_serves_a_bf16_pair():
    """The pool, the draft's pool and the engine's draft cache take the model's dtype (bf16 into a float32 pool
    would not even copy)."""
    target, draft = random_model(seed=0).to(torch.bfloat16), random_model(seed=1, layers=1).to(torch.bfloat16)
    outs = Engine(target, draft, gamma=3, block_size=4).run([Request([1, 2, 3], 12), Request([4, 5], 9)])
    assert [len(o.tokens) for o in outs] == [12, 9] and all(o.finish_reason == "length" for o in outs)


def test_paged_rows_have_the_shape_of_the_tensor_they_stand_in_for():
    pool = PagedPool(1, 4, 2, 1, 8)
    view = pool.view(torch.tensor([[3, 0], [1, 4]]), torch.zeros(2, dtype=torch.long))
    vectors = torch.zeros(10, 7)  # (P, F): a vector per physical slot
    assert PagedRows(vectors, view, S=6).shape == (2, 6, 7)  # (B, S, F)
