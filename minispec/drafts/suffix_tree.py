"""The suffix trees of suffix decoding (Oliaro et al., NeurIPS 2025), as Arctic Inference builds and searches them.

A :class:`SuffixTree` holds token sequences and counts, for every string w of at most ``max_depth`` tokens, how
many times w occurs in them: ``count(w)``. Its node for w has a child for each token t that ever followed w, and
count(w + t) / count(w) is the empirical probability that t comes next. Arctic stores it path-compressed (a
chain of nodes with one child and equal counts is one node, O(N) memory); here every token is a node (a trie of
all substrings up to ``max_depth``, O(N * max_depth) nodes), which reads more simply and gives the same counts.
Each node keeps its children most frequent first, with ties in the order Arctic's sibling lists keep them:

- a new child goes last;
- a child whose count rises to c + 1 goes to the front of the children with count c + 1 if it headed the
  children with count c, else (it sat behind another child of count c) to the back of those with count c + 1;
- a child whose count falls to c - 1 (a sequence removed) goes to the front of those with count c - 1.

:meth:`SuffixTree.speculate` is Arctic's rule (``SuffixTree::speculate`` in its ``suffix_tree.cc``). For each
match length m = 1, 2, ... (up to the context's length less one) it finds the node of the context's last m
tokens, stopping at the first m that does not occur, and drafts from it at most ``max_spec_tokens`` and at most
``int(max_spec_factor * m + max_spec_offset)`` tokens:

- a **path** (``use_tree_spec=False``, what vLLM's ``suffix`` method verifies): each time the most frequent
  child, its probability the product of count(child) / count(parent) along the way, until it falls below
  ``min_token_prob``;
- a **tree** (``use_tree_spec=True``): best first by that probability (a binary max-heap, popped in the order
  libstdc++'s ``std::priority_queue`` pops it, so that ties go where Arctic's go), every child whose probability
  is at least ``min_token_prob``.

The draft's score is the sum of its tokens' probabilities; the best score wins, a tie going to the longer match.
Probabilities and scores are float32, rounded after each operation as Arctic's C++ rounds them, so that equal
and nearly equal scores compare as they do there. :class:`SuffixCache` is Arctic's ``SuffixDecodingCache``: a
tree per active request over its prompt and output, and one global tree over the outputs of up to
``max_cached_requests`` requests (first in, first out); a request drafts from whichever of its own tree and
the global tree scores higher (its own on a tie).
"""

from __future__ import annotations

import struct
from typing import NamedTuple

_F32 = struct.Struct("f")


def _f32(x: float) -> float:
    """x rounded to float32. One +, *, / of float32 values done in float64 and rounded once equals the float32
    operation exactly (float64 carries more than twice float32's 24 bits), so this is C++'s float arithmetic."""
    return _F32.unpack(_F32.pack(x))[0]


class Speculation(NamedTuple):
    """One draft: Arctic's ``Draft``."""

    token_ids: list[int]  # the draft's tokens, parents before children
    parents: list[int]  # each token's parent's index in token_ids, -1 for a child of the matched context
    probs: list[float]  # each token's estimated probability (float32)
    score: float = 0.0  # the sum of probs (float32, summed in order)
    match_len: int = 0  # how many context tokens matched


class _Node:
    __slots__ = ("token", "count", "kids", "order")

    def __init__(self, token: int = -1, count: int = 0):
        self.token, self.count = token, count  # count: occurrences of the string from the root to here
        self.kids: dict[int, _Node] | None = None  # token -> child; None for a leaf
        self.order: list[_Node] | None = None  # the children, most frequent first (not kept at the root)


class SuffixTree:
    """Counts of every substring of at most ``max_depth`` tokens of the sequences it holds, keyed by sequence id."""

    def __init__(self, max_depth: int):
        self.max_depth = max_depth
        self.root = _Node()
        self._seqs: dict[int, list[int]] = {}
        self._open: dict[int, list[_Node]] = {}  # per sequence: the nodes of its last max_depth suffixes

    @property
    def num_seqs(self) -> int:
        return len(self._seqs)

    def extend(self, seq_id: int, tokens) -> None:
        """Append ``tokens`` to sequence ``seq_id`` (a new one if unseen)."""
        seq, open_ = self._seqs.setdefault(seq_id, []), self._open.setdefault(seq_id, [])
        root = self.root
        for token in tokens:
            open_.append(root)  # the suffix starting at the new token
            root.count += 1
            if len(open_) > self.max_depth:
                open_.pop(0)  # that suffix has reached max_depth tokens: it grows no more
            seq.append(token)
            for i, node in enumerate(open_):
                child = node.kids.get(token) if node.kids else None
                if child is None:
                    child = _Node(token, 1)
                    if node.kids is None:
                        node.kids, node.order = {}, []
                    node.kids[token] = child
                    if node is not root:
                        node.order.append(child)
                elif node is root:
                    child.count += 1
                else:
                    _raise(node.order, child)
                open_[i] = child

    def remove(self, seq_id: int) -> None:
        """Forget sequence ``seq_id``: every count its substrings added goes back down."""
        seq, root = self._seqs.pop(seq_id), self.root
        del self._open[seq_id]
        for start in range(len(seq)):
            root.count -= 1
            node = root
            for token in seq[start : start + self.max_depth]:
                child = node.kids[token]
                if child.count == 1:  # its subtree held this suffix only
                    del node.kids[token]
                    if node is not root:
                        node.order.remove(child)
                    break
                if node is root:
                    child.count -= 1
                else:
                    _lower(node.order, child)
                node = child

    def node(self, context) -> _Node | None:
        """The node of the string ``context``, None if it does not occur."""
        node = self.root
        for token in context:
            node = node.kids.get(token) if node.kids else None
            if node is None:
                return None
        return node

    def speculate(self, context, max_spec_tokens: int, max_spec_factor: float = 1.0, max_spec_offset: float = 0.0,
                  min_token_prob: float = 0.1, use_tree_spec: bool = False) -> Speculation:
        """The best draft for what follows ``context`` (see the module docstring)."""
        factor, offset, floor = _f32(max_spec_factor), _f32(max_spec_offset), _f32(min_token_prob)
        grow = self._tree if use_tree_spec else self._path
        best = Speculation([], [], [])
        for m in range(1, len(context)):
            node = self.node(context[len(context) - m :])
            if node is None:
                break
            limit = max(0, min(max_spec_tokens, int(_f32(_f32(m * factor) + offset) + 1e-6)))
            draft = grow(node, limit, floor)
            if draft.score >= best.score:
                best = draft._replace(match_len=m)
        return best

    @staticmethod
    def _path(node: _Node, limit: int, floor: float) -> Speculation:
        tokens, probs, score, prob = [], [], 0.0, 1.0
        while len(tokens) < limit and prob >= floor and node.order:
            child = node.order[0]
            if child.count < node.count:  # a branch or an end: Arctic's node boundary (inside a node, count is equal)
                prob = _f32(prob * _f32(child.count / node.count))
                if prob < floor:
                    break
            tokens.append(child.token)
            probs.append(prob)
            score = _f32(score + prob)
            node = child
        return Speculation(tokens, list(range(-1, len(tokens) - 1)), probs, score)

    @staticmethod
    def _tree(node: _Node, limit: int, floor: float) -> Speculation:
        """Arctic's ``_speculate_tree``: a heap of items (prob, node, emit, parent). ``emit``: the item is the node's
        token, to draft; else it is the end of one of Arctic's compressed nodes, whose children go on the heap."""
        tokens, parents, probs, score = [], [], [], 0.0
        heap = _Heap()
        heap.push(_step(1.0, node, -1))
        while len(tokens) < limit and heap.items:
            prob, at, emit, parent = heap.pop()
            if emit:
                tokens.append(at.token)
                parents.append(parent)
                probs.append(prob)
                score = _f32(score + prob)
                heap.push(_step(prob, at, len(tokens) - 1))
            else:
                for child in at.order or ():
                    p = _f32(_f32(prob * child.count) / at.count)
                    if p < floor:
                        break
                    heap.push((p, child, True, parent))
        return Speculation(tokens, parents, probs, score)


def _step(prob: float, node: _Node, parent: int) -> tuple:
    """The item after ``node``: its only child at the same count is the next token of the same compressed node in
    Arctic's tree (drafted at the same probability); otherwise the node ends one, and its children come next."""
    if node.order and len(node.order) == 1 and node.order[0].count == node.count:
        return prob, node.order[0], True, parent
    return prob, node, False, parent


def _raise(order: list[_Node], child: _Node) -> None:
    """child.count += 1, keeping ``order`` (most frequent first) as Arctic's sibling list moves it."""
    c, i = child.count, order.index(child)
    if i and order[i - 1].count <= c + 1:  # it must move ahead: before the first child with the count ahead of it
        ahead, j = order[i - 1].count, i - 1
        while j and order[j - 1].count == ahead:
            j -= 1
        order.insert(j, order.pop(i))
    child.count = c + 1


def _lower(order: list[_Node], child: _Node) -> None:
    """child.count -= 1, moving it behind every sibling that still has its old count."""
    c, i = child.count, order.index(child)
    order.pop(i)
    while i < len(order) and order[i].count >= c:
        i += 1
    order.insert(i, child)
    child.count = c - 1


class _Heap:
    """``std::priority_queue`` ordered by an item's first field, as libstdc++ implements it (``push_heap`` sifts up,
    ``pop_heap`` moves the hole to a leaf, then sifts the last item up from there): equal items pop in its order."""

    def __init__(self):
        self.items: list[tuple] = []

    def push(self, item: tuple) -> None:
        self.items.append(item)
        self._up(len(self.items) - 1, item)

    def _up(self, hole: int, item: tuple) -> None:
        a = self.items
        while hole > 0 and a[(hole - 1) // 2][0] < item[0]:
            a[hole] = a[(hole - 1) // 2]
            hole = (hole - 1) // 2
        a[hole] = item

    def pop(self) -> tuple:
        a = self.items
        top, last = a[0], a.pop()
        n = len(a)
        if n:
            hole = child = 0
            while child < (n - 1) // 2:
                child = 2 * (child + 1)
                if a[child][0] < a[child - 1][0]:
                    child -= 1
                a[hole], hole = a[child], child
            if n % 2 == 0 and child == (n - 2) // 2:
                child = 2 * (child + 1)
                a[hole], hole = a[child - 1], child - 1
            self._up(hole, last)
        return top


class SuffixCache:
    """Arctic Inference's ``SuffixDecodingCache``: a tree per active request (its prompt, then its output as it
    grows) and a global tree over the outputs of the last ``max_cached_requests`` requests started (0: none)."""

    def __init__(self, max_tree_depth: int = 24, max_cached_requests: int = 10000):
        self.max_tree_depth, self.max_cached_requests = max_tree_depth, max_cached_requests
        self.global_tree = SuffixTree(max_tree_depth)
        self.local: dict[int, SuffixTree] = {}  # request id -> its own tree, while it runs
        self.cached: dict[int, None] = {}  # request ids whose output the global tree holds, oldest first

    def start_request(self, rid: int, prompt) -> None:
        """A request begins: its own tree reads the prompt; its output gets a place in the global tree (the oldest
        cached output is evicted beyond ``max_cached_requests``)."""
        if rid in self.local:
            raise ValueError(f"request {rid} is already active")
        self.local[rid] = tree = SuffixTree(self.max_tree_depth)
        tree.extend(0, prompt)
        if self.max_cached_requests:
            if rid in self.cached:
                self.evict_cached_response(rid)
            self.cached[rid] = None
            self.global_tree.extend(rid, ())
            while len(self.cached) > self.max_cached_requests:
                self.evict_cached_response(next(r for r in self.cached if r != rid))

    def add_active_response(self, rid: int, tokens) -> None:
        """Tokens the request produced: into its own tree and, while it is cached, the global one."""
        if rid not in self.local:
            raise ValueError(f"request {rid} is not active")
        self.local[rid].extend(0, tokens)
        if rid in self.cached:
            self.global_tree.extend(rid, tokens)

    def stop_request(self, rid: int) -> None:
        """The request ended: its own tree goes; its output stays in the global tree until evicted."""
        if rid not in self.local:
            raise ValueError(f"request {rid} is not active")
        del self.local[rid]

    def evict_cached_response(self, rid: int) -> None:
        del self.cached[rid]
        self.global_tree.remove(rid)

    def speculate(self, rid: int, context, max_spec_tokens: int, max_spec_factor: float = 1.0,
                  max_spec_offset: float = 0.0, min_token_prob: float = 0.1,
                  use_tree_spec: bool = False) -> Speculation:
        """The better of the request's own tree's draft and the global tree's, for its last ``max_tree_depth``
        tokens ``context``."""
        if rid not in self.local:
            raise ValueError(f"request {rid} is not active")
        context = context[-self.max_tree_depth :]
        args = (context, max_spec_tokens, max_spec_factor, max_spec_offset, min_token_prob, use_tree_spec)
        own, shared = self.local[rid].speculate(*args), self.global_tree.speculate(*args)
        return own if own.score >= shared.score else shared
