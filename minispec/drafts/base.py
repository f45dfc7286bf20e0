"""The draft protocol: a Draft's configuration, one call's DraftRun and the Proposal it makes each step.

A draft proposes, per row and step, tokens x (B, T) and the distributions q they were drawn
from: dense (B, T, V), or point masses (:class:`~minispec.sampling.PointMass`, O(B * T) memory)
for tokens chosen deterministically. A row may propose fewer than T tokens, or none: q is zero at
a position where nothing was proposed, and the accept rule treats it as rejected with
max(0, p - 0) = p, so the row's token there is an ordinary draw from the target. T draft tokens
form a chain x_1..x_gamma, or the nodes of a tree (:class:`TreeDraft`).

A :class:`Draft` is configuration only; :meth:`Draft.start` reads one call's prompts and returns a
:class:`DraftRun` holding that call's state (its KV cache, what it has not yet read).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from minispec.decoding.plain import DecodeState
from minispec.decoding.sampling import DRAFT, PointMass, Sampler, probabilities, sample
from minispec.decoding.tree import Tree
from minispec.model.llama import Model, TreeMask
from minispec.roofline import ModelShape


class Proposal(NamedTuple):
    """One step's draft tokens for every row."""

    x: torch.Tensor  # (B, T) a chain x_1..x_T, or a tree's nodes 1..T
    q: torch.Tensor | PointMass  # (B, T, V) the distribution each token was drawn from, or point masses
    tree: Tree | None = None  # None: a chain


class DraftRun:
    """One call's drafting state: what :meth:`Draft.start` returns.

    Model-based runs implement :meth:`catch_up` and :meth:`extend`; the chain :meth:`propose` and
    :class:`TreeDraft` are built on those two.
    """

    features: tuple[int, ...] = ()  # target layers whose residual stream the draft reads (EAGLE); () none

    def __init__(self, sampler: Sampler):
        self.sampler = sampler

    def catch_up(self, state: DecodeState) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Read the row's tokens the draft has not seen; the draft's logits for the next token (B, V)
        and its hidden state there (B, C) (None for a draft that needs none)."""
        raise NotImplementedError

    def extend(self, tokens: torch.Tensor, hidden: torch.Tensor | None, tree: TreeMask | None = None):
        """Feed draft tokens (B, w) (each after the state ``hidden`` (B, w, C) its parent left); logits (B, w, V)
        and hidden states (B, w, C) or None. ``tree``: the tokens are nodes of a tree growing past the prefix."""
        raise NotImplementedError

    def propose(self, state: DecodeState, gamma: int) -> Proposal:
        """A chain of gamma tokens per row: each drawn from q (the draft's warped distribution), then fed back."""
        u = self.sampler.uniforms(DRAFT, state.total, gamma)  # (B, gamma) or None when greedy
        logits, h = self.catch_up(state)  # (B, V), (B, C) or None
        qs, xs = [], []
        for i in range(gamma):
            if i:
                logits, h = self.extend(xs[-1][:, None], None if h is None else h[:, None])
                logits, h = logits[:, -1], None if h is None else h[:, -1]  # (B, V), (B, C)
            qs.append(probabilities(logits, self.sampler.params))  # (B, V)
            xs.append(sample(qs[-1], None if u is None else u[:, i]))  # (B,)
        return Proposal(torch.stack(xs, 1), torch.stack(qs, 1))  # (B, gamma), (B, gamma, V)

    def compact(self, root: torch.Tensor, slots: torch.Tensor) -> None:
        """Move the accepted tree path's entries in the draft's own cache next to its prefix (see
        :meth:`~minispec.model.kv_cache.KVCache.compact`); slots (B, depth) relative to the root's slot ``root``."""

    def verified(self, path: torch.Tensor, n: torch.Tensor, features: torch.Tensor | None) -> None:
        """After a speculative step: path (B, depth) the accepted nodes (-1 past a row's n (B,)), and the
        target's ``features`` (B, 1 + depth, F) at the root and along the path (None unless asked for)."""

    def skipped(self, features: torch.Tensor | None) -> None:
        """After a plain step (gamma 0): the target fed one token per row (its ``features`` (B, 1, F))."""


class Draft:
    """A draft's configuration; :meth:`start` makes one call's :class:`DraftRun`."""

    shape: ModelShape | None = None  # what one draft step reads, for the cost model; None: free (c = 0)
    features: tuple[int, ...] = ()  # target layers whose residual stream the draft reads; () none

    def check(self, target: Model, positions: int) -> None:
        """Raise ValueError if this draft cannot serve ``target`` for sequences of ``positions`` tokens."""

    def observe(self, prompt: list[int], output: list[int]) -> None:
        """A request finished with ``output`` after ``prompt``. A draft that learns across requests keeps them
        (:class:`~minispec.drafts.suffix.SuffixDraft`); the engine calls this for every request that finishes."""

    def reset(self) -> None:
        """Forget every request :meth:`observe` kept, as if none had finished (a benchmark serving the same requests
        again starts here). Nothing to forget for a draft that keeps none."""

    def width(self, gamma: int) -> int:
        """The most slots one step writes past a row's tokens in the target's or the draft's cache, less the
        root's: gamma for a chain (the caches keep that many slots spare, plus one)."""
        return gamma

    def start(self, target: Model, state: DecodeState, sampler: Sampler,
              features: torch.Tensor | None = None) -> DraftRun:
        """Read the prompts (the loop times this as ``draft_prefill``: a cost in time to first token).
        ``features`` (B, P, F): the target's residual stream at every prompt position, if asked for."""
        raise NotImplementedError
