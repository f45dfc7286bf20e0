"""The ragged cache: per-row positions, rollback that copies nothing, stale slots invisible."""

import torch
from support import random_model

from minispec.model.kv_cache import KVCache


def test_rollback_equals_a_fresh_cache():
    model = random_model()
    g = torch.Generator().manual_seed(0)
    a, b = torch.randint(0, 64, (3, 12), generator=g), torch.randint(0, 64, (3, 5), generator=g)
    cache = model.new_cache(3, 32)
    model(a, cache)  # 12 tokens per row
    k_before = cache.k.clone()
    cache.rollback(torch.tensor([12, 7, 3]))  # rows 1 and 2 forget their last 5 and 9 tokens
    assert torch.equal(cache.k, k_before), "rollback must not touch the buffers"
    with torch.no_grad():
        cache.k[:, 1, :, 7:12].fill_(1e4)  # stale slots: anything in them must stay invisible
        cache.v[:, 2, :, 3:12].fill_(-1e4)
        out = model(b, cache)  # (3, 5, V)
    for row, keep in enumerate([12, 7, 3]):
        fresh = model.new_cache(1, 32)
        model(a[row : row + 1, :keep], fresh)
        ref = model(b[row : row + 1], fresh)
        assert (out[row] - ref[0]).abs().max() < 1e-5
    assert cache.lengths.tolist() == [17, 12, 8]


def test_rows_write_at_their_own_positions():
    model = random_model()
    cache = model.new_cache(2, 16)
    cache.rollback(torch.tensor([0, 4]))
    x = torch.tensor([[5, 6], [7, 8]])
    with torch.no_grad():
        model(x, cache)
    written = cache.k[0].abs().sum((1, 3))  # (B, S): which slots hold something
    assert written[0, :2].all() and not written[0, 2:].any()
    assert written[1, 4:6].all() and not written[1, 6:].any()


def test_size_in_bytes():
    model = random_model()  # 2 layers, 2 KV heads, head dim 16, float32
    cache = model.new_cache(batch_size=3, max_len=10)
    assert cache.nbytes == 2 * 2 * 3 * 2 * 10 * 16 * 4
    assert cache.nbytes == 3 * 10 * model.config.kv_elements_per_token * 4


def test_a_static_cache_without_compile_gives_the_same_logits():
    """static=True makes attention span all S slots (fixed shapes for torch.compile); the mask hides
    the slots a row has not written, so the logits equal those of a growing cache."""
    model = random_model()
    g = torch.Generator().manual_seed(3)
    prompt, steps = torch.randint(0, 64, (2, 6), generator=g), torch.randint(0, 64, (2, 4), generator=g)
    out = {}
    for static in (False, True):
        cache = model.new_cache(2, 16, static=static)
        with torch.no_grad():
            logits = [model(prompt, cache)] + [model(steps[:, i : i + 1], cache) for i in range(4)]
        out[static] = torch.cat(logits, 1)
        assert cache.slots_in_use == (16 if static else 10)
    assert (out[True] - out[False]).abs().max() < 1e-5


def test_a_cache_reads_only_the_slots_in_use_unless_static():
    """By default (the EAGLE head's cache is built so) attention spans the slots written so far, not the capacity;
    a static cache (for torch.compile) spans all of them."""
    k = torch.randn(2, 1, 3, 4)  # (B, K, T, D)
    for static, spanned in ((None, 3), (True, 64)):
        cache = KVCache(1, 2, 1, 64, 4) if static is None else KVCache(1, 2, 1, 64, 4, static=static)
        cache.begin(torch.arange(3).expand(2, 3))  # (B, T) slots 0..2
        keys, _ = cache.update(0, k, k)  # (B, K, S', D)
        assert keys.shape[2] == spanned
        assert torch.equal(keys[:, :, :3], k)
