"""Wrong versions made by hand (issues 23 and 33): each keeps the output exact, and each must fail a test.

Each wrong version only lowers acceptance, reuses random numbers, gets the engine's bookkeeping wrong or does more
work than a step needs, so no exactness test can see it. Each is a textual patch: a small snippet of the package
that must occur exactly once, and its replacement. For each one this script copies the working tree's package and
tests to a temporary folder, applies the patch, runs the tests named with it there (so the copy is the package they
import, stopping at the first failure) and reports the test that failed. A wrong version that fails no test is a
hole in the suite; a snippet that no longer occurs (the code was rewritten) is reported as TARGET NOT FOUND. Either
makes the script exit 1: a rewrite must carry its wrong versions along, not drop them silently.

    python scripts/hand_mutants.py --jobs 2         # all of them, two at a time (CI: 2 cores)
    python scripts/hand_mutants.py --only engine    # the ones whose name contains "engine"
    python scripts/hand_mutants.py --exact          # also check that each keeps the greedy tokens exact
    python scripts/hand_mutants.py --record         # and write the result into results/cpu/mutation.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PER_STEP = "tests/drafts/test_tokens_per_step.py"
ENGINE = "tests/engine/test_engine_mutants.py"
WORK = "tests/engine/test_engine_work.py"


def step_tests(k: str) -> list[str]:
    return [PER_STEP, "-k", k]


LOAD = "import minispec\nfrom minispec.model.load import sample_text\nt = minispec.load('tiny-code-target')[0]\n"
PROMPTS = "text = sample_text('code')\np = [list(text[400 * i: 400 * i + 24 + 13 * i]) for i in range(6)]\n"
SMALL, EAGLE = "minispec.load('tiny-code-draft')[0]", "minispec.EagleDraft.from_pretrained('tiny-code-eagle', t{})"
TREE = f"minispec.TreeDraft({SMALL}, branching=(3, 2, 1))"


def speculative(draft: str) -> str:
    """A probe: greedy speculative decoding with ``draft`` gives plain greedy decoding's tokens."""
    return (LOAD + PROMPTS + f"d = {draft}\nout = minispec.speculative_generate(t, d, p, gamma=4, max_new_tokens=24)\n"
            "assert out.tokens == minispec.generate(t, p, 24).tokens, 'the tokens changed'\n")


def engine(draft: str, **kw) -> str:
    """A probe: the engine, greedy, with ``draft`` and ``kw``, gives each request plain greedy decoding's tokens."""
    args = "".join(f", {k}={v}" for k, v in kw.items())
    return (LOAD + PROMPTS + "from minispec.engine import Engine, Request\n" + f"d = {draft}\n"
            f"outs = Engine(t, d, gamma=4{args}).run([Request(x, 32) for x in p])\n"
            "assert [o.tokens for o in outs] == minispec.generate(t, p, 32).tokens, 'the tokens changed'\n")


# name: (file, the snippet replaced (must occur exactly once), its wrong version, the tests one of which must fail,
#        a probe (Python run in the copy) that must pass with it: the output stays exact (greedy tokens equal plain
#        greedy decoding's); None for the random-number ones, whose exactness is a distribution's)
MUTANTS = {
    "draft cache not compacted after a tree step": (
        "minispec/drafts/model.py", "self.cache.compact(root, slots)", "pass",
        step_tests("every_proposal and model and static"), speculative(TREE)),
    "static tree: the draft's mask plain causal (nodes see their cousins)": (
        "minispec/drafts/tree.py", "mask = TreeMask(self.root + 1, positions[:, :hi], anc[:, lo:hi, :hi])",
        "mask = TreeMask(self.root + 1, positions[:, :hi], torch.ones(hi, hi, dtype=torch.bool, device=dev)"
        ".tril()[lo:hi].expand(B, -1, -1))",
        step_tests("every_proposal and model and static"), speculative(TREE)),
    "dynamic tree: the draft's mask plain causal (nodes see their cousins)": (
        "minispec/drafts/tree.py", "TreeMask(self.root + 1, positions, vis[:, f:])",
        "TreeMask(self.root + 1, positions, torch.ones(f + k, f + k, dtype=torch.bool, device=dev)"
        ".tril()[f:].expand(B, -1, -1))",
        step_tests("every_proposal and model and dynamic"),
        speculative(f"minispec.TreeDraft({SMALL}, budget=12, depth=4, topk=3)")),
    "EAGLE hot vocabulary: the draft -> target id map shifted by one": (
        "minispec/drafts/eagle.py", "full.index_copy_(-1, self.draft.hot, logits)",
        "full.index_copy_(-1, self.draft.hot.roll(1), logits)",
        step_tests("every_proposal and hot and chain"), speculative(EAGLE.format(", hot_vocab=96"))),
    "EAGLE tree: draft nodes' positions shifted by one": (
        "minispec/drafts/eagle.py", "tree = TreeMask(tree.base - 1, tree.positions - 1, tree.visible)",
        "tree = TreeMask(tree.base - 1, tree.positions, tree.visible)",
        step_tests("every_proposal and greedy and eagle and not hot and static"),
        speculative(f"minispec.TreeDraft({EAGLE.format('')}, branching=(2, 2, 1))")),
    "EAGLE tree: positions below depth 1 shifted by one": (
        "minispec/drafts/eagle.py", "tree = TreeMask(tree.base - 1, tree.positions - 1, tree.visible)",
        "tree = TreeMask(tree.base - 1, tree.positions - 1 + (tree.positions > tree.base[:, None]), tree.visible)",
        step_tests("every_proposal and greedy and eagle and not hot and static"),
        speculative(f"minispec.TreeDraft({EAGLE.format('')}, branching=(2, 2, 1))")),
    "Philox counter: the position folded into the index word (numbers reused across steps)": (
        "minispec/decoding/sampling.py",
        "counter = torch.stack([j.expand(len(keys), n), position[:, None].expand(-1, n),",
        "counter = torch.stack([j + position[:, None], torch.zeros_like(position[:, None]).expand(-1, n),",
        ["tests/decoding/test_random_numbers_once.py"], None),
    "Philox counter: the stream dropped (the accept test reuses the draft's numbers)": (
        "minispec/decoding/sampling.py", "torch.full_like(position[:, None], stream).expand(-1, n),",
        "torch.zeros_like(position[:, None]).expand(-1, n),",
        ["tests/decoding/test_random_numbers_once.py"], None),
    "chain draft: one uniform for every position": (
        "minispec/drafts/base.py", "xs.append(sample(qs[-1], None if u is None else u[:, i]))",
        "xs.append(sample(qs[-1], None if u is None else u[:, 0]))",
        step_tests("every_proposal and sampled and model and chain"), None),
    "greedy static tree: every sibling the draft's first choice": (
        "minispec/drafts/tree.py", "xs.append(top[:, up, rank[lo:hi]])", "xs.append(top[:, up, 0 * rank[lo:hi]])",
        step_tests("every_proposal and greedy and model and static"),
        speculative(TREE)),
    "prompt lookup: the longest n-gram never tried (n from max_ngram - 1 down)": (
        "minispec/drafts/lookup.py", "for n in range(self.max_ngram, self.min_ngram - 1, -1):",
        "for n in range(self.max_ngram - 1, self.min_ngram - 1, -1):",
        ["tests/drafts/test_lookup_vllm_rule.py", "-k", "hand_made"], speculative("minispec.PromptLookupDraft()")),
    "suffix decoding: earlier requests' outputs (the global tree) never drafted from": (
        "minispec/drafts/suffix_tree.py", "return own if own.score >= shared.score else shared", "return own",
        ["tests/drafts/test_suffix_draft.py", "-k", "earlier_outputs"], speculative("minispec.SuffixDraft()")),
    "EAGLE-3: the target's features read one layer up": (
        "minispec/drafts/eagle3.py", "self.features, self.hot_vocab = cfg.features, None if N == V else N",
        "self.features, self.hot_vocab = tuple(f + 1 for f in cfg.features), None if N == V else N",
        ["tests/drafts/test_eagle3.py", "-k", "every_proposal_is_vllms and greedy and chain"],
        speculative("minispec.Eagle3Draft.from_pretrained('tiny-code-eagle3', t)")),
    "loop counters: a row that proposed nothing counted as a draft": (
        "minispec/speculative/loop.py", "self.drafts += ((offered > 0) & active).sum()", "self.drafts += active.sum()",
        ["tests/drafts/test_suffix_engine.py", "-k", "engine_learns"], speculative("minispec.PromptLookupDraft()")),
    # --- the engine (issue 33) -------------------------------------------------------------------------------------
    "engine scheduler: rejected tokens' lookahead blocks kept (Scheduler.update's shrink skipped)": (
        "minispec/engine/scheduler.py", "self.blocks.shrink(seq, seq.num_computed)", "pass",
        [ENGINE, "-k", "blocks_its_kept_tokens_need"], engine(SMALL, block_size=4, num_blocks=200)),
    "engine scheduler: new requests admitted in a step that preempted": (
        "minispec/engine/scheduler.py", "and not plan.preempted and", "and",
        [ENGINE, "-k", "admitted_in_a_step_that_preempted"], engine(SMALL, num_blocks=14)),
    "engine EAGLE state: the target's features stored one position off": (
        "minispec/engine/drafting.py", "PagedRows(self.feats, view, S).scatter_(1, t[..., None], features)",
        "PagedRows(self.feats, view, S).scatter_(1, (t + 1).clamp_max(S - 1)[..., None], features)",
        [ENGINE, "-k", "proposals and eagle"], engine(EAGLE.format(""), max_num_seqs=3)),
    "engine EAGLE state: the next features' position one off": (  # _EagleRun.resume: the engine's assembled run
        "minispec/drafts/eagle.py", "run.cache, run.feats, run.pos, run.lag = cache, feats, state.total - 1, lag",
        "run.cache, run.feats, run.pos, run.lag = cache, feats, state.total, lag",
        [ENGINE, "-k", "proposals and eagle"], engine(EAGLE.format(""), max_num_seqs=3)),
    "engine draft model: a row's lag after a speculative step 1, not 2 (its last accepted token never read)": (
        "minispec/engine/drafting.py", "s.lag = 2 if speculative else s.lag + 1",
        "s.lag = 1 if speculative else s.lag + 1",
        [ENGINE, "-k", "proposals and model"], engine(SMALL, max_num_seqs=3)),
    "engine scheduler: a chain drafts past max_new_tokens - 1 (more than a step can emit)": (
        "minispec/engine/scheduler.py", "1 + min(plan.width, seq.max_new_tokens - 1) if chain",
        "1 + plan.width if chain", [WORK, "-k", "counters"], engine(SMALL)),
    "engine scheduler: decoding rows not charged to the token budget": (
        "minispec/engine/scheduler.py", "                    plan.k.append(n - 1)\n                budget -= n\n",
        "                    plan.k.append(n - 1)\n                budget -= n if seq.prefilling else 0\n",
        ["tests/engine/test_engine_exact.py", "-k", "chunks"], engine(SMALL, max_num_batched_tokens=16)),
    "engine scheduler: the policy told the mean prompt length, not the mean context": (
        "minispec/engine/scheduler.py", "context = sum(s.num_computed for s in decoding)",
        "context = sum(s.prompt_len for s in decoding)", ["tests/engine/test_engine_parts.py", "-k", "mean_context"],
        engine(SMALL)),
    "engine request: accepted flags kept past an EOS (acceptance counted for tokens never emitted)": (
        "minispec/engine/request.py", "new, accepted = new[: stop + 1], accepted[: stop + 1]", "new = new[: stop + 1]",
        ["tests/engine/test_engine_step.py", "-k", "stop_at_an_eos"], engine(SMALL)),
    "engine runner: every draft slot fed, proposed or not (prompt lookup's short drafts padded)": (
        "minispec/engine/runner.py", "fed = torch.zeros_like(self.root) if x is None else self._fed()",
        "fed = torch.zeros_like(self.root) if x is None else torch.full_like(self.root, x.shape[1])",
        [WORK, "-k", "only_the_tokens"], engine("minispec.PromptLookupDraft()")),
    "engine runner: tested tokens counted to the end of the draft (not the first rejection)": (
        "minispec/engine/runner.py", "tested = min(acc + 1, off)", "tested = off", [WORK, "-k", "counters"],
        engine(SMALL)),
    "engine runner: a prompt's first chunk read back through the pool": (
        "minispec/engine/runner.py", "slice(a, a + n) if start == 0 else None", "None", [WORK, "-k", "first_chunk"],
        engine(SMALL)),
    "engine runner: decoding rows attended as one group, padded to the longest": (
        "minispec/engine/runner.py", "parts = by_length([S[r] for r in rows], group_cost(pool))",
        "parts = [(list(range(len(rows))), max(S[r] for r in rows))]", [WORK, "-k", "first_chunk"], engine(SMALL)),
    "engine runner: rows that feed no draft token padded to the drafts' 1 + T queries": (
        "minispec/engine/runner.py", "sets = [(roots, 1), (feeding, 1 + T)]",
        "sets = [([], 1), (list(range(len(self.rows))), 1 + T)]", [WORK, "-k", "feed_no_draft"],
        engine("minispec.PromptLookupDraft()")),
    "engine runner: rows of one query kept apart from those that feed drafts where read sparse (two groups' calls)": (
        "minispec/engine/runner.py", "if roots and feeding and reads_sparse(self.runner.attention, pool, 1):",
        "if False:", [WORK, "-k", "feed_no_draft"], engine("minispec.PromptLookupDraft()")),
    "engine blocks: a new row placed at the start of the longest free run (its neighbour's growth room taken)": (
        "minispec/engine/blocks.py", "b = (run.start() + run.end()) // 2 if table or run.start() else 0",
        "b = run.start()", ["tests/engine/test_engine_parts.py", "-k", "grow_into"], engine(SMALL)),
    "engine attention: views copies every row (one run or not)": (
        "minispec/engine/attention.py", "copied = [r for r, sp in enumerate(g.spans) if sp is None]",
        "copied = list(range(R))",
        ["tests/engine/test_engine_step.py", "-k", "views_read"], engine(SMALL, attention="'views'")),
    "engine attention: auto copies a lone row whose blocks are one run (as the gather does)": (
        "minispec/engine/attention.py", "one = len(g.spans) == 1 and g.spans[0] is not None", "one = False",
        ["tests/engine/test_engine_step.py", "-k", "auto_reads"], engine(SMALL)),
    "engine attention: a batch of one row read as a group (its queries gathered, its outputs scattered)": (
        "minispec/engine/attention.py", "self.lone = g.spans[0] if g is not None", "self.lone = None if g is not None",
        ["tests/engine/test_engine_step.py", "-k", "attention_path"], engine(SMALL)),
    "sampling: a greedy batch under the exact rule still draws the accept test's uniforms": (
        "minispec/decoding/sampling.py", "if exact and self.params.greedy:", "if False:",
        ["tests/decoding/test_random_numbers_once.py", "-k", "draws_nothing"], engine(SMALL)),
    "loop: the accept test never told that its rule is exact (a greedy batch draws uniforms)": (
        "minispec/speculative/loop.py", "exact=tree is not None or rule is accept_reject", "exact=False",
        ["tests/decoding/test_random_numbers_once.py", "-k", "draws_nothing"], speculative(SMALL)),
    "engine attention: a group's mask built again in every layer (not once a step)": (
        "minispec/engine/attention.py", "        if (i, window, T) not in self._blocks:\n            m = g.masks",
        "        if True:\n            m = g.masks", [WORK, "-k", "mask_is_built"], engine(SMALL)),
    "engine draft model: a prompt read with the LM head at every token (not only each chunk's last)": (
        "minispec/engine/drafting.py", "chunk.tokens, cache, output_index=chunk.last[:, None], num_layers",
        "chunk.tokens, cache, num_layers", [WORK, "-k", "lm_head"], engine(SMALL)),
    "engine runner: a request's tokens sent to its device row again with every prefill chunk": (
        "minispec/engine/runner.py", "            if s.num_computed == 0:\n                self.rows.admit(s)",
        "            if True:\n                self.rows.admit(s)", ["tests/engine/test_device_rows.py", "-k", "once"],
        engine(SMALL)),
    "engine: glibc never told to keep freed memory (each step's temporaries faulted in again)": (
        "minispec/engine/engine.py", "            keep_freed_memory()\n", "            pass\n",
        [WORK, "-k", "keeps_the_memory"], engine(SMALL)),
    "engine scheduler: out of blocks, the row after the one being scheduled preempted (not the youngest)": (
        "minispec/engine/scheduler.py", "victim = self.running.pop()  # the youngest",
        "victim = self.running.pop(i + 1 if i + 1 < len(self.running) else -1)  # the youngest",
        ["tests/engine/test_engine_parts.py", "-k", "youngest"], engine(SMALL, num_blocks=14)),
    "engine device rows: every block table rewritten each step (not only what changed)": (
        "minispec/engine/batch.py", "            if same < len(new):",
        "            same = 0\n            if same < len(new):",
        ["tests/engine/test_device_rows.py"], engine(SMALL)),
    "engine: the policy never told a step's accepted and tested draft tokens": (
        "minispec/engine/engine.py", "if policy is not None and plan.gamma:", "if False:",
        ["tests/engine/test_engine_parts.py", "-k", "policy_is_told_every"], engine(SMALL)),
    "engine: a run starts from the last run's policy (its estimate carried between runs)": (
        "minispec/engine/engine.py", "policy = copy.deepcopy(self.policy)", "policy = self.policy",
        ["tests/engine/test_engine_parts.py", "-k", "policy_is_told_every"], engine(SMALL)),
    "engine: compile=True ignored (the target's layers run eager: the same tokens, slower)": (
        "minispec/engine/engine.py", "        if compile and target.paged_layers is None:",
        "        if False:", ["tests/engine/test_engine_compiled.py"], engine(SMALL, compile=True)),
    "model: the compiled layers built and never called (each step runs the eager layers)": (
        "minispec/model/llama.py", "if paged and self.paged_layers is not None and",
        "if False and self.paged_layers is not None and", ["tests/engine/test_engine_compiled.py"],
        engine(SMALL, compile=True)),
    "model: a compiled one-token pass runs its small products through oneDNN's packed call, bar the small weights'": (
        "minispec/model/llama.py", "small = n < PACKED_MIN_WEIGHT or tokens == 1 and n < PACKED_MIN_MACS",
        "small = n < PACKED_MIN_WEIGHT", ["tests/engine/test_engine_compiled.py", "-k", "small_products"],
        engine(SMALL, compile=True)),
    "model: a compiled pass of several tokens runs even a small weight's product through oneDNN's packed call": (
        "minispec/model/llama.py", "small = n < PACKED_MIN_WEIGHT or tokens == 1 and n < PACKED_MIN_MACS",
        "small = tokens == 1 and n < PACKED_MIN_MACS", ["tests/engine/test_engine_compiled.py", "-k",
                                                         "small_products"], engine(SMALL, compile=True)),
    "engine: requests queued in list order, not by arrival (an early one waits behind a later one)": (
        "minispec/engine/engine.py", "pending = deque(sorted(seqs, key=lambda s: s.arrival_s))",
        "pending = deque(seqs)", ["tests/engine/test_engine_parts.py", "-k", "arrival_time"], engine(SMALL)),
    "draft model: its cache never trimmed to the longest row (each draft pass reads every slot written)": (
        "minispec/drafts/model.py", "        self.cache.trim(state.longest)\n", "",
        ["tests/speculative/test_loop_counters.py", "-k", "draft_model_attends"], speculative(SMALL)),
    "loop: the target's cache never trimmed to the longest row (each step reads every slot written)": (
        "minispec/speculative/loop.py", "        t_cache.trim(end.longest)\n", "",
        ["tests/speculative/test_loop_counters.py", "-k", "longest_row"], speculative(SMALL)),
    "loop: the policy told every tested token was accepted (its alpha estimate 1)": (
        "minispec/speculative/loop.py", "policy.observe(end.accepted, end.tested)",
        "policy.observe(end.accepted, end.accepted)",
        ["tests/speculative/test_loop_counters.py", "-k", "levels_it_reached"], speculative(SMALL)),
    "engine runner: each group's masks as wide as the step's longest row (not its own longest)": (
        "minispec/engine/runner.py", "{w: m[i, :, :width, :longest] for w, m in masks.items()}",
        "{w: m[i, :, :width] for w, m in masks.items()}", [WORK, "-k", "first_chunk"], engine(SMALL)),
    "engine scheduler: max_num_seqs ignored when admitting": (
        "minispec/engine/scheduler.py", "and len(self.running) < self.max_num_seqs):", "and True):",
        ["tests/engine/test_engine_parts.py", "-k", "more_rows_than_max_num_seqs"], engine(SMALL)),
    "engine EAGLE state: a row's lag one more than the step left (a true pair re-read every step)": (
        "minispec/engine/drafting.py", "s.lag = run.lag if speculative else s.lag + 1",
        "s.lag = run.lag + 1 if speculative else s.lag + 1", [WORK, "-k", "re_reads_no_more"],
        engine(EAGLE.format(""))),
    "engine runner: a plain step's rows split by length even where read sparse (more calls, no padding saved)": (
        "minispec/engine/runner.py", "if reads_sparse(self.runner.attention, pool, fewest):", "if False:",
        [WORK, "-k", "one_sparse_group"], engine("None")),
    "loop: an all-greedy chain verified from one-hots (B, 1 + gamma, V), not its argmaxes (engine and loop)": (
        "minispec/speculative/loop.py", "return Argmax(top) if proposal.tree is None and rule is accept_reject else",
        "return one_hot(top, logits.shape[-1]) if True else", ["tests/engine/test_engine_step.py", "-k", "argmaxes"],
        engine("minispec.PromptLookupDraft()")),
    "engine runner: a static tree drafts a lone greedy row with the sampled rows (its children from a one-hot q)": (
        "minispec/engine/runner.py", "and 0 < sum(greedy) < len(rows)):", "and 1 < sum(greedy) < len(rows)):",
        ["tests/engine/test_engine_step.py", "-k", "one_greedy_row"], engine(TREE)),
    "engine draft model: its view copies its rows out of its pool at every forward of a step, not once": (
        "minispec/engine/drafting.py", "    keep = True  # a step's view", "    keep = False  # a step's view",
        ["tests/engine/test_engine_step.py", "-k", "copy_its_rows"], engine(SMALL)),
    "engine attention: a plain step's real queries gathered by index, not read as the pass's slice": (
        "minispec/engine/attention.py", "at = g.dest if g.tokens is None else g.tokens", "at = g.dest",
        [WORK, "-k", "one_sparse_group"], engine("None")),
    "engine attention: auto reads rows that all feed drafts sparse (slower than copying them)": (
        "minispec/engine/attention.py", "(attention == \"auto\" and fits and fewest == 1)",
        "(attention == \"auto\" and fits)", ["tests/engine/test_engine_step.py", "-k", "plain_steps_rows_sparse"],
        engine(SMALL)),
    "engine attention: the sparse softmax takes no max out (exp overflows on large scores)": (
        "minispec/engine/attention.py", "s.view(K, -1).sub_(s.view(K, -1).amax(1, keepdim=True)).exp_()", "s.exp_()",
        ["tests/engine/test_engine_step.py", "-k", "sparse_reads"], engine("None")),
    "engine attention: the sparse softmax never takes a query's own max out (its weights underflow to 0 / 0)": (
        "minispec/engine/attention.py", "or bool((total < TINY).any())", "or False",
        ["tests/engine/test_engine_step.py", "-k", "sparse_reads"], engine("None")),
    "engine attention: the sparse softmax always takes each query's own max out (a scatter and a gather a layer)": (
        "minispec/engine/attention.py", "if not cpu or bool(", "if True or bool(",
        ["tests/engine/test_engine_step.py", "-k", "sparse_reads"], engine("None")),
    "engine draft model: a row's lag after a speculative step 3, not 2 (a true token re-read every step)": (
        "minispec/engine/drafting.py", "s.lag = 2 if speculative else s.lag + 1",
        "s.lag = 3 if speculative else s.lag + 1", [WORK, "-k", "re_reads_no_more"], engine(SMALL)),
}


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()


def pytest(tmp: str, tests: list[str]) -> tuple[int, list[str], str]:
    env = dict(os.environ, MINISPEC_EXPECT_PACKAGE=str(Path(tmp) / "minispec"), OMP_NUM_THREADS="1",
               HF_HUB_OFFLINE="1")
    # nbmake (for notebooks; its imports build a URI grammar) and hypothesis's plugin cost 3.5 s of a 10 s mutant here
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-rf", "-p", "no:cacheprovider", "-p",
                          "no:xdist", "-p", "no:nbmake", "-p", "no:hypothesispytest", *tests], cwd=tmp, env=env,
                         capture_output=True, text=True)
    failed = sorted(set(re.findall(r"^FAILED (.+?)(?: - .*)?$", out.stdout, re.M)))
    return out.returncode, failed, out.stdout[-3000:] + out.stderr[-3000:]


def probe(tmp: str, code: str) -> tuple[bool, str]:
    env = dict(os.environ, MINISPEC_EXPECT_PACKAGE=str(Path(tmp) / "minispec"), OMP_NUM_THREADS="1",
               HF_HUB_OFFLINE="1", PYTHONPATH=tmp)
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp, env=env, capture_output=True, text=True)
    return out.returncode == 0, out.stderr[-2000:]


def run(name: str, file: str, old: str, new: str, tests: list[str], exact: str | None) -> dict:
    """Apply one wrong version in a copy of the working tree and run its tests (and, given, its exactness probe)."""
    with tempfile.TemporaryDirectory() as tmp:
        for part in ("minispec", "tests"):  # the tests run in the copy, so the copy is the package they import
            shutil.copytree(ROOT / part, Path(tmp) / part, ignore=shutil.ignore_patterns("__pycache__"))
        shutil.copy(ROOT / "pyproject.toml", tmp)
        path = Path(tmp) / file
        text = path.read_text()
        if text.count(old) != 1:
            return {"file": file, "status": "target not found" if not text.count(old) else "target ambiguous",
                    "fails": [], "snippet": old}
        path.write_text(text.replace(old, new))
        start = time.perf_counter()
        code, failed, log = pytest(tmp, tests)
        result = {"file": file, "fails": failed, "seconds": round(time.perf_counter() - start)}
        if code not in (0, 1) or (code == 1 and not failed):
            result.update(status="error", log=log)
        else:
            result["status"] = "caught" if failed else "SURVIVED"
        if exact:
            passed, log = probe(tmp, exact)
            result["exact"] = passed
            if not passed:
                result["exact_log"] = log
        return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="", help="run the wrong versions whose name contains this")
    ap.add_argument("--tests", help="pytest arguments to run instead of each one's own tests, e.g. "
                    "--tests='tests/drafts -m \"not slow\"'")
    ap.add_argument("--exact", action="store_true", help="also check that each keeps greedy tokens exact (a probe)")
    ap.add_argument("--jobs", type=int, default=1, help="wrong versions run at once (one core each)")
    ap.add_argument("--record", action="store_true", help="write the results into results/cpu/mutation.json")
    args = ap.parse_args()
    chosen = {n: m for n, m in MUTANTS.items() if args.only in n}
    with ThreadPoolExecutor(args.jobs) as pool:  # each wrong version runs in its own copy and processes
        futures = {name: pool.submit(run, name, file, old, new, shlex.split(args.tests) if args.tests else tests,
                                     exact if args.exact else None)
                   for name, (file, old, new, tests, exact) in chosen.items()}
    results, bad = {name: f.result() for name, f in futures.items()}, 0
    for name, r in results.items():
        file, old = chosen[name][:2]
        ok = r["status"] == "caught" and r.get("exact", True)
        bad += not ok
        print(f"{r['status']}: {name} ({file}; {r.get('seconds', 0)} s)")
        if r["status"] in ("target not found", "target ambiguous"):
            print(f"    {r['status'].upper()}: {old!r} must occur exactly once in {file}; carry this wrong version "
                  "over to the rewritten code")
        for test in r["fails"]:
            print(f"    fails {test}")
        if "exact" in r:
            print(f"    greedy tokens still exact: {'yes' if r['exact'] else 'NO (exactness tests would see it)'}")
            if not r["exact"]:
                print(r["exact_log"])
        if r["status"] == "error":
            print(r["log"])
    if args.record:
        path = ROOT / "results" / "cpu" / "mutation.json"
        data = json.loads(path.read_text()) if path.exists() else {}
        dirty = git("status", "--porcelain", "--", *sorted({f for f, *_ in MUTANTS.values()}), "tests")
        data["hand_mutants"] = {"commit": git("rev-parse", "HEAD"), "working_tree_clean": not dirty,
                                "mutants": {n: {k: v for k, v in r.items() if not k.endswith("log")}
                                            for n, r in results.items()}}
        path.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
