"""The engine's parts by hand: blocks and lookahead slots, attention through block tables, the scheduler's budget."""

import types

import pytest
import torch
from support import nudged_pair, random_model

import minispec
import minispec.engine.engine as engine_module
from minispec.decoding.plain import DecodeState
from minispec.decoding.sampling import Sampler, SamplingParams
from minispec.drafts.model import ModelDraft
from minispec.engine import Engine, Request
from minispec.engine.blocks import BlockManager
from minispec.engine.drafting import PagedModelDraft
from minispec.engine.paged import PagedPool
from minispec.engine.request import Sequence
from minispec.engine.runner import StepResult
from minispec.engine.scheduler import Scheduler, StepPlan
from minispec.roofline.policy import FixedPolicy

# --- blocks ---------------------------------------------------------------------------------------


def test_blocks_grow_on_demand_and_rejected_lookahead_blocks_come_back():
    blocks, seq = BlockManager(num_blocks=6, block_size=4), Sequence(5, 10)
    blocks.grow(seq, 5)  # a 5-token prompt: 2 blocks
    assert len(seq.block_table) == 2 and blocks.num_free == 4
    assert blocks.can_grow(seq, 24) and not blocks.can_grow(seq, 25)  # 6 blocks of 4 slots in all
    blocks.grow(seq, 5 + 1 + 10)  # the last token and 10 lookahead slots: 16 slots, 4 blocks
    assert len(seq.block_table) == 4 and blocks.num_free == 2
    blocks.shrink(seq, 7)  # 2 of the 10 were accepted: the KV holds 7 slots, 2 blocks
    assert len(seq.block_table) == 2 and blocks.num_free == 4 and len(set(seq.block_table)) == 2
    blocks.release(seq)
    assert seq.block_table == [] and blocks.free == list(range(6)) and blocks.num_free == 6


def test_rows_grow_into_their_next_block_and_new_rows_start_in_the_middle_of_the_longest_free_run():
    """Where blocks come from (the count is all the scheduler sees; the place decides whether a row is one run of the
    pool, which ``views`` attention reads in place): a row takes the block after its last when it is free, else the
    middle of the longest free run; a new row too, unless that run starts the pool."""
    blocks = BlockManager(num_blocks=32, block_size=4)
    a, b, c = Sequence(0, 10), Sequence(1, 10), Sequence(2, 10)
    blocks.grow(a, 8)
    blocks.grow(b, 8)
    assert a.block_table == [0, 1] and b.block_table == [17, 18]  # a: the run [0, 32) starts the pool; b: [2, 32)
    blocks.grow(a, 16)
    blocks.grow(b, 16)
    assert a.block_table == [0, 1, 2, 3] and b.block_table == [17, 18, 19, 20]  # each into its next block
    blocks.grow(c, 12)
    assert c.block_table == [10, 11, 12]  # the middle of [4, 17), 13 blocks against [21, 32)'s 11
    blocks.release(a)
    blocks.grow(a, 4)
    assert a.block_table == [26]  # [21, 32) is now the longest (11 against [0, 10)'s 10)
    blocks.grow(c, 28)
    assert c.block_table == [10, 11, 12, 13, 14, 15, 16]
    blocks.grow(c, 32)  # 17 is b's: the middle of the longest free run, [0, 10), although it starts the pool
    assert c.block_table[-1] == 5 and blocks.num_free == 32 - 13
    for s in (a, b, c):
        blocks.release(s)
    assert blocks.free == list(range(32))


# --- attention through block tables -----------------------------------------------------------------


def test_a_paged_cache_gives_the_static_caches_logits_and_compacts_like_it():
    """The same three forward passes (a prompt, then a verify pass of 4, then 1) through a contiguous KVCache and
    through a PagedCache whose blocks are scattered over the pool give the same logits, exactly."""
    model = random_model(seed=3)
    B, bs = 2, 4
    pool = PagedPool(2, 16, bs, 2, 16)
    tables = torch.tensor([[9, 2, 14, 5, 16], [0, 11, 7, 3, 16]])  # (B, nb) block 16 is the scratch block
    paged, static = pool.view(tables, torch.zeros(B, dtype=torch.long)), model.new_cache(B, 20)
    prompt = torch.tensor([[1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 11, 12]])
    for x in (prompt, torch.tensor([[5, 6, 7, 8], [1, 2, 3, 4]]), torch.tensor([[9], [9]])):
        assert torch.equal(model(x, paged), model(x, static))
    assert torch.equal(paged.lengths, static.lengths)
    base, src = torch.tensor([6, 6]), torch.tensor([[2, 4], [1, -1]])  # a tree's accepted path, per row
    paged.compact(base, src)
    static.compact(base, src)
    x = torch.tensor([[3], [4]])
    paged.rollback(torch.tensor([9, 8]))
    static.rollback(torch.tensor([9, 8]))
    paged.trim(9)
    static.trim(9)
    assert torch.equal(model(x, paged), model(x, static))
    unused = [1, 4, 6, 8, 10, 12, 13, 15]  # in no table: nothing may have been written there
    blocks = pool.k.view(2, 2, 17, bs, 16)  # (L, K, blocks, bs, D)
    assert blocks[:, :, unused].abs().sum() == 0 < blocks[:, :, 9].abs().sum()


# --- the scheduler --------------------------------------------------------------------------------


def counted(prompt_len, max_new=10):
    """A sequence of counts only (the simulator's kind): the scheduler reads no token."""
    s = Sequence(prompt_len, max_new, num_tokens=prompt_len)
    return s


def test_the_scheduler_by_hand():
    """8 blocks of 4 slots, 20 tokens a step, 3 rows at most, gamma 3.

    Step 1: A (6), B (9), C (5) are prefilled whole (20 tokens, 2 + 3 + 2 blocks); D waits for a row.
    Step 2: each decoding row costs 1 + 3 = 4 tokens and its last token plus 3 lookahead slots. A (6 + 4 = 10 slots)
    takes the last free block; B (9 + 4 = 13) needs one more: C, the youngest, is preempted (its 2 blocks freed),
    and B gets one. Nothing is admitted in a step that preempted. A's draft is rejected (it gains 1: 7 KV slots,
    2 blocks, one handed back); B's is accepted whole (it gains 4: 13 slots, 4 blocks).
    Step 3: A (7 + 4 slots) and B (13 + 4) each take one more block; C (5 slots, 2 blocks) waits. B finishes.
    Step 4: C comes back first, recomputing all its tokens but the last (5 slots; its first token is kept, not
    drawn again), and D joins."""
    blocks = BlockManager(8, 4)
    sched = Scheduler(blocks, max_num_seqs=3, max_num_batched_tokens=20, policy=FixedPolicy(3))
    a, b, c, d = counted(6), counted(9, max_new=9), counted(5), counted(4)
    for s in (a, b, c, d):
        sched.add(s)
    plan = sched.schedule()
    assert [(s, n) for s, n in plan.prefill] == [(a, 6), (b, 9), (c, 5)] and plan.tokens == 20 and not plan.decode
    assert [len(s.block_table) for s in (a, b, c)] == [2, 3, 2] and list(sched.waiting) == [d]
    sched.update(plan, {s: ([0], [False]) for s in (a, b, c)}, 1.0)  # the first tokens
    plan = sched.schedule()
    assert (plan.decode, plan.gamma, plan.width, plan.preempted, plan.tokens) == ([a, b], 3, 3, [c], 8)
    assert [len(s.block_table) for s in (a, b, c)] == [3, 4, 0] and list(sched.waiting) == [c, d]
    sched.update(plan, {a: ([0], [False]), b: ([0] * 4, [True] * 3 + [False])}, 2.0)
    assert (a.num_computed, len(a.block_table), b.num_computed, len(b.block_table)) == (7, 2, 13, 4)
    assert blocks.num_free == 2 and c.preemptions == 1 and c.num_tokens == 6 and c.prefill_end == 5
    plan = sched.schedule()
    assert (plan.decode, plan.prefill, plan.preempted, blocks.num_free) == ([a, b], [], [], 0)
    assert sched.update(plan, {a: ([0], [False]), b: ([0] * 4, [True] * 4)}, 3.0) == [b]  # B: its 9 tokens
    assert blocks.num_free == 6 and b.finish_reason == "length" and b.block_table == []  # B its 5, A 1 of 3
    plan = sched.schedule()
    assert plan.prefill == [(c, 5), (d, 4)] and plan.decode == [a] and sched.preemptions == 1
    sched.update(plan, {a: ([0], [False]), d: ([0], [False])}, 4.0)
    assert (c.num_computed, c.num_tokens, c.prefilling, d.num_tokens) == (5, 6, False, 5)


def test_out_of_blocks_the_youngest_running_row_is_preempted_first():
    """4 blocks of 4 slots, four 4-token prompts: one block each, none free. Each decoding row then needs a second
    block: A's comes from D, the youngest, and B's from C, the youngest left (vLLM V1 preempts the last running
    request). Preempting any other row keeps every token exact, so only the choice itself shows it."""
    sched = Scheduler(BlockManager(4, 4), 4, 16)
    a, b, c, d = (counted(4) for _ in range(4))
    for s in (a, b, c, d):
        sched.add(s)
    sched.update(sched.schedule(), {s: ([0], [False]) for s in (a, b, c, d)}, 1.0)
    plan = sched.schedule()
    assert (plan.decode, plan.preempted, list(sched.waiting)) == ([a, b], [d, c], [c, d])
    assert sched.running == [a, b] and sched.preemptions == 2


def test_the_last_token_of_the_budget_still_runs_a_row():
    """Two decoding rows, gamma 4, 6 tokens a step: A takes 1 + 4, B the one token left (its chain cut to nothing,
    a plain step for it: vLLM's rule)."""
    sched = Scheduler(BlockManager(16, 4), 4, 6, FixedPolicy(4))
    a, b = counted(3), counted(2)
    for s in (a, b):
        sched.add(s)
    plan = sched.schedule()
    sched.update(plan, {a: ([0], [False]), b: ([0], [False])}, 1.0)
    plan = sched.schedule()
    assert (plan.decode, plan.k, plan.tokens) == ([a, b], [4, 0], 6)


def test_a_tree_row_that_does_not_fit_waits_and_later_rows_still_run():
    """A tree of 5 nodes (1 + 5 tokens a row), 9 tokens a step. Step 1: A (3) and B (2) are prefilled, C (6) gets
    the 4 left. Step 2: A takes 6; B's 6 do not fit the 3 left, so B waits a step; C's last 2 prompt tokens run."""
    sched = Scheduler(BlockManager(16, 4), 4, 9, FixedPolicy(4), lambda g: g + 1)
    a, b, c = counted(3), counted(2), counted(6)
    for s in (a, b, c):
        sched.add(s)
    plan = sched.schedule()
    assert plan.prefill == [(a, 3), (b, 2), (c, 4)]
    sched.update(plan, {a: ([0], [False]), b: ([0], [False])}, 1.0)
    plan = sched.schedule()
    assert (plan.decode, plan.k, plan.prefill, plan.tokens) == ([a], [5], [(c, 2)], 8)


def test_a_waiting_prompt_takes_the_last_token_of_the_budget():
    """4 tokens a step: A's 3-token prompt, then one token of B's 5 (chunked prefill starts on what is left)."""
    sched = Scheduler(BlockManager(16, 4), 4, 4)
    a, b = counted(3), counted(5)
    for s in (a, b):
        sched.add(s)
    assert sched.schedule().prefill == [(a, 3), (b, 1)]


def test_the_policy_is_told_the_decoding_rows_and_their_mean_context():
    """gamma is chosen from the rows decoding and their mean KV length (what the roofline policy plans with)."""
    class Spy(FixedPolicy):
        def choose(self, batch_size, context=None):
            self.seen = (batch_size, context)
            return super().choose(batch_size, context)

    sched = Scheduler(BlockManager(16, 4), 4, 20, Spy(2))
    a, b = counted(3), counted(6)
    for s in (a, b):
        sched.add(s)
    sched.update(sched.schedule(), {a: ([0], [False]), b: ([0], [False])}, 1.0)
    plan = sched.schedule()
    assert sched.policy.seen == (2, (3 + 6) / 2)  # each row's KV: its prompt (the first token's is not yet written)
    sched.update(plan, {a: ([1, 2, 3], [True, True, False]), b: ([4], [False])}, 2.0)
    sched.schedule()
    assert sched.policy.seen == (2, (3 + 3 + 6 + 1) / 2)  # and, later, every token the row has but its last


def test_the_policy_is_told_every_steps_acceptance_and_each_run_starts_from_the_engines_policy():
    """After each speculative step the engine tells its policy the draft tokens accepted and tested (what an adaptive
    policy estimates alpha from), and each run starts from the policy as the engine was built with it, even one that
    carries its estimate between calls: the run's own copy learns. Neither changes a token, only what gamma a policy
    would choose next."""
    class Spy(FixedPolicy):
        starts, told = [], []

        def start(self):
            super().start()
            Spy.starts.append((self.accepted, self.tested))

        def observe(self, accepted, tested):
            Spy.told.append((accepted, tested))
            super().observe(accepted, tested)

    target, draft = nudged_pair()
    engine = Engine(target, draft, gamma=Spy(3, carry=True))
    reqs = [Request([1, 2, 3], 16), Request([4, 5, 6, 7], 12, arrival_s=0.01)]
    for _ in range(2):
        engine.run(reqs)
        s, told, Spy.told[:] = engine.stats, list(Spy.told), []
        assert len(told) == s.steps - s.batch_per_step.count(0) and 0 < s.accepted_tokens < s.tested_tokens
        assert (sum(a for a, _ in told), sum(t for _, t in told)) == (s.accepted_tokens, s.tested_tokens)
    assert Spy.starts == [(0.0, 0.0), (0.0, 0.0)]  # the second run did not start from the first one's evidence


def test_a_step_that_decodes_no_row_records_gamma_0():
    """A step whose decoding rows were all preempted keeps the gamma it chose in its plan, but drafted nothing: the
    stats record 0 for it (serve-bench's mean gamma weights the steps that decoded)."""
    stats = engine_module.EngineStats()
    a = counted(3)
    stats.record(StepPlan(gamma=4, width=4, prefill=[(a, 3)], preempted=[counted(5)]), StepResult(), 0.1)
    stats.record(StepPlan(decode=[a], k=[4], gamma=4, width=4), StepResult(), 0.1)
    assert stats.gamma_per_step == [0, 4] and stats.batch_per_step == [0, 1]


def test_a_prompt_longer_than_the_budget_is_prefilled_in_chunks_and_decodes_exactly():
    """max_num_batched_tokens 16: a 45-token prompt beside a 3-token one is prefilled over four steps (13, then 11
    a step beside the other row's 1 + 4), and every output still equals plain greedy decoding."""
    target, draft = random_model(seed=0), random_model(seed=1, layers=1, hidden=32, heads=2, kv_heads=1)
    prompts = [[1, 2, 3], [(7 * i) % 64 for i in range(45)]]
    engine = Engine(target, draft, gamma=4, max_num_batched_tokens=16)
    outs = engine.run([Request(prompts[0], 20), Request(prompts[1], 20)])  # both at t = 0, served in this order
    assert [o.tokens for o in outs] == minispec.generate(target, prompts, 20).tokens
    s = engine.stats
    assert max(s.tokens_per_step) == 16 and s.prefill_per_step[:5] == [2, 1, 1, 1, 0]
    assert s.tokens_per_step[:4] == [3 + 13, 5 + 11, 5 + 11, 5 + 10]


def test_requests_join_by_arrival_time_whatever_their_order_in_the_list():
    """Engine.run takes requests in any order and admits each when the clock passes its arrival_s: a later arrival
    listed first does not hold back an earlier one (whose first token would then wait for it). The clock skips the
    idle gap, so the 5 s cost nothing."""
    outs = Engine(random_model(seed=0)).run([Request([1, 2, 3], 4, arrival_s=5.0), Request([4, 5], 4)])
    assert outs[1].first_token_s < 5.0 <= outs[0].first_token_s and outs[1].ttft_s < 5.0


@pytest.mark.parametrize("name", ["model", "lookup"])
def test_every_block_comes_back_after_a_run(name):
    target, draft = random_model(seed=0), random_model(seed=1, layers=1, hidden=32, heads=2, kv_heads=1)
    drafter = draft if name == "model" else minispec.PromptLookupDraft()
    engine = Engine(target, drafter, gamma=3, block_size=4, num_blocks=20)
    outs = engine.run([Request([i + 1] * (3 + i), 12, temperature=1.0, seed=i) for i in range(8)])
    assert all(len(o.tokens) == 12 for o in outs) and engine.blocks.num_free == 20 and engine.stats.preemptions > 0


def test_a_draft_model_catches_up_rows_of_different_lags():
    """Rows whose drafts last read 2 and 5 tokens ago (a policy turned speculation off for one of them meanwhile)
    catch up in one pass at one width: each row's draft logits are the draft's over its whole sequence."""

    draft = random_model(seed=1, layers=1, hidden=32, heads=2, kv_heads=1)
    keeper = PagedModelDraft(ModelDraft(draft), draft, num_blocks=8, block_size=4)
    rows = [Sequence(3, 10, tokens=[5, 6, 7, 8, 9], num_tokens=5, block_table=[3, 1], lag=2),
            Sequence(2, 10, tokens=[1, 2, 3, 4, 5, 6, 7], num_tokens=7, block_table=[0, 6], lag=5)]
    seq = torch.zeros(2, 12, dtype=torch.long)  # (B, S) the rows' tokens, then room for a step's new ones
    for b, s in enumerate(rows):
        seq[b, : s.num_tokens] = torch.tensor(s.tokens)
    state = DecodeState.of_rows(seq, torch.tensor([5, 7]), torch.tensor([3, 2]), torch.tensor([10, 10]), 7)
    tables = torch.tensor([[3, 1, 8], [0, 6, 8]])
    read = torch.tensor([5 - 2, 7 - 5])  # what each row's draft KV already holds
    with torch.inference_mode():
        cache = keeper.pool.view(tables, torch.zeros(2, dtype=torch.long))
        draft(torch.tensor([[5, 6, 7, 0, 0], [1, 2, 0, 0, 0]]), cache)  # the rows' first tokens (and padding)
        run = keeper.run(state, Sampler(SamplingParams(), [0, 0], 2), rows, tables)
        run.cache.rollback(read)
        logits, _ = run.catch_up(state)  # (B, V)
        for b, s in enumerate(rows):
            assert torch.allclose(logits[b], draft(torch.tensor([s.tokens]))[0, -1], atol=1e-5)
        keeper.after(run, rows, speculative=False)
    assert [s.lag for s in rows] == [3, 6]


def test_the_default_kv_cache_holds_max_num_seqs_longest_sequences_of_target_and_draft(monkeypatch):
    """num_blocks left to the engine: room for max_num_seqs sequences of the longest length the model allows (its
    positions and a step's lookahead), with the draft model's KV per token counted beside the target's, within the
    byte budget, never below one such sequence; on a GPU the budget is 30 % of the device's free memory if more."""
    target, draft = random_model(seed=0), random_model(seed=1, layers=1)  # 256 positions each
    bs = 4

    def build():
        return Engine(target, draft, gamma=3, block_size=bs, max_num_seqs=2, prepack=False)

    e = build()
    one = -(-(target.config.max_position_embeddings + e.width) // bs)  # blocks of the longest sequence
    assert e.width == 3 and e.num_blocks == 2 * one  # the budget (1 GiB) does not bind
    per_token = 4 * (target.config.kv_elements_per_token + draft.config.kv_elements_per_token)  # float32 bytes
    monkeypatch.setattr(engine_module, "KV_BUDGET_BYTES", per_token * bs * (one + one // 2))
    assert build().num_blocks == one + one // 2
    monkeypatch.setattr(engine_module, "KV_BUDGET_BYTES", 1)
    assert build().num_blocks == one

    cuda = torch.device("cuda", 0)  # the GPU branch, with the device's free memory faked: no GPU here
    free, total = 10 * per_token * bs * one, 40 * per_token * bs * one

    def mem_get_info(device):
        assert device == cuda
        return free, total

    monkeypatch.setattr(torch.cuda, "mem_get_info", mem_get_info)
    fake = types.SimpleNamespace(target=types.SimpleNamespace(config=target.config, dtype=torch.float32, device=cuda),
                                 draft=e.draft, width=e.width, block_size=bs, max_num_seqs=100)
    assert Engine._default_blocks(fake) == int(engine_module.KV_FREE_FRACTION * free // (per_token * bs))  # 3 x one


def test_no_step_runs_more_rows_than_max_num_seqs(code_pair, monkeypatch):
    """Six requests at once and ``max_num_seqs=3``: no step's plan holds more than 3 rows (decoding or in prefill),
    and some holds 3; the others wait for a row to finish. Admitting past it keeps every token exact and runs rows the
    cache and the step's budget were not sized for."""
    target, small, prompts = code_pair
    engine = Engine(target, small, gamma=3, max_num_seqs=3)
    rows, execute = [], engine.runner.execute
    monkeypatch.setattr(engine.runner, "execute", lambda plan: (rows.append(len(plan.decode) + len(plan.prefill)),
                                                                execute(plan))[1])
    engine.run([Request(p, 8) for p in prompts])
    assert max(rows) == 3
