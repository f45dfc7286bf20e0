"""Suffix decoding's trees against a brute-force reference: what SuffixCache drafts, checked by a search over the
token history itself.

The reference (:class:`Naive`, :class:`NaiveCache`) keeps the raw sequences and counts a string by scanning
them every time it is asked; the children of a string are ordered by count, ties by replaying Arctic's
sibling-list rule with those scanned counts (its own formulation: "front or back of the group with the new
count"). Paths are compared exactly. A tree is checked without any heap: its probabilities must be the largest
``limit`` of every candidate continuation's (in non-increasing order, so its float32 score is determined), each
node must be a real continuation with the probability the scan gives, and nothing likelier may be left out.
tests/vllm/test_suffix_vllm.py compares the same cache with Arctic Inference's own C++ tree, order included.
"""

from __future__ import annotations

import struct

import pytest
from support import suffix_histories

from minispec.drafts.suffix_tree import Speculation, SuffixCache, SuffixTree


def f32(x: float) -> float:
    return struct.unpack("f", struct.pack("f", x))[0]


class Naive:
    """Sequences, scanned on every count; each string's children in Arctic's order, replayed on every change."""

    def __init__(self, depth: int):
        self.depth, self.seqs, self.gone, self.kids = depth, {}, {}, {}  # kids: string -> child tokens, in order

    def count(self, s: tuple) -> int:
        """Occurrences of s (positions a sequence being removed has passed no longer count)."""
        n = len(s)
        return sum(tuple(seq[i : i + n]) == s for sid, seq in self.seqs.items()
                   for i in range(self.gone.get(sid, 0), len(seq) - n + 1))

    def children(self, w: tuple) -> list[int]:
        return [t for t in self.kids.get(w, []) if self.count(w + (t,)) > 0]

    def _move(self, w: tuple, t: int, up: bool) -> None:
        """t's count under w changes by one (+1 if ``up``); counts are scanned before the change."""
        order = self.kids.setdefault(w, [])
        c = self.count(w + (t,))
        if up and c == 0:  # a new child: last
            order.append(t)
            return
        cnt = {x: self.count(w + (x,)) for x in order}
        i = order.index(t)
        rest = order[:i] + order[i + 1 :]
        if up:  # to the front of the group with count c + 1 if it led the group with count c, else to its back
            led = i == 0 or cnt[order[i - 1]] != c
            pos = next((j for j, x in enumerate(rest) if cnt[x] <= (c + 1 if led else c)), len(rest))
        else:  # to the front of the group with count c - 1
            pos = next((j for j, x in enumerate(rest) if cnt[x] < c), len(rest))
        order[:] = rest[:pos] + [t] + rest[pos:]

    def extend(self, sid: int, tokens) -> None:
        for t in tokens:
            seq = self.seqs.setdefault(sid, [])
            for start in range(max(0, len(seq) + 1 - self.depth), len(seq) + 1):
                w = tuple(seq[start:])
                if w:  # the root's children are not ordered
                    self._move(w, t, up=True)
            seq.append(t)

    def remove(self, sid: int) -> None:
        seq = self.seqs[sid]
        for start in range(len(seq)):
            self.gone[sid] = start
            for n in range(1, min(self.depth, len(seq) - start) + 1):
                s = tuple(seq[start : start + n])
                if self.count(s) == 1:  # the last occurrence: the string and everything below it go
                    if n > 1:
                        self.kids[s[:-1]].remove(s[-1])
                    self.kids = {w: v for w, v in self.kids.items() if w[: len(s)] != s}
                    break
                if n > 1:
                    self._move(s[:-1], s[-1], up=False)
        del self.seqs[sid]
        self.gone.pop(sid, None)

    def path(self, w: tuple, limit: int, floor: float) -> Speculation:
        tokens, probs, score, prob = [], [], 0.0, 1.0
        while len(tokens) < limit and prob >= floor:
            kids = self.children(w)
            if not kids:
                break
            c, n = self.count(w + (kids[0],)), self.count(w)
            if c < n:
                prob = f32(prob * f32(c / n))
                if prob < floor:
                    break
            tokens.append(kids[0])
            probs.append(prob)
            score = f32(score + prob)
            w += (kids[0],)
        return Speculation(tokens, list(range(-1, len(tokens) - 1)), probs, score)

    def candidates(self, w: tuple, prob: float, floor: float, below: tuple = ()) -> dict[tuple, float]:
        """Every continuation of w (as the tokens after w) a tree may draft, with its probability."""
        out, kids, n = {}, self.children(w), self.count(w)
        for t in kids:
            c = self.count(w + (t,))
            p = prob if c == n else f32(f32(prob * c) / n)  # equal counts: inside one of Arctic's nodes
            if p >= floor:
                out[below + (t,)] = p
                out |= self.candidates(w + (t,), p, floor, below + (t,))
        return out

    def speculate(self, context, limit_max, factor=1.0, offset=0.0, floor=0.1, tree=False):
        """(best draft, its candidates if a tree) by the same match-length rule as Arctic's."""
        best, best_cands = Speculation([], [], []), {}
        factor, offset, floor = f32(factor), f32(offset), f32(floor)
        for m in range(1, len(context)):
            w = tuple(context[len(context) - m :])
            if self.count(w) == 0:
                break
            limit = max(0, min(limit_max, int(f32(f32(m * factor) + offset) + 1e-6)))
            if tree:
                cands = self.candidates(w, 1.0, floor)
                probs = sorted(cands.values(), reverse=True)[:limit]
                score = 0.0
                for p in probs:
                    score = f32(score + p)
                draft = Speculation(None, None, probs, score)
            else:
                draft, cands = self.path(w, limit, floor), {}
            if draft.score >= best.score:
                best, best_cands = draft._replace(match_len=m), cands
        return best, best_cands


class NaiveCache:
    """SuffixCache's requests over :class:`Naive` trees."""

    def __init__(self, depth: int, max_cached: int):
        self.depth, self.max_cached, self.glob, self.local, self.cached = depth, max_cached, Naive(depth), {}, []

    def start_request(self, rid, prompt):
        self.local[rid] = Naive(self.depth)
        self.local[rid].extend(0, prompt)
        if self.max_cached:
            self.glob.seqs[rid] = []
            self.cached.append(rid)
            while len(self.cached) > self.max_cached:
                self.glob.remove(self.cached.pop(0))

    def add_active_response(self, rid, tokens):
        self.local[rid].extend(0, tokens)
        if rid in self.cached:
            self.glob.extend(rid, tokens)

    def stop_request(self, rid):
        del self.local[rid]

    def speculate(self, rid, context, *args):
        context = context[-self.depth :]
        own, shared = self.local[rid].speculate(context, *args), self.glob.speculate(context, *args)
        return own if own[0].score >= shared[0].score else shared


def check(got: Speculation, want: tuple, tree: bool) -> None:
    """``got`` (SuffixCache's) is the reference's draft: exactly for a path; for a tree, by its probabilities."""
    ref, cands = want
    if not tree:
        assert got == ref
        return
    assert (got.match_len, got.score, got.probs) == (ref.match_len, ref.score, ref.probs)
    paths = []
    for t, p, prob in zip(got.token_ids, got.parents, got.probs):
        assert -1 <= p < len(paths)  # parents come first
        paths.append((paths[p] if p >= 0 else ()) + (t,))
        assert cands[paths[-1]] == prob  # a real continuation, with the probability the scan gives
    assert len(set(paths)) == len(paths)
    if got.probs:
        assert all(p <= got.probs[-1] or path in paths for path, p in cands.items())  # nothing likelier left out


# --- by hand ----------------------------------------------------------------------------------------------

def test_a_path_by_hand():
    """1 2 3 1 2 4 1 2: "2" and "1 2" occur three times, followed once each by 3 and by 4 (3 first: a tie goes to
    the child made first) and once by nothing. A match of m tokens drafts at most m (factor 1)."""
    cache = SuffixCache(max_tree_depth=24, max_cached_requests=0)
    cache.start_request(0, [1, 2, 3, 1, 2, 4, 1, 2])
    third = f32(1 / 3)
    m2 = cache.speculate(0, [1, 2, 3, 1, 2, 4, 1, 2], max_spec_tokens=8)
    assert m2 == Speculation([3, 1], [-1, 0], [third, third], f32(third + third), 2)  # beats m = 1's [3] (1/3)
    # longer matches (4 1 2, 2 4 1 2, ...) occur once, at the end, with nothing after: empty drafts, score 0
    assert cache.speculate(0, [1, 2, 3, 1, 2, 4, 1, 2], max_spec_tokens=8, min_token_prob=0.4) == \
        Speculation([], [], [], 0.0, 7)  # nothing reaches 0.4; a tie at score 0 goes to the longest match
    assert cache.speculate(0, [1, 2, 3, 1, 2, 4, 1, 2], max_spec_tokens=8, max_spec_factor=4.0).token_ids == \
        [3, 1, 2, 4, 1, 2]  # from "2": 3 at 1/3, then 1 2 4 1 2 inside the same run of single occurrences


def test_ties_follow_arctics_sibling_lists():
    """After 9 1 9 2 9 3 9 3 9 2, 3 and 2 have both followed 9 twice: 3 got there first (9 3 9 3) and leads. 2,
    the later, queues behind it, not in front (it did not lead the children seen once). Then 9 2 makes 2 the
    most frequent."""
    tree = SuffixTree(8)
    tree.extend(0, [9, 1, 9, 2, 9, 3, 9, 3, 9, 2])
    assert [c.token for c in tree.node([9]).order] == [3, 2, 1]
    assert tree.speculate([5, 9], 1, min_token_prob=0.0).token_ids == [3]
    tree.extend(0, [9, 2])
    assert [c.token for c in tree.node([9]).order] == [2, 3, 1]


def test_the_global_tree_keeps_the_latest_outputs():
    """Requests A, B, C with outputs 5 6 7 (A) and 5 6 8 (B); two cached: when C starts, A's output is evicted,
    so C drafts 8 after 5 6, from B's."""
    cache = SuffixCache(max_tree_depth=8, max_cached_requests=2)
    for rid, out in ((0, [5, 6, 7]), (1, [5, 6, 8])):
        cache.start_request(rid, [1])
        cache.add_active_response(rid, out)
        cache.stop_request(rid)
    assert list(cache.cached) == [0, 1]
    cache.start_request(2, [1])
    assert list(cache.cached) == [1, 2]
    assert cache.speculate(2, [1, 5, 6], 4).token_ids == [8]
    cache.stop_request(2)


def test_a_tree_holds_every_likely_continuation():
    """Four sequences 7 1 2, 7 1 2, 7 3, 7 1 4. From "7": 1 (3/4), then 2 (1/2) and 4 (1/4) below it, and 3 (1/4);
    best first, so 1, 2, then the two quarters (their order is the heap's). A path takes 1 2 only."""
    tree = SuffixTree(8)
    for sid, seq in enumerate(([7, 1, 2], [7, 1, 2], [7, 3], [7, 1, 4])):
        tree.extend(sid, seq)
    got = tree.speculate([0, 7], 8, max_spec_factor=8.0, min_token_prob=0.2, use_tree_spec=True)
    assert got.token_ids[:2] == [1, 2] and got.probs == [0.75, 0.5, 0.25, 0.25]
    assert sorted(zip(got.token_ids, got.parents)) == [(1, -1), (2, 0), (3, -1), (4, 0)]
    assert (got.score, got.match_len) == (1.75, 1)
    assert tree.speculate([0, 7], 8, max_spec_factor=8.0, min_token_prob=0.2).token_ids == [1, 2]


# --- against the reference, on random histories -------------------------------------------------------------

def replay(seed: int, tree: bool, vocab: int, depth: int, max_cached: int, steps: int = 120) -> int:
    """Random requests (prompts that copy earlier ones, outputs that copy earlier stretches, so that counts tie
    and grow) through SuffixCache and NaiveCache; every draft compared. Returns how many drafts had tokens."""
    fast, slow, drafted = SuffixCache(depth, max_cached), NaiveCache(depth, max_cached), 0
    for k, context, kw in suffix_histories((fast, slow), seed, vocab, depth, tree, steps, 12, 6, 10):
        got = fast.speculate(k, context, **kw)
        check(got, slow.speculate(k, context, *kw.values()), tree)  # the same arguments, in order
        drafted += bool(got.probs)
    for k in fast.local:  # and every live request's node's children, in order
        same_order(fast.local[k], slow.local[k])
    same_order(fast.global_tree, slow.glob)
    return drafted


def same_order(fast: SuffixTree, slow: Naive) -> None:
    """Every string's count and children in order, between the trie and the scan."""
    stack = [((), fast.root)]
    while stack:
        w, node = stack.pop()
        if w:
            assert node.count == slow.count(w), w
            assert [c.token for c in node.order or ()] == slow.children(w), w
        stack += [(w + (t,), c) for t, c in (node.kids or {}).items()]
    assert fast.root.count == sum(map(len, slow.seqs.values()))


@pytest.mark.parametrize("tree", [False, True], ids=["path", "tree"])
@pytest.mark.parametrize("vocab, depth, max_cached", [(3, 6, 0), (4, 8, 3), (6, 10, 100)])
def test_drafts_equal_the_reference(tree, vocab, depth, max_cached):
    drafted = sum(replay(seed, tree, vocab, depth, max_cached) for seed in range(3))
    assert drafted > 100  # most drafts propose something: the comparison is not of empty drafts


def test_the_reference_comparison_fails_on_a_wrong_tie_rule(monkeypatch):
    """A negative control: a child whose count rises jumps ahead of every sibling it now ties with."""
    import minispec.drafts.suffix_tree as st

    def ahead_of_all_ties(order, child):
        i = order.index(child)
        j = i
        while j and order[j - 1].count <= child.count + 1:
            j -= 1
        order.insert(j, order.pop(i))
        child.count += 1

    monkeypatch.setattr(st, "_raise", ahead_of_all_ties)
    with pytest.raises(AssertionError):
        replay(0, False, 6, 10, 100)
