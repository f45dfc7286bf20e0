"""Plain batched autoregressive decoding (the baseline), and the state one decoding call keeps.

A call decodes prompts of different lengths together. Row b's tokens (prompt, then generated)
live in ``seq[b, :total[b]]``; the model's cache always holds all of them but the last, so a
decode step feeds each row its last token. Rows finish independently (EOS or max_new_tokens); a
finished row stays in the batch, produces nothing and its cache stops advancing.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import NamedTuple

import torch

from minispec.model import Model
from minispec.sampling import TARGET, SamplingParams, keys_at, probabilities, row_keys, row_seeds, sample, subkeys
from minispec.stats import Stats, latency_stats
from minispec.timing import PhaseTimer, synchronize


@dataclass
class GenerationResult:
    tokens: list[list[int]]  # the new tokens of each row, each stopped at its own EOS or max_new_tokens
    stats: Stats
    accepted: list[list[bool]] | None = None  # speculative only: was each token an accepted draft token?


class StepEnd(NamedTuple):
    """What the host learns at the end of a decode step (one sync)."""

    running: int  # rows still generating
    longest: int  # the longest row's tokens (prompt + generated): a bound for the caches
    accepted: int = 0  # speculative steps: draft tokens accepted, over running rows
    tested: int = 0  # speculative steps: draft tokens the accept test reached (up to each row's first rejection)


class DecodeState:
    """Token buffers, per-row progress, random keys and timestamps of one decoding call."""

    def __init__(self, model: Model, prompts, max_new_tokens: int, params: SamplingParams,
                 seed: int | list[int] | None, eos_token_id, slack: int = 0):
        """Validate everything before any work; ``slack`` extra slots per row for speculation."""
        V, max_pos = model.config.vocab_size, model.config.max_position_embeddings
        if not isinstance(prompts, (list, tuple)) or not prompts:
            raise ValueError("prompts must be a non-empty list of token-id lists")
        prompts = [p.tolist() if isinstance(p, torch.Tensor) else list(p) for p in prompts]
        for i, p in enumerate(prompts):
            if not p:
                raise ValueError(f"prompt {i} is empty")
            if not all(isinstance(t, int) and 0 <= t < V for t in p):
                bad = next(t for t in p if not (isinstance(t, int) and 0 <= t < V))
                raise ValueError(f"prompt {i} has token id {bad!r} outside the vocabulary [0, {V})")
        if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
        longest = max(len(p) for p in prompts)
        if longest + max_new_tokens > max_pos:
            raise ValueError(f"the longest prompt ({longest} tokens) plus max_new_tokens ({max_new_tokens}) "
                             f"exceeds the model's maximum length of {max_pos} positions")
        eos = [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id or [])
        if not all(isinstance(t, int) and 0 <= t < V for t in eos):
            raise ValueError(f"eos_token_id {eos_token_id!r} is not a token id in [0, {V})")
        seeds = row_seeds(seed, len(prompts))

        self.t0 = time.perf_counter()
        dev = self.device = model.device
        B, self.max_new, self.params = len(prompts), max_new_tokens, params
        self.slots = longest + max_new_tokens + slack  # S: a row never writes past this
        self.seq = torch.zeros(B, self.slots, dtype=torch.long)  # (B, S) prompt, generated, padding
        for b, p in enumerate(prompts):
            self.seq[b, : len(p)] = torch.tensor(p)
        self.seq = self.seq.to(dev)
        self.prompt_len = torch.tensor([len(p) for p in prompts], device=dev)  # (B,)
        self.longest = longest  # host-side: the longest row so far, a bound on every cache's length
        self.total = self.prompt_len.clone()  # (B,) tokens in seq
        self.done = torch.zeros(B, dtype=torch.bool, device=dev)  # (B,)
        self.finish_step = torch.full((B,), -1, dtype=torch.long, device=dev)  # (B,)
        self.from_draft = torch.zeros(B, self.slots, dtype=torch.bool, device=dev)  # (B, S)
        self.eos = torch.tensor(eos, dtype=torch.long, device=dev) if eos else None
        self.keys = row_keys(seeds, dev)  # (B,) each row's random key: its draws never depend on other rows
        self.timer = PhaseTimer(dev)
        self.t_first, self.step_ends, self.step_active, self.step = None, [], [], -1

    @property
    def batch_size(self) -> int:
        return self.seq.shape[0]

    def last(self, k: int = 1) -> torch.Tensor:
        """The last k tokens of each row (B, k); index 0 repeats for rows shorter than k."""
        idx = (self.total[:, None] - k + torch.arange(k, device=self.device)).clamp_min(0)  # (B, k)
        return self.seq.gather(1, idx)

    def draw_keys(self, stream: int, n: int | None = None) -> torch.Tensor | None:
        """Random keys of this step for ``stream``: (B,), or (B, n) for n draws in a row; None when
        greedy (argmax needs no randomness). A step is keyed by the position where it starts
        (``total``), which grows every step."""
        return None if self.params.greedy else self.keys_now(stream, n)

    def keys_now(self, stream: int, n: int | None = None) -> torch.Tensor:
        """As :meth:`draw_keys`, also when greedy."""
        keys = keys_at(self.keys, stream, self.total)  # (B,)
        return keys if n is None else subkeys(keys, n)  # (B, [n])

    def draw(self, logits: torch.Tensor) -> torch.Tensor:
        """One target token per row (B,) from logits (B, V) under this call's sampling parameters."""
        return sample(probabilities(logits, self.params), self.draw_keys(TARGET))

    def emit(self, new: torch.Tensor, n: torch.Tensor, drafted: torch.Tensor | None = None) -> None:
        """Append the first n[b] of new[b] (B, K) to each running row, cut at EOS and max_new_tokens."""
        K = new.shape[1]
        j = torch.arange(K, device=self.device)  # (K,)
        count = self.total - self.prompt_len  # (B,) tokens generated so far
        room = self.max_new - count  # (B,)
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

    def first_token(self, logits: torch.Tensor) -> None:
        """Sample each row's first token from the prefill logits (B, V): time to first token ends here."""
        self.emit(self.draw(logits)[:, None], torch.ones_like(self.total))
        synchronize(self.device)  # host sync: TTFT is the moment the first token exists
        self.t_first = time.perf_counter()

    def start_loop(self) -> int:
        """Rows running after the first token (one host sync)."""
        self.active_before = int((~self.done).sum())  # host sync: before the first decode step
        self.longest += 1
        self.step = 0
        return self.active_before

    def end_step(self, accepted: torch.Tensor | None = None, tested: torch.Tensor | None = None) -> StepEnd:
        """Close a decode step with one host sync: rows still running, the longest row, and for a
        speculative step its accepted and tested draft-token counts (0-dim tensors)."""
        extra = [t for t in (accepted, tested) if t is not None]
        # host sync: the loop must know whether any row is still running.
        end = StepEnd(*torch.stack([(~self.done).sum(), self.total.max(), *extra]).tolist())
        self.step += 1
        self.step_ends.append(time.perf_counter())
        self.step_active.append(self.active_before)
        self.active_before, self.longest = end.running, end.longest
        return end

    def result(self, **spec) -> GenerationResult:
        """Per-row tokens and the stats of this call."""
        wall = time.perf_counter() - self.t0
        start, total = self.prompt_len.tolist(), self.total.tolist()
        seq, drafted = self.seq.tolist(), self.from_draft.tolist()
        tokens = [row[s:t] for row, s, t in zip(seq, start, total)]
        lat = latency_stats(self.t0, self.t_first, self.step_ends, self.step_active,
                            [len(t) for t in tokens], self.finish_step.tolist())
        n_out = sum(len(t) for t in tokens)
        stats = Stats(batch_size=self.batch_size, num_output_tokens=n_out, wall_s=wall,
                      output_throughput=n_out / wall, phase_s=self.timer.totals(), **lat, **spec)
        accepted = [row[s:t] for row, s, t in zip(drafted, start, total)] if "num_drafts" in spec else None
        return GenerationResult(tokens, stats, accepted)


def prefill(model: Model, state: DecodeState, cache, num_layers: int | None = None) -> torch.Tensor:
    """Run every prompt through ``model`` (its first ``num_layers`` layers) into ``cache``; the logits
    (B, V) at each last prompt token."""
    tokens = state.seq[:, : state.longest]  # (B, T) right-padded prompts
    logits = model(tokens, cache, output_index=(state.prompt_len - 1)[:, None], num_layers=num_layers)[:, 0]  # (B, V)
    cache.rollback(state.prompt_len)  # padding slots become stale
    return logits


def decode_step(model: Model, cache, state: DecodeState) -> None:
    """One plain decode step: every running row gets one token from one forward pass."""
    logits = model(state.last(1), cache)[:, 0]  # (B, V)
    state.emit(state.draw(logits)[:, None], torch.ones_like(state.total))
    cache.rollback(state.total - 1)  # the cache holds all but the last token; finished rows stay put


@torch.inference_mode()
def generate(model: Model, prompts, max_new_tokens: int, temperature: float = 0.0, top_k: int | None = None,
             top_p: float | None = None, seed: int | list[int] | None = None, eos_token_id=None) -> GenerationResult:
    """Plain batched decoding: one target forward pass per token.

    ``prompts`` is a list of token-id lists of any lengths. Temperature 0 is greedy. ``seed``: an
    int (row b's draws are derived from (seed, b)), one int per prompt, or None; a seeded row's
    tokens do not depend on the other rows of the batch. The result has ``.tokens`` (new tokens
    per row) and ``.stats`` (TTFT, TPOT, throughput, ...).
    """
    state = DecodeState(model, prompts, max_new_tokens, SamplingParams(temperature, top_k, top_p), seed, eos_token_id)
    cache = model.new_cache(state.batch_size, state.slots)
    with state.timer("prefill"):
        logits = prefill(model, state, cache)  # (B, V)
    state.first_token(logits)
    running = state.start_loop()
    while running:
        with state.timer("decode"):
            decode_step(model, cache, state)
        running, longest, *_ = state.end_step()
        cache.trim(longest)
    return state.result()
