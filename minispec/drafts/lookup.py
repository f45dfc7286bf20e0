"""Prompt lookup: draft the tokens that followed the row's last n-gram earlier in its own text, with no model.

Saxena 2023; vLLM's ``ngram``, Hugging Face's ``prompt_lookup_num_tokens``. The proposals are point
masses (:class:`~minispec.decoding.sampling.PointMass`), so the accept rule stays exact in O(B gamma)
memory, and c is about 0.

Three rules that all take the longest n-gram ending the row (n at most ``max_ngram``) that occurred
earlier with at least one token after it, and propose up to gamma of the tokens that followed (fewer
when fewer follow before the row's end). They differ in which occurrence, and at the edges:

  ``rule="latest"`` (minispec's default)  the most recent occurrence; n from ``max_ngram`` down to
                                          ``min_ngram``.
  ``rule="vllm"``                          vLLM's ``ngram`` method (``vllm/v1/spec_decode/ngram_proposer.py``,
                                          0.32): the earliest occurrence; n in [``prompt_lookup_min``,
                                          ``prompt_lookup_max``]; and no proposal reaches past the model's
                                          maximum length (vLLM's ``max_model_len``; here the target's
                                          ``max_position_embeddings``, vLLM's default for it).
  Hugging Face (not an option here)        ``PromptLookupCandidateGenerator``: the earliest occurrence, n
                                          from ``max_matching_ngram_size`` down to 1 (no minimum), batch 1;
                                          it also cuts a proposal at its first EOS and at a token a logits
                                          processor forbids.

An occurrence may overlap the n-gram it matches (in "a a a a" the 2-gram "a a" occurs at 0, 1 and 2);
all three allow it. docs/VLLM.md shows where the rules part on real text.
"""

from __future__ import annotations

import torch

from minispec.decoding.sampling import PointMass, Sampler
from minispec.drafts.base import Draft, DraftRun, Proposal

RULES = ("latest", "vllm")


class PromptLookupDraft(Draft):
    """Prompt lookup: propose the tokens that followed an earlier occurrence of the row's last n-gram
    (n from ``max_ngram`` down to ``min_ngram``, the longest that occurs wins) in the row's own prompt
    and output. Rows with no occurrence propose nothing that step. ``rule``: which occurrence, "latest"
    (the most recent; the default) or "vllm" (the earliest, and never past the model's maximum length:
    vLLM's ``ngram`` with ``prompt_lookup_max=max_ngram, prompt_lookup_min=min_ngram``, proposal for
    proposal); see the module docstring.

    Its q is a point mass on each proposed token, held as a :class:`~minispec.decoding.sampling.PointMass`
    (no dense one-hot), so the unchanged accept rule stays exact: x is accepted with probability
    min(1, p(x) / 1) = p(x), and on rejection the token is drawn from norm(max(0, p - onehot(x))),
    which is p with x removed and renormalised. The batch verifies as many positions as the longest
    proposal in it (a plain step when none); vLLM verifies each request's own ragged draft instead.
    """

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1, rule: str = "latest"):
        for name, n in (("max_ngram", max_ngram), ("min_ngram", min_ngram)):
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {n!r}")
        if min_ngram > max_ngram:
            raise ValueError(f"min_ngram ({min_ngram}) must be at most max_ngram ({max_ngram})")
        if rule not in RULES:
            raise ValueError(f"rule must be one of {', '.join(map(repr, RULES))}, got {rule!r}")
        self.max_ngram, self.min_ngram, self.rule = max_ngram, min_ngram, rule

    def start(self, target, state, sampler, features=None) -> _LookupRun:
        # vLLM proposes nothing past max_model_len, by default the model's maximum length
        max_len = target.config.max_position_embeddings if self.rule == "vllm" else None
        return _LookupRun(self, target.config.vocab_size, sampler, max_len)

    def __repr__(self) -> str:
        rule = "" if self.rule == "latest" else f", rule={self.rule!r}"
        return f"PromptLookupDraft(max_ngram={self.max_ngram}, min_ngram={self.min_ngram}{rule})"


class _LookupRun(DraftRun):
    def __init__(self, draft: PromptLookupDraft, vocab_size: int, sampler: Sampler, max_len: int | None):
        super().__init__(sampler)
        self.max_ngram, self.min_ngram, self.vocab_size = draft.max_ngram, draft.min_ngram, vocab_size
        self.earliest, self.max_len = draft.rule == "vllm", max_len

    def propose(self, state, gamma):
        seq, total = state.seq, state.total  # (B, S), (B,)
        S = seq.shape[1]
        start = torch.full_like(total, -1)  # (B,) where the continuation starts; -1: no match yet
        for n in range(self.max_ngram, self.min_ngram - 1, -1):
            i = torch.arange(S - n + 1, device=seq.device)  # (S-n+1,) window starts
            match = (seq.unfold(1, n, 1) == state.last(n)[:, None, :]).all(-1)  # (B, S-n+1) window i == last n
            match &= i + n < total[:, None]  # an earlier occurrence (i >= 0, so total > n), with a next token
            if self.earliest:  # the first one's continuation (S: none)
                found = torch.where(match, i + n, S).amin(1)  # (B,)
                found = torch.where(found == S, -1, found)  # (B,)
            else:  # the most recent one's continuation
                found = torch.where(match, i + n, -1).amax(1)  # (B,)
            start = torch.where(start < 0, found, start)
        room = total - start  # (B,) tokens that follow the occurrence
        if self.max_len is not None:
            room = torch.minimum(room, self.max_len - total)  # (B,) never past the model's maximum length
        k = torch.where(start < 0, 0, room.clamp(0, gamma))  # (B,) tokens proposed
        # host sync: verify up to the batch's longest proposal (0: a plain step); vLLM: each request's own draft
        width = int(k.max())
        j = torch.arange(width, device=seq.device)  # (width,)
        x = seq.gather(1, (start.clamp_min(0)[:, None] + j).clamp_max(S - 1))  # (B, width)
        return Proposal(x, PointMass(j < k[:, None], self.vocab_size))  # (B, width), point masses
