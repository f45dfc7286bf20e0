"""Prompt lookup: draft the tokens that followed the row's last n-gram earlier in its own text, with no model.

Saxena 2023; vLLM's ``ngram``, Hugging Face's ``prompt_lookup_num_tokens``. The proposals are point
masses (:class:`~minispec.decoding.sampling.PointMass`), so the accept rule stays exact in O(B gamma)
memory, and c is about 0.
"""

from __future__ import annotations

import torch

from minispec.decoding.sampling import PointMass, Sampler
from minispec.drafts.base import Draft, DraftRun, Proposal


class PromptLookupDraft(Draft):
    """Prompt lookup: propose the tokens that followed the most recent earlier occurrence of the row's
    last n-gram (n from ``max_ngram`` down to ``min_ngram``, the longest that occurs wins) in the row's
    own prompt and output. Rows with no occurrence propose nothing that step.

    Its q is a point mass on each proposed token, held as a :class:`~minispec.decoding.sampling.PointMass`
    (no dense one-hot), so the unchanged accept rule stays exact: x is accepted with probability
    min(1, p(x) / 1) = p(x), and on rejection the token is drawn from norm(max(0, p - onehot(x))),
    which is p with x removed and renormalised. The batch verifies as many positions as the longest
    proposal in it (a plain step when none); vLLM verifies each request's own ragged draft instead.
    """

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1):
        for name, n in (("max_ngram", max_ngram), ("min_ngram", min_ngram)):
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {n!r}")
        if min_ngram > max_ngram:
            raise ValueError(f"min_ngram ({min_ngram}) must be at most max_ngram ({max_ngram})")
        self.max_ngram, self.min_ngram = max_ngram, min_ngram

    def start(self, target, state, sampler, features=None) -> _LookupRun:
        return _LookupRun(self, target.config.vocab_size, sampler)

    def __repr__(self) -> str:
        return f"PromptLookupDraft(max_ngram={self.max_ngram}, min_ngram={self.min_ngram})"


class _LookupRun(DraftRun):
    def __init__(self, draft: PromptLookupDraft, vocab_size: int, sampler: Sampler):
        super().__init__(sampler)
        self.max_ngram, self.min_ngram, self.vocab_size = draft.max_ngram, draft.min_ngram, vocab_size

    def propose(self, state, gamma):
        seq, total = state.seq, state.total  # (B, S), (B,)
        S = seq.shape[1]
        start = torch.full_like(total, -1)  # (B,) where the continuation starts; -1: no match yet
        for n in range(self.max_ngram, self.min_ngram - 1, -1):
            i = torch.arange(S - n + 1, device=seq.device)  # (S-n+1,) window starts
            match = (seq.unfold(1, n, 1) == state.last(n)[:, None, :]).all(-1)  # (B, S-n+1) window i == last n
            match &= i + n < total[:, None]  # an earlier occurrence (i >= 0, so total > n), with a next token
            latest = torch.where(match, i + n, -1).amax(1)  # (B,) the most recent one's continuation
            start = torch.where(start < 0, latest, start)
        k = torch.where(start < 0, 0, (total - start).clamp(0, gamma))  # (B,) tokens proposed
        # host sync: verify up to the batch's longest proposal (0: a plain step); vLLM: each request's own draft
        width = int(k.max())
        j = torch.arange(width, device=seq.device)  # (width,)
        x = seq.gather(1, (start.clamp_min(0)[:, None] + j).clamp_max(S - 1))  # (B, width)
        return Proposal(x, PointMass(j < k[:, None], self.vocab_size))  # (B, width), point masses
