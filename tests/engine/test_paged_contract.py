"""The paged cache's contract where the engine's tests do not reach it (written from mutation testing): slots past a
row's blocks, however far, land in the scratch block; the pool keeps the model's dtype; paged rows of vectors have
the shape of the tensor they stand in for."""

import copy

import torch

import minispec
from minispec.engine import Engine, Request
from minispec.engine.paged import PagedPool, PagedRows, read_blocks
from minispec.model.kv_cache import KVCache
from minispec.model.load import sample_text


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
    would not even copy), and the tokens are right: the embedded pair in bf16, greedy, gives the float32 greedy tokens
    of the same weights (on prompts where bf16 cannot change them: float32's top-1 margin over 4x bf16's largest
    logit error at every position, checked), and accepts as many draft tokens as the pair in float32, within 10 %."""
    t16, d16 = (minispec.load(name)[0].to(torch.bfloat16) for name in ("tiny-code-target", "tiny-code-draft"))
    t32, d32 = copy.deepcopy(t16).float(), copy.deepcopy(d16).float()
    text = sample_text("code")
    prompts = [list(text[400 * i: 400 * i + 20]) for i in (1, 3, 5, 8)]  # bytes = tokens
    ref = minispec.generate(t32, prompts, 24).tokens
    with torch.inference_mode():
        for p, r in zip(prompts, ref):  # the margin: bf16 greedy decoding cannot pick another token than float32's
            seq = torch.tensor([p + r])  # (1, P + 24)
            l32, l16 = t32(seq)[0, len(p) - 1: -1], t16(seq)[0, len(p) - 1: -1].float()  # (24, V) each
            top = l32.topk(2, -1).values  # (24, 2)
            assert ((top[:, 0] - top[:, 1]) > 4 * (l16 - l32).abs().amax(-1)).all()
    engines = {dtype: Engine(t, d, gamma=3, block_size=4) for dtype, t, d in (("bf16", t16, d16), ("f32", t32, d32))}
    outs = {dtype: e.run([Request(p, 24) for p in prompts]) for dtype, e in engines.items()}
    assert [o.tokens for o in outs["bf16"]] == ref == [o.tokens for o in outs["f32"]]
    assert engines["bf16"].stats.accepted_tokens >= 0.9 * engines["f32"].stats.accepted_tokens > 0


def test_paged_rows_have_the_shape_of_the_tensor_they_stand_in_for():
    pool = PagedPool(1, 4, 2, 1, 8)
    view = pool.view(torch.tensor([[3, 0], [1, 4]]), torch.zeros(2, dtype=torch.long))
    vectors = torch.zeros(10, 7)  # (P, F): a vector per physical slot
    assert PagedRows(vectors, view, S=6).shape == (2, 6, 7)  # (B, S, F)


def test_compact_moves_what_the_dense_cache_moves_offset_zero_included():
    """A tree step's accepted path moved to contiguous slots, in the pool as in the dense cache: slot base + src[b, k]
    to base + 1 + k, where an offset of 0 (the root's own slot) moves too and -1 moves nothing."""
    L, B, K, S, D, bs = 2, 2, 1, 12, 4, 4
    dense = KVCache(L, B, K, S, D)
    g = torch.Generator().manual_seed(0)
    dense.k.copy_(torch.randn(dense.k.shape, generator=g))
    dense.v.copy_(torch.randn(dense.v.shape, generator=g))
    pool = PagedPool(L, 8, bs, K, D)
    tables = torch.tensor([[5, 2, 7], [0, 6, 3]])  # (B, 3 blocks) = 12 slots each
    view = pool.view(tables, torch.zeros(B, dtype=torch.long))
    slots = view.physical(torch.arange(S).expand(B, -1))  # (B, S)
    for buf, src in ((pool.k, dense.k), (pool.v, dense.v)):
        buf[:, :, slots] = src.transpose(1, 2)  # (L, K, B, S, D)
    base = torch.tensor([3, 5])  # (B,) each row's root
    path = torch.tensor([[0, 2, -1], [3, 1, 4]])  # (B, D) offsets from the root; row 0 moves its root to base + 1
    dense.compact(base, path)
    view.compact(base, path)
    for buf, ref in ((pool.k, dense.k), (pool.v, dense.v)):
        assert torch.equal(buf[:, :, slots], ref.transpose(1, 2))


def test_a_view_reads_exactly_the_slots_written_so_far():
    """Two rows, nothing written yet, then steps of 3 and 2 tokens: each update returns the rows' slots [0, bound),
    3 then 5, not a slot more (the view copies whole blocks and cuts them to the bound)."""
    pool = PagedPool(1, 8, 4, 2, 8)
    view = pool.view(torch.tensor([[5, 2, 8], [0, 6, 8]]), torch.zeros(2, dtype=torch.long))
    for T, bound in ((3, 3), (2, 5)):
        view.begin(view.lengths[:, None] + torch.arange(T))
        k, v = view.update(0, torch.randn(2, 2, T, 8), torch.randn(2, 2, T, 8))  # (B, K, T, D) each
        assert k.shape == v.shape == (2, 2, bound, 8)
        view.end(T)


def test_a_kept_view_returns_what_a_fresh_copy_returns_and_reads_the_pool_once_a_layer(monkeypatch):
    """A draft's view over a step (``keep=True``) copies each layer's rows once and then writes only the new slots
    into its copy: call by call it returns exactly what the plain view's fresh copy returns, through writes that
    cross blocks, a rollback that writes slots again, a trim and a compact (after which it copies again), and it
    reads the pool once per layer and K or V, not once per call."""
    import minispec.engine.paged as paged

    reads = []
    monkeypatch.setattr(paged, "read_blocks", lambda *a: reads.append(1) or read_blocks(*a))
    L, B, K, D, bs = 2, 2, 2, 8, 4
    tables = torch.tensor([[5, 2, 7, 1], [0, 6, 3, 8]])  # (B, 4 blocks): row 1's last is the scratch block
    pools = [PagedPool(L, 8, bs, K, D) for _ in range(2)]
    g = torch.Generator().manual_seed(0)
    for buf in ("k", "v"):  # history already in the pool: the same in both
        x = torch.randn(getattr(pools[0], buf).shape, generator=g)
        for p in pools:
            getattr(p, buf).copy_(x)
    start = torch.tensor([6, 3])
    plain, kept = pools[0].view(tables, start), pools[1].view(tables, start, keep=True)
    calls = [("write", 2), ("write", 1), ("write", 3), ("rollback", None), ("write", 2), ("trim", None),
             ("write", 1), ("compact", None), ("write", 1)]
    per_call = []
    for what, T in calls:
        for view in (plain, kept):
            if what == "rollback":
                view.rollback(start + 1)
            elif what == "trim":
                view.trim(int(view.lengths.max()))
            elif what == "compact":
                view.compact(view.lengths - 3, torch.tensor([[2, -1], [1, 2]]))
        if what != "write":
            continue
        new = [torch.randn(B, K, T, D, generator=g) for _ in range(2 * L)]
        n = len(reads)
        outs = []
        for view in (plain, kept):
            view.begin(view.lengths[:, None] + torch.arange(T))
            outs.append([view.update(layer, new[2 * layer], new[2 * layer + 1]) for layer in range(L)])
            view.end(T)
            per_call.append(len(reads) - n)
            n = len(reads)
        for (k0, v0), (k1, v1) in zip(*outs):
            assert torch.equal(k0, k1) and torch.equal(v0, v1)
    assert torch.equal(pools[0].k, pools[1].k) and torch.equal(pools[0].v, pools[1].v)
    assert per_call[0::2] == [2 * L] * 6  # the plain view copies every call
    assert per_call[1::2] == [2 * L, 0, 0, 0, 0, 2 * L]  # the kept one at its first call and after the compact


def test_a_drafts_own_pool_holds_its_layers_and_no_more(code_pair):
    """The runner's KV bytes: the target's pool, plus a draft model's pool of its own layers, or an EAGLE head's of
    its one layer and its feature record (one vector per slot); no draft keeps nothing."""
    target, small, _ = code_pair
    eagle = minispec.EagleDraft.from_pretrained("tiny-code-eagle", target)
    blocks, bs = 40, 16
    slots = (blocks + 1) * bs  # the scratch block too

    def kv(cfg, layers):
        return 2 * layers * cfg.num_key_value_heads * cfg.head_dim * slots * 4  # K and V, float32

    base = kv(target.config, target.config.num_hidden_layers)
    head = eagle.model.config.layer
    want = {None: base, small: base + kv(small.config, small.config.num_hidden_layers),
            eagle: base + kv(head, 1) + slots * head.hidden_size * len(eagle.features) * 4}
    for draft, nbytes in want.items():
        assert Engine(target, draft, num_blocks=blocks, block_size=bs).runner.nbytes == nbytes
