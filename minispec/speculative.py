"""Exact speculative sampling, batched, with a different number of accepted tokens per row.

Notation (Leviathan et al. 2023; Chen et al. 2023):
  p      the target's distribution (after temperature / top-k / top-p)
  q      the draft's distribution (after the same warping)
  gamma  draft tokens proposed per row and step
  alpha  acceptance rate; c the cost of a draft step relative to a target step

One step, for every row at once: the draft proposes x_1..x_gamma from q; the target scores all
gamma+1 positions in one forward pass; x_i is accepted with probability min(1, p_i(x_i) / q_i(x_i));
at a row's first rejection the next token is drawn from norm(max(0, p_i - q_i)); if all gamma
are accepted a bonus token is drawn from p_{gamma+1}. Each row thus gains n+1 tokens, n its
own number of accepted tokens, and the tokens have exactly the target's distribution p.
Both caches roll back per row by moving lengths; nothing is copied.

The draft cache re-reads the last ``lag`` tokens of each row at the start of a step (``lag``
is 2 after a speculative step). Re-writing a slot it already holds is harmless (same token,
same position), and it covers the case where all gamma tokens were accepted and the draft never
saw x_gamma, without a per-row branch.
"""

from __future__ import annotations

import torch

from minispec.decode import Batch, GenerationResult, decode_step, prefill
from minispec.model import Model
from minispec.policy import FixedPolicy, GammaPolicy
from minispec.sampling import SamplingParams, probabilities, sample


def accept_reject(p, q, x, generator, accept_rate: float | None = None, greedy: bool = False):
    """The speculative-sampling rule for every row.

    p (B, gamma+1, V) and q (B, gamma, V) are distributions, x (B, gamma) the draft tokens.
    Returns accepted (B, gamma), the accepted prefix of each row, and t (B,), the token the
    target adds: drawn from norm(max(0, p - q)) at the first rejection, or from p_{gamma+1}.
    ``accept_rate`` (benchmarks only) replaces the test with Bernoulli(accept_rate) draws and
    then draws t from p: the timing of a given alpha, not the target's distribution.
    ``greedy``: p and q are one-hot (temperature 0), so t is their hot token (see ``sample``).
    """
    B, gamma = x.shape
    u = torch.rand(B, gamma, generator=generator, device=x.device)  # (B, gamma) one uniform per row and position
    if accept_rate is None:
        p_x = p[:, :-1].gather(-1, x[..., None])[..., 0]  # (B, gamma)
        q_x = q.gather(-1, x[..., None])[..., 0]  # (B, gamma) > 0: x was drawn from q
        ok = u * q_x < p_x  # (B, gamma) u < min(1, p/q), with no division
        residual = (p[:, :-1] - q).clamp_min(0)  # (B, gamma, V) max(0, p - q)
        # Where p == q nothing is ever rejected and max(0, p - q) is all zero: fall back to p, no 0/0.
        residual = torch.where(residual.sum(-1, keepdim=True) > 0, residual, p[:, :-1])
    else:
        ok, residual = u < accept_rate, p[:, :-1]
    accepted = ok.cumprod(1).bool()  # (B, gamma) nothing after a row's first rejection counts
    n = accepted.sum(1)  # (B,)
    dist = torch.cat([residual, p[:, -1:]], 1)  # (B, gamma+1, V) the correction, then the bonus from p
    t = sample(dist.gather(1, n[:, None, None].expand(-1, 1, dist.shape[-1]))[:, 0], generator, greedy)  # (B,)
    return accepted, t


def speculative_step(target: Model, draft: Model, t_cache, d_cache, batch: Batch, gamma: int, lag: int,
                     accept_rate: float | None = None) -> torch.Tensor:
    """Draft, verify, accept, roll back: one step for every row. Returns accepted (B, gamma)."""
    params, gen, timer = batch.params, batch.gen, batch.timer
    with timer("draft"):
        d_cache.rollback((batch.total - lag).clamp_min(0))  # re-read the last `lag` tokens (see module doc)
        inp, qs, xs = batch.last(lag), [], []  # (B, lag)
        for _ in range(gamma):
            qs.append(probabilities(draft(inp, d_cache)[:, -1], params))  # (B, V)
            xs.append(sample(qs[-1], gen, params.greedy))  # (B,)
            inp = xs[-1][:, None]  # (B, 1)
        q, x = torch.stack(qs, 1), torch.stack(xs, 1)  # (B, gamma, V), (B, gamma)
    with timer("verify"):
        p = probabilities(target(torch.cat([batch.last(1), x], 1), t_cache), params)  # (B, gamma+1, V)
    with timer("accept"):
        accepted, t = accept_reject(p, q, x, gen, accept_rate, params.greedy)  # (B, gamma), (B,)
        n = accepted.sum(1)  # (B,)
        new = torch.cat([x, t[:, None]], 1).scatter(1, n[:, None], t[:, None])  # (B, gamma+1) x_1..x_n, t
        batch.emit(new, n + 1, drafted=torch.arange(gamma + 1, device=x.device) < n[:, None])
        t_cache.rollback(batch.total - 1)  # keep what was accepted; finished rows stay put
    return accepted


def _check_pair(target: Model, draft: Model) -> None:
    tv, dv = target.config.vocab_size, draft.config.vocab_size
    if tv != dv:
        raise ValueError(f"the draft and target must share a vocabulary: target has {tv} tokens, draft has {dv}")
    if target.device != draft.device:
        raise ValueError(f"target is on {target.device} but draft is on {draft.device}; move both to one device")
    if target.dtype != draft.dtype:
        raise ValueError(f"target is {target.dtype} but draft is {draft.dtype}; load both with the same dtype")


@torch.inference_mode()
def speculative_generate(target: Model, draft: Model, prompts, gamma: int | str | GammaPolicy = 4,
                         max_new_tokens: int = 128, temperature: float = 0.0, top_k: int | None = None,
                         top_p: float | None = None, seed: int | None = None, eos_token_id=None,
                         accept_rate: float | None = None) -> GenerationResult:
    """Speculative decoding of a batch; the output has the target's distribution exactly.

    ``gamma``: draft tokens per step (>= 1); ``"auto"`` to let the default policy of
    :func:`minispec.policy.auto_policy` choose it each step from the running batch size and
    acceptance (0 = plain decoding for that step); or any :class:`GammaPolicy`.
    ``accept_rate``: benchmarks only, see :func:`accept_reject`; the stats say ``synthetic``.
    Returns the same :class:`GenerationResult` as :func:`minispec.generate`, with speculative
    stats and ``.accepted`` marking which output tokens were accepted draft tokens.
    """
    policy = _policy(gamma, target, draft)
    _check_pair(target, draft)
    if accept_rate is not None and not 0 <= accept_rate <= 1:
        raise ValueError(f"accept_rate must be in [0, 1], got {accept_rate!r}")
    params = SamplingParams(temperature, top_k, top_p)
    G = policy.gamma_max
    batch = Batch(target, prompts, max_new_tokens, params, seed, eos_token_id, slack=G + 1)
    if batch.slots - G - 1 > draft.config.max_position_embeddings:
        raise ValueError(f"the longest prompt plus max_new_tokens exceeds the draft's maximum length of "
                         f"{draft.config.max_position_embeddings} positions")
    t_cache, d_cache = target.new_cache(batch.batch_size, batch.slots), draft.new_cache(batch.batch_size, batch.slots)
    with batch.timer("prefill"):
        logits = prefill(target, batch, t_cache)  # (B, V)
    with batch.timer("draft_prefill"):
        prefill(draft, batch, d_cache)  # the draft reads every prompt too: a cost in TTFT
    batch.first_token(logits)
    dev = batch.device
    proposed_at = torch.zeros(G, dtype=torch.long, device=dev)  # (G,) drafts that proposed position i
    accepted_at = torch.zeros(G, dtype=torch.long, device=dev)  # (G,) of which accepted
    n_tested = torch.zeros((), dtype=torch.long, device=dev)  # draft tokens the accept test reached
    gammas, lag, running = [], 2, batch.start_loop()
    while running:
        g = policy.choose(running)
        if g == 0:  # speculation off: a plain target step; the draft falls one more token behind
            with batch.timer("decode"):
                decode_step(target, t_cache, batch)
            running, longest = batch.end_step()
            lag += 1
        else:
            active = ~batch.done  # (B,)
            accepted = speculative_step(target, draft, t_cache, d_cache, batch, g, lag, accept_rate) & active[:, None]
            n = accepted.sum(1)  # (B,)
            proposed_at[:g] += active.sum()
            accepted_at[:g] += accepted.sum(0)
            tested = (n + 1).clamp_max(g) * active  # (B,) positions the test reached: up to the first rejection
            n_tested += tested.sum()
            running, longest, step_accepted, step_tested = batch.end_step(n.sum(), tested.sum())
            policy.observe(step_accepted, step_tested)
            lag = 2
        gammas.append(g)
        t_cache.trim(longest)
        d_cache.trim(longest)
    proposed_at, accepted_at = proposed_at.tolist(), accepted_at.tolist()
    used = [i for i in range(G) if proposed_at[i]]
    return batch.result(
        gamma=gamma if isinstance(gamma, (int, str)) else type(gamma).__name__,
        num_drafts=proposed_at[0], draft_tokens=sum(proposed_at), accepted_tokens=sum(accepted_at),
        tested_tokens=int(n_tested),
        per_position_acceptance_rates=[accepted_at[i] / proposed_at[i] for i in used],
        gamma_per_step=gammas, synthetic=accept_rate is not None)


def _policy(gamma, target: Model, draft: Model) -> GammaPolicy:
    if isinstance(gamma, GammaPolicy):
        return gamma
    if gamma == "auto":
        from minispec.policy import auto_policy

        return auto_policy(target, draft)
    if isinstance(gamma, bool) or not isinstance(gamma, int) or gamma < 1:
        raise ValueError(f"gamma must be an integer >= 1, 'auto' or a GammaPolicy, got {gamma!r}")
    return FixedPolicy(gamma)
