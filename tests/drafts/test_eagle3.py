"""The EAGLE-3 head: exact (greedy, and in distribution through the tree verifier with a draft vocabulary that misses
the target's favourites), every proposal equal to vLLM's computation written out from the saved weights, saved in
vLLM's layout and loaded back, its configuration checked, and its training-time test the drafting chain."""

import json

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from support import Scripted, empirical_tv, random_model
from test_tokens_per_step import SAMPLED, SCRIPT, check_proposals, record

import minispec
from minispec.course.grader import tv_bound
from minispec.decoding.sampling import SamplingParams
from minispec.drafts.eagle3 import Eagle3Config, Eagle3Draft, Eagle3Model, default_features, is_eagle3
from minispec.drafts.tree import TreeDraft
from minispec.engine import Engine, Request
from minispec.model.kv_cache import KVCache
from minispec.model.load import ASSETS, sample_text
from minispec.tools.train_eagle import unroll

RAGGED = [[1, 2, 3], [4, 5, 6, 7, 8, 9, 10, 11], [12], [13, 14, 15, 16, 17]]


def random_head(target, seed=1, features=None, draft_vocab=None, ids=None) -> Eagle3Model:
    """An EAGLE-3 head with random weights, sharpened (fc x 20) so that its q is far from uniform; ``ids``: its
    draft vocabulary (target ids, increasing)."""
    torch.manual_seed(seed)
    model = Eagle3Model(Eagle3Config.for_target(target.config, features, draft_vocab))
    with torch.no_grad():
        model.fc.weight.mul_(20)
        model.lm_head.weight.mul_(10)
    if ids is not None:
        model.set_vocab(torch.tensor(ids))
    return model.requires_grad_(False)


@pytest.fixture(scope="module")
def target():
    """8 layers, so that vLLM's default layers (2, 4, 5) apply."""
    return random_model(seed=0, layers=8, logit_scale=4.0)


@pytest.fixture(scope="module")
def code():
    target, _ = minispec.load("tiny-code-target")
    return target, Eagle3Draft.from_pretrained("tiny-code-eagle3", target)


EVERY_OTHER = list(range(0, 64, 2))  # a draft vocabulary of 32 whose map is not the identity (d2t[i] = i)
SHAPES = {
    "chain": lambda d: d,
    "static tree": lambda d: TreeDraft(d, branching=(3, 2, 1)),
    "dynamic tree": lambda d: TreeDraft(d, budget=10, depth=4, topk=3),
}


# --- greedy: exactly the plain tokens ---------------------------------------------------------------------

@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("vocab", [None, EVERY_OTHER], ids=["full vocabulary", "draft vocabulary 32"])
def test_greedy_equals_plain_decoding(target, shape, vocab):
    head = random_head(target, draft_vocab=vocab and len(vocab), ids=vocab)
    draft = SHAPES[shape](Eagle3Draft(target, head))
    for prompts in (RAGGED[:1], RAGGED):  # batch 1, then a ragged batch of 4
        plain = minispec.generate(target, prompts, max_new_tokens=16).tokens
        for gamma in (1, 4) if shape == "chain" else (4,):
            out = minispec.speculative_generate(target, draft, prompts, gamma=gamma, max_new_tokens=16)
            assert out.tokens == plain
        out = minispec.speculative_generate(target, draft, prompts, gamma=Scripted([3, 0, 0, 2]), max_new_tokens=16)
        assert out.tokens == plain  # plain steps between speculative ones


@pytest.mark.parametrize("shape", SHAPES)
def test_the_shipped_head_is_exact_and_accepts_on_held_out_code(code, shape):
    target, head = code
    prompts = [list(b"def main(argv):\n    "), list(b"import os\n"), list(b"class Parser:\n    def __init__(self"),
               list(b"    for i in range(")]
    plain = minispec.generate(target, prompts, max_new_tokens=40).tokens
    out = minispec.speculative_generate(target, SHAPES[shape](head), prompts, gamma=4, max_new_tokens=40)
    assert out.tokens == plain
    assert out.stats.mean_acceptance_length > 2


@pytest.mark.parametrize("shape", ["chain", "dynamic tree"])
def test_greedy_through_the_engine_equals_plain_per_request(code, shape):
    """Staggered requests of different lengths join and leave; each gets its plain greedy tokens, and the engine
    accepts per position what speculative_generate accepts (a lost draft token would show)."""
    target, head = code
    text = sample_text("code")
    prompts = [list(text[400 * i : 400 * i + 24 + 13 * i]) for i in range(6)]
    draft = SHAPES[shape](head)
    engine = Engine(target, draft, gamma=4)
    outs = engine.run([Request(p, 32, arrival_s=0.0005 * i) for i, p in enumerate(prompts)])
    assert [o.tokens for o in outs] == minispec.generate(target, prompts, 32).tokens
    ref = minispec.speculative_generate(target, draft, prompts, gamma=4, max_new_tokens=32)
    assert engine.stats.accepted_per_position == ref.stats.accepted_per_position
    assert engine.stats.accepted_tokens == ref.stats.accepted_tokens > 0


# --- every proposal is vLLM's computation, written out from the saved weights -------------------------------

def vllm_reference(target, folder):
    """logits(seq, path) (V,): vLLM's Eagle3LlamaForCausalLM for the head saved in ``folder``, written out from its
    safetensors (vLLM's names) with no cache: pairs (fc(f_t), x_{t+1}) over the row, then the head's own
    pre-norm state fed to each path token; the draft logits placed at target ids i + d2t[i], -inf elsewhere."""
    w = {k: v.float() if v.is_floating_point() else v for k, v in load_file(str(folder / "model.safetensors")).items()}
    c = json.loads((folder / "config.json").read_text())
    layers = tuple(c["eagle_config"]["eagle_aux_hidden_state_layer_ids"])
    H, K, D, eps = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"], c["rms_norm_eps"]
    inv = 1.0 / c["rope_parameters"]["rope_theta"] ** (torch.arange(0, D, 2).float() / D)  # (D/2,)
    rms = lambda x, g: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * g  # noqa: E731
    p = "midlayer."

    def rope(x, pos):  # x (heads, P, D), HF's rotate-half
        ang = pos[:, None].float() * inv  # (P, D/2)
        cos, sin = torch.cat([ang, ang], -1).cos(), torch.cat([ang, ang], -1).sin()
        x1, x2 = x[..., : D // 2], x[..., D // 2 :]
        return x * cos + torch.cat([-x2, x1], -1) * sin

    def layer(e, g):  # e, g (P, C) at positions 0..P-1: the layer's pre-norm output (P, C)
        P = e.shape[0]
        a = torch.cat([rms(e, w[p + "input_layernorm.weight"]), rms(g, w[p + "hidden_norm.weight"])], -1)
        q = (a @ w[p + "self_attn.q_proj.weight"].T).view(P, H, D).transpose(0, 1)
        k = (a @ w[p + "self_attn.k_proj.weight"].T).view(P, K, D).transpose(0, 1).repeat_interleave(H // K, 0)
        v = (a @ w[p + "self_attn.v_proj.weight"].T).view(P, K, D).transpose(0, 1).repeat_interleave(H // K, 0)
        pos = torch.arange(P)
        s = rope(q, pos) @ rope(k, pos).transpose(1, 2) / D**0.5  # (H, P, P)
        s = s.masked_fill(pos[None, :] > pos[:, None], float("-inf"))
        o = (s.softmax(-1) @ v).transpose(0, 1).reshape(P, H * D)
        r = g + o @ w[p + "self_attn.o_proj.weight"].T
        m = rms(r, w[p + "post_attention_layernorm.weight"])
        return r + (F.silu(m @ w[p + "mlp.gate_proj.weight"].T) * (m @ w[p + "mlp.up_proj.weight"].T)) @ \
            w[p + "mlp.down_proj.weight"].T

    def fresh(seq, path):
        x = torch.tensor([seq])
        _, f = target(x[:, :-1], features=layers)  # (1, n-1, 3C)
        e = target.embed(torch.tensor(seq[1:] + path))  # (n-1+m, C)
        g = f[0] @ w["fc.weight"].T  # (n-1, C)
        for _ in path:  # each path token reads the state the layer left at its parent
            g = torch.cat([g, layer(e[: len(g)], g)[-1:]])
        h = rms(layer(e, g)[-1], w["norm.weight"])  # (C,)
        d = h @ w["lm_head.weight"].T  # (N,)
        ids = torch.arange(len(d)) + w["d2t"] if "d2t" in w else torch.arange(len(d))
        return torch.full((target.config.vocab_size,), float("-inf")).index_copy_(0, ids, d)

    return fresh


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("params", [SamplingParams(), SAMPLED], ids=["greedy", "sampled"])
def test_every_proposal_is_vllms_computation_from_scratch(code, shape, params):
    """Tokens per step, not only exactness: a ragged batch with plain steps and shorter drafts between, chains and
    trees; dense q equals the reference's q, point masses are its top tokens in rank order."""
    target, head = code
    draft = SHAPES[shape](head)
    calls = record(draft)
    prompts = [list(b"def parse(argv):\n    "), list(b"import os\nimport sys\n\n"), list(b"#"),
               list(b"class Stack:\n    def push(self, x):\n        ")]
    out = minispec.speculative_generate(target, draft, prompts, gamma=Scripted(SCRIPT), max_new_tokens=24,
                                        temperature=params.temperature, top_k=params.top_k, seed=[5, 6, 7, 8])
    with torch.inference_mode():
        assert check_proposals(calls, vllm_reference(target, ASSETS / "tiny-code-eagle3"), params, atol=1e-4) > 40
    if params.greedy:
        assert out.tokens == minispec.generate(target, prompts, max_new_tokens=24).tokens
        assert out.stats.accepted_tokens > 20  # the head accepts, so later positions read its own states


def test_a_random_heads_proposals_with_a_draft_vocabulary_are_vllms(target, tmp_path):
    """A head whose draft vocabulary maps draft id i to target id 2 i: its logits sit at those ids (an off-by-one
    or an identity map would move them), in a chain and a tree, at positions past the feature width."""
    Eagle3Draft(target, random_head(target, draft_vocab=32, ids=EVERY_OTHER)).save(tmp_path / "head")
    head = Eagle3Draft.from_pretrained(tmp_path / "head", target)
    prompts = [[(7 * i + b) % 64 for i in range(n)] for b, n in enumerate((80, 3))]
    for shape in ("chain", "static tree"):
        draft = SHAPES[shape](head)
        calls = record(draft)
        minispec.speculative_generate(target, draft, prompts, gamma=Scripted([3, 0, 2]), max_new_tokens=12,
                                      temperature=1.0, seed=[3, 4])
        with torch.inference_mode():
            assert check_proposals(calls, vllm_reference(target, tmp_path / "head"), SamplingParams(1.0)) > 8


# --- sampling: the target's distribution through the tree verifier --------------------------------------------

V = 5


@pytest.fixture(scope="module")
def narrow_pair():
    """A peaked random target over 5 tokens and a head whose draft vocabulary holds 3 of them, not the target's two
    favourite first tokens."""
    target = random_model(seed=5, vocab=V, logit_scale=10)
    with torch.no_grad():
        p = target(torch.tensor([[1, 3]]))[0, -1].softmax(-1)  # (V,)
    cold = p.topk(2).indices.tolist()
    hot = sorted(v for v in range(V) if v not in cold)
    head = random_head(target, seed=3, features=(0, 1, 2), draft_vocab=3, ids=hot)
    return target, Eagle3Draft(target, head), p[cold].sum().item()


@pytest.mark.slow
@pytest.mark.parametrize("shape, params", [("chain", SamplingParams(1.0)),
                                           ("static tree", SamplingParams(0.8, top_p=0.9)),
                                           ("dynamic tree", SamplingParams(1.0))])
def test_sampled_tokens_follow_the_target(narrow_pair, shape, params):
    target, head, cold_mass = narrow_pair
    assert cold_mass > 0.3, "the draft vocabulary must miss tokens the target likes"
    tv, out = empirical_tv(target, SHAPES[shape](head), params, 3)
    assert 0.05 < out.stats.acceptance_rate < 0.95
    assert tv < tv_bound(V**3, 30_000), f"TV {tv:.4f} exceeds the sampling bound"


def test_the_draft_never_proposes_outside_its_vocabulary(narrow_pair):
    target, head, _ = narrow_pair
    calls = record(head)
    minispec.speculative_generate(target, head, [[1, 3]] * 50, gamma=3, max_new_tokens=6, temperature=1.0, seed=0)
    allowed = set(head.hot.tolist())
    for _, _, (x, q, _) in calls:
        assert set(x.flatten().tolist()) <= allowed
        assert q[..., [v for v in range(V) if v not in allowed]].sum() == 0


# --- training-time test: the unrolled forward is the drafting chain --------------------------------------------

def test_the_unrolled_training_forward_is_the_drafting_chain(target):
    """Position k at slot j of the unrolled window equals drafting k tokens after the head read slots 0..j-k+1 with
    the target's features (the same tokens fed)."""
    model = random_head(target)
    x = torch.randint(0, 64, (1, 12))
    with torch.no_grad():
        _, f = target(x, features=model.config.features)  # (1, 12, 3C)
        hs = unroll(model, target.embed(x[:, 1:]), f[:, :-1], 3)  # 3 x (1, 11, C)
        for k in (1, 2, 3):
            for j in range(k - 1, 11):
                m = j - k + 1
                cache = KVCache(1, 1, model.config.layer.num_key_value_heads, 16, model.config.layer.head_dim)
                h = model(model.fuse(target.embed(x[:, 1 : m + 2]), f[:, : m + 1], True), cache)[:, -1:]
                for i in range(2, k + 1):
                    h = model(model.fuse(target.embed(x[:, m + i : m + i + 1]), h, False), cache)
                torch.testing.assert_close(hs[k - 1][:, j], h[:, 0], rtol=1e-4, atol=1e-5)


# --- vLLM's layout, saved and loaded -------------------------------------------------------------------------

def test_saved_in_vllms_layout_and_loaded_back(target, tmp_path):
    head = random_head(target, draft_vocab=32, ids=EVERY_OTHER)
    draft = Eagle3Draft(target, head)
    draft.save(tmp_path / "head", extra={"note": "test"})
    c = json.loads((tmp_path / "head" / "config.json").read_text())
    assert c["architectures"] == ["LlamaForCausalLMEagle3"] and c["num_hidden_layers"] == 1
    assert c["draft_vocab_size"] == 32 and c["vocab_size"] == 64 and c["tie_word_embeddings"] is False
    assert c["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [2, 4, 5] == list(default_features(8))
    w = load_file(str(tmp_path / "head" / "model.safetensors"))
    C, H, K, D, Fw = 64, 4, 2, 16, 128
    assert {k: tuple(v.shape) for k, v in w.items()} == {
        "fc.weight": (C, 3 * C), "norm.weight": (C,), "lm_head.weight": (32, C), "d2t": (32,), "t2d": (64,),
        "midlayer.input_layernorm.weight": (C,), "midlayer.hidden_norm.weight": (C,),
        "midlayer.post_attention_layernorm.weight": (C,), "midlayer.self_attn.q_proj.weight": (H * D, 2 * C),
        "midlayer.self_attn.k_proj.weight": (K * D, 2 * C), "midlayer.self_attn.v_proj.weight": (K * D, 2 * C),
        "midlayer.self_attn.o_proj.weight": (C, H * D), "midlayer.mlp.gate_proj.weight": (Fw, C),
        "midlayer.mlp.up_proj.weight": (Fw, C), "midlayer.mlp.down_proj.weight": (C, Fw)}
    assert w["d2t"].dtype == torch.int64 and w["d2t"].tolist() == list(range(32))  # draft id i -> target id 2 i
    assert w["t2d"].dtype == torch.bool and w["t2d"].nonzero()[:, 0].tolist() == EVERY_OTHER
    assert torch.equal(w["midlayer.self_attn.k_proj.weight"], head.layer.wqkv.weight[H * D : (H + K) * D])
    again = Eagle3Draft.from_pretrained(tmp_path / "head", target)
    for k, v in head.state_dict().items():
        assert torch.equal(again.model.state_dict()[k], v), k
    assert again.features == (2, 4, 5) and torch.equal(again.hot, torch.tensor(EVERY_OTHER))
    out = [minispec.speculative_generate(target, d, RAGGED, gamma=3, max_new_tokens=12, temperature=1.0, seed=0)
           for d in (draft, again)]
    assert out[0].tokens == out[1].tokens and out[0].accepted == out[1].accepted
    assert is_eagle3(str(tmp_path / "head")) and is_eagle3("eagle3:anything") and not is_eagle3("tiny-code-eagle")
    bf16 = Eagle3Draft(target.to(torch.bfloat16), head.to(torch.bfloat16))
    bf16.save(tmp_path / "bf16", dtype=torch.bfloat16)
    target.float()
    assert load_file(str(tmp_path / "bf16" / "model.safetensors"))["fc.weight"].dtype == torch.bfloat16
    loaded = Eagle3Draft.from_pretrained(tmp_path / "bf16", target)
    assert loaded.model.fc.weight.dtype == torch.float32 and loaded.model.d2t.dtype == torch.long


def test_a_head_written_elsewhere_without_maps_or_layer_ids_loads_with_vllms_defaults(target, tmp_path):
    """A full-vocabulary head from another trainer: no d2t/t2d (vLLM reads none then), no layer ids (vLLM's
    defaults for the target), no target layer count: it loads beside its target and reads layers 2, 4, 5."""
    from safetensors.torch import save_file

    from minispec.drafts.eagle3 import to_vllm

    head = random_head(target)
    c = head.config.to_dict()
    del c["eagle_config"], c["target_num_hidden_layers"], c["draft_vocab_size"]
    (tmp_path / "config.json").write_text(json.dumps(c))
    save_file({k: v for k, v in to_vllm(head).items() if k not in ("d2t", "t2d")}, str(tmp_path / "model.safetensors"))
    draft = Eagle3Draft.from_pretrained(tmp_path, target)
    assert draft.features == (2, 4, 5) and draft.hot is None and draft.head.shape == (64, 64)
    plain = minispec.generate(target, RAGGED, max_new_tokens=8).tokens
    assert minispec.speculative_generate(target, draft, RAGGED, gamma=3, max_new_tokens=8).tokens == plain


def test_the_shipped_head_is_small_and_says_what_it_reads(code):
    target, head = code
    assert head.features == (2, 4, 5) and head.hot_vocab == 128  # vLLM's defaults for 8 layers; 128 byte values
    size = (ASSETS / "tiny-code-eagle3" / "model.safetensors").stat().st_size
    assert size < 4 * sum(p.numel() for p in head.model.parameters()) + 8 * 512 + 10_000
    assert json.loads((ASSETS / "tiny-code-eagle3" / "training.json").read_text())["steps"] > 0


# --- configuration checks ------------------------------------------------------------------------------------

@pytest.mark.parametrize("features, message", [
    ((), "features must be"), ((4, 2), "features must be"), ((2, 2, 5), "features must be"), ((2, 4, 9), "in 0..8"),
    ((-1, 4, 5), "features must be"), ((2.0, 4, 5), "features must be"),
])
def test_bad_layer_ids_are_named(target, features, message):
    with pytest.raises(ValueError, match=message):
        Eagle3Config.for_target(target.config, features)


def test_vllms_default_layers_and_where_they_do_not_exist():
    assert default_features(8) == (2, 4, 5) and default_features(30) == (2, 15, 27) and default_features(32) == (
        2, 16, 29)
    with pytest.raises(ValueError, match="features must be"):  # 6 layers: (2, 3, 3), a layer twice
        Eagle3Config.for_target(random_model(seed=0, layers=6).config)


@pytest.mark.parametrize("make, message", [
    (lambda: random_model(seed=0, layers=8, vocab=80), "vocabulary 64"),
    (lambda: random_model(seed=0, layers=8, hidden=32), "hidden size 64"),
    (lambda: random_model(seed=0, layers=7), "8-layer target"),
])
def test_a_mismatched_target_is_named(target, tmp_path, make, message):
    Eagle3Draft(target, random_head(target)).save(tmp_path / "head")
    with pytest.raises(ValueError, match=message):
        Eagle3Draft.from_pretrained(tmp_path / "head", make())
    with pytest.raises(ValueError, match=message):
        Eagle3Draft(make(), random_head(target))


def test_bad_vocabulary_maps_are_named(target, tmp_path):
    with pytest.raises(ValueError, match="draft_vocab must be"):
        Eagle3Config.for_target(target.config, draft_vocab=65)
    with pytest.raises(ValueError, match="draft_vocab must be"):
        Eagle3Config.for_target(target.config, draft_vocab=True)
    head = random_head(target, draft_vocab=4)
    for ids in ([0, 1, 2], [3, 2, 1, 0], [0, 1, 1, 2], [0, 1, 2, 64], [-1, 0, 1, 2]):
        with pytest.raises(ValueError, match="a draft vocabulary is 4 distinct target ids"):
            head.set_vocab(torch.tensor(ids))
    full = random_head(target)
    full.d2t[3] = 1
    with pytest.raises(ValueError, match="d2t all zero"):
        Eagle3Draft(target, full)
    Eagle3Draft(target, random_head(target, draft_vocab=4, ids=[1, 5, 9, 60])).save(tmp_path / "head")
    w = load_file(str(tmp_path / "head" / "model.safetensors"))
    w["t2d"] = torch.roll(w["t2d"], 1)  # t2d names other tokens than d2t
    from safetensors.torch import save_file

    save_file(w, str(tmp_path / "head" / "model.safetensors"))
    with pytest.raises(ValueError, match="d2t and t2d name different draft vocabularies"):
        Eagle3Draft.from_pretrained(tmp_path / "head", target)


@pytest.mark.parametrize("edit, message", [
    (lambda c: c.update(architectures=["EagleDraft"]), "not an EAGLE-3 head"),
    (lambda c: c.update(num_hidden_layers=2), "one decoder layer"),
    (lambda c: c.update(norm_before_residual=True), "norm_before_residual"),
    (lambda c: c["eagle_config"].update(fc_norm=True), "fc_norm"),
    (lambda c: c["eagle_config"].update(use_aux_hidden_state=False), "use_aux_hidden_state"),
    (lambda c: c.update(target_hidden_size=128), "target_hidden_size"),
    (lambda c: c.update(draft_vocab_size=16), "has shape"),
])
def test_bad_configs_are_named(target, tmp_path, edit, message):
    Eagle3Draft(target, random_head(target, draft_vocab=32, ids=EVERY_OTHER)).save(tmp_path)
    c = json.loads((tmp_path / "config.json").read_text())
    edit(c)
    (tmp_path / "config.json").write_text(json.dumps(c))
    with pytest.raises(ValueError, match=message):
        Eagle3Draft.from_pretrained(tmp_path, target)


def test_bad_heads_and_arguments_are_named(target, tmp_path):
    with pytest.raises(ValueError, match="neither a shipped EAGLE-3 head"):
        Eagle3Draft.from_pretrained(tmp_path / "nowhere", target)
    with pytest.raises(ValueError, match="not an EAGLE-3 head"):
        Eagle3Draft.from_pretrained(ASSETS / "tiny-code-eagle", target)
    with pytest.raises(ValueError, match="needs a minispec Model and an Eagle3Model"):
        Eagle3Draft(target, object())
    with pytest.raises(ValueError, match="target must be a minispec Model"):
        Eagle3Draft.from_pretrained("tiny-code-eagle3", "tiny-code-target")
    draft = Eagle3Draft(target, random_head(target))
    with pytest.raises(ValueError, match="target it was built with"):
        minispec.speculative_generate(random_model(seed=0, layers=8), draft, RAGGED, max_new_tokens=4)
    assert repr(draft) == "Eagle3Draft(features=(2, 4, 5), full vocabulary)"
