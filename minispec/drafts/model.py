"""Draft models with a KV cache of their own: a smaller model, or the target's first layers (self-speculation).

:class:`ModelDraft` (Leviathan et al. 2023) runs a separate, smaller model sharing the target's
vocabulary; :class:`LayerSkipDraft` runs the target's first N layers, then its final norm and LM head.
Both draft a chain one cached forward pass per token, and grow trees level by level
(:class:`~minispec.drafts.tree.TreeDraft`). :func:`as_draft` wraps a bare model.
"""

from __future__ import annotations

from dataclasses import replace

from minispec.decoding.plain import prefill
from minispec.decoding.sampling import Sampler
from minispec.drafts.base import Draft, DraftRun
from minispec.model.llama import Model
from minispec.roofline import ModelShape


class ModelDraft(Draft):
    """A draft model: one cached forward pass per draft token (the first re-reads ``lag`` tokens).

    Each step the draft first re-reads the last ``lag`` tokens of each row: 2 after a speculative
    step, one more for each plain step since. Re-writing a slot it already holds is harmless (same
    token, same position), and it covers the case where every draft token was accepted and the draft
    never saw the last one, without a per-row branch.
    """

    def __init__(self, model: Model, num_layers: int | None = None):
        self.model, self.num_layers = model, num_layers
        cfg = model.config if num_layers is None else replace(model.config, num_hidden_layers=num_layers)
        self.shape = ModelShape.from_config(cfg, model.dtype.itemsize)

    def check(self, target: Model, positions: int) -> None:
        tv, dv = target.config.vocab_size, self.model.config.vocab_size
        if tv != dv:
            raise ValueError(f"the draft and target must share a vocabulary: target has {tv} tokens, draft has {dv}")
        if target.device != self.model.device:
            raise ValueError(f"target is on {target.device} but draft is on {self.model.device}; "
                             "move both to one device")
        if target.dtype != self.model.dtype:
            raise ValueError(f"target is {target.dtype} but draft is {self.model.dtype}; load both with the same dtype")
        if positions > self.model.config.max_position_embeddings:
            raise ValueError(f"the longest prompt plus max_new_tokens exceeds the draft's maximum length of "
                             f"{self.model.config.max_position_embeddings} positions")

    def start(self, target, state, sampler, features=None) -> _ModelRun:
        cache = self.model.new_cache(state.batch_size, state.slots, num_layers=self.num_layers)
        prefill(self.model, state, cache, self.num_layers)
        return _ModelRun(self, cache, sampler)

    def __repr__(self) -> str:
        return f"ModelDraft({self.shape.params / 1e6:.3g}M parameters)"


class _ModelRun(DraftRun):
    def __init__(self, draft: ModelDraft, cache, sampler: Sampler):
        super().__init__(sampler)
        self.model, self.num_layers, self.cache = draft.model, draft.num_layers, cache
        self.lag = 2  # tokens to re-read at the next catch-up (see ModelDraft)

    def catch_up(self, state):
        self.cache.trim(state.longest)
        self.cache.rollback((state.total - self.lag).clamp_min(0))
        logits = self.model(state.last(self.lag), self.cache, num_layers=self.num_layers)[:, -1]  # (B, V)
        return logits, None

    def extend(self, tokens, hidden, tree=None):
        return self.model(tokens, self.cache, num_layers=self.num_layers, tree=tree), None  # (B, w, V)

    def compact(self, root, slots):
        self.cache.compact(root, slots)

    def verified(self, path, n, features):
        self.lag = 2

    def skipped(self, features):
        self.lag += 1


class LayerSkipDraft(ModelDraft):
    """Self-speculation: the target's first ``num_layers`` layers, then its final norm and LM head.

    It shares every weight with the target (nothing is copied). Here it keeps a KV cache of its own
    ``num_layers`` layers and reads each prompt again: that is this package's choice, not the method's.
    LayerSkip (Elhoushi et al. 2024) shares the target's cache and verifies by running only the
    remaining layers. An early exit drafts well for checkpoints trained for it (LayerSkip); skipping
    layers in the middle of an ordinary model instead of the last ones (Draft & Verify, Zhang et al.
    2024; SWIFT, Xia et al. 2025) pays on 7-13B models without new training. A large vocabulary makes
    even a shallow draft costly, because the LM head is read in full every step.
    """

    def __init__(self, target: Model, num_layers: int):
        L = target.config.num_hidden_layers
        if isinstance(num_layers, bool) or not isinstance(num_layers, int) or not 1 <= num_layers <= L:
            raise ValueError(f"num_layers must be an integer from 1 to the target's {L} layers, got {num_layers!r}")
        super().__init__(target, num_layers)

    def check(self, target: Model, positions: int) -> None:
        if target is not self.model:
            raise ValueError("a LayerSkipDraft drafts with the target it was built from; pass that same target")

    def __repr__(self) -> str:
        return f"LayerSkipDraft({self.num_layers} of {self.model.config.num_hidden_layers} layers)"


def as_draft(draft) -> Draft:
    """A :class:`Draft` from a draft ``Model`` or a Draft."""
    if isinstance(draft, Draft):
        return draft
    if isinstance(draft, Model):
        return ModelDraft(draft)
    raise ValueError(f"draft must be a minispec Model or a Draft (PromptLookupDraft, LayerSkipDraft, TreeDraft, "
                     f"...), got {type(draft).__name__}")
