"""The engine's step: one flattened target pass per step, attention through the block tables, per-row sampling,
drafts cut to the token budget, acceptance counted up to an EOS."""

import pytest
import torch
from support import random_model

import minispec
from minispec.engine import Engine, Request
from minispec.engine.attention import PagedStep, _block_mask, group
from minispec.engine.paged import PagedPool
from minispec.model.load import sample_text
from minispec.roofline.policy import FixedPolicy
from minispec.speculative import loop
from minispec.speculative.rule import accept_reject


@pytest.fixture(scope="module")
def pair(code_pair):
    """The embedded pair (tests/engine/conftest.py) with this module's six prompts, 20 to 75 bytes."""
    target, draft, _ = code_pair
    text = sample_text("code")
    return target, draft, [list(text[300 * i: 300 * i + 20 + 11 * i]) for i in range(6)]


class Passes:
    """Counts the target's forward passes and keeps each one's logits."""

    def __init__(self, model):
        self.calls, self.logits = 0, []
        self.handle = model.register_forward_hook(self.hook)

    def hook(self, module, args, out):
        self.calls += 1
        self.logits.append((out[0] if isinstance(out, tuple) else out).detach().clone())

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.handle.remove()


def mixed(prompts, n=24):
    """Greedy, sampled, top-k, top-p and both rows in one batch, arriving a little apart."""
    kinds = [dict(), dict(temperature=1.0, seed=3), dict(temperature=0.7, top_k=20, seed=4),
             dict(temperature=0.9, top_p=0.8, seed=5), dict(temperature=1.3, top_k=40, top_p=0.95, seed=6), dict()]
    return [Request(p, n, arrival_s=0.002 * i, **k) for i, (p, k) in enumerate(zip(prompts, kinds))]


def alternating(prompts, n):
    """Greedy and sampled rows in turn (temperature 0 and 0.8, each row seeded by its index), all at t = 0."""
    return [Request(p, n, temperature=0.8 * (i % 2), seed=i) for i, p in enumerate(prompts)]


@pytest.mark.parametrize("draft_kind", ["none", "model", "lookup", "tree", "static"])
def test_a_mixed_batch_runs_one_target_pass_per_step(pair, draft_kind):
    """Any mix of sampling settings, prefill chunks and decoding rows: exactly one target forward per step, and every
    decoding row gets its new tokens from it (a static tree drafts greedy and sampled rows as two groups: both are
    read)."""
    target, draft, prompts = pair
    d = {"none": None, "model": draft, "lookup": minispec.PromptLookupDraft(),
         "tree": minispec.TreeDraft(draft, budget=6, depth=3), "static": minispec.TreeDraft(draft, branching=(2, 2, 1))
         }[draft_kind]
    engine = Engine(target, d, gamma=3, max_num_batched_tokens=40)
    execute, missed = engine.runner.execute, []

    def checked(plan):
        result = execute(plan)
        missed.extend(s for s in plan.decode if not result.new.get(s, ((),))[0])
        return result

    engine.runner.execute = checked
    with Passes(target) as passes:
        outs = engine.run(mixed(prompts))
    assert passes.calls == engine.stats.steps  # one pass a step, whatever runs in it
    assert not missed  # no decoding row went a step without a token
    assert any(b > 0 and p > 0 for b, p in zip(engine.stats.batch_per_step, engine.stats.prefill_per_step))
    assert all(len(o.tokens) == 24 for o in outs)
    reqs = mixed(prompts)
    for r, o in zip(reqs, outs):  # each row as alone (float32 on a CPU; the sampled rows by their own seeds)
        if d is None:
            alone = minispec.generate(target, [r.prompt], 24, r.temperature, r.top_k, r.top_p, [r.seed or 0])
        else:
            alone = minispec.speculative_generate(target, d, [r.prompt], gamma=3, max_new_tokens=24,
                                                  temperature=r.temperature, top_k=r.top_k, top_p=r.top_p,
                                                  seed=[r.seed or 0])
        assert o.tokens == alone.tokens[0]


@pytest.mark.parametrize("draft_kind", ["none", "model", "tree", "eagle"])
def test_every_attention_path_equals_the_gather(pair, draft_kind, monkeypatch):
    """Every path against the reference gather, on steps with prefill chunks, decoding rows and draft tokens (chains
    and trees) or plain ones: the same tokens and acceptance, logits within float tolerance."""
    pytest.importorskip("torch.nn.attention.flex_attention")
    target, draft, prompts = pair
    d = {"none": None, "model": draft, "tree": minispec.TreeDraft(draft, budget=6, depth=3),
         "eagle": minispec.EagleDraft.from_pretrained("tiny-code-eagle", target)}[draft_kind]
    runs, reads = {}, []

    def counted(path):  # each path's reads counted: the engine's option must reach the step
        read = getattr(PagedStep, path)

        def counting(self, *args):
            reads.append(path)
            return read(self, *args)
        return counting

    for path in ("_gather", "_flex", "_views", "_sparse", "_one"):
        monkeypatch.setattr(PagedStep, path, counted(path))
    for attention in ("gather", "flex", "views", "sparse", "auto"):
        engine = Engine(target, d, gamma=3, num_blocks=48, max_num_batched_tokens=32, attention=attention)
        with Passes(target) as passes:
            outs = engine.run([Request(p, 12, arrival_s=0.002 * i) for i, p in enumerate(prompts[:4])])
        runs[attention] = outs, engine.stats, passes.logits
        # auto: lone rows in place, a plain step's rows sparse, a speculative step's copied; auto and views: a step of
        # one row (the batch's last) by _one
        want = {"_views", "_sparse" if d is None else "_gather"} if attention == "auto" else {"_" + attention}
        want |= {"_one"} if attention in ("auto", "views") else set()
        assert set(reads) == want, (attention, set(reads))  # this path, and only it, read the pool
        reads.clear()
    g_out, g_stats, g_logits = runs["gather"]
    for attention in ("flex", "views", "sparse", "auto"):
        f_out, f_stats, f_logits = runs[attention]
        assert [o.tokens for o in f_out] == [o.tokens for o in g_out]
        assert f_stats.accepted_per_position == g_stats.accepted_per_position
        assert sum(g_stats.accepted_per_position) or d is None
        assert len(f_logits) == len(g_logits)
        for a, b in zip(g_logits, f_logits):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("draft_kind", ["model", "eagle"])
def test_a_drafts_forwards_in_a_step_copy_its_rows_out_of_its_pool_once(pair, draft_kind, monkeypatch):
    """A draft model or EAGLE head runs gamma forwards a step over the same rows (a catch-up, then gamma - 1 more):
    its view of its own pool copies each layer's rows once a step (K and V), not once a forward, and serves what the
    copy-per-forward view serves (the same tokens and acceptance)."""
    import minispec.engine.paged as paged

    target, draft, prompts = pair
    d = draft if draft_kind == "model" else minispec.EagleDraft.from_pretrained("tiny-code-eagle", target)
    layers = d.config.num_hidden_layers if draft_kind == "model" else 1  # the EAGLE head: one layer
    reads, runs = [], {}
    monkeypatch.setattr(paged, "read_blocks", lambda *a, _f=paged.read_blocks: reads.append(1) or _f(*a))
    for keep in (True, False):
        engine = Engine(target, d, gamma=4)
        if not keep:
            engine.runner.drafter.keep = False  # the reference: a fresh copy at every forward
        per_step = []

        def counted(plan, execute=engine.runner.execute, per_step=per_step):
            n = len(reads)
            result = execute(plan)
            if plan.decode and not plan.prefill:
                per_step.append(len(reads) - n)
            return result

        engine.runner.execute = counted
        runs[keep] = [o.tokens for o in engine.run([Request(p, 16) for p in prompts[:4]])], engine.stats
        assert per_step and set(per_step) == ({2 * layers} if keep else {2 * layers * 4}), per_step
    assert runs[True][0] == runs[False][0]
    assert runs[True][1].accepted_per_position == runs[False][1].accepted_per_position


def test_the_flat_pass_gives_each_row_its_own_logits():
    """A random Llama (vocabulary 32,768, sliding window off): the engine's plain steps over rows of different
    lengths give, row by row, the logits of the model run on that row alone."""
    target = random_model(seed=3, vocab=32_768, layers=2, hidden=64, heads=4, kv_heads=2)
    prompts = [[(5 * i + j) % 32_768 for j in range(3 + 9 * i)] for i in range(4)]
    engine = Engine(target, None, block_size=4, num_blocks=64)
    with Passes(target) as passes:
        outs = engine.run([Request(p, 6) for p in prompts])
    last = passes.logits[-1][0]  # (M, V): the last step's rows, in the order they ran
    alone = [target(torch.tensor([p + o.tokens[:-1]]))[0, -1] for p, o in zip(prompts, outs)]  # (V,) each
    assert any(torch.allclose(last[b], alone[3], atol=1e-4) for b in range(len(last)))
    assert [o.tokens for o in outs] == minispec.generate(target, prompts, 6).tokens


def test_a_chain_is_cut_to_fit_the_token_budget_instead_of_waiting(pair):
    """A budget of 12 tokens and three rows at gamma 4: the third decoding row verifies the 1 + 1 tokens left (vLLM
    cuts its draft) instead of waiting a step; no step exceeds the budget and every output is plain greedy decoding."""
    target, draft, prompts = pair
    short = [p[:6] for p in prompts[:3]]
    engine = Engine(target, draft, gamma=4, max_num_batched_tokens=12)
    outs = engine.run([Request(p, 24) for p in short])
    s = engine.stats
    assert max(s.tokens_per_step) <= 12
    three = [i for i, b in enumerate(s.batch_per_step) if b == 3]
    assert three and all(s.tokens_per_step[i] == 12 for i in three)  # 5 + 5 + 2: the third row does not wait
    assert [o.tokens for o in outs] == minispec.generate(target, short, 24).tokens


@pytest.mark.parametrize("where", ["engine", "loop"])
def test_greedy_chains_hand_the_rule_argmaxes_and_sampled_rows_dense_p(pair, where, monkeypatch):
    """The engine and the static loop give :func:`accept_reject` an all-greedy chain's argmaxes (Argmax: no
    (B, 1 + gamma, V) one-hots written and read each step) and a batch with a sampled row its dense p; the greedy
    tokens are plain greedy decoding's. In the engine a sampled row may finish first: from then on its greedy
    neighbours' steps are all greedy again, so dense p exactly while it verifies (each step after its first token);
    seed 3 makes it finish first here (four dense steps, then one of argmaxes)."""
    target, draft, prompts = pair
    seen = []

    def spy(p, *rest):  # accept_reject itself, which the loop recognises by identity: patched where it looks
        seen.append(type(p).__name__)
        return accept_reject(p, *rest)

    monkeypatch.setattr(loop, "accept_reject", spy)
    for temperatures in ([0.0] * 3, [0.0, 0.8, 0.0]):
        seen.clear()
        if where == "engine":
            requests = [Request(p, 16, t, seed=3) for p, t in zip(prompts, temperatures)]
            outs = Engine(target, draft, gamma=4, rule=spy).run(requests)
            out, dense = [o.tokens for o in outs], len(outs[1].itl_s) * (max(temperatures) > 0)  # row 1's steps
        else:
            out = minispec.speculative_generate(target, draft, prompts[:3], gamma=4, max_new_tokens=16, rule=spy,
                                                temperature=max(temperatures), seed=0).tokens
            dense = len(seen) * (max(temperatures) > 0)  # one temperature for the batch: every step sampled or none
        assert seen and (dense > 0) == (max(temperatures) > 0)
        assert seen == ["Tensor"] * dense + ["Argmax"] * (len(seen) - dense)
        if max(temperatures) == 0:
            assert out == minispec.generate(target, prompts[:3], 16).tokens


def test_acceptance_counts_stop_at_an_eos(pair):
    """A request that stops at an EOS which the draft proposed and the target accepted: draft tokens after it are
    neither output nor counted as accepted."""
    target, draft, prompts = pair
    plain = minispec.generate(target, [prompts[0]], 24).tokens[0]
    free = Engine(target, draft, gamma=4)
    out = free.run([Request(prompts[0], 24)])[0]
    # an accepted draft token, its first occurrence, followed by another accepted one (so in the same step)
    j = next(i for i in range(len(plain) - 1) if out.accepted[i] and out.accepted[i + 1] and plain.index(plain[i]) == i)
    stop = Engine(target, draft, gamma=4)
    got = stop.run([Request(prompts[0], 24, eos_token_id=plain[j])])[0]
    assert got.tokens == plain[: j + 1] and got.finish_reason == "stop" and got.accepted[j]
    assert stop.stats.accepted_tokens == sum(got.accepted)  # the accepted draft token after the EOS is not counted


def test_a_policy_above_its_gamma_max_is_refused(pair):
    target, draft, prompts = pair

    class Greedy(FixedPolicy):
        def choose(self, batch_size, context=None):
            return self.gamma_max + 1

    with pytest.raises(ValueError, match="outside 0..gamma_max=3"):
        Engine(target, draft, gamma=Greedy(3)).run([Request(prompts[0], 8)])


def test_rows_are_grouped_by_length_optimally():
    """by_length: every row in exactly one group, each group's width its longest row, and the total (slots read +
    cost per group) the least over every split of the sorted rows into runs (brute force, 9 rows)."""
    import itertools
    import random

    from minispec.engine.attention import by_length

    rng = random.Random(0)
    for _ in range(40):
        S = [rng.choice([5, 40, 41, 300, 600, rng.randint(1, 700)]) for _ in range(rng.randint(1, 9))]
        cost = rng.choice([0, 64, 256, 10**9])
        groups = by_length(S, cost)
        assert sorted(r for rows, _ in groups for r in rows) == list(range(len(S)))
        assert all(width == max(S[r] for r in rows) for rows, width in groups)
        total = sum(cost + len(rows) * width for rows, width in groups)
        s = sorted(S, reverse=True)
        best = min(sum(cost + (b - a) * s[a] for a, b in zip((0,) + cuts, cuts + (len(s),)))
                   for n in range(len(s)) for cuts in itertools.combinations(range(1, len(s)), n))
        assert total == best, (S, cost, groups)
    assert len(by_length([600, 64, 64, 64], 10**9)) == 1 and len(by_length([600, 64, 64, 64], 0)) == 2


@pytest.mark.parametrize("draft_kind", ["none", "model", "tree"])
def test_rows_split_by_length_give_the_tokens_and_logits_of_one_group(pair, draft_kind, monkeypatch):
    """Decoding rows of 20 to 300 tokens: attended as one group padded to the longest, or as groups of similar
    length (every distinct length apart at cost 0): the same tokens and acceptance, logits within float tolerance,
    and the split really ran (more groups than steps)."""
    from minispec.engine import attention

    target, draft, _ = pair
    text = sample_text("code")
    prompts = [list(text[400 * i: 400 * i + n]) for i, n in enumerate((20, 300, 35, 180, 60, 240))]
    d = {"none": None, "model": draft, "tree": minispec.TreeDraft(draft, budget=6, depth=3)}[draft_kind]
    seen, split = [], attention.by_length
    monkeypatch.setattr("minispec.engine.runner.by_length", lambda S, cost: seen.append(split(S, cost)) or seen[-1])
    runs = {}
    for cost in (10**15, 0):
        monkeypatch.setattr(attention, "GROUP_BYTES", cost)
        seen.clear()
        engine = Engine(target, d, gamma=3, attention="gather")  # the copying paths group (sparse reads no padding)
        with Passes(target) as passes:
            outs = engine.run(alternating(prompts, 16))
        runs[cost] = outs, engine.stats, passes.logits, [len(g) for g in seen]
    (one, one_stats, one_logits, one_groups), (many, many_stats, many_logits, many_groups) = runs[10**15], runs[0]
    assert set(one_groups) == {1} and max(many_groups) >= 3  # a tree drafts greedy and sampled rows apart
    assert [o.tokens for o in many] == [o.tokens for o in one]
    assert many_stats.accepted_per_position == one_stats.accepted_per_position
    for a, b in zip(one_logits, many_logits):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


def test_a_tree_over_greedy_and_sampled_rows_reads_each_groups_own_pattern(pair):
    """A static tree over greedy and sampled rows drafts them as two groups, verified in one pass: read ``sparse``,
    each group is a slice of the pass with a pattern of its own (one shared would attend one group's queries over the
    other's slots); the tokens, acceptance and logits are the gather's."""
    target, draft, prompts = pair
    tree = minispec.TreeDraft(draft, branching=(2, 2, 1))
    runs = {}
    for attention in ("gather", "sparse"):
        engine = Engine(target, tree, gamma=3, attention=attention)
        with Passes(target) as passes:
            outs = engine.run(alternating(prompts[:4], 12))
        runs[attention] = [o.tokens for o in outs], engine.stats.accepted_per_position, passes.logits
    assert runs["sparse"][:2] == runs["gather"][:2] and sum(runs["gather"][1])
    for a, b in zip(runs["gather"][2], runs["sparse"][2]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


def test_one_greedy_row_among_sampled_rows_gets_its_own_top_k_tree(pair):
    """A tree over one greedy row and sampled rows: the greedy row is still drafted as a group of its own, its children
    the draft's top-k (drafted with the sampled rows it would get i.i.d. children from a one-hot q: the same tokens,
    fewer accepted), so it accepts at each step what it accepts alone."""
    target, draft, prompts = pair
    tree = minispec.TreeDraft(draft, branching=(2, 2, 1))  # a static tree: a sampled row's children are drawn
    alone = Engine(target, tree, gamma=3).run([Request(prompts[0], 16)])[0]
    mixed_batch = [Request(prompts[0], 16)] + [Request(p, 16, temperature=0.9, seed=i) for i, p in
                                               enumerate(prompts[1:3], 1)]
    ours = Engine(target, tree, gamma=3).run(mixed_batch)[0]
    assert ours.tokens == alone.tokens and sum(alone.accepted) >= 8
    assert ours.accepted == alone.accepted


@pytest.mark.parametrize("shape, groups", [(dict(budget=6, depth=3), 1), (dict(branching=(2, 2, 1)), 2)])
def test_only_a_static_tree_drafts_greedy_and_sampled_rows_apart(pair, shape, groups):
    """A dynamic tree takes every row's top-k, sampled or not, so greedy and sampled rows draft as one group (two
    would run the draft twice at every depth); a static tree draws a sampled row's children from q: two groups."""
    target, draft, prompts = pair
    engine = Engine(target, minispec.TreeDraft(draft, **shape), gamma=3)
    split, seen = engine.runner._decoding, []
    engine.runner._decoding = lambda plan: seen.append(split(plan)) or seen[-1]
    engine.run(alternating(prompts[:4], 8))
    mixed_steps = [len(decs) for decs in seen if len({r.params.greedy for d in decs for r in d.rows}) == 2]
    assert mixed_steps and set(mixed_steps) == {groups}


@pytest.mark.parametrize("attention", ["gather", "flex", "views", "sparse"])
def test_a_sliding_window_layer_reads_only_its_window(attention):
    """A random Llama whose first layer attends to its last 4 tokens only, the second to all of them, prompts of 9-30
    tokens (longer than the window; the first chunks of the longer ones cut by a 16-token budget), decoding with a
    draft and without one (its last steps a lone row's): the engine's tokens are plain greedy decoding's, which reads
    the window (a read that ignored it changed them)."""
    target = random_model(seed=5, logit_scale=4.0, sliding_window=(4, None))
    draft = random_model(seed=5, logit_scale=4.0, sliding_window=(4, None), layers=1)
    prompts = [[(7 * i + 3 * j) % 64 for j in range(9 + 7 * i)] for i in range(4)]
    for d in (draft, None):
        engine = Engine(target, d, gamma=3, block_size=4, num_blocks=96, max_num_batched_tokens=16,
                        attention=attention)
        outs = engine.run([Request(p, 16 + 8 * i) for i, p in enumerate(prompts)])
        assert [o.tokens for o in outs] == [minispec.generate(target, [p], 16 + 8 * i).tokens[0]
                                            for i, p in enumerate(prompts)]


@pytest.mark.parametrize("T, window, K", [(1, None, 2), (1, 5, 2), (2, None, 2), (3, None, 2), (3, 5, 2),
                                          (2, None, 1), (3, 5, 3)])
def test_views_read_one_run_rows_in_place_and_copy_the_others_as_the_gather_does(T, window, K, monkeypatch):
    """Three rows of 11, 7 and 5 slots before the step's T queries, row 0's blocks one run of the pool (3, 4, 5),
    rows 1 and 2 scattered (9, 1 and 11, 0): ``views`` reads row 0 as a view of the pool (no copy) and copies rows 1
    and 2 together (one copy of keys and one of values), and gives the gather's output: decode, chains of 2 and 3
    causal queries, with and without a window of 5; 6 query heads over K = 1, 2 or 3 KV heads
    (MQA and GQA groups of 3 and 2: SmolLM2 has 9 over 3)."""
    from minispec.engine.attention import span
    from minispec.model.llama import attention_masks

    bs, H, D = 4, 6, 8
    pool = PagedPool(1, num_blocks=12, block_size=bs, kv_heads=K, head_dim=D)
    torch.manual_seed(0)
    pool.k.normal_(), pool.v.normal_()
    lists = [[3, 4, 5, 6], [9, 1, 7], [11, 0, 8]]
    tables = torch.tensor([lists[0], lists[1] + [12], lists[2] + [12]])  # (R, nb) the scratch block 12 pads rows 1, 2
    lengths = torch.tensor([11, 7, 5])
    new = lengths[:, None] + torch.arange(T)  # (R, T) the queries' logical slots
    _, masks = attention_masks(new, int(new.max()) + 1, None, (window,))
    spans = tuple(span(t, int(n) + T, bs) for t, n in zip(lists, lengths))
    assert spans == ((12, 11 + T), None, None)  # row 0 starts at slot 3 * 4; rows 1 and 2 are not one run
    assert span([2, 3], 7, bs) == (8, 7) and span([2, 3], 12, bs) == (8, 8)  # past the table: left out
    g = group(torch.arange(3 * T).view(3, T), torch.ones(3, T, dtype=torch.bool), tables, masks, bs, spans=spans)
    q = torch.randn(3, H, T, D)  # (R, H, T, D)
    steps = {a: PagedStep(pool, new.flatten()[None], new.flatten(), [g], a) for a in ("gather", "views")}
    copies = []
    monkeypatch.setattr(torch.Tensor, "index_select", lambda self, dim, index, _f=torch.Tensor.index_select: (
        copies.append(len(index)), _f(self, dim, index))[1])
    got = steps["views"]._views(0, q, g, window, 0)
    nb = g.blocks.shape[1]
    assert copies == [2 * nb, 2 * nb]  # rows 1 and 2's blocks, keys then values, in one copy each; row 0 in place
    monkeypatch.undo()
    torch.testing.assert_close(got, steps["gather"]._gather(0, q, g, window, 0), rtol=1e-5, atol=1e-6)


def test_auto_reads_a_lone_one_run_row_in_place_and_copies_a_group_of_rows():
    """The default path: a group of one row whose blocks are one run of the pool (3, 4, 5) is read as a view of it,
    with no copy; a lone scattered row is copied as the gather copies it; a group of two rows (one of them scattered)
    is copied; every output is the gather's (two causal queries, 6 heads over 2 KV heads)."""
    from minispec.engine.attention import span
    from minispec.model.llama import attention_masks

    bs, H, K, D, T = 4, 6, 2, 8, 2
    pool = PagedPool(1, num_blocks=12, block_size=bs, kv_heads=K, head_dim=D)
    torch.manual_seed(1)
    pool.k.normal_(), pool.v.normal_()
    lists, lengths = [[3, 4, 5, 6], [9, 1, 7]], torch.tensor([11, 7])
    tables = torch.tensor([lists[0], lists[1] + [12]])  # (R, nb) the scratch block 12 pads row 1
    spans = tuple(span(t, int(n) + T, bs) for t, n in zip(lists, lengths))
    assert spans == ((12, 11 + T), None)
    q = torch.randn(2, H, T, D)  # (R, H, T, D)
    copies = []
    select = torch.Tensor.index_select
    for rows, want in (([0], 0), ([1], 2), ([0, 1], 2)):  # copies (index_select calls) each group should make
        i = torch.tensor(rows)
        new = lengths[i, None] + torch.arange(T)  # (R, T)
        _, masks = attention_masks(new, int(new.max()) + 1, None, (None,))
        g = group(torch.arange(len(rows) * T).view(-1, T), torch.ones(len(rows), T, dtype=torch.bool), tables[i],
                  masks, bs, spans=tuple(spans[r] for r in rows))
        steps = {a: PagedStep(pool, new.flatten()[None], new.flatten(), [g], a) for a in ("gather", "auto")}
        assert not steps["auto"].sparse(g)  # two queries a row: read as below (sparse: a plain step's rows)
        copies.clear()
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(torch.Tensor, "index_select", lambda self, *a: (copies.append(self.shape), select(self, *a))[1])
            got = steps["auto"].read(0, q[i], g, None, 0)
        assert len(copies) == want, (rows, copies)
        torch.testing.assert_close(got, steps["gather"]._gather(0, q[i], g, None, 0), rtol=1e-5, atol=1e-6)


def test_auto_reads_a_plain_steps_rows_sparse_on_a_cpu_float32_pool_only():
    """Where ``auto`` reads a group sparse: several rows of which one has a single query (a plain step; a speculative
    step with a row that feeds no draft token), on this CPU, in a float32 pool; not a lone row, not rows that all
    feed draft tokens, not a bf16 pool (torch's CPU SDDMM takes no other dtype). ``sparse`` reads every group so."""
    from minispec.engine.attention import reads_sparse

    bs, S = 4, 8
    tables = torch.tensor([[3, 4], [9, 1]])  # (R, nb)
    pools = {dt: PagedPool(1, num_blocks=12, block_size=bs, kv_heads=1, head_dim=8, dtype=dt)
             for dt in (torch.float32, torch.bfloat16)}
    for R, T, fewest, dtype, attention, want in [
            (2, 1, 1, torch.float32, "auto", True), (1, 1, 1, torch.float32, "auto", False),
            (2, 2, 2, torch.float32, "auto", False), (2, 2, 1, torch.float32, "auto", True),
            (2, 1, 1, torch.bfloat16, "auto", False), (2, 1, 1, torch.float32, "gather", False),
            (1, 2, 2, torch.float32, "sparse", True)]:
        masks = {None: torch.ones(R, 1, T, S, dtype=torch.bool)}
        valid = torch.arange(T) < torch.tensor([T, fewest][:R])[:, None]  # (R, T) row 1 has ``fewest`` real queries
        g = group(torch.arange(R * T).view(R, T), valid, tables[:R], masks, bs, fewest=fewest)
        step = PagedStep(pools[dtype], torch.zeros(1, R * T, dtype=torch.long), torch.zeros(R * T, dtype=torch.long),
                         [g], attention)
        assert step.sparse(g) == want, (R, T, fewest, dtype, attention)
        assert reads_sparse(attention, pools[dtype], fewest) == (want or R == 1 and attention == "auto"
                                                                 and fewest == 1 and dtype == torch.float32)


@pytest.mark.parametrize("T, window, K", [(1, None, 3), (2, None, 1), (3, None, 2), (3, 5, 2)])
def test_sparse_reads_each_real_querys_own_slots_in_place_and_gives_the_gathers_output(T, window, K, monkeypatch):
    """Three rows of 11, 7 and 2 slots before the step's queries, blocks scattered over the pool, row 1 feeding one
    query fewer than the others (its last is padding): ``sparse`` copies nothing out of the pool (no index_select of
    it), its pattern holds, for every real query and each of its query heads, exactly the physical slots the query sees
    (its row's, causal, inside the window) and no other, and attend gives the gather's output; decode and chains of
    2 and 3, 6 query heads over 1, 2 or 3 KV heads."""
    from minispec.model.llama import attention_masks

    bs, H, D = 4, 6, 8
    pool = PagedPool(1, num_blocks=12, block_size=bs, kv_heads=K, head_dim=D)
    torch.manual_seed(2)
    pool.k.normal_(), pool.v.normal_()
    tables = torch.tensor([[3, 4, 5, 6], [9, 1, 7, 12], [2, 10, 12, 12]])  # (R, nb) 12: the scratch block
    lengths = torch.tensor([11, 7, 2])
    j = torch.arange(T)
    counts = torch.tensor([T, max(T - 1, 1), T])  # (R,) real queries a row
    valid = j < counts[:, None]  # (R, T)
    query = (counts.cumsum(0) - counts)[:, None] + torch.minimum(j, counts[:, None] - 1)  # (R, T) padding repeats
    new = lengths[:, None] + j  # (R, T) logical slots
    _, masks = attention_masks(new, int(new.max()) + 1, None, (window,))
    g = group(query, valid, tables, masks, bs)
    physical = tables.gather(1, new // bs) * bs + new % bs  # (R, T)
    N = int(counts.sum())
    q, k, v = torch.randn(1, H, N, D), torch.randn(1, K, N, D), torch.randn(1, K, N, D)
    out = {}
    for a in ("gather", "sparse"):
        p = PagedPool(1, num_blocks=12, block_size=bs, kv_heads=K, head_dim=D)
        p.k.copy_(pool.k), p.v.copy_(pool.v)
        step = PagedStep(p, new[valid][None], physical[valid], [g], a)
        copies, pooled = [], {t.untyped_storage().data_ptr() for t in (p.k, p.v)}  # reads out of the pool's storage
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(torch.Tensor, "index_select", lambda self, *a, _f=torch.Tensor.index_select, _c=copies,
                       _p=pooled: (self.untyped_storage().data_ptr() in _p and _c.append(self.shape), _f(self, *a))[1])
            out[a] = step.attend(0, q, k, v, window)[0]  # (H, N, D)
        assert (len(copies) == 0) == (a == "sparse"), (a, copies)
    torch.testing.assert_close(out["sparse"], out["gather"], rtol=1e-5, atol=1e-6)

    def sparse(scale):  # sparse's output for the queries times ``scale``, and whether it took each query's largest out
        scatters = []  # (a scatter finds each query's largest score)
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(torch.Tensor, "scatter_reduce_", lambda self, *a, _f=torch.Tensor.scatter_reduce_, _c=scatters:
                       _c.append(1) or _f(self, *a))
            y = PagedStep(pool, new[valid][None], physical[valid], [g], "sparse").attend(0, scale * q, k, v, window)
        return y[0], bool(scatters)

    y, own = sparse(1)
    assert not own  # each KV head's largest score taken out: no query's scores underflow
    torch.testing.assert_close(y, out["gather"], rtol=1e-5, atol=1e-6)
    big, own = sparse(300)  # scores in the hundreds: exp overflows unless a max is taken out, and some queries' scores
    assert own  # lie hundreds below their head's largest, so that each query's own largest is taken out
    gather = PagedStep(pool, new[valid][None], physical[valid], [g], "gather").attend(0, 300 * q, k, v, window)[0]
    torch.testing.assert_close(big, gather, rtol=1e-3, atol=1e-3)  # not NaN, not inf
    built = []  # the pattern is built once a step: a second layer finds it (nonzero is where it is built)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(torch.Tensor, "nonzero", lambda self, *a, _f=torch.Tensor.nonzero: built.append(1) or _f(self, *a))
        step.attend(0, q, k, v, window)
    assert not built
    crow, _, w = step._pattern(g, window, 0, H // K)
    col = w.col_indices()
    P = pool.k.shape[2]
    rows = [col[a:b].tolist() for a, b in zip(crow[:-1].tolist(), crow[1:].tolist())]  # each CSR row's columns
    want = []
    for h in range(K):
        for r, t in valid.nonzero().tolist():  # each real query, in the pass's order
            seen = masks[window][r, 0, t].nonzero()[:, 0]  # (n,) logical slots it sees
            slots = (tables[r, seen // bs] * bs + seen % bs).tolist()
            want += [[h * P + s for s in slots]] * (H // K)  # once per query head of KV head h
    assert rows == want


def test_the_flex_block_mask_visits_each_rows_own_blocks_and_no_other():
    """What a compiled FlexAttention kernel relies on (the eager one reads every slot and lets the mask_mod decide):
    the block mask of a group visits, for each row, exactly the blocks of its table, in units of the pool's blocks;
    not the scratch block that pads the tables, and not a block of another row. Row 0 holds the pool's last real
    block, whose number sits next to the scratch block's."""
    pool = PagedPool(1, num_blocks=12, block_size=4, kv_heads=1, head_dim=8)
    scratch = 12
    tables = torch.tensor([[11, 3, scratch, scratch], [0, 5, 7, scratch]])  # (R, nb)
    lengths = torch.tensor([7, 10])  # slots each row reads: 2 and 3 blocks
    S = int(lengths.max())
    masks = {None: (torch.arange(S) < lengths[:, None])[:, None, None, :]}  # (R, 1, T=1, S)
    g = group(torch.tensor([[0], [1]]), torch.ones(2, 1, dtype=torch.bool), tables, masks, pool.block_size)
    bm = _block_mask(g, masks[None], pool)
    assert bm.BLOCK_SIZE == (1, pool.block_size)
    visited = bm.to_dense()[:, 0, 0]  # (R, pool blocks) 1 where the kernel reads the row's block
    assert visited.shape == (2, scratch + 1)
    assert [set(v.nonzero()[:, 0].tolist()) for v in visited] == [{11, 3}, {0, 5, 7}]


def test_a_group_whose_masks_read_past_its_tables_is_refused():
    """The gather copies whole blocks, nb = S / block size (rounded up) a row, from the group's tables: masks over
    more slots than the tables hold would read blocks no row owns, so group() refuses them, naming both counts."""
    tables = torch.tensor([[3, 4, 12], [9, 1, 12]])  # (R, nb) 3 blocks of 4 slots
    for S, ok in ((12, True), (13, False)):
        masks = {None: torch.ones(2, 1, 1, S, dtype=torch.bool)}  # (R, 1, T, S)
        if ok:
            assert group(torch.tensor([[0], [1]]), torch.ones(2, 1, dtype=torch.bool), tables, masks, 4).blocks.equal(
                tables)
        else:
            with pytest.raises(ValueError, match="read 4 blocks a row but the tables hold 3"):
                group(torch.tensor([[0], [1]]), torch.ones(2, 1, dtype=torch.bool), tables, masks, 4)


def test_flex_is_compiled_where_asked_and_by_default_on_a_gpu_only(monkeypatch):
    """``compiled`` picks the FlexAttention kernel: True asks for the compiled one even on a CPU (what
    scripts/engine_attention.py measures), False and the default for the eager one on a CPU (a GPU's default is the
    compiled one). The kernel is stood in for by the eager one, so nothing compiles here."""
    import minispec.engine.attention as attention

    pool = PagedPool(1, num_blocks=12, block_size=4, kv_heads=1, head_dim=8)
    tables = torch.tensor([[11, 3, 12], [0, 5, 7]])  # (R, nb) the scratch block 12 pads row 0
    masks = {None: (torch.arange(10) < torch.tensor([7, 10])[:, None])[:, None, None, :]}  # (R, 1, T=1, S)
    g = group(torch.tensor([[0], [1]]), torch.ones(2, 1, dtype=torch.bool), tables, masks, pool.block_size)
    asked, eager = [], attention.flex_function.__wrapped__(False)
    monkeypatch.setattr(attention, "flex_function", lambda compiled: (asked.append(compiled), eager)[1])
    for compiled in (True, False, None):
        step = PagedStep(pool, torch.zeros(1, 2, dtype=torch.long), torch.tensor([6, 9]), [g], "flex", compiled)
        step._flex(0, torch.randn(2, 1, 1, 8), g, None, 0)
    assert asked == [True, False, False]
