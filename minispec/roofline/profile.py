"""Acceptance profiles: which child of a tree node the target accepts, by rank, assumed from alpha or measured.

A profile is Sequoia's positional acceptance vector (Chen et al. 2024, arXiv 2402.12374): P(the accepted child of a
node is its child of rank k), rank 0 the draft's first guess. :mod:`minispec.roofline.tree` turns it into a tree's
expected accepted length. Three forms:

- one row, the same below every node; ``default_profile(alpha)`` makes one from alpha alone;
- one row per depth (the root's children first, the last row repeating);
- a :class:`RankProfile`: one row below a node its parent ranked first, one below any other. Acceptance runs in
  streaks (a span of text easy for the draft stays easy): on the embedded pair the draft's first guess is right
  83 % of the time after a first guess that was right, 60 % after one that was not (``EMBEDDED_PROFILE``), where a
  single row says 78 % everywhere. Ranks along a path are then no longer independent.

Measured on the embedded pair (tiny-code-target drafted by tiny-code-draft, greedy, teacher-forced on 4096 positions
of held-out code: ``python scripts/tree_bench.py --profile``, results/cpu/rank_profile.json): the rank of the
target's token in the draft's order, as counts made non-increasing in rank (a running minimum trims the noisy
tail), at every position and split by whether the draft's first guess at the position before was right.
"""

from __future__ import annotations

from dataclasses import dataclass

from minispec.roofline.shapes import check_arguments

# (positions, counts by rank 0, 1, ...): results/cpu/rank_profile.json (git 96e8588), counts = rows x positions.
_EMBEDDED_ALL = (4096, (3190, 332, 139, 115, 53, 50, 34, 22, 21, 16, 16, 15, 15, 10, 8, 7, 7, 7, 7, 3, 2, 2, 2, 2,
                        2, 1, 1, 1))
_EMBEDDED_AFTER_FIRST = (3142, (2614, 208, 71, 61, 34, 30, 22, 11, 8, 8, 8, 8, 8, 6, 5, 3, 1, 1, 1, 1, 1, 1, 1, 1,
                                1, 1, 1, 1))
_EMBEDDED_AFTER_OTHER = (890, (534, 119, 63, 52, 18, 17, 12, 7, 7, 6, 6, 5, 5, 4, 3, 3, 3, 2, 1))
# Of the mass the first guess misses, the share each later rank catches (ranks 1, 2, ...): 0.366, 0.153, 0.127, ...
_EMBEDDED_SHARES = tuple(c / (_EMBEDDED_ALL[0] - _EMBEDDED_ALL[1][0]) for c in _EMBEDDED_ALL[1][1:])


def default_profile(alpha: float, ranks: int = 64) -> tuple[float, ...]:
    """The profile used when only alpha is known: rank 0 is accepted with alpha; of the 1 - alpha it misses, rank k
    catches the share the embedded pair measured (0.366, 0.153, 0.127, ... for ranks 1, 2, 3), cut to be
    non-increasing in rank. At the pair's own alpha (0.779) it is the pair's profile: 0.081 for rank 1, where the
    geometric alpha (1 - alpha)^k this replaces said 0.172.

    Two assumptions, stated: that those shares carry over to other pairs and alphas (they come from one small pair),
    and that ranks along a path are independent (the pair measured otherwise: pass ``EMBEDDED_PROFILE`` or your
    own :class:`RankProfile` to condition on the parent's rank). Rank 0 is alpha, so a chain keeps Leviathan's E.
    """
    check_arguments(alpha=alpha)
    row, last = [], alpha
    for k in range(ranks):
        last = min(last, alpha if k == 0 else (1 - alpha) * (_EMBEDDED_SHARES[k - 1] if k <= len(_EMBEDDED_SHARES)
                                                                else 0.0))
        row.append(last)
    return tuple(row)


def _row(values, name: str) -> tuple[float, ...]:
    row = tuple(float(p) for p in values)
    if not row or not all(0 <= p <= 1 for p in row) or sum(row) > 1 + 1e-9:
        raise ValueError(f"{name}: a profile row gives disjoint events' probabilities (which child is accepted): at "
                         f"least one, each in [0, 1], their sum <= 1; got {values!r}")
    return row


@dataclass(frozen=True)
class RankProfile:
    """A profile conditioned on the parent's rank: ``after_first[k]`` = P(the accepted child of a node is its rank-k
    child) when that node was its own parent's first-ranked child, ``after_other[k]`` when it was not.

    The root (the last accepted token) has a rank too: after a rejection it is the target's own token where the
    draft's first guess was rejected (``after_other`` below it); after a path accepted down to a leaf it is the
    bonus token, first-ranked with the leaf's row's rank-0 entry. Steps thus form a two-state Markov chain, and a
    tree's E is its steady state (:func:`~minispec.roofline.tree_expected_tokens`). Against the embedded pair's 44
    measured static trees and chains (results/cpu/trees.jsonl: batches 1-64, 1-64 nodes) it is off by 0.15 tokens
    per step on average, a single row by 0.22 (chain of 8 at batch 1: 3.91 modelled, 3.83 measured, 4.04 from one
    row; 64 nodes: 5.87, 6.51 and 5.77).
    """

    after_first: tuple[float, ...]
    after_other: tuple[float, ...]

    def __post_init__(self):
        object.__setattr__(self, "after_first", _row(self.after_first, "after_first"))
        object.__setattr__(self, "after_other", _row(self.after_other, "after_other"))

    @classmethod
    def from_counts(cls, after_first: tuple[int, tuple[int, ...]], after_other: tuple[int, tuple[int, ...]]):
        """From (positions, counts by rank) of each kind of parent."""
        return cls(*(tuple(c / n for c in counts) for n, counts in (after_first, after_other)))


EMBEDDED_PROFILE = RankProfile.from_counts(_EMBEDDED_AFTER_FIRST, _EMBEDDED_AFTER_OTHER)


@dataclass(frozen=True)
class Rows:
    """A checked profile as the tree model reads it: ``p(depth, parent_rank, rank)``, rows by depth, or by the
    parent's rank (root -1, first 0, other) when ``by_rank``."""

    rows: tuple[tuple[float, ...], ...]
    by_rank: bool = False

    def p(self, depth: int, parent_rank: int, rank: int) -> float:
        """P(the accepted child of a node at ``depth`` (the root at 0) with ``parent_rank`` (-1: the root) is its
        child of this rank); ranks past a row's end are never accepted."""
        if self.by_rank:
            row = self.rows[0 if parent_rank < 0 else 1 if parent_rank == 0 else 2]
        else:
            row = self.rows[min(depth, len(self.rows) - 1)]
        return row[rank] if rank < len(row) else 0.0

    @property
    def non_increasing(self) -> bool:
        return all(a >= b for row in self.rows for a, b in zip(row, row[1:]))

    @property
    def most(self) -> float:
        """The largest row sum: below any node, the reach of its children sums to at most this times its own."""
        return max(sum(row) for row in self.rows)


def profile_rows(alpha: float, profile, ranks: int) -> tuple[Rows, ...]:
    """The profile checked, as one :class:`Rows`, or for a :class:`RankProfile` two: below a root the draft did not
    rank first (the search ranks nodes by this one), and below one it did. None: :func:`default_profile` of alpha
    with ``ranks`` ranks."""
    if profile is None:
        return (Rows((default_profile(alpha, max(ranks, 1)),)),)
    if isinstance(profile, RankProfile):
        first, other = profile.after_first, profile.after_other
        return Rows((other, first, other), True), Rows((first, first, other), True)
    rows = list(profile)
    rows = [rows] if rows and not hasattr(rows[0], "__len__") else rows
    if not rows:
        raise ValueError(f"profile must be a non-empty list of probabilities by rank, one such list per depth, or a "
                         f"RankProfile, got {profile!r}")
    return (Rows(tuple(_row(row, "profile") for row in rows)),)


def steady(parents, ranks, depths, models: tuple[Rows, ...], reached: list[list[float]]) -> float:
    """E = 1 + the sum of the nodes' reach under the one model; for two (a :class:`RankProfile`'s), the steady state
    of :func:`steady_tokens`, from each model's summed reach and its leaves' chance of a first-ranked bonus token."""
    if len(models) == 1:
        return 1.0 + sum(reached[0])
    inner = set(parents)
    first = [sum(r[i] * m.p(d, k, 0) for i, (k, d) in enumerate(zip(ranks, depths)) if i not in inner)
             for m, r in zip(models, reached)]
    return steady_tokens([sum(r) for r in reached], first)


def steady_tokens(totals: list[float], first: list[float]) -> float:
    """E from each model's summed reach: 1 + the one; or, for a :class:`RankProfile`, S_O and S_F (below a root
    the draft did not, or did, rank first) with f_O and f_F, each one's chance that the step ends at a leaf with a
    bonus token the draft ranked first. The root's class is a two-state Markov chain across steps: in the steady
    state P(first) = f_O / (1 - f_F + f_O), and E = 1 + P(first) S_F + (1 - P(first)) S_O."""
    if len(totals) == 1:
        return 1.0 + totals[0]
    (s_o, s_f), (f_o, f_f) = totals, first
    share = f_o / (1 - f_f + f_o) if 1 - f_f + f_o > 0 else 1.0
    return 1.0 + share * s_f + (1 - share) * s_o
