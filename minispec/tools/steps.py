"""Step times measured on this device: one forward at each batch and tokens per row; c from two runs.

:func:`measure_step_time` times one cached forward; :func:`step_time_table` fills the table a
:class:`~minispec.roofline.policy.MeasuredPolicy` and vLLM's K table are chosen from;
:func:`measured_draft_cost` reads c off a plain and a speculative run.
"""

from __future__ import annotations

import torch

from minispec.model.llama import Model
from minispec.roofline.hardware import median_time


def measure_step_time(model: Model, batch: int, tokens_per_row: int = 1, context: int = 64,
                      repeats: int = 5, num_layers: int | None = None) -> float:
    """Median seconds of one cached forward pass of ``tokens_per_row`` tokens for each of ``batch``
    rows at ``context`` tokens of history, through the first ``num_layers`` layers (default all: a
    layer-skip draft's step otherwise). Measured; :func:`minispec.roofline.step_time` models it."""
    cache = model.new_cache(batch, context + tokens_per_row, num_layers=num_layers)
    x = torch.randint(0, model.config.vocab_size, (batch, tokens_per_row), device=model.device)
    lengths = torch.full((batch,), context, device=model.device)

    def run():
        cache.rollback(lengths)
        model(x, cache, num_layers=num_layers)

    cache.trim(context)
    with torch.inference_mode():
        return median_time(run, model.device, repeats)


def step_time_table(target: Model, draft: Model, batches, gamma_max: int, context: int = 64, repeats: int = 5,
                    rounds: int = 1):
    """Measured target steps {(batch, tokens_per_row): s} for 1..gamma_max+1 tokens and draft steps {batch: s}.

    The table is measured ``rounds`` times, and each step keeps the fastest time measured for it or for
    any step that does at least as much work (as many rows or more, as many tokens per row or more):
    noise on a shared machine only adds time, and more work never takes less.
    """
    tables = [({(b, t): measure_step_time(target, b, t, context, repeats)
                for b in batches for t in range(1, gamma_max + 2)},
               {b: measure_step_time(draft, b, 1, context, repeats) for b in batches}) for _ in range(rounds)]
    fastest = {k: min(t[0][k] for t in tables) for k in tables[0][0]}
    target_s = {(B, T): min(s for (b, t), s in fastest.items() if b >= B and t >= T) for B, T in fastest}
    draft_s = {B: min(t[1][b] for t in tables for b in batches if b >= B) for B in batches}
    return target_s, draft_s


def measured_draft_cost(plain, spec) -> float:
    """c measured inside the loops: seconds per draft pass of a speculative run (its "draft" phase
    over the gammas it drafted, sampling included) over seconds per plain decode step (the
    "decode" phase of a plain run over its steps). Arguments: the ``.stats`` of the two runs."""
    per_draft = spec.phase_s["draft"] / sum(spec.gamma_per_step)
    return per_draft / (plain.phase_s["decode"] / plain.num_steps)
