"""The engine's layer stack compiled, as vLLM's CPU build starts by default: ``Engine(compile=True)``.

``torch.compile`` (Inductor: C++ on a CPU, Triton on a GPU) fuses what the layers do between their matmuls (the
norms, the rotary embedding, the residual adds, SiLU-and-multiply) and drops the Python that issues each operator.
Two calls stay opaque to it, as vLLM keeps them ("piecewise" compilation):

- **attention**, :func:`paged_attention`: the step's own :meth:`~minispec.engine.attention.PagedStep.attend`
  (its groups, masks and sparse patterns are Python built once a step), reached through :data:`CURRENT`, as vLLM's
  ``unified_attention`` reaches its step through a forward context. It writes the layer's K and V into the pool,
  which is not one of its arguments: no compiled operator reads the pool, so nothing can be reordered around it.
- **the prepacked linear**, :func:`~minispec.model.llama.packed_linear`: oneDNN's call
  (:meth:`~minispec.model.llama.Model.prepack`), which Inductor cannot lower on its own with dynamic shapes.

One graph for every token count (``dynamic=True``; one token a pass, a batch of one decoding, compiles a second), both
built when the engine is (15-35 s on this project's 2-core CPU), as vLLM compiles at start-up, not in a measured step.
Every compiled model's graphs count against one budget of Dynamo's (``torch._dynamo.config.recompile_limit``, 8 by
default: four models a process), as :meth:`~minispec.model.llama.Model.compile`'s do; past it a step raises instead of
running eagerly. The tokens are the same as the eager step's up to float rounding (fused norms sum in another order).
The target's step only: a draft model's passes (through a paged view of its own KV), an EAGLE head's feature passes and
an early-exit draft's run the eager layers.
"""

from __future__ import annotations

import torch

from minispec.model.llama import opaque

CURRENT: list = [None]  # the PagedStep the compiled layers attend through, set around each compiled call


@opaque(lambda q, k, v, layer, window: torch.empty_like(q))  # (1, H, N, D)
def paged_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int,
                    window: int | None) -> torch.Tensor:
    """q (1, H, N, D), k and v (1, K, N, D): the current step's attention of ``layer`` (writes k, v into the pool)."""
    return CURRENT[0].attend(layer, q, k, v, window)  # (1, H, N, D)


class _Opaque:
    """What the compiled layers take for a cache: attention through :func:`paged_attention`."""

    attends = True

    def attend(self, layer, q, k, v, window):
        return paged_attention(q, k, v, layer, window)  # (1, H, N, D)


def compile_layers(model) -> None:
    """Compile ``model``'s layer stack for the engine's paged step, in place (:attr:`Model.paged_layers`)."""
    layers, cache = model.layers, _Opaque()

    def body(x, cos, sin):  # x (1, N, C), cos and sin (1, 1, N, D) -> (1, N, C)
        for block in layers:
            x = block(x, cos, sin, None, cache)
        return x

    compiled = torch.compile(body, dynamic=True, fullgraph=True)

    def run(x, cos, sin, step):
        CURRENT[0] = step
        try:
            return compiled(x, cos, sin)  # (1, N, C)
        finally:
            CURRENT[0] = None

    model.paged_layers = run
