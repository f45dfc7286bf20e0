"""Suffix decoding: draft what followed the row's latest tokens in its own prompt and output and in other requests'
outputs, as a chain or a tree whose size follows how often it followed, with no model.

SuffixDecoding (Oliaro et al., NeurIPS 2025; Arctic Inference; vLLM's ``method: "suffix"``). The counts live in
suffix trees (:mod:`minispec.drafts.suffix_tree`): one per running request over its prompt and output, and one
global tree over the outputs of the last ``max_cached_requests`` requests, so that a workload that repeats
itself across requests (the same task over many inputs, agents, code edits) drafts long runs of it. Each step a
row looks up every suffix of its last ``max_tree_depth`` tokens that the trees hold (1 token, 2, ...); from each
match of m tokens it drafts at most ``max_spec_factor * m + max_spec_offset`` tokens (and at most gamma) whose
estimated probability, the product of count(child) / count(parent) along the path, is at least
``min_token_prob``, and it keeps the draft whose probabilities sum highest (Arctic's score; a tie goes to the
longer match). A long, frequent match drafts many tokens; a short or rare one few or none. The proposals are
point masses (:class:`~minispec.decoding.sampling.PointMass`), so the accept rule stays exact, and c is about 0
(the trees are searched on the host, in Python here, in C++ in Arctic).

In :class:`minispec.Engine` a SuffixDraft keeps nothing in the engine's blocks (its trees are its own): the engine
builds a run each step with its base keeper, and calls :meth:`SuffixDraft.observe` on each request that finishes.
"""

from __future__ import annotations

import math
from collections import Counter

import torch

from minispec.decoding.sampling import PointMass, Sampler
from minispec.decoding.tree import Tree
from minispec.drafts.base import Draft, DraftRun, Proposal
from minispec.drafts.suffix_tree import Speculation, SuffixCache


class _Request:
    """A request the trees know: its id in the :class:`SuffixCache`, its prompt, the output tokens they have read, and
    ``key``, the tuple of its prompt and those tokens (how a row finds its request)."""

    __slots__ = ("rid", "prompt", "seen", "key", "listed")

    def __init__(self, rid: int, prompt: list[int]):
        self.rid, self.prompt, self.seen, self.key = rid, prompt, [], tuple(prompt)
        self.listed = False  # in the draft's index (else a row holds it, or it has ended)


class SuffixDraft(Draft):
    """Suffix decoding: per row, a chain (``use_tree_spec=False``: vLLM's ``suffix`` method) or a tree
    (``use_tree_spec=True``: Arctic Inference's tree speculation) of at most gamma draft tokens from suffix trees
    over the row's own prompt and output and over the outputs of earlier requests. Parameters as vLLM and Arctic
    name them (vLLM's defaults; vLLM's ``num_speculative_tokens``, the most a step drafts, is gamma here):

    - ``max_tree_depth`` (24): the longest context suffix matched, and the trees' depth;
    - ``max_spec_factor`` (1.0), ``max_spec_offset`` (0.0): a match of m tokens drafts at most
      ``int(max_spec_factor * m + max_spec_offset)`` tokens;
    - ``min_token_prob`` (0.1): a token is drafted only if its estimated probability is at least this;
    - ``max_cached_requests`` (10000): the global tree holds the outputs of this many requests, the oldest
      evicted first; 0: no global tree, each row drafts from its own prompt and output only.

    Unlike the other drafts, a SuffixDraft remembers across calls: the global tree learns every request's output
    as it is produced and keeps it once the request ends, so each call of :func:`minispec.speculative_generate`
    (every row of it) and each request an engine serves teaches the next ones. :meth:`reset` forgets.

    **The finish hook.** A run learns a row's tokens as they come and ends the row's request when it stops
    (its own prompt tree is dropped; its output stays in the global tree). An engine whose rows come and go
    builds a run per step and stops rows itself (at EOS, say): it must call :meth:`observe` with each finished
    request's prompt and output. Rows are matched to requests by their tokens (the prompt, and an output that
    extends the one seen), so a fresh run each step picks up each request's trees where it left them.

    Like vLLM, a request's last step teaches the trees every token the target produced in it, also those that
    max_new_tokens or EOS then cut. The batch verifies as many positions as the longest proposal in it (a plain
    step when none); vLLM verifies each request's own ragged draft.
    """

    def __init__(self, max_tree_depth: int = 24, max_spec_factor: float = 1.0, max_spec_offset: float = 0.0,
                 min_token_prob: float = 0.1, max_cached_requests: int = 10000, use_tree_spec: bool = False):
        for name, v, low in (("max_tree_depth", max_tree_depth, 1), ("max_cached_requests", max_cached_requests, 0)):
            if isinstance(v, bool) or not isinstance(v, int) or v < low:
                raise ValueError(f"{name} must be an integer >= {low}, got {v!r}")
        for name, v in (("max_spec_factor", max_spec_factor), ("max_spec_offset", max_spec_offset),
                        ("min_token_prob", min_token_prob)):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise ValueError(f"{name} must be a finite number, got {v!r}")
        if max_spec_factor < 0:
            raise ValueError(f"max_spec_factor must be >= 0, got {max_spec_factor!r}")
        if not 0 <= min_token_prob <= 1:
            raise ValueError(f"min_token_prob must be in [0, 1], got {min_token_prob!r}")
        if not isinstance(use_tree_spec, bool):
            raise ValueError(f"use_tree_spec must be True or False, got {use_tree_spec!r}")
        self.max_tree_depth, self.max_cached_requests = max_tree_depth, max_cached_requests
        self.max_spec_factor, self.max_spec_offset = float(max_spec_factor), float(max_spec_offset)
        self.min_token_prob, self.use_tree_spec = float(min_token_prob), use_tree_spec
        self.reset()

    def reset(self) -> None:
        """Forget every request: empty trees."""
        self.cache = SuffixCache(self.max_tree_depth, self.max_cached_requests)
        self._live: dict[tuple[int, ...], list[_Request]] = {}  # prompt + output read -> running requests
        self._ended: dict[tuple[int, ...], list[_Request]] = {}  # prompt + output -> ended by a run, not observed
        self._n_ended, self._next = 0, 0

    def start(self, target, state, sampler, features=None) -> _SuffixRun:
        return _SuffixRun(self, target.config.vocab_size, sampler)

    def observe(self, prompt, output) -> None:
        """A request has finished with ``output`` (token ids, EOS included if it stopped there) after ``prompt``:
        its prompt tree goes and its output stays in the global tree, learned now if no run saw it all (it
        stopped at EOS, or at its first token, before any draft step). Calling it again for the same request
        adds nothing; a request no run has seen (served elsewhere) is learned as a new one."""
        prompt, output = _ids(prompt, "prompt"), _ids(output, "output")
        ended = self._ended.get(tuple(prompt + output))
        if ended:  # a run saw it end: confirmed
            ended.pop(0)
            self._n_ended -= 1
            if not ended:
                del self._ended[tuple(prompt + output)]
            return
        req = self._find(prompt, output) or self._begin(prompt)
        self._learn(req, output)
        self._end(req)

    def __repr__(self) -> str:
        return (f"SuffixDraft(max_tree_depth={self.max_tree_depth}, max_spec_factor={self.max_spec_factor}, "
                f"max_spec_offset={self.max_spec_offset}, min_token_prob={self.min_token_prob}, "
                f"max_cached_requests={self.max_cached_requests}, use_tree_spec={self.use_tree_spec})")

    # --- requests, as the cache sees them --------------------------------------------------------------------

    def _begin(self, prompt: list[int]) -> _Request:
        """A new request, out of the index (its row holds it until the step's proposals are made)."""
        req = _Request(self._next, prompt)
        self._next += 1
        self.cache.start_request(req.rid, prompt)
        return req

    def _find(self, prompt: list[int], output: list[int]) -> _Request | None:
        """Take out of the index the running request whose trees have read the most of ``output`` after ``prompt``
        (and nothing else), or None. A row of a fresh run (an engine's step) finds its request so."""
        tokens = prompt + output
        for k in range(len(tokens), len(prompt) - 1, -1):  # most recently, the row's last step's tokens are new
            reqs = self._live.get(tuple(tokens[:k]))
            if reqs:
                req = reqs[-1]
                self._unlist(req)
                return req
        return None

    def _list(self, req: _Request) -> None:
        self._live.setdefault(req.key, []).append(req)
        req.listed = True

    def _unlist(self, req: _Request) -> None:
        reqs = self._live[req.key]
        reqs.remove(req)
        if not reqs:
            del self._live[req.key]
        req.listed = False

    def _learn(self, req: _Request, output: list[int]) -> None:
        """The request's output so far (or past it): the tokens its trees have not read."""
        new = output[len(req.seen) :]
        if new:
            listed = req.listed
            if listed:
                self._unlist(req)
            self.cache.add_active_response(req.rid, new)
            req.seen += new
            req.key = tuple(req.prompt + req.seen)
            if listed:
                self._list(req)

    def _end(self, req: _Request, emitted: tuple[int, ...] | None = None) -> None:
        """The request (out of the index) ended; ``emitted``: its prompt and output, if a run ended it (held until
        :meth:`observe` confirms it, so that the engine's call adds nothing twice)."""
        if req.listed:
            self._unlist(req)
        self.cache.stop_request(req.rid)
        if emitted is not None and req.rid in self.cache.cached:
            self._ended.setdefault(emitted, []).append(req)
            self._n_ended += 1
            if self._n_ended > 2 * self.max_cached_requests + 64:  # forget those whose output has been evicted
                self._ended = {k: kept for k, v in self._ended.items()
                               if (kept := [r for r in v if r.rid in self.cache.cached])}
                self._n_ended = sum(map(len, self._ended.values()))


def _ids(tokens, what: str) -> list[int]:
    tokens = tokens.tolist() if isinstance(tokens, torch.Tensor) else tokens
    if not isinstance(tokens, (list, tuple)) or not all(
            isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in tokens):
        raise ValueError(f"{what} must be a list of token ids (integers >= 0), got {tokens!r}")
    return list(tokens)


class _SuffixRun(DraftRun):
    """One call's drafting (or, in an engine, one step's): each row's request, and what the step started from."""

    def __init__(self, draft: SuffixDraft, vocab_size: int, sampler: Sampler):
        super().__init__(sampler)
        self.draft, self.vocab_size = draft, vocab_size
        self.requests: list[_Request | None] | None = None  # per row, once found or begun

    def propose(self, state, gamma):
        d = self.draft
        # host sync: the trees are host data structures (as Arctic's and vLLM's are); each row's tokens come over
        seqs, totals, plens, done = (t.tolist() for t in (state.seq, state.total, state.prompt_len, state.done))
        if self.requests is None:
            self.requests = [None] * len(seqs)
        drafts: list[Speculation | None] = []
        for b, row in enumerate(seqs):  # row by row, as vLLM's proposer: a row sees the rows before it this step
            if done[b]:
                drafts.append(None)
                continue
            prompt, output = row[: plens[b]], row[plens[b] : totals[b]]
            req = self.requests[b]
            if req is None:
                req = self.requests[b] = d._find(prompt, output) or d._begin(prompt)
            d._learn(req, output)
            context = row[max(0, totals[b] - d.max_tree_depth) : totals[b]]
            drafts.append(d.cache.speculate(req.rid, context, gamma, d.max_spec_factor, d.max_spec_offset,
                                            d.min_token_prob, d.use_tree_spec))
        for b, req in enumerate(self.requests):  # listed under what they have read: an engine's next run finds them
            if not done[b] and not req.listed:
                d._list(req)
        self.state, self.starts, self.running = state, totals, [not x for x in done]
        return _proposal(drafts, self.vocab_size, d.use_tree_spec, state.device)

    def verified(self, path, n, features):
        self._learn_ended(n)

    def skipped(self, features):
        self._learn_ended(torch.zeros_like(self.state.total))

    def _learn_ended(self, n: torch.Tensor) -> None:
        """Rows that ended this step: learn every token the step produced (n + 1 per row), then end the request."""
        state = self.state
        # host sync: which rows ended (the trees must learn their last tokens before the request is dropped)
        done, n, totals = torch.stack([state.done.long(), n, state.total]).tolist()
        ended = [b for b, r in enumerate(self.running) if r and done[b]]
        if not ended:
            return
        rows, plens = state.seq[ended].tolist(), state.prompt_len[ended].tolist()
        for b, row, p in zip(ended, rows, plens):
            req = self.requests[b]
            self.draft._learn(req, row[p : self.starts[b] + n[b] + 1])
            self.draft._end(req, emitted=tuple(row[: totals[b]]))
            self.running[b] = False


def _proposal(drafts: list[Speculation | None], vocab_size: int, tree: bool, device) -> Proposal:
    """Point masses on each row's draft: a chain (B, W), or per-row trees padded to W nodes with unproposed nodes
    under the root (q = 0: never accepted), W the most tokens any row drafted."""
    tokens = [d.token_ids if d is not None else [] for d in drafts]
    W = max(map(len, tokens), default=0)
    pad = [t + [0] * (W - len(t)) for t in tokens]
    x = torch.tensor(pad, dtype=torch.long, device=device).view(len(drafts), W)  # (B, W)
    k = torch.tensor([len(t) for t in tokens], device=device)  # (B,) tokens each row drafted
    q = PointMass(torch.arange(W, device=device) < k[:, None], vocab_size)  # (B, W)
    if not tree or W == 0:
        return Proposal(x, q)
    parents, depth, width = [], 1, 1
    for d in drafts:
        par = [p + 1 for p in d.parents] if d is not None else []  # node j's parent at j - 1 (0: the root)
        level = [0]
        for p in par:
            level.append(level[p] + 1)
        depth, width = max(depth, *level), max(width, *Counter(par).values()) if par else width
        parents.append(par + [0] * (W - len(par)))
    return Proposal(x, q, Tree(torch.tensor(parents, device=device), depth, width))  # parent (B, W)
