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
The target's cache rolls back per row by moving lengths; nothing is copied.
"""

from __future__ import annotations

import warnings

import torch

from minispec.decode import DecodeState, GenerationResult, decode_step, prefill
from minispec.drafts import Draft, as_draft
from minispec.hardware import device_hardware, is_calibrated, preset_for
from minispec.model import Model
from minispec.policy import FixedPolicy, GammaPolicy, auto_policy
from minispec.roofline import ModelShape
from minispec.sampling import ACCEPT, TARGET, SamplingParams, probabilities, sample, uniform

AUTO_GAMMA_MAX = 8  # the longest draft gamma="auto" considers


def accept_reject(p, q, x, u, draw):
    """The speculative-sampling rule, for every row; nothing else.

    p (B, gamma+1, V): the target's distributions at the gamma draft positions and one more.
    q (B, gamma, V): the draft's; x (B, gamma): the draft tokens; u (B, gamma): one uniform per
    row and position; ``draw(weights)``: one token per row (B,) from unnormalised weights (B, V).

    - accepted tokens: x_i is accepted if u_i < p_i(x_i) / q_i(x_i) and every earlier x was;
    - recovered token: at a row's first rejection i, t ~ norm(max(0, p_i - q_i));
    - bonus token: when all gamma are accepted, t ~ p_{gamma+1}.

    Returns accepted (B, gamma), the accepted prefix of each row, and t (B,). A position where q
    is all zero proposed nothing: q(x) = 0 is rejected and max(0, p - 0) = p, a plain draw.
    """
    p_x = p[:, :-1].gather(-1, x[..., None])[..., 0]  # (B, gamma)
    q_x = q.gather(-1, x[..., None])[..., 0]  # (B, gamma) > 0 for every proposed token
    accepted = ((u * q_x < p_x) & (q_x > 0)).cumprod(1).bool()  # (B, gamma) u < p/q, up to the first rejection
    n = accepted.sum(1)  # (B,)
    residual = (p[:, :-1] - q).clamp_min(0)  # (B, gamma, V) max(0, p - q)
    # Where p == q nothing is ever rejected and max(0, p - q) is all zero: fall back to p, no 0/0.
    residual = torch.where(residual.sum(-1, keepdim=True) > 0, residual, p[:, :-1])
    dist = torch.cat([residual, p[:, -1:]], 1)  # (B, gamma+1, V) the corrections, then the bonus from p
    t = draw(dist.gather(1, n[:, None, None].expand(-1, 1, dist.shape[-1]))[:, 0])  # (B,)
    return accepted, t


def speculative_step(target: Model, t_cache, draft: Draft, state: DecodeState, gamma: int, rule=accept_reject):
    """Draft, verify, accept, roll back: one step for every row.

    Returns accepted and proposed (B, gamma' <= gamma): the draft tokens accepted, and those proposed.
    """
    timer = state.timer
    with timer("draft"):
        q, x = draft.propose(state, gamma)  # (B, gamma, V), (B, gamma)
        proposed = q.amax(-1) > 0  # (B, gamma) q is all zero where a row proposed nothing
        if draft.ragged:  # host sync: verify only up to the longest proposal (0: a plain step), as vLLM does
            width = int(proposed.sum(1).max())
            q, x, proposed = q[:, :width], x[:, :width], proposed[:, :width]  # (B, width, ...)
    with timer("verify"):
        p = probabilities(target(torch.cat([state.last(1), x], 1), t_cache), state.params)  # (B, gamma+1, V)
    with timer("accept"):
        u = uniform(state.keys_now(ACCEPT, x.shape[1]))  # (B, gamma) one uniform per row and position
        accepted, t = rule(p, q, x, u, lambda w: sample(w, state.draw_keys(TARGET)))  # (B, gamma), (B,)
        n = accepted.sum(1)  # (B,)
        new = torch.cat([x, t[:, None]], 1).scatter(1, n[:, None], t[:, None])  # (B, gamma+1) x_1..x_n, t
        state.emit(new, n + 1, drafted=torch.arange(x.shape[1] + 1, device=x.device) < n[:, None])
        t_cache.rollback(state.total - 1)  # keep what was accepted; finished rows stay put
    return accepted, proposed


@torch.inference_mode()
def speculative_generate(target: Model, draft, prompts, gamma: int | str | GammaPolicy = 4,
                         max_new_tokens: int = 128, temperature: float = 0.0, top_k: int | None = None,
                         top_p: float | None = None, seed: int | list[int] | None = None, eos_token_id=None,
                         rule=accept_reject) -> GenerationResult:
    """Speculative decoding of a batch; the output has the target's distribution exactly.

    ``draft``: a smaller :class:`Model` sharing the target's vocabulary, or a :class:`Draft`
    (``PromptLookupDraft()``, ``LayerSkipDraft(target, n)``). ``gamma``: draft tokens per step
    (>= 1); ``"auto"`` to let the roofline policy choose it each step from the running batch size
    and acceptance (0 = a plain step), on this device's preset or calibration; or any
    :class:`GammaPolicy`. ``seed`` as in :func:`minispec.generate`. ``rule``: the accept rule
    (:func:`accept_reject`; benchmarks and the course swap in others, and the stats say
    ``synthetic`` for a rule marked so). Returns the same :class:`GenerationResult` as
    :func:`minispec.generate`, with speculative stats and ``.accepted`` marking accepted draft tokens.
    """
    draft, policy = as_draft(draft), _policy(gamma)
    G = AUTO_GAMMA_MAX if policy is None else policy.gamma_max
    state = DecodeState(target, prompts, max_new_tokens, SamplingParams(temperature, top_k, top_p), seed,
                        eos_token_id, slack=G + 1)
    draft.check(target, state.slots - G - 1)
    if policy is None:  # validated above; now the device's ceilings (a preset, or one calibration per process)
        if preset_for(target.device) is None and not is_calibrated(target.device, target.dtype):
            warnings.warn(f"gamma='auto' measures {target.device}'s bandwidth and FLOP/s once for this process "
                          "(about a second); call minispec.hardware.calibrate() beforehand to do it up front",
                          stacklevel=2)
        hardware = device_hardware(target.device, target.dtype)
        policy = auto_policy(ModelShape.from_model(target), draft.shape, hardware, gamma_max=G)
    policy.start()
    t_cache = target.new_cache(state.batch_size, state.slots)
    with state.timer("prefill"):
        logits = prefill(target, state, t_cache)  # (B, V)
    with state.timer("draft_prefill"):
        draft.start(state)  # the draft reads every prompt too: a cost in TTFT
    state.first_token(logits)
    dev = state.device
    proposed_at = torch.zeros(G, dtype=torch.long, device=dev)  # (G,) rows that proposed position i
    accepted_at = torch.zeros(G, dtype=torch.long, device=dev)  # (G,) of which accepted
    n_tested = torch.zeros((), dtype=torch.long, device=dev)  # draft tokens the accept test reached
    gammas, running = [], state.start_loop()
    while running:
        g = policy.choose(running)
        if g == 0:  # speculation off: a plain target step; the draft falls one more token behind
            with state.timer("decode"):
                decode_step(target, t_cache, state)
            end = state.end_step()
        else:
            active = ~state.done[:, None]  # (B, 1)
            accepted, proposed = speculative_step(target, t_cache, draft, state, g, rule)  # (B, w <= g) each
            accepted, proposed, w = accepted & active, proposed & active, accepted.shape[1]
            proposed_at[:w] += proposed.sum(0)
            accepted_at[:w] += accepted.sum(0)
            tested = torch.minimum(accepted.sum(1) + 1, proposed.sum(1))  # (B,) up to each row's first rejection
            n_tested += tested.sum()
            end = state.end_step(accepted.sum(), tested.sum())
            policy.observe(end.accepted, end.tested)
        running = end.running
        gammas.append(g)
        t_cache.trim(end.longest)
    proposed_at, accepted_at = proposed_at.tolist(), accepted_at.tolist()
    used = [i for i in range(G) if proposed_at[i]]
    return state.result(
        gamma=gamma if isinstance(gamma, (int, str)) else type(gamma).__name__, draft=repr(draft),
        num_drafts=proposed_at[0], draft_tokens=sum(proposed_at), accepted_tokens=sum(accepted_at),
        tested_tokens=int(n_tested), per_position_acceptance_rates=[accepted_at[i] / proposed_at[i] for i in used],
        gamma_per_step=gammas, synthetic=getattr(rule, "synthetic", False))


def _policy(gamma) -> GammaPolicy | None:
    """The policy for ``gamma``; None for "auto", which is built once the inputs are validated."""
    if isinstance(gamma, GammaPolicy):
        return gamma
    if gamma == "auto":
        return None
    if isinstance(gamma, bool) or not isinstance(gamma, int) or gamma < 1:
        raise ValueError(f"gamma must be an integer >= 1, 'auto' or a GammaPolicy, got {gamma!r}")
    return FixedPolicy(gamma)
