"""Model.prepack (oneDNN's prepacked linears, the engine's default on a CPU): the same products as F.linear, and a
model in any dtype still runs on a CPU whose oneDNN cannot pack that dtype (this project's AVX2 CPU has no
AVX-512 BF16/FP16 nor AVX-NE-CONVERT: packing bf16 there raised before a token was served)."""

import pytest
import torch
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM

import minispec
from tests.support import random_model


def packed_linears(model) -> int:
    return sum(hasattr(m, "packed") for m in model.modules() if isinstance(m, nn.Linear))


def test_float32_prepack_gives_f_linear_logits_through_packed_weights():
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


def test_prepack_keeps_a_linears_bias_and_packs_once(tmp_path):
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
