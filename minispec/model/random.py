"""Random-weight models of named shapes, for systems measurements without a download.

``SHAPES`` holds Hugging Face config fields (Llama-3-8B and smaller); :func:`random_model` builds one
directly on the device in the requested dtype. Timing does not depend on the weights; acceptance does,
which is why benchmarks on these use a synthetic acceptance rate and say so.
"""

from __future__ import annotations

import torch

from minispec.model.config import ModelConfig
from minispec.model.llama import Model

# Random-weight shapes for systems measurements without a download (Hugging Face config names).
SHAPES = {
    # meta-llama/Meta-Llama-3-8B config.json
    "llama-8b": dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                     num_attention_heads=32, num_key_value_heads=8, head_dim=128, rope_theta=500000.0,
                     max_position_embeddings=8192),
    # meta-llama/Llama-3.2-1B config.json
    "llama-1b": dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                     num_attention_heads=32, num_key_value_heads=8, head_dim=64, rope_theta=500000.0,
                     max_position_embeddings=8192, tie_word_embeddings=True),
    # Two layers of Llama-3.2-1B with its tied embedding: about 5 % of llama-8b's weight bytes.
    "llama-draft-2l": dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=2,
                           num_attention_heads=32, num_key_value_heads=8, head_dim=64, rope_theta=500000.0,
                           max_position_embeddings=8192, tie_word_embeddings=True),
    # Small shapes of the same family, for running this file's code paths on a CPU.
    "tiny": dict(vocab_size=256, hidden_size=256, intermediate_size=688, num_hidden_layers=8, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=64, max_position_embeddings=1024),
    "tiny-draft": dict(vocab_size=256, hidden_size=64, intermediate_size=172, num_hidden_layers=1,
                       num_attention_heads=2, num_key_value_heads=1, head_dim=32, max_position_embeddings=1024),
}


def random_model(shape: str, device="cpu", dtype=torch.float32, seed: int = 0) -> Model:
    """A randomly initialised model of a named shape (see SHAPES), built directly on the device."""
    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}; shapes: {', '.join(SHAPES)}")
    torch.manual_seed(seed)
    with torch.device(device):
        model = Model(ModelConfig(**SHAPES[shape]))
    return model.to(dtype).eval().requires_grad_(False)
