"""What proposes draft tokens: a smaller model, the target's own first layers, or the text itself.

A draft proposes up to gamma tokens x (B, gamma) per row and the distributions q (B, gamma, V)
it drew them from. A row may propose fewer than gamma tokens, or none: q is all zero at a
position where nothing was proposed, and the accept rule treats that position as rejected with
max(0, p - 0) = p, so the row's token there is an ordinary draw from the target.

  ModelDraft        a separate, smaller model with its own KV cache (Leviathan et al. 2023)
  LayerSkipDraft    the target's first N layers, then its final norm and LM head: self-speculation
                    with no new weights (LayerSkip, Elhoushi et al. 2024), only a KV cache of N layers
  PromptLookupDraft the tokens that followed the last n-gram's most recent earlier occurrence in the
                    row's own prompt and output (Saxena 2023; vLLM's "ngram", Hugging Face's
                    prompt_lookup_num_tokens): no model, no memory, c ~ 0
"""

from __future__ import annotations

from dataclasses import replace

import torch
import torch.nn.functional as F

from minispec.decode import DecodeState, prefill
from minispec.model import Model
from minispec.roofline import ModelShape
from minispec.sampling import DRAFT, probabilities, sample


class Draft:
    """The interface the speculative loop uses."""

    shape: ModelShape | None = None  # what one draft step reads, for the cost model; None: free (c = 0)
    ragged = False  # rows may propose fewer than gamma tokens: verify only as many as the longest proposal

    def check(self, target: Model, positions: int) -> None:
        """Raise ValueError if this draft cannot serve ``target`` for sequences of ``positions`` tokens."""

    def start(self, state: DecodeState) -> None:
        """Read the prompts (the loop times this as ``draft_prefill``: a cost in time to first token)."""

    def propose(self, state: DecodeState, gamma: int) -> tuple[torch.Tensor, torch.Tensor]:
        """q (B, gamma, V) and x (B, gamma) for every row, from ``state``'s tokens."""
        raise NotImplementedError


class ModelDraft(Draft):
    """A draft model: gamma cached forward passes of one token per step (the first re-reads ``lag``).

    The draft cache re-reads the last ``lag`` tokens of each row at the start of a step: 2 after a
    speculative step, one more for each plain step since. Re-writing a slot it already holds is
    harmless (same token, same position), and it covers the case where all gamma tokens were
    accepted and the draft never saw x_gamma, without a per-row branch.
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

    def start(self, state: DecodeState) -> None:
        self.cache = self.model.new_cache(state.batch_size, state.slots, num_layers=self.num_layers)
        prefill(self.model, state, self.cache, self.num_layers)
        self.resume = 0  # the step at which the cache is one speculative step behind

    def propose(self, state: DecodeState, gamma: int) -> tuple[torch.Tensor, torch.Tensor]:
        lag = 2 + state.step - self.resume  # tokens to re-read (see the class doc)
        self.cache.trim(state.longest)
        self.cache.rollback((state.total - lag).clamp_min(0))
        inp, qs, xs, keys = state.last(lag), [], [], state.draw_keys(DRAFT, gamma)  # (B, lag), (B, gamma) keys
        for i in range(gamma):
            logits = self.model(inp, self.cache, num_layers=self.num_layers)[:, -1]  # (B, V)
            qs.append(probabilities(logits, state.params))  # (B, V)
            xs.append(sample(qs[-1], None if keys is None else keys[:, i]))  # (B,)
            inp = xs[-1][:, None]  # (B, 1)
        self.resume = state.step + 1
        return torch.stack(qs, 1), torch.stack(xs, 1)  # (B, gamma, V), (B, gamma)

    def __repr__(self) -> str:
        return f"ModelDraft({self.shape.params / 1e6:.3g}M parameters)"


class LayerSkipDraft(ModelDraft):
    """Self-speculation: the target's first ``num_layers`` layers, then its final norm and LM head.

    It shares every weight with the target (nothing is copied; the only new memory is a KV cache
    of ``num_layers`` layers). It drafts well only for checkpoints trained for early exit
    (LayerSkip); an ordinary model's early layers predict its output poorly, and a large
    vocabulary makes even a shallow draft costly, because the LM head is read in full every step.
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


class PromptLookupDraft(Draft):
    """Prompt lookup: propose the tokens that followed the most recent earlier occurrence of the row's
    last n-gram (n from ``max_ngram`` down to ``min_ngram``, the longest that occurs wins) in the row's
    own prompt and output. Rows with no occurrence propose nothing that step, and the target verifies
    only as many positions as the longest proposal in the batch (none: a plain step).

    Its q is a point mass on each proposed token, so the unchanged accept rule stays exact: x is
    accepted with probability min(1, p(x) / 1) = p(x), and on rejection the token is drawn from
    norm(max(0, p - onehot(x))), which is p with x removed and renormalised.
    """

    ragged = True

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1):
        for name, n in (("max_ngram", max_ngram), ("min_ngram", min_ngram)):
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {n!r}")
        if min_ngram > max_ngram:
            raise ValueError(f"min_ngram ({min_ngram}) must be at most max_ngram ({max_ngram})")
        self.max_ngram, self.min_ngram = max_ngram, min_ngram

    def check(self, target: Model, positions: int) -> None:
        self.vocab_size = target.config.vocab_size

    def propose(self, state: DecodeState, gamma: int) -> tuple[torch.Tensor, torch.Tensor]:
        seq, total = state.seq, state.total  # (B, S), (B,)
        S = seq.shape[1]
        start = torch.full_like(total, -1)  # (B,) where the continuation starts; -1: no match yet
        for n in range(self.max_ngram, self.min_ngram - 1, -1):
            i = torch.arange(S - n + 1, device=seq.device)  # (S-n+1,) window starts
            match = (seq.unfold(1, n, 1) == state.last(n)[:, None, :]).all(-1)  # (B, S-n+1) window i == last n
            match &= (i + n < total[:, None]) & (total[:, None] > n)  # an earlier occurrence, with a next token
            latest = torch.where(match, i + n, -1).amax(1)  # (B,) the most recent one's continuation
            start = torch.where(start < 0, latest, start)
        j = torch.arange(gamma, device=seq.device)  # (gamma,)
        k = torch.where(start < 0, 0, (total - start).clamp(0, gamma))  # (B,) tokens proposed
        x = seq.gather(1, (start.clamp_min(0)[:, None] + j).clamp_max(S - 1))  # (B, gamma)
        q = F.one_hot(x, self.vocab_size).float() * (j < k[:, None])[..., None]  # (B, gamma, V) point masses
        return q, x

    def __repr__(self) -> str:
        return f"PromptLookupDraft(max_ngram={self.max_ngram}, min_ngram={self.min_ngram})"


def as_draft(draft) -> Draft:
    """A :class:`Draft` from a draft ``Model`` or a Draft."""
    if isinstance(draft, Draft):
        return draft
    if isinstance(draft, Model):
        return ModelDraft(draft)
    raise ValueError(f"draft must be a minispec Model, PromptLookupDraft or LayerSkipDraft, got {type(draft).__name__}")
