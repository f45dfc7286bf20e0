"""Model.prepack (oneDNN's prepacked linears, the engine's default on a CPU): the same products as F.linear, and a
model in any dtype still runs on a CPU whose oneDNN cannot pack that dtype (this project's AVX2 CPU has no
AVX-512 BF16/FP16 nor AVX-NE-CONVERT: packing bf16 there raised before a token was served)."""

import pytest
import torch
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM

import minispec
from minispec.model import llama
from tests.support import random_model


def packed_linears(model) -> int:
    return sum(hasattr(m, "packed") for m in model.modules() if isinstance(m, nn.Linear))


@pytest.fixture
def always_packed(monkeypatch):
    """Every product through oneDNN's packed weight (by default the small ones run through F.linear)."""
    monkeypatch.setattr(llama, "PACKED_MIN_MACS", 0)


def test_float32_prepack_gives_f_linear_logits_through_packed_weights(always_packed):
    model = random_model(seed=3, vocab=512)
    x = torch.randint(0, 512, (3, 17))  # (B, T)
    with torch.inference_mode():
        ref = model(x)  # (B, T, V)
        model.prepack()
        got = model(x)  # (B, T, V)
    if torch.backends.mkldnn.is_available():
        assert packed_linears(model) == sum(isinstance(m, nn.Linear) for m in model.modules()) > 0
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_prepack_packs_only_where_onednn_can(dtype):
    model = random_model(seed=4, vocab=512).to(dtype)
    x = torch.randint(0, 512, (2, 9))  # (B, T)
    with torch.inference_mode():
        ref = model(x).float()  # (B, T, V)
        model.prepack()
        got = model(x).float()  # (B, T, V)
    can = {torch.bfloat16: torch.ops.mkldnn._is_mkldnn_bf16_supported,
           torch.float16: torch.ops.mkldnn._is_mkldnn_fp16_supported}[dtype]()
    assert (packed_linears(model) > 0) == (can and torch.backends.mkldnn.is_available())
    torch.testing.assert_close(got, ref, rtol=2e-2, atol=2e-2)


def test_prepack_keeps_a_linears_bias_and_packs_once(tmp_path, always_packed):
    """A model with biased linears (Llama's attention_bias and mlp_bias, Qwen2's QKV bias) gives the same logits
    packed, and a second prepack (each Engine built on the model calls it) packs nothing again."""
    torch.manual_seed(0)
    hf = LlamaForCausalLM(LlamaConfig(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=1,
                                      num_attention_heads=4, num_key_value_heads=2, attention_bias=True,
                                      mlp_bias=True, max_position_embeddings=64))
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.endswith("bias"):
                p.normal_(0, 0.5)
    hf.save_pretrained(tmp_path)
    model, _ = minispec.load(tmp_path)
    x = torch.randint(0, 97, (2, 11))  # (B, T)
    with torch.inference_mode():
        ref = model(x)  # (B, T, V)
        packed = {id(m.packed) for m in model.prepack().modules() if hasattr(m, "packed")}
        again = {id(m.packed) for m in model.prepack().modules() if hasattr(m, "packed")}
        got = model(x)  # (B, T, V)
    if torch.backends.mkldnn.is_available():
        assert packed and again == packed
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)


def test_a_packed_model_sends_products_under_the_threshold_through_f_linear(monkeypatch):
    """oneDNN's call costs more than F.linear's before any arithmetic, so a product of fewer than PACKED_MIN_MACS
    multiply-adds (tokens x in x out) runs through F.linear; a larger one through the packed weight. Counted at a
    layer of 192 x 384 (the embedded target's qkv): 8 tokens (0.6M) and 32 (2.4M) on either side of 1M."""
    if not torch.backends.mkldnn.is_available():
        pytest.skip("no oneDNN: prepack packs nothing")
    calls = []
    f_linear = torch.nn.functional.linear
    monkeypatch.setattr(torch.nn.functional, "linear", lambda *a: calls.append(a[0].shape) or f_linear(*a))
    layer = nn.Linear(192, 384)
    layer.packed = torch.ops.mkldnn._reorder_linear_weight(layer.weight.detach(), None)
    with torch.inference_mode():
        for tokens in (1, 8, 32, 200):
            x = torch.randn(1, tokens, 192)
            torch.testing.assert_close(llama._packed_linear(layer, x), f_linear(x, layer.weight, layer.bias),
                                       rtol=1e-5, atol=1e-5)
    assert [s[1] for s in calls] == [1, 8]  # the tokens of the calls that went through F.linear
