"""The engine counts what speculative_generate counts and does no more work than its steps need. Each wrong version
here keeps every token exact, so only counts catch it: a chain drafting past what a step can emit, the tested-token
counter run to the end of the draft, draft slots fed that nothing proposed, short rows padded to the longest, rows
without draft tokens padded to the drafts' queries, a prompt's first chunk read back from the pool
(scripts/hand_mutants.py applies each); and, from mutation testing, a cut draft's tail fed, a step's drafts not
summed, the target's own EOS counted as an accepted draft token; and a draft model's prompt read with its LM head at
every token, a step's mask built again in every layer, glibc left to unmap what each step frees, a draft's lag one
too large (a true token re-read every step)."""

import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import minispec
from minispec.engine import Engine, Request
from minispec.engine import runner as runner_module
from minispec.engine.attention import PagedStep, group_cost
from minispec.model.load import sample_text

COUNTERS = ("num_drafts", "draft_tokens", "accepted_tokens", "tested_tokens", "accepted_per_position")


@pytest.fixture
def passes(monkeypatch):
    """Every target pass the engine runs, its :class:`PagedStep`: its attention groups (``groups``), the slots of the
    tokens it reads (``slots``) and, once the runner sets it, how many of them are decoding rows' (``decoding``)."""
    log = []

    class Recorded(PagedStep):
        def __init__(self, *args, **kw):
            super().__init__(*args, **kw)
            log.append(self)

    monkeypatch.setattr(runner_module, "PagedStep", Recorded)
    return log


@pytest.mark.parametrize("max_new", [32, 3])  # 3: a step can emit at most 2 draft tokens, so gamma 4 drafts 2
@pytest.mark.parametrize("name", ["model", "lookup"])
def test_the_engines_counters_are_speculative_generates(code_pair, name, max_new):
    """Greedy, gamma 4, rows joining as others finish: drafts, draft tokens, accepted, tested (up to each row's first
    rejection) and accepted per position are those of speculative_generate over the same prompts, whose greedy rows
    are each as alone."""
    target, small, prompts = code_pair
    draft = small if name == "model" else minispec.PromptLookupDraft()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # gamma 4 is more than 3 new tokens can use: speculative_generate says so
        ref = minispec.speculative_generate(target, draft, prompts, gamma=4, max_new_tokens=max_new).stats
    engine = Engine(target, draft, gamma=4, max_num_seqs=3)
    engine.run([Request(p, max_new) for p in prompts])
    got = {k: getattr(engine.stats, k) for k in COUNTERS}
    assert got == {k: getattr(ref, k) for k in COUNTERS}
    assert got["tested_tokens"] < got["draft_tokens"] and got["accepted_tokens"] > 0  # rejections happened


def test_the_target_reads_only_the_tokens_a_step_verifies(code_pair, passes):
    """Prompt lookup proposes fewer than gamma tokens, or none, where its n-grams match less: a row feeds its last
    token and what it proposed, nothing more. Over the run the target reads every prompt once (no preemption), one
    token per decoding row and step, and each draft token proposed."""
    target, _, prompts = code_pair
    engine = Engine(target, minispec.PromptLookupDraft(), gamma=4, max_num_seqs=3)
    outs = engine.run([Request(p, 32) for p in prompts])
    s = engine.stats
    assert s.preemptions == 0 and s.draft_tokens < 4 * s.num_drafts  # some drafts were short
    assert sum(len(p.slots) for p in passes) == sum(map(len, prompts)) + sum(s.batch_per_step) + s.draft_tokens
    assert [o.tokens for o in outs] == minispec.generate(target, prompts, 32).tokens


def test_a_prompts_first_chunk_attends_to_itself_and_short_rows_are_not_padded_to_long_ones(code_pair, passes):
    """Two rows of about 30 tokens beside one of 460: the step attends them in groups of similar length, so the
    short rows read about their own slots, not the long row's (:func:`~minispec.engine.attention.by_length`; with
    this model one more group costs as much as reading group_cost slots, less than the padding it saves). A prompt
    that starts in this step attends causally to its own keys and reads nothing from the pool."""
    target, draft, _ = code_pair
    text = sample_text("code")
    prompts = [list(text[100: 130]), list(text[2000: 2460]), list(text[5000: 5025])]
    engine = Engine(target, draft, gamma=4, attention="gather")  # the copying paths' groups (sparse reads no padding)
    outs = engine.run([Request(p, 16) for p in prompts])
    assert [o.tokens for o in outs] == minispec.generate(target, prompts, 16).tokens
    assert all(g.fresh is not None for g in passes[0].groups)  # the first step: three whole prompts, nothing read
    assert 460 - 30 > group_cost(engine.runner.pool)  # padding a short row to the long one costs more than a group
    together = 0
    for groups in [p.groups for p in passes[1:]]:
        read = [g.masks[None].shape[::3] for g in groups if g.fresh is None]  # (R, S) each: R rows read S slots each
        # no slot read for nothing: each group's last slot is its longest row's last draft token's (all 4 are fed)
        assert all(g.masks[None][..., -1].any() for g in groups if g.fresh is None)
        if sum(R for R, _ in read) == 3:  # the three rows decode together
            together += 1
            longest = max(S for _, S in read)  # the long row's: its 460 tokens and the step's
            assert sum(R * S for R, S in read) <= longest + 2 * 64  # each short row reads at most 64 slots
    assert together >= 2


def test_a_plain_steps_rows_are_one_sparse_group_read_as_the_passs_tokens(code_pair, passes, monkeypatch):
    """The default path on this CPU, plain decoding, rows of 30 to 460 tokens: every step's decoding rows are one
    group (the sparse read pays for no padding, so splitting them by length would only add calls), whose real
    queries are the pass's first tokens in order (read as a slice, not gathered), read by the sparse path and by
    nothing else."""
    target, _, _ = code_pair
    text = sample_text("code")
    prompts = [list(text[100: 130]), list(text[2000: 2460]), list(text[5000: 5025]), list(text[7000: 7200])]
    reads = []
    attend, sparse, passed = PagedStep.attend, PagedStep._sparse, []
    monkeypatch.setattr(PagedStep, "attend", lambda self, *a: passed.append(a[1].untyped_storage()) or attend(self, *a))
    monkeypatch.setattr(PagedStep, "_sparse", lambda self, *a: reads.append(  # a: layer, q, group, window, i
        a[1].untyped_storage().data_ptr() == passed[-1].data_ptr()) or sparse(self, *a))
    outs = Engine(target).run([Request(p, 8) for p in prompts])
    assert [o.tokens for o in outs] == minispec.generate(target, prompts, 8).tokens
    decoding = [[g for g in p.groups if g.fresh is None] for p in passes[1:]]
    assert decoding and all(len(gs) == 1 for gs in decoding)  # one group a step
    for (g,) in decoding:
        assert g.tokens == slice(0, len(g.query)) and g.query.shape[1] == 1  # the pass's first tokens, in order
    assert len(reads) == target.config.num_hidden_layers * len(decoding)  # each layer, each step: the sparse read
    assert all(reads)  # of the pass's queries in place (a view of the layer's q), not gathered


@pytest.mark.parametrize("attention", ["auto", "gather"])
def test_rows_that_feed_no_draft_token_are_attended_with_one_query_not_padded_to_the_drafts(code_pair, passes,
                                                                                           attention):
    """Prompt lookup proposes nothing for a row without a match. That row's one query (its root) is never attended
    padded to the 1 + T queries of the rows that feed draft tokens. ``auto`` on this CPU (float32 pool): a step with
    such a row reads all its decoding rows as one group by the sparse path, which computes each row's real queries
    only (one here, five there: no padding, and one group's calls a layer instead of several). ``gather``: such rows are
    one group of one query a row, and every group of several queries a row has only rows with draft tokens of their
    own. Steps of both kinds of rows happen, and the tokens are the target's."""
    target, _, _ = code_pair
    text = sample_text("code")
    prompts = [list(text[i: i + n]) for i, n in ((100, 60), (2000, 300), (5000, 40), (7000, 200), (9000, 120))]
    engine = Engine(target, minispec.PromptLookupDraft(), gamma=4, attention=attention)
    outs = engine.run([Request(p, 24) for p in prompts])
    assert [o.tokens for o in outs] == minispec.generate(target, prompts, 24).tokens
    mixed = 0
    for step in passes:
        decoding = [g for g in step.groups if g.fresh is None and int(g.dest.max()) < step.decoding]  # not a chunk
        rows = [(g.keep // g.query.shape[1]).bincount(minlength=len(g.query)) for g in decoding]  # real queries a row
        one = [bool((r == 1).any()) for r in rows]  # the group has a row of one query (its root)
        if attention == "auto" and any(one):  # all the step's decoding rows, one group, read sparse
            assert len(decoding) == 1 and step.sparse(decoding[0]), "rows of one query not read sparse, as one group"
            mixed += bool((rows[0] > 1).any())
            continue
        for g, r in zip(decoding, rows):
            assert g.query.shape[1] == 1 or bool((r >= 2).all()), "a row without draft tokens padded to the drafts'"
        widths = [g.query.shape[1] for g in decoding]
        assert widths.count(1) <= 1  # the rows without draft tokens: one group
        mixed += 1 in widths and max(widths, default=1) > 1
    assert mixed >= 3


def test_a_greedy_plain_step_takes_the_argmax_without_building_a_distribution(code_pair, monkeypatch):
    """Greedy plain decoding: each step's token is the logits' argmax, taken once; the one-hot distribution (a
    (B, V) write, and a second argmax over it) is built only where a prompt completes and draws its first token."""
    target, _, prompts = code_pair
    built = []
    probabilities = runner_module.probabilities
    monkeypatch.setattr(runner_module, "probabilities", lambda *a: built.append(1) or probabilities(*a))
    engine = Engine(target)
    outs = engine.run([Request(p, 8) for p in prompts[:3]])
    assert [o.tokens for o in outs] == minispec.generate(target, prompts[:3], 8).tokens
    assert len(built) == sum(1 for p in engine.stats.prefill_per_step if p) < engine.stats.steps


@pytest.mark.parametrize("temperature", [0.0, 1.0])  # greedy q is one-hot; sampled q has every token
def test_each_pass_reads_the_tokens_its_plan_budgeted_where_drafts_are_cut_to_fit(code_pair, passes, temperature):
    """18 tokens a step and six rows of 1 + 4 on 8-token prompts: the scheduler cuts the fourth row's draft to
    what is left of the budget (vLLM's rule), and the target reads exactly the step's budgeted tokens, prompt
    chunks included: a cut draft's tail is neither fed nor verified (its q is zero there). Greedy and sampled: a
    sampled row's q has every token, so a tail divided by the mask instead of zeroed would read as proposed."""
    target, small, _ = code_pair
    text = sample_text("code")
    prompts = [list(text[400 * i: 400 * i + 8]) for i in range(6)]
    engine = Engine(target, small, gamma=4, max_num_batched_tokens=18)
    outs = engine.run([Request(p, 24, temperature, seed=i) for i, p in enumerate(prompts)])
    s = engine.stats
    assert [len(p.slots) for p in passes] == s.tokens_per_step and max(s.tokens_per_step) == 18
    assert s.draft_tokens < 4 * s.num_drafts  # some drafts were cut (the draft model always proposes 4)
    if not temperature:
        assert [o.tokens for o in outs] == minispec.generate(target, prompts, 24).tokens


def test_a_row_whose_draft_is_cut_reads_only_the_slots_it_feeds(code_pair, passes):
    """Block size 1, gamma 4: the short row A (16 new tokens) drafts 4, the long row B (3 new tokens, so at most 2
    drafted: no more than it can emit) is cut to 2. B has the step's most blocks and the step's last 2 draft slots
    lie past them: B reads its own tokens and the draft tokens it feeds, not the step's full draft width (whose
    slots it has no blocks for)."""
    target, small, _ = code_pair
    text = sample_text("code")
    prompts, max_new = [list(text[100: 108]), list(text[2000: 2040])], [16, 3]
    engine = Engine(target, small, gamma=4, block_size=1)
    outs = engine.run([Request(p, n) for p, n in zip(prompts, max_new)])
    assert [o.tokens for o in outs] == [minispec.generate(target, [p], n).tokens[0] for p, n in zip(prompts, max_new)]
    cut = 0
    for p in passes:
        decoding = [g for g in p.groups if g.fresh is None and g.query.shape[1] == 5]  # rows of a gamma-4 step
        # each group's last slot is seen by some query: no row reads slots past the tokens it feeds
        assert all(g.masks[None][..., -1].any() for g in decoding)
        cut += sum(int((g.query[:, 2:] == g.query[:, -1:]).all(1).sum()) for g in decoding)  # rows feeding <= 2
    assert cut >= 1  # the long row was cut


def test_a_step_whose_drafts_are_shorter_than_gamma_reads_no_slot_past_them(code_pair, passes):
    """Suffix decoding drafts as far as its trees support, so a step's widest draft is often shorter than gamma (the
    rows' lookahead slots): each row reads its tokens and the step's draft width, no slot past what any query
    sees."""
    target, _, prompts = code_pair
    engine = Engine(target, minispec.SuffixDraft(), gamma=8)
    outs = engine.run([Request(p + p[:24], 24) for p in prompts])  # the prompts repeat themselves: matches to draft
    assert [o.tokens for o in outs] == minispec.generate(target, [p + p[:24] for p in prompts], 24).tokens
    widths = []
    for p in passes:
        for g in p.groups:
            if g.fresh is None:
                widths.append(g.query.shape[1] - 1)  # the step's draft width
                assert g.masks[None][..., -1].any()  # its last slot is seen by some query
    assert 0 < min(w for w in widths if w) < 8  # steps drafted fewer than gamma tokens


def test_the_engines_phase_times_name_the_parts_of_its_steps(code_pair):
    """EngineStats.phase_s: the target's pass, drafting, the draft reading new prompts, and acceptance, each timed
    (serve-bench's drafting share reads "draft"); a plain engine drafts nothing."""
    target, small, prompts = code_pair
    for draft, parts in ((small, {"forward", "draft", "draft_prefill", "accept"}), (None, {"forward", "accept"})):
        engine = Engine(target, draft, gamma=4)
        engine.run([Request(p, 8) for p in prompts[:2]])
        assert set(engine.stats.phase_s) == parts and all(t > 0 for t in engine.stats.phase_s.values())


def test_the_engines_acceptance_counts_stop_at_an_eos(code_pair):
    """EOS a space: every request stops there, some on a draft token the target accepted, some on the target's own
    token after the accepted ones. The engine counts accepted draft tokens up to the EOS (an accepted EOS included,
    the target's own not): exactly the outputs' accepted flags. (speculative_generate counts every draft token a
    step accepted, past an EOS too.)"""
    target, small, prompts = code_pair
    engine = Engine(target, small, gamma=4, max_num_seqs=3)
    outs = engine.run([Request(p, 32, eos_token_id=32) for p in prompts])
    assert all(o.finish_reason == "stop" for o in outs)
    assert {o.accepted[-1] for o in outs} == {True, False}  # both kinds of EOS
    assert engine.stats.accepted_tokens == sum(o.num_accepted for o in outs) > 0
    assert engine.stats.tested_tokens < engine.stats.draft_tokens


def test_the_draft_model_reads_a_prompt_without_its_lm_head_but_at_the_last_token(code_pair):
    """A draft model's prefill in the engine writes its keys and values for every prompt token and computes logits at
    each chunk's last token only, as the target's does: the LM head at every prompt token is a vocabulary-wide product
    per token that nothing reads (a draft with SmolLM2's 49k tokens would pay it on every prompt). Four prompts of 120
    tokens, four new tokens each: the draft's logits rows over the run stay far below the prompts' tokens."""
    target, small, _ = code_pair
    text = sample_text("code")
    prompts = [list(text[300 * i: 300 * i + 120]) for i in range(4)]
    rows = []
    hook = small.register_forward_hook(lambda m, args, out: rows.append((out[0] if isinstance(out, tuple) else
                                                                         out).shape[:-1].numel()))
    try:
        outs = Engine(target, small, gamma=3).run([Request(p, 4) for p in prompts])
    finally:
        hook.remove()
    assert all(len(o.tokens) == 4 for o in outs)
    assert 0 < sum(rows) < sum(map(len, prompts)) // 4  # one row per chunk, and the steps' few draft tokens


def test_a_steps_attention_mask_is_built_once_and_read_by_every_layer(code_pair, monkeypatch):
    """PagedStep builds each group's additive mask once per step (per window) and every layer reads that tensor:
    building it again in each of the target's 8 layers keeps the tokens and costs a mask a layer."""
    target, small, prompts = code_pair
    built = []
    head_mask = PagedStep._head_mask

    def recorded(self, g, window, i, G, dtype):
        out = head_mask(self, g, window, i, G, dtype)
        built.append((self, i, window, out))  # kept alive: object identity is the test
        return out

    monkeypatch.setattr(PagedStep, "_head_mask", recorded)
    Engine(target, small, gamma=3, attention="gather").run([Request(p, 8) for p in prompts[:4]])
    by = {}
    for step, i, window, out in built:
        by.setdefault((id(step), i, window), []).append(out)
    assert by and all(len(v) == target.config.num_hidden_layers for v in by.values())
    assert all(all(m is v[0] for m in v) for v in by.values())  # one tensor per step and group, read by each layer


def test_an_engine_on_a_cpu_keeps_the_memory_its_steps_free():
    """The engine tells glibc to keep freed memory (keep_freed_memory): without it each step's large temporaries
    (gathered keys and values, logits) are unmapped when freed and faulted in again the next step. A fresh process,
    the embedded target at batch 8, 48 steps after a first run: measured 21-1,723 minor page faults with it, about
    27,500 without (this project's AVX-512 machine). Linux only."""
    if not sys.platform.startswith("linux"):
        pytest.skip("glibc's malloc settings: Linux only")
    code = (
        "import resource, torch, minispec\n"
        "from minispec.engine import Engine, Request\n"
        "from minispec.model.load import sample_text\n"
        "torch.set_num_threads(1)\n"
        "t = minispec.load('tiny-code-target')[0]\n"
        "text = sample_text('code')\n"
        "p = [list(text[300 * i: 300 * i + 200]) for i in range(8)]\n"
        "e = Engine(t, None, num_blocks=256)\n"
        "e.run([Request(x, 16) for x in p])\n"
        "f = resource.getrusage(resource.RUSAGE_SELF).ru_minflt\n"
        "e.run([Request(x, 48) for x in p])\n"
        "print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f, e.stats.steps)\n")
    root = str(Path(minispec.__file__).resolve().parents[1])  # the package under test, in the child too
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root,
                         env={**os.environ, "PYTHONPATH": root}, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    faults, steps = map(int, out.stdout.split())
    assert steps >= 48 and faults < 100 * steps, (faults, steps)


@pytest.mark.parametrize("name, widest", [("model", 2), ("eagle", 1 + 3)])
def test_a_draft_re_reads_no_more_in_the_engine_than_in_speculative_generate(code_pair, name, widest):
    """After a speculative step a draft catches up before it drafts again, in the engine as in
    ``speculative_generate``: a draft model re-reads the last 2 tokens (its lag), an EAGLE head the root's pair and
    the step's path (1 + gamma pairs). Every read but the prompts' (24 tokens or more) has a width the loop's draft
    also reads, the widest ``widest``. A lag one too large re-reads a true token every step: the same tokens and
    proposals, and more work."""
    target, small, prompts = code_pair
    draft = small if name == "model" else minispec.EagleDraft.from_pretrained("tiny-code-eagle", target)
    widths = []
    hook = (small if name == "model" else draft.model).register_forward_hook(
        lambda m, args, out: widths.append(args[0].shape[1]))
    try:
        ref = minispec.speculative_generate(target, draft, prompts, gamma=3, max_new_tokens=16)
        loop, widths[:] = {w for w in widths if w < 24}, []
        outs = Engine(target, draft, gamma=3).run([Request(p, 16) for p in prompts])
    finally:
        hook.remove()
    assert [o.tokens for o in outs] == ref.tokens
    assert {w for w in widths if w < 24} == loop and max(loop) == widest
