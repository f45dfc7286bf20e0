"""Plain batched autoregressive decoding (the baseline) and the bookkeeping both loops share.

A batch holds prompts of different lengths. Row b's tokens (prompt, then generated) live in
``seq[b, :total[b]]``; the model's cache always holds all of them but the last, so a decode
step feeds each row its last token. Rows finish independently (EOS or max_new_tokens); a
finished row stays in the batch, produces nothing and its cache stops advancing.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from minispec.model import Model
from minispec.sampling import SamplingParams, probabilities, sample
from minispec.stats import Stats, latency_stats
from minispec.timing import PhaseTimer, synchronize


@dataclass
class GenerationResult:
    tokens: list[list[int]]  # the new tokens of each row, each stopped at its own EOS or max_new_tokens
    stats: Stats
    accepted: list[list[bool]] | None = None  # speculative only: was each token an accepted draft token?


class Batch:
    """Token buffers, per-row progress and timestamps of one decoding call."""

    def __init__(self, model: Model, prompts, max_new_tokens: int, params: SamplingParams,
                 seed: int | None, eos_token_id, slack: int = 0):
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
        if seed is not None and not isinstance(seed, int):
            raise ValueError(f"seed must be an integer or None, got {seed!r}")

        self.t0 = time.perf_counter()
        dev = self.device = model.device
        B, self.max_new, self.params = len(prompts), max_new_tokens, params
        self.slots = longest + max_new_tokens + slack  # S: a row never writes past this
        self.seq = torch.zeros(B, self.slots, dtype=torch.long)  # (B, S) prompt, generated, padding
        for b, p in enumerate(prompts):
            self.seq[b, : len(p)] = torch.tensor(p)
        self.seq = self.seq.to(dev)
        self.prompt_len = torch.tensor([len(p) for p in prompts], device=dev)  # (B,)
        self.longest = longest
        self.total = self.prompt_len.clone()  # (B,) tokens in seq
        self.done = torch.zeros(B, dtype=torch.bool, device=dev)  # (B,)
        self.finish_step = torch.full((B,), -1, dtype=torch.long, device=dev)  # (B,)
        self.from_draft = torch.zeros(B, self.slots, dtype=torch.bool, device=dev)  # (B, S)
        self.eos = torch.tensor(eos, dtype=torch.long, device=dev) if eos else None
        self.gen = torch.Generator(device=dev)
        self.gen.manual_seed(seed) if seed is not None else self.gen.seed()
        self.timer = PhaseTimer(dev)
        self.t_first, self.step_ends, self.step_active, self.step = None, [], [], -1

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

    def draw(self, logits: torch.Tensor) -> torch.Tensor:
        """One token per row (B,) from logits (B, V) under this call's sampling parameters."""
        return sample(probabilities(logits, self.params), self.gen, self.params.greedy)

    def first_token(self, logits: torch.Tensor) -> None:
        """Sample each row's first token from the prefill logits (B, V): time to first token ends here."""
        self.emit(self.draw(logits)[:, None], torch.ones_like(self.total))
        synchronize(self.device)  # host sync: TTFT is the moment the first token exists
        self.t_first = time.perf_counter()

    def end_step(self, *extra: torch.Tensor) -> list[int]:
        """Close a decode step: one host sync that reads how many rows still run, the longest
        row, and any extra scalars the caller needs on the host (e.g. for its gamma policy)."""
        # host sync: the loop must know whether any row is still running.
        vals = torch.stack([(~self.done).sum(), self.total.max(), *extra]).tolist()
        self.step += 1
        self.step_ends.append(time.perf_counter())
        self.step_active.append(self.active_before)
        self.active_before = vals[0]
        return vals

    def start_loop(self) -> int:
        """Rows running after the first token (one host sync)."""
        self.active_before = int((~self.done).sum())  # host sync: before the first decode step
        self.step = 0
        return self.active_before

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


def prefill(model: Model, batch: Batch, cache) -> torch.Tensor:
    """Run every prompt through ``model`` into ``cache``; the logits (B, V) at each last prompt token."""
    tokens = batch.seq[:, : batch.longest]  # (B, T) right-padded prompts
    logits = model(tokens, cache, output_index=(batch.prompt_len - 1)[:, None])[:, 0]  # (B, V)
    cache.rollback(batch.prompt_len)  # padding slots become stale
    return logits


def decode_step(model: Model, cache, batch: Batch) -> None:
    """One plain decode step: every running row gets one token from one forward pass."""
    logits = model(batch.last(1), cache)[:, 0]  # (B, V)
    batch.emit(batch.draw(logits)[:, None], torch.ones_like(batch.total))
    cache.rollback(batch.total - 1)  # the cache holds all but the last token; finished rows stay put


@torch.inference_mode()
def generate(model: Model, prompts, max_new_tokens: int, temperature: float = 0.0, top_k: int | None = None,
             top_p: float | None = None, seed: int | None = None, eos_token_id=None) -> GenerationResult:
    """Plain batched decoding: one target forward pass per token.

    ``prompts`` is a list of token-id lists of any lengths. Temperature 0 is greedy. The result
    has ``.tokens`` (new tokens per row) and ``.stats`` (TTFT, TPOT, throughput, ...).
    """
    batch = Batch(model, prompts, max_new_tokens, SamplingParams(temperature, top_k, top_p), seed, eos_token_id)
    cache = model.new_cache(batch.batch_size, batch.slots)
    with batch.timer("prefill"):
        logits = prefill(model, batch, cache)  # (B, V)
    batch.first_token(logits)
    running = batch.start_loop()
    while running:
        with batch.timer("decode"):
            decode_step(model, cache, batch)
        running, longest = batch.end_step()
        cache.trim(longest)
    return batch.result()
