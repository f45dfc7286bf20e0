"""minispec's model against Hugging Face's own implementation, on random checkpoints."""

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM

import minispec
from minispec.model.llama import Model
from tests.support import random_model

SMALL = dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
             max_position_embeddings=128)
# Llama 3's scaling with every band in use at head_dim 16: wavelengths 6.3 (kept), 32 (smoothed, inside [100 / 4,
# 100 / 2]; a frequency that is not 1, so scaled * and / differ), 167 and up (divided by the factor); low_freq_factor
# 2, not Llama 3's 1, so that old / lo and old * lo differ too
LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 2.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 100}
CASES = {
    "llama-gqa-tied-llama3rope": (LlamaForCausalLM, LlamaConfig(**SMALL, num_key_value_heads=2,
                                                                tie_word_embeddings=True, rope_parameters=LLAMA3_ROPE)),
    "llama-bias-untied": (LlamaForCausalLM, LlamaConfig(**SMALL, num_key_value_heads=4, attention_bias=True,
                                                        mlp_bias=True, tie_word_embeddings=False)),
    "llama-linear-rope": (LlamaForCausalLM, LlamaConfig(**SMALL, num_key_value_heads=2, tie_word_embeddings=False,
                                                        rope_parameters={"rope_type": "linear", "rope_theta": 1e4,
                                                                         "factor": 4.0})),
    "mistral-sliding-window": (MistralForCausalLM, MistralConfig(**SMALL, num_key_value_heads=2, sliding_window=7,
                                                                 tie_word_embeddings=False)),
    "qwen2-qkv-bias-mqa": (Qwen2ForCausalLM, Qwen2Config(**SMALL, num_key_value_heads=1, tie_word_embeddings=True,
                                                         rope_parameters={"rope_type": "default",
                                                                          "rope_theta": 1e6})),
}


@pytest.fixture(scope="module", params=list(CASES))
def hf_and_ours(request, tmp_path_factory):
    cls, cfg = CASES[request.param]
    torch.manual_seed(0)
    hf = cls(cfg).eval()
    with torch.no_grad():  # random biases and norms, so that a missing one would show
        for name, p in hf.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.normal_(0, 0.5 if "norm" in name else 0.1).add_(1.0 if "norm" in name else 0.0)
    path = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(path)
    model, _ = minispec.load(path)
    return hf, model


def test_full_forward_matches_hf(hf_and_ours):
    hf, model = hf_and_ours
    x = torch.randint(0, 97, (3, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        diff = (hf(x).logits - model(x)).abs().max().item()
    assert diff <= 1e-4


def test_cached_decoding_matches_hf(hf_and_ours):
    hf, model = hf_and_ours
    x = torch.randint(0, 97, (2, 30), generator=torch.Generator().manual_seed(2))
    cache = model.new_cache(2, 30)
    with torch.no_grad():
        ref = hf(x).logits
        ours = torch.cat([model(x[:, :10], cache)] + [model(x[:, i : i + 1], cache) for i in range(10, 30)], 1)
    assert (ref - ours).abs().max().item() <= 1e-4
    assert cache.lengths.tolist() == [30, 30]


def test_parameter_count_matches_hf(hf_and_ours):
    hf, model = hf_and_ours
    assert model.config.num_parameters == sum(p.numel() for p in hf.parameters())


def test_sharded_checkpoint_loads(tmp_path):
    cls, cfg = CASES["llama-bias-untied"]
    torch.manual_seed(0)
    hf = cls(cfg).eval()
    hf.save_pretrained(tmp_path, max_shard_size="50KB")
    assert (tmp_path / "model.safetensors.index.json").exists()
    model, _ = minispec.load(tmp_path)
    x = torch.randint(0, 97, (1, 12))
    with torch.no_grad():
        assert (hf(x).logits - model(x)).abs().max().item() <= 1e-4


def test_dtype_and_device_arguments(tmp_path):
    cls, cfg = CASES["llama-gqa-tied-llama3rope"]
    cls(cfg).save_pretrained(tmp_path)
    model, _ = minispec.load(tmp_path, device="cpu", dtype=torch.bfloat16)
    assert model.dtype == torch.bfloat16 and model.inv_freq.dtype == torch.float32
    assert model.lm_head.weight is model.embed.weight  # still tied after the cast
    assert model(torch.tensor([[1, 2, 3]])).dtype == torch.bfloat16


def test_a_checkpoint_missing_weights_is_named_and_a_loaded_model_takes_no_gradients():
    model = random_model(seed=0)
    state = model.state_dict()
    loaded = Model.from_state_dict(model.config, state)
    assert not any(p.requires_grad for p in loaded.parameters())
    with pytest.raises(ValueError, match=r"the checkpoint lacks weights \['norm'\]"):
        Model.from_state_dict(model.config, {k: v for k, v in state.items() if k != "norm"})


def test_unsupported_architecture_is_named(tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel

    GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=50)).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="GPT2LMHeadModel.*LlamaForCausalLM"):
        minispec.load(tmp_path)


def test_unreachable_hub_says_how_to_pass_a_directory(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ValueError, match=r"hf download someone/\S+ --local-dir DIR.*--model DIR"):
        minispec.load("someone/some-model-that-is-not-cached")


def test_bad_source_is_named(tmp_path):
    with pytest.raises(ValueError, match="no config.json"):
        minispec.load(tmp_path)
    with pytest.raises(ValueError, match="neither a directory"):
        minispec.load("no-such-model")


@pytest.mark.parametrize("kw", [dict(tie_word_embeddings=True), dict(qkv_bias=True, architecture="Qwen2ForCausalLM"),
                                dict(sliding_window=(5, 5), architecture="MistralForCausalLM"),
                                dict(sliding_window=(None, 6), qkv_bias=True, architecture="Qwen2ForCausalLM")],
                         ids=["llama-tied", "qwen2", "mistral", "qwen2-sliding"])
def test_a_saved_checkpoint_round_trips_through_transformers(tmp_path, kw):
    """minispec writes what transformers reads: save_checkpoint, then AutoModelForCausalLM, same logits."""
    from transformers import AutoModelForCausalLM

    from minispec.model.config import ModelConfig
    from minispec.model.llama import Model
    from minispec.tools.train import save_checkpoint

    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=16, max_position_embeddings=128, **kw)
    ours = Model(cfg).eval()
    with torch.no_grad():
        for name, p in ours.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.normal_(1.0 if "norm" in name else 0.0, 0.2)
    save_checkpoint(ours, tmp_path)
    hf = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    assert type(hf).__name__ == cfg.architecture
    x = torch.randint(0, 97, (2, 20), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert (hf(x).logits - ours(x)).abs().max().item() <= 1e-4
    again, _ = minispec.load(tmp_path)
    with torch.no_grad():
        assert torch.equal(again(x), ours(x))


@pytest.mark.parametrize("raw", [
    dict(architectures=["Qwen2ForCausalLM"], use_sliding_window=True, sliding_window=16, max_window_layers=1),
    dict(architectures=["Qwen2ForCausalLM"], use_sliding_window=False, sliding_window=16, max_window_layers=1),
    dict(architectures=["MistralForCausalLM"]),
    dict(architectures=["MistralForCausalLM"], sliding_window=None),
], ids=["qwen2-sliding", "qwen2-off", "mistral-default", "mistral-none"])
def test_config_json_is_read_as_transformers_reads_it(raw):
    """load() reads config.json without transformers; the windows it derives are transformers' own."""
    from transformers import AutoConfig

    from minispec.model.config import config_from_hf

    raw = raw | dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
                     num_key_value_heads=2)
    theirs = AutoConfig.for_model({"Qwen2ForCausalLM": "qwen2", "MistralForCausalLM": "mistral"}[
        raw["architectures"][0]], **{k: v for k, v in raw.items() if k != "architectures"})
    theirs.architectures = raw["architectures"]
    assert config_from_hf(raw) == config_from_hf(theirs)


def test_a_compiled_model_makes_static_caches_unless_told_otherwise():
    """compile() fixes shapes, so the caches a compiled model makes attend over all their slots (static); a plain
    model's are trimmed to the longest row; static= overrides either."""
    model = random_model(seed=0)
    assert not model.new_cache(1, 8).static and model.new_cache(1, 8, static=True).static
    model.compile()  # wraps forward; nothing compiles until a call
    assert model.new_cache(1, 8).static and not model.new_cache(1, 8, static=False).static
