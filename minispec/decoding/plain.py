"""Decode a batch plainly, one target pass per token, keeping each row's tokens and progress.

A call decodes prompts of different lengths together. Row b's tokens (prompt, then generated)
live in ``seq[b, :total[b]]``; the model's cache always holds all of them but the last, so a
decode step feeds each row its last token. Rows finish independently (EOS or max_new_tokens); a
finished row stays in the batch, produces nothing and its cache stops advancing.

Who does what in a call: :func:`check_request` validates the inputs before any work;
:class:`DecodeState` keeps the tokens and each row's progress; a
:class:`~minispec.decoding.sampling.Sampler` draws tokens; a :class:`~minispec.decoding.stats.Timeline` and a
:class:`~minispec.decoding.timing.PhaseTimer` take the times; :func:`finish` assembles the result.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from minispec.decoding.sampling import Sampler, SamplingParams, probabilities
from minispec.decoding.stats import Stats, Timeline, latency_stats
from minispec.decoding.timing import PhaseTimer
from minispec.model.llama import Model


@dataclass
class GenerationResult:
    tokens: list[list[int]]  # the new tokens of each row, each stopped at its own EOS or max_new_tokens
    stats: Stats
    accepted: list[list[bool]] | None = None  # speculative only: was each token an accepted draft token?


def check_request(model: Model, prompts, max_new_tokens: int, eos_token_id, slack: int = 0):
    """Validate a call's inputs before any work: (prompts as lists of ints, EOS ids as a list).

    ``slack``: extra positions a row may write past max_new_tokens (speculation's draft tokens).
    """
    V, max_pos = model.config.vocab_size, model.config.max_position_embeddings
    flat = ValueError("expected a list of token lists (a batch of prompts), got a flat list of token ids; "
                      "for one prompt pass [ids], e.g. [tok.encode(text)]")
    if isinstance(prompts, torch.Tensor) and prompts.dim() < 2:
        raise flat
    if isinstance(prompts, str) or (isinstance(prompts, (list, tuple)) and any(isinstance(p, str) for p in prompts)):
        raise ValueError("prompts are token ids, not text: encode each prompt with the tokenizer, "
                         "e.g. [tok.encode(text)]")
    if isinstance(prompts, torch.Tensor):
        prompts = list(prompts)  # (B, T): B prompts of T tokens, as Hugging Face's input_ids
    if not isinstance(prompts, (list, tuple)) or not prompts:
        raise ValueError("prompts must be a non-empty list of token-id lists")
    if any(not hasattr(p, "__len__") or (isinstance(p, torch.Tensor) and p.dim() == 0) for p in prompts):
        raise flat
    prompts = [p.tolist() if isinstance(p, torch.Tensor) else list(p) for p in prompts]
    for i, p in enumerate(prompts):
        if not p:
            raise ValueError(f"prompt {i} is empty")
        if not all(isinstance(t, int) and 0 <= t < V for t in p):
            bad = next(t for t in p if not (isinstance(t, int) and 0 <= t < V))
            raise ValueError(f"prompt {i} has token id {bad!r} outside the vocabulary [0, {V})")
    if not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
    longest = max(len(p) for p in prompts)
    if longest + max_new_tokens > max_pos:
        raise ValueError(f"the longest prompt ({longest} tokens) plus max_new_tokens ({max_new_tokens}) "
                         f"exceeds the model's maximum length of {max_pos} positions")
    eos = [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id or [])
    if not all(isinstance(t, int) and 0 <= t < V for t in eos):
        raise ValueError(f"eos_token_id {eos_token_id!r} is not a token id in [0, {V})")
    return prompts, eos


class StepEnd(NamedTuple):
    """What the host learns at the end of a decode step (one sync)."""

    running: int  # rows still generating
    longest: int  # the longest row's tokens (prompt + generated): a bound for the caches
    context: float  # mean KV tokens per running row (all its tokens but the last; 0 when none runs)
    accepted: int = 0  # speculative steps: draft tokens accepted, over running rows
    tested: int = 0  # speculative steps: draft tokens the accept test reached (up to each row's first rejection)


class DecodeState:
    """The tokens of one call: each row's prompt and output, where it has got to, and when it stops."""

    def __init__(self, prompts: list[list[int]], max_new_tokens: int, eos: list[int], device, slack: int = 0):
        """Validated inputs (:func:`check_request`); ``slack`` extra slots per row for speculation."""
        B, longest = len(prompts), max(len(p) for p in prompts)
        self.device, self.max_new = torch.device(device), max_new_tokens
        self.slots = longest + max_new_tokens + slack  # S: a row never writes past this
        seq = torch.zeros(B, self.slots, dtype=torch.long)  # (B, S) prompt, generated, padding
        for b, p in enumerate(prompts):
            seq[b, : len(p)] = torch.tensor(p)
        self.seq = seq.to(self.device)
        self.prompt_len = torch.tensor([len(p) for p in prompts], device=self.device)  # (B,)
        self.longest = longest  # host-side: the longest row so far, a bound on every cache's length
        self.total = self.prompt_len.clone()  # (B,) tokens in seq
        self.done = torch.zeros(B, dtype=torch.bool, device=self.device)  # (B,)
        self.finish_step = torch.full((B,), -1, dtype=torch.long, device=self.device)  # (B,)
        self.from_draft = torch.zeros(B, self.slots, dtype=torch.bool, device=self.device)  # (B, S)
        self.eos = torch.tensor(eos, dtype=torch.long, device=self.device) if eos else None
        self.step = -1  # decode steps taken (-1 before the first token)

    @classmethod
    def of_rows(cls, seq: torch.Tensor, total: torch.Tensor, prompt_len: torch.Tensor, max_new: torch.Tensor,
                longest: int) -> DecodeState:
        """A state over rows whose tokens are on the device already (the engine's running rows): ``seq`` (B, S)
        with ``total`` (B,) tokens each, of which ``prompt_len`` (B,) prompt, and ``max_new`` (B,) each row's
        own limit; ``longest`` = max(total), host-side. EOS is left to the caller (the engine checks each row's
        own set after the step)."""
        state = cls.__new__(cls)
        state.seq, state.total, state.prompt_len, state.max_new = seq, total, prompt_len, max_new
        state.device, state.longest, state.slots, state.eos, state.step = seq.device, longest, seq.shape[1], None, 0
        state.done = torch.zeros_like(total, dtype=torch.bool)  # (B,)
        state.finish_step = torch.full_like(total, -1)  # (B,)
        state.from_draft = torch.zeros_like(seq, dtype=torch.bool)  # (B, S)
        return state

    @property
    def batch_size(self) -> int:
        return self.seq.shape[0]

    def last(self, k: int = 1) -> torch.Tensor:
        """The last k tokens of each row (B, k); index 0 repeats for rows shorter than k."""
        idx = (self.total[:, None] - k + torch.arange(k, device=self.device)).clamp_min(0)  # (B, k)
        return self.seq.gather(1, idx)

    def emit(self, new: torch.Tensor, n: torch.Tensor, drafted: torch.Tensor | None = None) -> None:
        """Append the first n[b] of new[b] (B, K) to each running row, cut at EOS and max_new_tokens."""
        K = new.shape[1]
        j = torch.arange(K, device=self.device)  # (K,)
        room = self.max_new - (self.total - self.prompt_len)  # (B,) tokens a row may still add
        ends = torch.zeros_like(self.done)  # (B,) the row emits an EOS now
        if self.eos is not None:
            hit = torch.isin(new, self.eos) & (j < n[:, None])  # (B, K)
            first = hit.int().argmax(1) + 1  # (B,) tokens up to and including the first EOS
            ends = hit.any(1) & (first <= room)
            n = torch.where(hit.any(1), torch.minimum(n, first), n)
        n = torch.minimum(n, room) * ~self.done  # (B,) finished rows take nothing
        idx = self.total[:, None] + j  # (B, K) slots past a row's new total are scratch
        self.seq.scatter_(1, idx, new)
        if drafted is not None:
            self.from_draft.scatter_(1, idx, drafted)
        self.total += n
        finished = ~self.done & (ends | (n >= room))  # (B,)
        self.finish_step = torch.where(finished, self.step, self.finish_step)
        self.done |= finished

    def start_loop(self) -> StepEnd:
        """After the first token: rows running, the longest row and the running rows' mean length (one host sync)."""
        end = self.end_step()
        self.step = 0
        return end

    def end_step(self, accepted: torch.Tensor | None = None, tested: torch.Tensor | None = None) -> StepEnd:
        """Close a decode step with one host sync: rows still running, the longest row, the running rows' mean
        KV length, and for a speculative step its accepted and tested draft tokens (0-dim tensors)."""
        running = ~self.done  # (B,)
        extra = [t for t in (accepted, tested) if t is not None]
        # host sync: the loop must know whether any row is still running.
        n, longest, kv, *rest = torch.stack([running.sum(), self.total.max(), ((self.total - 1) * running).sum(),
                                             *extra]).tolist()
        self.step += 1
        if n and self.step >= self.max_new - 1:  # every step gives each running row a token: cannot happen
            raise RuntimeError(f"{n} rows still running after {self.step} decode steps (max_new_tokens="
                               f"{self.max_new}): a step that emitted nothing")
        self.longest = longest
        return StepEnd(n, longest, kv / n if n else 0.0, *rest)


def finish(state: DecodeState, timeline: Timeline, timer: PhaseTimer, **spec) -> GenerationResult:
    """Per-row tokens and the stats of a call (``spec``: the speculative fields of :class:`Stats`)."""
    wall = timeline.elapsed()
    start, total = state.prompt_len.tolist(), state.total.tolist()
    seq, drafted = state.seq.tolist(), state.from_draft.tolist()
    tokens = [row[s:t] for row, s, t in zip(seq, start, total)]
    lat = latency_stats(timeline, [len(t) for t in tokens], state.finish_step.tolist())
    n_out = sum(len(t) for t in tokens)
    stats = Stats(batch_size=state.batch_size, num_output_tokens=n_out, wall_s=wall, output_throughput=n_out / wall,
                  phase_s=timer.totals(), **lat, **spec)
    accepted = [row[s:t] for row, s, t in zip(drafted, start, total)] if "num_drafts" in spec else None
    return GenerationResult(tokens, stats, accepted)


def prefill(model: Model, state: DecodeState, cache, num_layers: int | None = None, features: tuple[int, ...] = ()):
    """Run every prompt through ``model`` (its first ``num_layers`` layers) into ``cache``: the logits (B, V)
    at each last prompt token, and with ``features`` also the residual stream at every prompt position
    (B, T, F) (see :meth:`Model.forward`)."""
    tokens = state.seq[:, : state.longest]  # (B, T) right-padded prompts
    last = (state.prompt_len - 1)[:, None]  # (B, 1)
    if features:
        logits, h = model(tokens, cache, num_layers=num_layers, features=features)  # (B, T, V), (B, T, F)
        cache.rollback(state.prompt_len)  # padding slots become stale
        return logits.gather(1, last[..., None].expand(-1, -1, logits.shape[-1]))[:, 0], h
    logits = model(tokens, cache, output_index=last, num_layers=num_layers)[:, 0]  # (B, V)
    cache.rollback(state.prompt_len)  # padding slots become stale
    return logits


def first_token(state: DecodeState, sampler: Sampler, logits: torch.Tensor, timeline: Timeline) -> None:
    """Each row's first token from the prefill logits (B, V): time to first token ends here."""
    state.emit(sampler.draw(probabilities(logits, sampler.params), state.total)[:, None], torch.ones_like(state.total))
    timeline.first_token(state.device)


def decode_step(model: Model, cache, state: DecodeState, sampler: Sampler, features: tuple[int, ...] = ()):
    """One plain decode step: every running row gets one token from one forward pass. Returns the
    residual-stream ``features`` of the token each row fed (B, 1, F), or None."""
    out = model(state.last(1), cache, features=features)
    logits, h = out if features else (out, None)  # (B, 1, V), (B, 1, F)
    state.emit(sampler.draw(probabilities(logits[:, 0], sampler.params), state.total)[:, None],
               torch.ones_like(state.total))
    cache.rollback(state.total - 1)  # the cache holds all but the last token; finished rows stay put
    return h


@torch.inference_mode()
def generate(model: Model, prompts, max_new_tokens: int, temperature: float = 0.0, top_k: int | None = None,
             top_p: float | None = None, seed: int | list[int] | None = None, eos_token_id=None) -> GenerationResult:
    """Plain batched decoding: one target forward pass per token.

    ``prompts`` is a list of token-id lists of any lengths. Temperature 0 is greedy. ``seed``: one int
    per prompt (a row's draws then depend on its own seed only, so a request gives the same tokens
    alone and in any batch wherever the logits do: in float32 on a CPU, not in bf16 on a GPU), an int
    (row b's seed is derived from (seed, b)), or None. The result has ``.tokens`` (new tokens per row)
    and ``.stats`` (TTFT, TPOT, throughput, ...).
    """
    params = SamplingParams(temperature, top_k, top_p)
    prompts, eos = check_request(model, prompts, max_new_tokens, eos_token_id)
    timeline, timer = Timeline(), PhaseTimer(model.device)
    state = DecodeState(prompts, max_new_tokens, eos, model.device)
    sampler = Sampler(params, seed, state.batch_size, model.device)
    cache = model.new_cache(state.batch_size, state.slots)
    with timer("prefill"):
        logits = prefill(model, state, cache)  # (B, V)
    first_token(state, sampler, logits, timeline)
    running = state.start_loop().running
    while running:
        with timer("decode"):
            decode_step(model, cache, state, sampler)
        end = state.end_step()
        timeline.step(running)
        running = end.running
        cache.trim(end.longest)
    return finish(state, timeline, timer)

