"""Jacobi decoding: speculation with no draft at all, the target guessing its own next tokens.

**Jacobi decoding** (Santilli et al. 2023, arXiv 2305.10427) treats greedy decoding as a fixed-point problem: guess
the next W tokens, run the target once over the sequence and the guess, and replace each guessed token by the
target's argmax at the position before it. The first new token is always right (it follows the true prefix); the
token after guess j is right as soon as guesses 1..j all were, so one pass yields 1 + (the guesses that were already
right, in a run from the first) tokens, at most W + 1. The rest of the updated guess is the next pass's guess (the
*Jacobi trajectory*). Only tokens whose whole prefix was verified are kept, so the output is greedy decoding's.

**Lookahead decoding** (Fu et al. 2024, arXiv 2402.02057) builds on it: it keeps the n-grams the trajectories pass
through in a pool and, in the same pass (a second branch of the attention mask), verifies up to G of the pool's
n-grams that start with the last accepted token, as prompt lookup verifies copies of the prompt. It is not run here;
:func:`jacobi` counts, at every pass of the Jacobi loop, how many tokens the pool's best candidate would have been
right about, so a lesson can see what the pool adds on the same trajectory.

The loop recomputes the target's whole sequence each pass (no KV cache): it is for counting tokens per pass, which
is what sets the speedup where a pass over W + 1 tokens costs about what one token does (a GPU at batch 1). Greedy.
"""

from __future__ import annotations

import torch

from minispec.model.llama import Model


@torch.inference_mode()
def _argmax_after(target: Model, tokens: list[int]) -> list[int]:
    """The target's greedy next token after each prefix of ``tokens`` (one forward pass)."""
    x = torch.tensor([tokens], device=target.device)  # (1, T)
    return target(x)[0].argmax(-1).tolist()  # (T,)


def jacobi(target: Model, prompt: list[int], new_tokens: int, window: int = 8, ngram: int = 4,
           candidates: int = 4) -> dict:
    """Greedy decoding of ``new_tokens`` tokens by Jacobi iteration over a guess of ``window`` tokens (the first
    guess: the prompt's last token repeated). Returns ``tokens``, ``per_pass`` (the tokens each pass yielded), and
    ``pool_right``: for each pass, the most tokens after the last accepted one that one of the pool's ``candidates``
    latest ``ngram``-grams starting with that token gets right (0 where the pool has none), judged against the final
    greedy tokens."""
    if window < 1 or new_tokens < 1 or ngram < 2 or candidates < 1:
        raise ValueError(f"need window, new_tokens, candidates >= 1 and ngram >= 2, got {window}, {new_tokens}, "
                         f"{candidates}, {ngram}")
    out: list[int] = []
    guess = [prompt[-1]] * window
    pool: dict[int, list[tuple[int, ...]]] = {}  # first token -> the latest n-grams after it on the trajectories
    per_pass, offers = [], []  # offers: (where the pass starts in the output, the pool's n-grams after its token)
    while len(out) < new_tokens:
        seq = list(prompt) + out
        y = _argmax_after(target, seq + guess)[len(seq) - 1:]  # (window + 1,) the updated guess and one more
        right = next((j for j in range(window) if guess[j] != y[j]), window)  # guesses right, in a run
        offers.append((len(out), list(pool.get(seq[-1], []))))
        traj = [seq[-1]] + y  # this pass's trajectory: where the guess is heading
        for i in range(len(traj) - ngram + 1):
            grams = pool.setdefault(traj[i], [])
            g = tuple(traj[i:i + ngram])
            if g in grams:
                grams.remove(g)
            grams.insert(0, g)
            del grams[candidates:]
        accepted = y[: right + 1][: new_tokens - len(out)]
        out += accepted
        per_pass.append(len(accepted))
        guess = (y[right + 1:window + 1] + [y[window]] * window)[:window]  # the trajectory goes on

    def matched(at: int, gram: tuple[int, ...]) -> int:
        return next((j for j, t in enumerate(gram[1:]) if at + j >= len(out) or out[at + j] != t), len(gram) - 1)

    pool_right = [max((matched(at, g) for g in grams), default=0) for at, grams in offers]
    return {"tokens": out, "per_pass": per_pass, "pool_right": pool_right}
