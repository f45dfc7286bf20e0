"""An EAGLE head's configuration, weights, files and cost-model shape: the contract around the drafting code.

Written from mutation testing (scripts/mutation.py): each test here fails on a change to drafts/eagle.py that every
other test let through, such as a hot vocabulary of 1 refused, a head built with biases, ids saved in bf16, a
head directory named relatively not found, or the cost model handed the full vocabulary's shape for a hot head.
"""

import json
from dataclasses import replace

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from support import random_model, tiny_config

from minispec.drafts.eagle import EagleConfig, EagleDraft, EagleModel
from minispec.roofline import eagle_head_shape

V, L = 64, 2  # the random target's vocabulary and layers


@pytest.fixture(scope="module")
def target():
    return random_model(seed=0)


def head(target, features=None, hot_vocab=None, seed=1):
    torch.manual_seed(seed)
    return EagleModel(EagleConfig.for_target(target.config, features, hot_vocab)).requires_grad_(False)


@pytest.mark.parametrize("hot", [1, V, None])
def test_every_hot_vocabulary_from_1_to_the_vocabulary_is_taken(target, hot):
    assert EagleConfig.for_target(target.config, hot_vocab=hot).hot_vocab == hot
    draft = EagleDraft(target, head(target), hot_vocab=hot)
    assert draft.hot_vocab == (None if hot in (None, V) else hot)  # all V rows: the full head, no id map
    assert draft.head.shape == (hot if hot not in (None, V) else V, target.config.hidden_size)


@pytest.mark.parametrize("hot", [0, V + 1, 3.0, True, "8"])
def test_a_bad_hot_vocabulary_is_named(target, hot):
    with pytest.raises(ValueError, match=rf"hot_vocab must be an integer in 1\.\.{V} .* got {hot!r}"):
        EagleDraft(target, head(target), hot_vocab=hot)
    if not isinstance(hot, bool):  # the config's own check (True is an int there, as JSON has no bool/int clash)
        with pytest.raises(ValueError, match=rf"hot_vocab must be an integer in 1\.\.{V} \(the vocabulary\) or None"):
            EagleConfig.for_target(target.config, hot_vocab=hot)


@pytest.mark.parametrize("features", [(), (2, 1), (1, 1), (0, L + 1), (-1,), (1.0,)])
def test_bad_feature_layers_are_named(target, features):
    with pytest.raises(ValueError, match=rf"features must be increasing layer numbers in 0\.\.{L}, got"):
        EagleConfig.for_target(target.config, features)


def test_the_heads_layer_is_one_layer_of_the_target_with_full_attention():
    cfg = tiny_config(layers=3, sliding_window=(8, None, 8))  # a windowed target
    layer = EagleConfig.for_target(cfg).layer
    assert (layer.num_hidden_layers, layer.sliding_window) == (1, None)
    assert replace(layer, num_hidden_layers=3, sliding_window=(8, None, 8)) == cfg


def test_not_a_head_says_what_the_file_holds():
    with pytest.raises(ValueError, match=r"architectures is \['LlamaForCausalLM'\], expected \['EagleDraft'\]"):
        EagleConfig.from_dict({"architectures": ["LlamaForCausalLM"]})


def test_a_new_head_has_no_biases_small_random_matrices_and_unit_norms(target):
    model = head(target, features=(0, 1, 2))
    assert model.fc.bias is None and model.reduce.bias is None
    for name, p in model.named_parameters():
        if p.dim() == 2:
            assert 0.015 < p.std().item() < 0.025 and abs(p.mean().item()) < 0.005, name  # normal, std 0.02
        else:
            assert "norm" in name and torch.equal(p, torch.ones_like(p)), name
    assert "inv_freq" not in model.state_dict()  # recomputed, never saved


def test_a_head_for_a_target_with_biases_starts_them_at_zero():
    """A Qwen2-style target (q/k/v, output and MLP biases): the head's layer copies its shape, biases at zero."""
    target = random_model(seed=0, qkv_bias=True, o_bias=True, mlp_bias=True)
    biases = {n: p for n, p in head(target).named_parameters() if n.endswith("bias")}
    assert sorted(biases) == ["layer.w13.bias", "layer.w2.bias", "layer.wo.bias", "layer.wqkv.bias"]
    assert all(torch.equal(b, torch.zeros_like(b)) for b in biases.values())


def test_the_draft_needs_a_model_and_a_head(target):
    with pytest.raises(ValueError, match="EagleDraft needs a minispec Model and an EagleModel, got Model and str"):
        EagleDraft(target, "head")
    with pytest.raises(ValueError, match="got str and EagleModel"):
        EagleDraft("target", head(target))
    with pytest.raises(ValueError, match=r"target must be a minispec Model \(minispec.load\(...\)\[0\]\), got str"):
        EagleDraft.from_pretrained("tiny-code-eagle", "target")


def test_the_head_is_cast_to_the_targets_dtype():
    target = random_model(seed=0).to(torch.bfloat16)
    draft = EagleDraft(target, head(random_model(seed=0)))  # a float32 head
    assert {p.dtype for p in draft.model.parameters()} == {torch.bfloat16}
    assert draft.model.inv_freq.dtype == torch.float32  # positions in float32, as the target's own


@pytest.mark.parametrize("features, hot", [(None, None), (None, 16), ((0, 1, 2), 16)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_cost_model_gets_the_heads_own_shape(features, hot, dtype):
    """The rows it reads (a hot vocabulary's N, not V), its bytes per parameter and, with several feature layers,
    the reduction matmul: what c and gamma="auto" are priced from."""
    target = random_model(seed=0).to(dtype)
    draft = EagleDraft(target, head(random_model(seed=0), features, hot))
    want = eagle_head_shape(target.config, hot, bytes_per_param=dtype.itemsize)
    reduce = 0 if features is None else 3 * 64 * 64  # (3 C) x C
    assert draft.shape == replace(want, params=want.params + reduce)
    full = EagleDraft(target, head(random_model(seed=0), features, None)).shape
    assert hot is None or draft.shape.weight_bytes < full.weight_bytes


def test_repr_says_which_vocabulary(target):
    assert repr(EagleDraft(target, head(target))) == "EagleDraft(features=(2,), full vocabulary)"
    hot = EagleDraft(target, head(target, (0, 2)), hot_vocab=8)
    assert repr(hot) == "EagleDraft(features=(0, 2), hot vocabulary 8)"


def test_saved_files_round_trip_into_new_nested_folders_and_again(tmp_path, monkeypatch):
    """A new nested folder is made, saving twice is fine, training.json holds ``extra``; token ids stay int32 in a
    bf16 file (bf16 holds integers exactly only to 256: ids 257 and up would round), and a relative or ~ folder is
    found."""
    target = random_model(seed=0, vocab=1024)
    model = head(target, hot_vocab=8)
    ranking = torch.arange(1024).flip(0)  # the most expected token first: 1023, 1022, ...
    model.ranking.copy_(ranking)
    draft = EagleDraft(target, model)
    out = tmp_path / "a" / "b"
    for _ in range(2):
        draft.save(out, dtype=torch.bfloat16, extra={"steps": 3})
    assert json.loads((out / "training.json").read_text()) == {"steps": 3}
    assert json.loads((out / "config.json").read_text())["hot_vocab"] == 8
    state = load_file(out / "model.safetensors")
    assert state["ranking"].dtype == torch.int32 and state["fc.weight"].dtype == torch.bfloat16
    with safe_open(out / "model.safetensors", "pt") as f:  # as save_pretrained writes it; older transformers
        assert f.metadata() == {"format": "pt"}  # refuse a file without it
    monkeypatch.chdir(tmp_path)
    again = EagleDraft.from_pretrained("a/b", target)  # a relative folder
    assert torch.equal(again.model.ranking, ranking) and torch.equal(again.hot, ranking[:8].sort().values)
    assert not any(p.requires_grad for p in again.model.parameters())
    monkeypatch.setenv("HOME", str(tmp_path))
    assert EagleDraft.from_pretrained("~/a/b", target).hot_vocab == 8


def test_a_head_folder_missing_a_file_or_with_other_weights_is_named(target, tmp_path):
    draft = EagleDraft(target, head(target))
    draft.save(tmp_path / "h")
    (tmp_path / "h" / "model.safetensors").rename(tmp_path / "weights")
    with pytest.raises(ValueError, match="nor a directory holding config.json and model.safetensors"):
        EagleDraft.from_pretrained(tmp_path / "h", target)
    state = load_file(tmp_path / "weights")
    save_file(state | {"extra.weight": torch.zeros(2)}, tmp_path / "h" / "model.safetensors")
    with pytest.raises(ValueError, match=r"do not match the config \(missing \[\], unexpected \['extra.weight'"):
        EagleDraft.from_pretrained(tmp_path / "h", target)
    del state["fc.weight"]
    save_file(state, tmp_path / "h" / "model.safetensors")
    with pytest.raises(ValueError, match=r"missing \['fc.weight'\], unexpected \[\]"):
        EagleDraft.from_pretrained(tmp_path / "h", target)


def float32_greedy_that_bf16_must_match(t16, prompts, n):
    """The bf16 target's weights in float32 and their plain greedy tokens, after checking that at every generated
    position float32's top-1 margin exceeds 4x the largest bf16 error of any logit there (a bf16 forward of the
    whole sequence against the float32 one): bf16 rounding of that size, twice over, cannot change the argmax, so
    bf16 greedy decoding must give these tokens, deterministically."""
    import copy

    import minispec

    t32 = copy.deepcopy(t16).float()
    ref = minispec.generate(t32, prompts, n).tokens
    with torch.inference_mode():
        for p, r in zip(prompts, ref):
            seq = torch.tensor([p + r])  # (1, P + n)
            l32, l16 = t32(seq)[0, len(p) - 1: -1], t16(seq)[0, len(p) - 1: -1].float()  # (n, V) each
            top = l32.topk(2, -1).values  # (n, 2)
            assert ((top[:, 0] - top[:, 1]) > 4 * (l16 - l32).abs().amax(-1)).all(), "pick prompts with margin"
    return t32, ref


def test_a_head_drafts_for_a_bf16_target():
    """Its cache and weights follow the target's dtype, and the tokens are right: the embedded target in bf16 with
    the shipped head and with a random two-layer-feature head (the reduce path), in chains and trees, gives the
    float32 greedy tokens of the same weights (on prompts where bf16 cannot change them, checked), and the shipped
    head accepts as many tokens in bf16 as in float32, within 10 %."""
    import minispec
    from minispec.drafts.tree import TreeDraft
    from minispec.model.load import sample_text

    t16 = minispec.load("tiny-code-target")[0].to(torch.bfloat16)
    text = sample_text("code")
    prompts = [list(text[400 * i: 400 * i + 20]) for i in (1, 3, 5, 8)]  # bytes = tokens
    t32, ref = float32_greedy_that_bf16_must_match(t16, prompts, 24)
    shipped = EagleDraft.from_pretrained("tiny-code-eagle", t16)
    two_layers = EagleDraft(t16, head(t16, features=(1, 2)))
    assert {p.dtype for d in (shipped, two_layers) for p in d.model.parameters()} == {torch.bfloat16}
    for draft in (shipped, two_layers):
        for d in (draft, TreeDraft(draft, branching=(2, 1))):
            out = minispec.speculative_generate(t16, d, prompts, gamma=2, max_new_tokens=24)
            assert out.tokens == ref and out.stats.num_drafts > 0
            if draft is shipped:
                f32 = EagleDraft.from_pretrained("tiny-code-eagle", t32)
                d32 = f32 if d is draft else TreeDraft(f32, branching=(2, 1))
                s32 = minispec.speculative_generate(t32, d32, prompts, gamma=2, max_new_tokens=24).stats
                assert out.stats.accepted_tokens >= 0.9 * s32.accepted_tokens > 0
