"""Dynamic tree selection keeps every chosen node's ancestors, whatever the scores' magnitude (issue 23)."""

from types import SimpleNamespace

import pytest
import torch

from minispec.drafts.tree import _TreeRun


def candidates(B, k, depth, scale, gen):
    """``_dynamic``'s candidate lists, level by level, with exact ties: every node's top child has log q = 0,
    so it ties with its parent. Tokens number the candidates, so a proposal names the candidates it chose."""
    scores, parents = [-scale - torch.rand(B, k, generator=gen).mul(10).round()], [torch.full((B, k), -1)]
    frontier = torch.arange(k).expand(B, k)  # (B, k)
    for _ in range(1, depth):
        lp = -torch.rand(B, k, k, generator=gen).mul(10).round()  # (B, k, k) each frontier node's children
        lp[..., 0] = 0
        scores.append((scores[-1].gather(1, frontier)[..., None] + lp).flatten(1))  # (B, k*k)
        parents.append(frontier.repeat_interleave(k, 1))  # (B, k*k)
        frontier = scores[-1].topk(k, -1).indices
    sizes = [s.shape[1] for s in scores]
    start = [sum(sizes[:i]) for i in range(len(sizes))]
    toks = [torch.arange(a, a + n).expand(B, n) for a, n in zip(start, sizes)]
    up = torch.cat([torch.where(p >= 0, p + start[max(i - 1, 0)], -1) for i, p in enumerate(parents)], 1)  # (B, N)
    return scores, toks, parents, [torch.full_like(t, -1) for t in toks], up


@pytest.mark.parametrize("scale", [0.0, 40.0, 1e6])
def test_every_chosen_node_keeps_its_parent(scale):
    """With scores of -40 a tie-break of 1e-6 per level vanished in float32, and a child chosen without its parent
    was hung from the root: the draft then proposed it as the first token, which verification tests in the wrong
    context."""
    gen = torch.Generator().manual_seed(0)
    k, depth = 3, 3
    for budget in range(1, 12):
        run = _TreeRun.__new__(_TreeRun)  # only what _select reads
        run.cfg, run.vocab_size = SimpleNamespace(budget=budget, topk=k), 1000
        scores, toks, parents, fed, up = candidates(32, k, depth, scale, gen)
        proposal = run._select(scores, toks, parents, fed, depth)
        x, parent = proposal.x, proposal.tree.parent  # (B, T) candidate ids, (B, T) 0: the root
        hung = torch.where(parent > 0, x.gather(1, (parent - 1).clamp_min(0)), -1)  # (B, T) the parent's candidate
        assert torch.equal(hung, up.gather(1, x)), f"a node lost its parent at budget {budget}"
        assert (parent < torch.arange(1, x.shape[1] + 1)).all()  # parents before children
