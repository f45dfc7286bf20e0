"""Model.prepack (oneDNN's prepacked linears, the engine's default on a CPU): the same products as F.linear, and a
model in any dtype still runs on a CPU whose oneDNN cannot pack that dtype (this project's AVX2 CPU has no
AVX-512 BF16/FP16 nor AVX-NE-CONVERT: packing bf16 there raised before a token was served)."""

import pytest
import torch
from torch import nn

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
