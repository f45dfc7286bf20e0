"""Speculative decoding of a batch: draft, verify, accept and roll back, step after step, until every row ends.

:func:`speculative_step` is one step for every row at once, chain or tree, and reads top to bottom:
the draft proposes (:mod:`minispec.drafts`), the target scores every draft position in one forward
pass, the exact rule of :mod:`minispec.speculative.rule` accepts a prefix (or a tree path) per row, and
the target's cache rolls back by moving each row's length; nothing is copied (a tree's accepted path's
few KV slots move next to the prefix). :func:`speculative_generate` runs the steps, choosing gamma each
step (fixed, or a :class:`~minispec.roofline.policy.GammaPolicy`; 0 is a plain step), and counts
acceptance with vLLM's names.
"""

from __future__ import annotations

import warnings

import torch

from minispec.decoding.plain import (
    DecodeState,
    GenerationResult,
    check_request,
    decode_step,
    finish,
    first_token,
    prefill,
)
from minispec.decoding.sampling import (
    Argmax,
    RowParams,
    Sampler,
    SamplingParams,
    argmax,
    one_hot,
    probabilities,
    proposed,
)
from minispec.decoding.stats import Timeline
from minispec.decoding.timing import PhaseTimer
from minispec.decoding.tree import tree_mask
from minispec.drafts.base import DraftRun, Proposal
from minispec.drafts.model import as_draft
from minispec.drafts.tree import TreeDraft
from minispec.model.llama import Model
from minispec.roofline import ModelShape, TreeShape
from minispec.roofline.hardware import device_hardware, is_calibrated, preset_for
from minispec.roofline.policy import FixedPolicy, GammaPolicy, auto_policy
from minispec.speculative.rule import accept_reject, verify_tree

AUTO_GAMMA_MAX = 8  # the longest draft gamma="auto" considers


def speculative_step(target: Model, t_cache, run: DraftRun, state: DecodeState, sampler: Sampler, gamma: int,
                     timer: PhaseTimer, rule=accept_reject):
    """Draft, verify, accept, roll back: one step for every row; a chain, or a tree in one pass.

    Returns path (B, depth), the accepted draft tokens' indices (1-based, -1 past a row's last;
    for a chain, positions), their ranks among their siblings (None for a chain), and the tokens
    each row proposed (B,).
    """
    with timer("draft"):
        proposal = run.propose(state, gamma)  # x (B, T), q of each, the tree's shape (None: a chain)
    with timer("verify"):
        root = t_cache.lengths.clone()  # (B,) the slot the root (each row's last token) goes to
        mask = None if proposal.tree is None else tree_mask(proposal.tree, root)
        out = target(torch.cat([state.last(1), proposal.x], 1), t_cache, tree=mask, features=run.features)
        logits, h = out if run.features else (out, None)  # (B, T+1, V), (B, T+1, F)
        p = target_p(logits, sampler.params, proposal, rule)  # (B, T+1, V), or Argmax (B, T+1)
    with timer("accept"):
        path, rank = accept(proposal, p, h, run, state, sampler, rule, lambda path: t_cache.compact(root, path))
        t_cache.rollback(state.total - 1)  # keep what was accepted; finished rows stay put
    return path, rank, proposed(proposal.q).sum(1)


def target_p(logits: torch.Tensor, params: SamplingParams | RowParams, proposal: Proposal, rule,
             at: torch.Tensor | None = None) -> torch.Tensor | Argmax:
    """The target's p for the accept rule, from the pass's logits (..., V), read at ``at`` (B, T+1) of logits (M, V)
    where given (the engine's flattened pass), else all of them (B, T+1, V). Rows that are all greedy on a chain that
    :func:`accept_reject` verifies: their argmaxes (:class:`~minispec.decoding.sampling.Argmax`, no one-hot; the
    rule compares tokens); greedy otherwise (a tree, another rule): the one-hots; else :func:`probabilities`. The
    argmax is taken before ``at`` reads it, so no row of logits is copied."""
    if not params.greedy:
        return probabilities(logits if at is None else logits[at], params)  # (B, T+1, V)
    top = argmax(logits)  # (..., ) each position's argmax
    top = top if at is None else top[at]  # (B, T+1)
    return Argmax(top) if proposal.tree is None and rule is accept_reject else one_hot(top, logits.shape[-1])


def accept(proposal: Proposal, p: torch.Tensor, h: torch.Tensor | None, run: DraftRun, state: DecodeState,
           sampler: Sampler, rule=accept_reject, compact=None):
    """The verified step's second half, shared with the engine: given the target's p (B, T+1, V) at the root and
    each draft token (and its features h there, or None), accept a prefix (a tree path) per row, append the
    accepted tokens and one more to ``state``, move a tree's accepted path's KV next to its prefix
    (``compact(path)``), and tell the draft what was kept. Returns path (B, depth) and rank (B, depth) or None."""
    x, q, tree = proposal
    u = sampler.accept_uniforms(state.total, x.shape[1], exact=tree is not None or rule is accept_reject)  # (B, T)
    draw = lambda w: sampler.draw(w, state.total)  # noqa: E731 the target's draw: a correction or bonus
    if tree is None:
        accepted, t = rule(p, q, x, u, draw)  # (B, T), (B,)
        path, rank = torch.where(accepted, torch.arange(1, x.shape[1] + 1, device=x.device), -1), None  # (B, T)
    else:
        path, rank, t = verify_tree(p, q, x, tree, u, draw, sampler.params.greedy)  # (B, depth) each, (B,)
        compact(path)  # the accepted path's KV next to the prefix; the rest is stale
    n = (path > 0).sum(1)  # (B,) draft tokens accepted
    new = torch.cat([x.gather(1, (path - 1).clamp_min(0)), t[:, None]], 1)  # (B, depth+1) the path's tokens
    new = new.scatter(1, n[:, None], t[:, None])  # (B, depth+1) then t after each row's last accepted
    state.emit(new, n + 1, drafted=torch.arange(new.shape[1], device=x.device) < n[:, None])  # x's, then t
    kept = torch.cat([torch.zeros_like(path[:, :1]), path.clamp_min(0)], 1)  # (B, 1+depth) root, then the path
    run.verified(path, n, None if h is None else h.gather(1, kept[..., None].expand(-1, -1, h.shape[-1])))
    return path, rank


@torch.inference_mode()
def speculative_generate(target: Model, draft, prompts, gamma: int | str | GammaPolicy | None = None,
                         max_new_tokens: int = 128, temperature: float = 0.0, top_k: int | None = None,
                         top_p: float | None = None, seed: int | list[int] | None = None, eos_token_id=None,
                         rule=accept_reject) -> GenerationResult:
    """Speculative decoding of a batch; the output has the target's distribution exactly.

    ``draft``: a smaller :class:`Model` sharing the target's vocabulary, or a :class:`Draft`
    (``PromptLookupDraft()``, ``LayerSkipDraft(target, n)``, ``TreeDraft(draft, ...)``, ...). ``gamma``: draft
    tokens per step (>= 1; default 4), for a tree the depth it drafts to (default: the tree's own depth; a
    smaller gamma cuts the tree); ``"auto"`` to let the roofline policy choose it
    each step from the running batch size, the running rows' context and the acceptance so far (0 = a
    plain step), on this device's preset or calibration; or any :class:`GammaPolicy`. ``seed`` as in
    :func:`minispec.generate`. ``rule``: the accept rule of a chain (:func:`accept_reject`; benchmarks and
    the course swap in others, and the stats say ``synthetic`` for a rule marked so). Returns the same
    :class:`GenerationResult` as :func:`minispec.generate`, with speculative stats and ``.accepted``
    marking accepted draft tokens.

    Gamma is capped at what the call can use, ``max_new_tokens - 1`` (every token but the prefill's first comes
    from a step, so a step never emits more; the length checks keep that within the target's and the draft's
    positions less the longest prompt): a larger fixed gamma drafts at most that many, with one UserWarning when
    the caller set it (10**6 with 8 new tokens drafts 7 a step, not a million); a policy's choices are capped the
    same way, silently. The tokens are those the larger gamma would give: its extra draft tokens are never emitted.
    """
    draft = as_draft(draft)
    stated = gamma
    if gamma is None:  # a tree's own depth, else a chain of 4
        gamma = draft.depth if isinstance(draft, TreeDraft) else 4
    policy = _policy(gamma)
    prompts, eos = check_request(target, prompts, max_new_tokens, eos_token_id)
    usable = max(1, max_new_tokens - 1)  # draft tokens a step can ever emit: all but the prefill's token
    if isinstance(gamma, int) and gamma > usable:
        if stated is not None:
            warnings.warn(f"gamma {gamma} is more than this call can use: a step emits at most max_new_tokens - 1 = "
                          f"{max_new_tokens - 1} tokens after the prefill's first, so each step drafts at most "
                          f"{usable}", UserWarning, stacklevel=3)  # the caller's line, past inference_mode's wrapper
        gamma, policy = usable, FixedPolicy(usable)
    G = min(AUTO_GAMMA_MAX if policy is None else policy.gamma_max, usable)  # the most a step drafts (a
    # policy still weighs every gamma up to its own gamma_max; what it chooses is capped below)
    state = DecodeState(prompts, max_new_tokens, eos, target.device, slack=draft.width(G) + 1)
    draft.check(target, state.slots - draft.width(G) - 1)
    if policy is None:  # validated above; now the device's ceilings (a preset, or one calibration per process)
        policy = gamma_policy("auto", target, draft, stacklevel=4)  # past speculative_generate and inference_mode
    policy.start()
    sampler = Sampler(SamplingParams(temperature, top_k, top_p), seed, state.batch_size, target.device)
    timeline, timer = Timeline(), PhaseTimer(target.device)
    t_cache = target.new_cache(state.batch_size, state.slots)
    with timer("prefill"):
        out = prefill(target, state, t_cache, features=draft.features)
        logits, feats = out if draft.features else (out, None)  # (B, V), (B, P, F)
    with timer("draft_prefill"):
        run = draft.start(target, state, sampler, feats)  # the draft reads every prompt too: a cost in TTFT
    first_token(state, sampler, logits, timeline)
    count = _Counts(draft.width(G), state.device)
    gammas, (running, _, context, *_) = [], state.start_loop()
    while running:
        g = policy.choose(running, context)
        if isinstance(g, bool) or not isinstance(g, int):  # a float would fail deep inside the draft
            raise TypeError(f"{type(policy).__name__}.choose must return an int gamma, got {g!r} "
                            f"({type(g).__name__})")
        if not 0 <= g <= policy.gamma_max:
            raise ValueError(f"{type(policy).__name__} chose gamma {g}, outside 0..gamma_max={policy.gamma_max}")
        g = min(g, G)  # no more than the call can use (the cache keeps draft.width(G) spare slots per row)
        if g == 0:  # speculation off: a plain target step; the draft falls one more token behind
            with timer("decode"):
                run.skipped(decode_step(target, t_cache, state, sampler, draft.features))
            end = state.end_step()
        else:
            active = ~state.done  # (B,)
            path, rank, offered = speculative_step(target, t_cache, run, state, sampler, g, timer, rule)
            end = state.end_step(*count.add(path, rank, offered, active))
            policy.observe(end.accepted, end.tested)
        timeline.step(running)
        running, context = end.running, end.context
        gammas.append(g)
        t_cache.trim(end.longest)
    return finish(state, timeline, timer, gamma=gamma if isinstance(gamma, (int, str)) else type(gamma).__name__,
                  draft=repr(draft), gamma_per_step=gammas, synthetic=getattr(rule, "synthetic", False),
                  **count.stats())


class _Counts:
    """Acceptance counters kept on the device through the loop (vLLM's names), read once at the end."""

    def __init__(self, width: int, device):
        zeros = lambda n: torch.zeros(n, dtype=torch.long, device=device)  # noqa: E731
        self.drafts, self.offered, self.tested = zeros(()), zeros(()), zeros(())  # rows that proposed, tokens, tested
        self.on_path, self.nodes = zeros(()), zeros(())  # tokens drafted along one path; the most nodes a row offered
        self.at, self.by_rank = zeros(width), zeros(width)  # accepted per position (depth), per child rank
        self.depth = 0  # trees: the deepest tree verified (a host int: a shape)

    def add(self, path, rank, offered, active):
        """One step's path (B, depth), ranks (B, depth) or None, tokens offered (B,) over active rows (B,): for the
        policy, 0-dim tensors of the step's accepted and tested draft tokens; for a tree, of the levels whose
        first-ranked child was accepted and the levels reached (up to the first rejection, at most the depth), the
        alpha a tree's profile starts from."""
        ok = (path > 0) & active[:, None]  # (B, depth)
        n = ok.sum(1)  # (B,)
        self.drafts += ((offered > 0) & active).sum()
        self.offered += (offered * active).sum()
        self.on_path += (offered.clamp_max(path.shape[1]) * active).sum()  # a chain: all it offered; a tree: depth
        self.at[: ok.shape[1]] += ok.sum(0)
        if rank is not None:
            self.depth = max(self.depth, path.shape[1])
            self.nodes = torch.maximum(self.nodes, (offered * active).max())
            self.by_rank.scatter_add_(0, rank.clamp_min(0).flatten(), ok.flatten().long())  # no host sync
        tested = (torch.minimum(n + 1, offered) * active).sum()  # up to each row's first rejection
        self.tested += tested
        if rank is not None:
            return ((rank == 0) & ok).sum(), ((n + 1).clamp_max(ok.shape[1]) * active).sum()
        return n.sum(), tested

    def stats(self) -> dict:
        drafts, at, ranks = int(self.drafts), _trimmed(self.at.tolist()), _trimmed(self.by_rank.tolist())
        tree = self.depth > 0
        return dict(num_drafts=drafts, draft_tokens=int(self.offered), accepted_tokens=sum(at),
                    tested_tokens=int(self.tested), path_tokens=int(self.on_path), accepted_per_position=at,
                    per_position_acceptance_rates=[a / drafts for a in at] if drafts else [],
                    accepted_per_rank=(ranks or [0]) if tree else None, tree_depth=self.depth if tree else None,
                    tree_nodes=int(self.nodes) if tree else None)


def _trimmed(counts: list[int]) -> list[int]:
    """``counts`` without its trailing zeros."""
    while counts and not counts[-1]:
        counts = counts[:-1]
    return counts


def _tree_of(draft) -> dict:
    """What gamma="auto" prices for a tree draft (the static tree, or a dynamic one's budget and top-k); {} else."""
    if not isinstance(draft, TreeDraft):
        return {}
    if draft.parents is not None:  # node j's parent at j - 1, 0 the root
        return {"tree": TreeShape(tuple(p - 1 for p in draft.parents), tuple(draft.ranks))}
    return {"budget": draft.budget, "topk": draft.topk}


def gamma_policy(gamma, target: Model, draft, stacklevel: int = 3) -> GammaPolicy:
    """The policy for ``gamma`` (an int: fixed; a GammaPolicy: itself), and for "auto" the roofline policy for this
    target and draft on this device's preset or calibration (measured once per process, with a warning the first
    time): a chain's, or for a tree draft the one that prices its nodes, up to the tree's own depth. The loop and the
    engine both build it here; ``stacklevel`` points the warning at their caller's line."""
    policy = _policy(gamma)
    if policy is not None:
        return policy
    if preset_for(target.device) is None and not is_calibrated(target.device, target.dtype):
        warnings.warn(f"gamma='auto' measures {target.device}'s bandwidth and FLOP/s once for this process "
                      "(about a second); call minispec.roofline.hardware.calibrate() beforehand to do it up front",
                      stacklevel=stacklevel)
    G = min(AUTO_GAMMA_MAX, draft.depth) if isinstance(draft, TreeDraft) else AUTO_GAMMA_MAX  # a tree goes no deeper
    return auto_policy(ModelShape.from_model(target), draft.shape, device_hardware(target.device, target.dtype),
                       gamma_max=G, **_tree_of(draft))


def _policy(gamma) -> GammaPolicy | None:
    """The policy for ``gamma``; None for "auto", which is built once the inputs are validated."""
    if isinstance(gamma, GammaPolicy):
        return gamma
    if gamma == "auto":
        return None
    if isinstance(gamma, bool) or not isinstance(gamma, int) or gamma < 1:
        raise ValueError(f"gamma must be an integer >= 1, 'auto' or a GammaPolicy, got {gamma!r}")
    return FixedPolicy(gamma)
