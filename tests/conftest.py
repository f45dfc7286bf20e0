import os

import pytest
import torch

from minispec.model import Model, ModelConfig

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tests never touch the network
if os.environ.get("PYTEST_XDIST_WORKER"):  # pytest -n 2: one thread per worker, not two workers fighting for 2 cores
    torch.set_num_threads(1)


def tiny_config(layers=2, hidden=64, heads=4, kv_heads=2, vocab=64, positions=256, **kw) -> ModelConfig:
    return ModelConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                       num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=hidden // heads,
                       max_position_embeddings=positions, **kw)


def random_model(seed=0, logit_scale=1.0, **kw) -> Model:
    """A randomly initialised model; ``logit_scale`` > 1 sharpens its distributions."""
    torch.manual_seed(seed)
    model = Model(tiny_config(**kw)).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(logit_scale)
    return model.requires_grad_(False)


@pytest.fixture(scope="session")
def pair():
    """A random target and a smaller random draft sharing a 64-token vocabulary."""
    return random_model(seed=0), random_model(seed=1, layers=1, hidden=32, heads=2, kv_heads=1)
