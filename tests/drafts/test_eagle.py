"""The EAGLE feature draft: exact (greedy and in distribution, hot vocabulary included), consistent with a
from-scratch computation, saved and loaded, and the shipped head drafts better than the shipped small model."""

import pytest
import torch
from support import PROMPTS, Scripted, empirical_tv, random_model

import minispec
from minispec.course.grader import tv_bound
from minispec.decoding.sampling import SamplingParams
from minispec.drafts.eagle import EagleConfig, EagleDraft, EagleModel
from minispec.drafts.tree import TreeDraft
from minispec.model.kv_cache import KVCache
from minispec.model.load import ASSETS, sample_text
from minispec.speculative.rule import accept_reject
from minispec.tools.train_eagle import unroll

RAGGED = [[1, 2, 3], [4, 5, 6, 7, 8, 9, 10, 11], [12], [13, 14, 15, 16, 17]]


def random_head(target, seed=1, features=None, hot_vocab=None, ranking=None) -> EagleModel:
    """An EAGLE head with random weights (sharpened, so that its q is far from uniform)."""
    torch.manual_seed(seed)
    model = EagleModel(EagleConfig.for_target(target.config, features, hot_vocab))
    with torch.no_grad():
        model.fc.weight.mul_(20)
        if ranking is not None:
            model.ranking.copy_(torch.tensor(ranking))
    return model.requires_grad_(False)


@pytest.fixture(scope="module")
def target():
    return random_model(seed=0)


@pytest.fixture(scope="module")
def code_pair():
    return minispec.load("tiny-code-target")[0], minispec.load("tiny-code-draft")[0]


DRAFTS = {
    "chain": lambda d: d,
    "static tree": lambda d: TreeDraft(d, branching=(3, 2, 1)),
    "dynamic tree": lambda d: TreeDraft(d, budget=10, depth=4, topk=3),
}
SLOW_TREES = [pytest.param(k, marks=pytest.mark.slow) if k != "chain" else k for k in DRAFTS]


# --- greedy: exactly the plain tokens -----------------------------------------------------------

@pytest.mark.parametrize("kind", DRAFTS)
@pytest.mark.parametrize("features, hot", [(None, None), ((0, 1, 2), 40)], ids=["eagle1", "eagle3-hot"])
def test_greedy_equals_plain_decoding(target, kind, features, hot):
    draft = DRAFTS[kind](EagleDraft(target, random_head(target, features=features, hot_vocab=hot)))
    for prompts in (RAGGED[:1], RAGGED):  # batch 1, then a ragged batch of 4
        plain = minispec.generate(target, prompts, max_new_tokens=16).tokens
        for gamma in (1, 4) if kind == "chain" else (4,):  # a tree's gamma caps its depth
            assert minispec.speculative_generate(target, draft, prompts, gamma=gamma, max_new_tokens=16).tokens == plain


@pytest.mark.parametrize("kind", SLOW_TREES)
def test_shipped_head_greedy_equals_plain_and_accepts(code_pair, kind):
    """On real code the shipped head accepts often, so the equality covers long accepted runs."""
    target, _ = code_pair
    draft = DRAFTS[kind](EagleDraft.from_pretrained("tiny-code-eagle", target))
    prompts = [list(b"def main(argv):\n    "), list(b"import os\n"), list(b"class Parser:\n    def __init__(self"),
               list(b"    for i in range(")]
    plain = minispec.generate(target, prompts, max_new_tokens=40).tokens
    out = minispec.speculative_generate(target, draft, prompts, gamma=4, max_new_tokens=40)
    assert out.tokens == plain
    assert out.stats.mean_acceptance_length > 2


@pytest.mark.parametrize("script", [[0, 3, 0, 0, 4, 1], [2, 0, 0, 1]])
def test_plain_steps_between_speculative_ones_stay_exact(target, script):
    draft = EagleDraft(target, random_head(target))
    plain = minispec.generate(target, PROMPTS, max_new_tokens=30).tokens
    out = minispec.speculative_generate(target, draft, PROMPTS, gamma=Scripted(script), max_new_tokens=30)
    assert out.tokens == plain


# --- the draft's cache follows the target's ----------------------------------------------------

def from_scratch(target, model, head, seq):
    """The head's logits for the token after ``seq`` (a row's tokens), with a fresh cache: pairs (f_t, x_{t+1})."""
    x = torch.tensor([seq])
    _, f = target(x[:, :-1], features=model.config.features)  # (1, n-1, F)
    cache = KVCache(1, 1, model.config.layer.num_key_value_heads, len(seq), model.config.layer.head_dim)
    h = model(model.fuse(target.embed(x[:, 1:]), f, True), cache)  # (1, n-1, C)
    return model.logits(h[:, -1], head)[0]  # (N,)


class Recording(EagleDraft):
    """Records every catch-up: each row's tokens then, and the logits the run returned."""

    def start(self, target, state, sampler, features=None):
        run, calls = super().start(target, state, sampler, features), self.calls
        catch_up = run.catch_up

        def recorded(state):
            logits, h = catch_up(state)
            calls.append(([row[:n] for row, n in zip(state.seq.tolist(), state.total.tolist())], state.done.clone(),
                          logits.clone()))
            return logits, h

        run.catch_up = recorded
        return run


class Reads(EagleDraft):
    """Records how many (feature, token) pairs each catch-up feeds the head."""

    def start(self, target, state, sampler, features=None):
        run, reads = super().start(target, state, sampler, features), self.reads
        read = run._read

        def counted(f, tokens):
            reads.append(f.shape[1])
            return read(f, tokens)

        run._read = counted  # after start: the prompt's read is not counted
        return run


def test_after_plain_steps_the_head_reads_only_the_pairs_it_has_not_read(target):
    """A chain step of depth d leaves 1 + d pairs to re-read (the root's and the path's, with the target's true
    features), and each plain step one more: a head that re-read more would give the same tokens at more cost."""
    draft = Reads(target, random_head(target))
    draft.reads = []
    minispec.speculative_generate(target, draft, [[1, 2, 3]], gamma=Scripted([4, 0, 0, 3]), max_new_tokens=30)
    assert draft.reads[:4] == [1, 1 + 4 + 2, 1 + 3, 1 + 4 + 2]


@pytest.mark.parametrize("kind", SLOW_TREES)
def test_each_catch_up_equals_a_from_scratch_pass(code_pair, kind):
    """After accepted runs, rejections, tree steps and plain steps, the draft's cache holds exactly what a fresh
    pass over the row's tokens with the target's true features gives (the rollback and re-read are right)."""
    target, _ = code_pair
    loaded = EagleDraft.from_pretrained("tiny-code-eagle", target)
    draft = Recording(target, loaded.model)
    draft.calls = []
    prompts = [list(b"def f(x):\n    return"), list(b"import sys\n"), list(b"#"), list(b"class A:\n    def g(self):\n")]
    minispec.speculative_generate(target, DRAFTS[kind](draft), prompts, gamma=Scripted([4, 0, 3, 0, 0, 2]),
                                  max_new_tokens=30)
    assert len(draft.calls) > 5
    with torch.inference_mode():
        for rows, done, logits in draft.calls:
            for b, seq in enumerate(rows):
                if not done[b]:
                    torch.testing.assert_close(logits[b], from_scratch(target, draft.model, draft.head, seq),
                                               rtol=1e-4, atol=1e-4)


def test_the_unrolled_training_forward_is_the_drafting_chain(target):
    """Training-time test: position k at slot j, unrolled over a whole window, equals drafting k tokens after
    the draft has read slots 0..j-k+1 with the target's features (fed the same tokens)."""
    model = random_head(target, features=(1, 2))
    x = torch.randint(0, 64, (1, 12))
    with torch.no_grad():
        _, f = target(x, features=model.config.features)  # (1, 12, F)
        hs = unroll(model, target.embed(x[:, 1:]), f[:, :-1], 3)  # 3 x (1, 11, C)
        for k in (1, 2, 3):
            for j in range(k - 1, 11):
                m = j - k + 1  # the last slot read with the target's features
                cache = KVCache(1, 1, model.config.layer.num_key_value_heads, 16, model.config.layer.head_dim)
                h = model(model.fuse(target.embed(x[:, 1 : m + 2]), f[:, : m + 1], True), cache)[:, -1:]
                for i in range(2, k + 1):  # the draft's own positions 2..k, at slots m + 1 .. j
                    h = model(model.fuse(target.embed(x[:, m + i : m + i + 1]), h, False), cache)
                torch.testing.assert_close(hs[k - 1][:, j], h[:, 0], rtol=1e-4, atol=1e-5)


# --- sampling: the target's distribution, with a hot vocabulary that misses the target's favourites ----

V = 5


@pytest.fixture(scope="module")
def hot_pair():
    """A peaked random target over 5 tokens and a draft over 3 of them; the target puts much of its mass on
    the other 2."""
    target = random_model(seed=5, vocab=V, logit_scale=10)
    with torch.no_grad():
        p = target(torch.tensor([[1, 3]]))[0, -1].softmax(-1)  # (V,) the first token's distribution
    cold = p.topk(2).indices.tolist()  # the target's two favourite first tokens are left out
    hot = [v for v in range(V) if v not in cold]
    draft = EagleDraft(target, random_head(target, seed=3, hot_vocab=3, ranking=hot + cold))
    return target, draft, p[cold].sum().item()


@pytest.mark.slow
@pytest.mark.parametrize("params, gamma", [(SamplingParams(1.0), 3), (SamplingParams(0.8, top_p=0.9), 2)])
def test_hot_vocabulary_keeps_the_target_distribution(hot_pair, params, gamma):
    target, draft, cold_mass = hot_pair
    assert cold_mass > 0.3, "the hot set must miss tokens the target likes"
    tv, out = empirical_tv(target, draft, params, gamma)
    assert 0.05 < out.stats.acceptance_rate < 0.95
    assert tv < tv_bound(V**3, 30_000), f"TV {tv:.4f} exceeds the sampling bound"


def test_hot_vocabulary_never_proposes_a_cold_token(hot_pair):
    target, draft, _ = hot_pair
    out = minispec.speculative_generate(target, draft, [[1, 3]] * 200, gamma=3, max_new_tokens=6,
                                        temperature=1.0, seed=0)
    hot = set(draft.hot.tolist())
    for row, accepted in zip(out.tokens, out.accepted):
        assert all(t in hot for t, a in zip(row, accepted) if a)
    assert 0 < out.stats.acceptance_rate < 1


def resample_from_p(p, q, x, u, draw):
    """A wrong rule: after a rejection it draws from p instead of norm(max(0, p - q))."""
    accepted, _ = accept_reject(p, q, x, u, draw)
    return accepted, draw(p.gather(1, accepted.sum(1)[:, None, None].expand(-1, 1, p.shape[-1]))[:, 0])


@pytest.mark.slow
def test_the_hot_vocabulary_distribution_test_can_fail(hot_pair):
    """The same bound catches a wrong accept rule with this draft."""
    target, draft, _ = hot_pair
    tv, _ = empirical_tv(target, draft, SamplingParams(1.0), 3, rule=resample_from_p)
    assert tv > tv_bound(V**3, 30_000)


# --- weights: borrowed, saved, loaded, checked ---------------------------------------------------

def test_embedding_and_head_are_the_targets_not_copies(target):
    model = random_head(target)
    draft = EagleDraft(target, model)
    assert draft.embed.weight.data_ptr() == target.embed.weight.data_ptr()
    assert draft.head.data_ptr() == target.lm_head.weight.data_ptr()
    ptrs = {p.data_ptr() for p in model.parameters()}
    assert target.embed.weight.data_ptr() not in ptrs and target.lm_head.weight.data_ptr() not in ptrs
    hot = EagleDraft(target, model, hot_vocab=10)
    assert hot.embed.weight.data_ptr() == target.embed.weight.data_ptr()
    assert hot.head.shape == (10, 64) and torch.equal(hot.head, target.lm_head.weight[hot.hot])


def test_hot_logits_are_minus_infinity_outside_the_hot_set(target):
    draft = EagleDraft(target, random_head(target), hot_vocab=10)
    state = minispec.decoding.plain.DecodeState([[1, 2, 3]], 4, [], "cpu", slack=5)
    _, f = target(state.seq[:, :3], features=draft.features)
    run = draft.start(target, state, None, f)
    state.emit(torch.tensor([[7]]), torch.tensor([1]))
    logits, _ = run.catch_up(state)
    cold = torch.ones(64, dtype=torch.bool)
    cold[draft.hot] = False
    assert torch.isinf(logits[0, cold]).all() and torch.isfinite(logits[0, ~cold]).all()
    q = minispec.decoding.sampling.probabilities(logits, SamplingParams(1.0, top_k=20, top_p=0.9))
    assert q[0, cold].sum() == 0 and torch.isclose(q.sum(), torch.tensor(1.0))


def test_save_and_load_round_trip(target, tmp_path):
    model = random_head(target, features=(0, 2), hot_vocab=12, ranking=list(range(63, -1, -1)))
    draft = EagleDraft(target, model)
    draft.save(tmp_path / "head", extra={"note": "test"})
    again = EagleDraft.from_pretrained(tmp_path / "head", target)
    assert again.features == (0, 2) and again.hot_vocab == 12 and torch.equal(again.hot, draft.hot)
    for k, v in model.state_dict().items():
        assert torch.equal(again.model.state_dict()[k], v), k
    out = [minispec.speculative_generate(target, d, RAGGED, gamma=3, max_new_tokens=12, temperature=1.0, seed=0)
           for d in (draft, again)]
    assert out[0].tokens == out[1].tokens and out[0].accepted == out[1].accepted
    assert EagleDraft.from_pretrained(tmp_path / "head", target, hot_vocab=64).hot is None  # the full vocabulary
    bf16 = model.to(torch.bfloat16)
    EagleDraft(target.to(torch.bfloat16), bf16).save(tmp_path / "bf16", dtype=torch.bfloat16)
    target.float()
    assert EagleDraft.from_pretrained(tmp_path / "bf16", target).model.fc.weight.dtype == torch.float32


@pytest.mark.parametrize("make, message", [
    (lambda: random_model(seed=0, vocab=80), "vocabulary 64"),
    (lambda: random_model(seed=0, hidden=32), "hidden size 64"),
    (lambda: random_model(seed=0, layers=3), "2-layer target"),
])
def test_a_mismatched_target_is_named(target, tmp_path, make, message):
    EagleDraft(target, random_head(target)).save(tmp_path / "head")
    with pytest.raises(ValueError, match=message):
        EagleDraft.from_pretrained(tmp_path / "head", make())


def test_bad_heads_and_arguments_are_named(target, tmp_path):
    with pytest.raises(ValueError, match="neither a shipped EAGLE head"):
        EagleDraft.from_pretrained(tmp_path / "nowhere", target)
    with pytest.raises(ValueError, match="not an EAGLE head"):
        EagleDraft.from_pretrained(ASSETS / "tiny-code-target", target)
    with pytest.raises(ValueError, match="hot_vocab must be"):
        EagleDraft(target, random_head(target), hot_vocab=65)
    with pytest.raises(ValueError, match="features must be"):
        EagleConfig.for_target(target.config, (3,))
    draft = EagleDraft(target, random_head(target))
    with pytest.raises(ValueError, match="target it was built with"):
        minispec.speculative_generate(random_model(seed=0), draft, RAGGED, max_new_tokens=4)


def test_shipped_heads_load_and_ship_their_weights_only(code_pair):
    target, _ = code_pair
    draft = EagleDraft.from_pretrained("tiny-code-eagle", target)
    assert draft.features == (target.config.num_hidden_layers,)
    size = (ASSETS / "tiny-code-eagle" / "model.safetensors").stat().st_size
    assert size < 4 * (sum(p.numel() for p in draft.model.parameters()) + target.config.vocab_size) + 10_000


# --- the shipped head against the shipped small draft model --------------------------------------

def heldout_prompts(n, length=64):
    """Prompts cut at line starts from the shipped held-out code (no module of it was trained on)."""
    text = sample_text("code")
    starts = [i + 1 for i, c in enumerate(text) if c == ord("\n")][:: len(text) // (n * 40)][:n]
    return [list(text[s : s + length]) for s in starts]


def test_the_shipped_head_accepts_more_than_the_small_draft_model(code_pair):
    """Greedy, gamma 4, on held-out code: tiny-code-eagle's acceptance beats tiny-code-draft's by a margin
    (both give the plain tokens)."""
    target, small = code_pair
    eagle = EagleDraft.from_pretrained("tiny-code-eagle", target)
    prompts = heldout_prompts(4)
    plain = minispec.generate(target, prompts, max_new_tokens=32).tokens
    runs = {name: minispec.speculative_generate(target, d, prompts, gamma=4, max_new_tokens=32)
            for name, d in (("eagle", eagle), ("small", small))}
    assert all(r.tokens == plain for r in runs.values())
    a, b = runs["eagle"].stats, runs["small"].stats  # when shipped: 0.59 and 0.40, mean lengths 3.35 and 2.61
    assert a.acceptance_rate > b.acceptance_rate + 0.1, (a.acceptance_rate, b.acceptance_rate)
    assert a.mean_acceptance_length > b.mean_acceptance_length


def test_the_shipped_head_agrees_with_the_target_more_than_the_small_draft_teacher_forced(code_pair):
    """Teacher-forced on held-out code: the head's argmax matches the target's more often than the small
    draft model's does (position 1: the head reads the target's true features)."""
    target, small = code_pair
    eagle = EagleDraft.from_pretrained("tiny-code-eagle", target)
    x = torch.tensor([list(sample_text("code")[:2048])]).view(4, 512)
    with torch.inference_mode():
        logits, f = target(x, features=eagle.features)  # (4, 512, V), (4, 512, F)
        best = logits[:, 1:].argmax(-1)  # (4, 511) the target's token after x_{t+1}
        cache = KVCache(1, 4, eagle.model.config.layer.num_key_value_heads, 512, eagle.model.config.layer.head_dim)
        h = eagle.model(eagle.model.fuse(target.embed(x[:, 1:]), f[:, :-1], True), cache)  # (4, 511, C)
        head = (eagle.model.logits(h, eagle.head).argmax(-1) == best).float().mean()
        model = (small(x)[:, 1:].argmax(-1) == best).float().mean()
    assert head > model + 0.05, (head.item(), model.item())


# --- training ---------------------------------------------------------------------------------------

@pytest.mark.slow
def test_training_is_seeded_and_writes_a_loadable_head(tmp_path, code_pair):
    """Two short runs with one seed give the same weights; the head loads and drafts exactly."""
    from minispec.tools.train_eagle import EagleTrainConfig, train_eagle

    cfg = EagleTrainConfig(ttt=2, ttt_from=0.5, eval_every=2)
    records = [train_eagle("tiny-code-target", tmp_path / name, steps=4, windows=4, threads=1, config=cfg,
                           progress=False) for name in ("a", "b")]
    assert records[0]["steps"] == 4 and records[0]["windows"] == 4 and len(records[0]["curve"]) == 2
    assert len(records[0]["curve"][-1]["heldout_greedy_match"]) == 4  # draft positions 1..4
    target, _ = code_pair
    a, b = (EagleDraft.from_pretrained(tmp_path / name, target) for name in ("a", "b"))
    for k, v in a.model.state_dict().items():
        assert torch.equal(v, b.model.state_dict()[k]), k
    plain = minispec.generate(target, RAGGED, max_new_tokens=8).tokens
    assert minispec.speculative_generate(target, a, RAGGED, gamma=3, max_new_tokens=8).tokens == plain


@pytest.mark.parametrize("kw, message", [
    (dict(minutes=0), "minutes must be"), (dict(steps=0), "steps must be"), (dict(threads=1.5), "threads must be"),
])
def test_bad_training_arguments_are_named_before_any_work(tmp_path, kw, message, monkeypatch):
    from minispec.tools import train_eagle

    loaded = lambda *a, **k: pytest.fail("loaded a model before checking the arguments")  # noqa: E731
    monkeypatch.setattr(train_eagle, "load", loaded)
    with pytest.raises(ValueError, match=message):
        train_eagle.train_eagle("tiny-code-target", tmp_path, **kw)


@pytest.mark.parametrize("native", [False, True])
def test_the_data_pass_is_bfloat16_only_where_the_cpu_computes_it(tmp_path, monkeypatch, native):
    """The target's data pass: "auto" (the default) loads it in bfloat16 only where that is native (emulated, it
    made training 8x slower on an AVX2 CPU); an explicit dtype is kept."""
    from minispec.tools import train_eagle

    class Loaded(Exception):
        pass

    def data(name, features, cfg, *a, **k):
        raise Loaded(cfg.data_dtype)  # the dtype eagle_data loads the target in

    monkeypatch.setattr(train_eagle, "native_bf16", lambda: native)
    monkeypatch.setattr(train_eagle, "eagle_data", data)
    for cfg, want in ((None, "bfloat16" if native else "float32"),
                      (train_eagle.EagleTrainConfig(data_dtype="float32"), "float32")):
        with pytest.raises(Loaded) as e:
            train_eagle.train_eagle("tiny-code-target", tmp_path, steps=1, windows=1, config=cfg, progress=False)
        assert e.value.args[0] == want


# --- SmolLM2 (skipped where it cannot be fetched) -----------------------------------------------------

@pytest.fixture(scope="module")
def smollm2():
    try:
        return minispec.load("smollm2-135m-instruct")
    except ValueError as e:
        pytest.skip(f"SmolLM2-135M-Instruct is not in minispec's cache: {str(e).split(':')[0]}")


@pytest.mark.slow
def test_the_shipped_smollm2_head_is_exact_with_its_hot_and_the_full_vocabulary(smollm2):
    target, tok = smollm2
    hot = EagleDraft.from_pretrained("smollm2-135m-eagle", target)
    full = EagleDraft.from_pretrained("smollm2-135m-eagle", target, hot_vocab=target.config.vocab_size)
    assert hot.hot_vocab == 8192 and hot.head.shape == (8192, 576) and full.hot is None
    prompts = [tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                       tokenize=True)["input_ids"] for q in ("What is rain?", "Name a prime number.")]
    plain = minispec.generate(target, prompts, max_new_tokens=12).tokens
    for draft in (hot, full, TreeDraft(hot, budget=8, depth=3)):
        assert minispec.speculative_generate(target, draft, prompts, gamma=3, max_new_tokens=12).tokens == plain
