"""Train an EAGLE-3 head (:mod:`minispec.drafts.eagle3`) on a CPU within a wall-clock budget, by training-time test.

Each step reads a batch of windows of the training text through the frozen target once (its p, and its features
at the head's layers, in float32), then unrolls the head over ``ttt`` draft positions at every slot of the windows
at once (:func:`minispec.tools.train_eagle.unroll`): position 1 reads the target's fused features, position k > 1
reads the head's own hidden state from position k - 1, exactly as when drafting, with the keys the draft's cache
would hold. The loss is EAGLE-3's: at each position, the soft cross-entropy to the target's p restricted to the
draft vocabulary and renormalised, over the slots whose target argmax lies in the draft vocabulary (SpecForge's
mask), position k weighted ``decay`` ** (k - 1); no regression onto the target's features (EAGLE-1 has one).

The draft vocabulary is the N most frequent tokens of the training text (SpecForge counts its data the same way),
in increasing id order, so draft id i is target id i + d2t[i].
"""

from __future__ import annotations

import dataclasses
import json
import math
import platform
import resource
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

from minispec.drafts.eagle3 import Eagle3Config, Eagle3Model, save_head
from minispec.model.config import config_from_hf
from minispec.model.llama import native_bf16
from minispec.model.load import EMBEDDED, load, resolve
from minispec.tools.train_eagle import EVAL_POSITIONS, _eagle_corpus, unroll

PROBE_STEPS = 5  # steps timed before the rest of a time budget is first planned (then again at each evaluation)


@dataclass(frozen=True)
class Eagle3TrainConfig:
    features: tuple[int, ...] | None = None  # target layers read; None: vLLM's (2, L // 2, L - 3)
    draft_vocab: int | None = None  # N, the head's own vocabulary (most frequent tokens); None: the target's V
    ttt: int = 4  # draft positions unrolled every step (training-time test); 1: teacher-forced only
    decay: float = 0.8  # weight of position k's loss: decay ** (k - 1) (SpecForge's 0.8)
    seq_len: int = 256  # tokens per window
    batch_size: int = 8  # windows per step
    lr: float = 3e-3  # peak AdamW learning rate: linear warm-up, then cosine to 10 %
    warmup: int = 20  # steps
    eval_every: int = 50  # steps between held-out evaluations
    scaled_init: bool = True  # fc's blocks divided by their layers' rms at the start (False: as they are)
    autocast: str | None = "auto"  # CPU autocast for the target's pass and the head (None: float32 throughout;
    # auto: bfloat16 where the CPU computes it natively, model.llama.native_bf16, else None)
    save_dtype: str = "float32"  # the checkpoint's weights (loading casts them to the target's dtype)
    seed: int = 0


def _corpus(target_name: str, tok) -> tuple[torch.Tensor, torch.Tensor]:
    """(training tokens (n,), held-out tokens (m,)): the same text minispec's EAGLE trainer reads, as one stream."""
    groups, held = _eagle_corpus(target_name, tok)
    sep = [ord("\n")] if target_name in EMBEDDED else [tok.eos_token_id]
    joined = lambda docs: torch.tensor([t for d in docs for t in [*d, *sep]], dtype=torch.long)  # noqa: E731
    return joined([d for g in groups for d in g]), joined(held)


def draft_vocabulary(tokens: torch.Tensor, V: int, N: int) -> torch.Tensor:
    """The N most frequent of ``tokens`` (ties: the lower id), in increasing id order (N,)."""
    counts = torch.bincount(tokens, minlength=V)  # (V,)
    return counts.argsort(descending=True, stable=True)[:N].sort().values


def train_eagle3(target_name: str, out_dir: str | Path, minutes: float = 10.0, *, steps: int | None = None,
                 threads: int | None = 1, config: Eagle3TrainConfig | None = None, progress: bool = True) -> dict:
    """Train an EAGLE-3 head for ``target_name`` (a name :func:`minispec.model.load` takes) in about ``minutes``
    of wall clock on this CPU, write it to ``out_dir`` in vLLM's layout (:meth:`minispec.Eagle3Draft.from_pretrained`
    and ``speculative_config={"method": "eagle3", "model": out_dir}`` read it) with ``training.json``; return that
    record. ``steps`` fixes the number of steps instead of the budget (the record's ``steps`` repeat a run, with
    the same seed and threads). ``threads``: torch's intra-op threads for the run (1: on 2 shared cores, two
    threads fight)."""
    cfg = config or Eagle3TrainConfig()
    if cfg.autocast not in (None, "auto", "bfloat16", "float16"):
        raise ValueError(f"autocast must be None, 'auto', 'bfloat16' or 'float16', got {cfg.autocast!r}")
    if cfg.autocast == "auto":  # resolved here, so that the training record says which ran
        cfg = dataclasses.replace(cfg, autocast="bfloat16" if native_bf16() else None)
    if isinstance(minutes, bool) or not isinstance(minutes, (int, float)) or not minutes > 0:
        raise ValueError(f"minutes must be a number > 0, got {minutes!r}")
    for name, v in (("steps", steps), ("threads", threads), ("ttt", cfg.ttt), ("batch_size", cfg.batch_size)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
    if not 0 < cfg.decay <= 1 or cfg.seq_len < cfg.ttt + 2:
        raise ValueError(f"decay must be in (0, 1] and seq_len at least ttt + 2, got {cfg.decay}, {cfg.seq_len}")
    if Path(out_dir).expanduser().exists() and not Path(out_dir).expanduser().is_dir():
        raise ValueError(f"out_dir {out_dir} is a file; name a folder to write the head in")
    path = resolve(target_name)  # a name that is no checkpoint fails here, before anything loads
    if path.is_dir():  # the head's shape against the target's config (a GGUF file's is read when it loads)
        Eagle3Config.for_target(config_from_hf(json.loads((path / "config.json").read_text())), cfg.features,
                                cfg.draft_vocab)
    old = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        with warnings.catch_warnings():  # autocast's rms_norm of a bf16 input by a float32 weight: a kernel note
            warnings.filterwarnings("ignore", "Mismatch dtype between input and weight", UserWarning)
            return _train(target_name, out_dir, minutes, steps, cfg, print if progress else (lambda *a: None))
    finally:
        torch.set_num_threads(old)


def _train(target_name, out_dir, minutes, steps, cfg: Eagle3TrainConfig, say) -> dict:
    start = time.perf_counter()
    end = start + 60 * minutes
    target, tok = load(target_name, dtype=torch.float32)
    target.requires_grad_(False)
    tc = target.config
    head_cfg = Eagle3Config.for_target(tc, cfg.features, cfg.draft_vocab)
    C, V, N, T = tc.hidden_size, tc.vocab_size, head_cfg.draft_vocab, cfg.seq_len
    train_ids, held_ids = _corpus(target_name, tok)
    gen = torch.Generator().manual_seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    model = Eagle3Model(head_cfg)
    ids = draft_vocabulary(train_ids, V, N)  # (N,) target ids
    model.set_vocab(ids)
    with torch.no_grad():  # start from the target's own rows and final norm, and fc reading the highest layer
        model.lm_head.weight.copy_(target.lm_head.weight[ids])
        model.norm.copy_(target.norm)
        if cfg.scaled_init:
            # the residual stream grows with depth (rms 5 to 11 in the embedded target) and g = fc(f) is the layer's
            # residual as it is (vLLM's computation, no norm): each layer's block of fc is divided by that layer's
            # rms on a few windows, so that g starts near unit rms and the layer's updates are not drowned in it
            k = len(head_cfg.features)
            f0 = target(train_ids[: 4 * T].view(4, T), features=head_cfg.features)[1]  # (4, T, k C)
            rms = f0.unflatten(-1, (k, C)).pow(2).mean((0, 1, 3)).sqrt()  # (k,)
            model.fc.weight.view(C, k, C).div_(rms[:, None])
            model.fc.weight[:, -C:] += torch.eye(C) / rms[-1]
        else:
            model.fc.weight[:, -C:] += torch.eye(C)
    held = held_ids[: len(held_ids) // T * T].view(-1, T)[:8]  # (8, T) held-out windows
    amp = lambda: torch.autocast("cpu", dtype=getattr(torch, cfg.autocast or "float32"),  # noqa: E731
                                 enabled=cfg.autocast is not None)

    def batch(windows: torch.Tensor):
        """The target's features (B, T, k C), p over the draft vocabulary (B, T, N), its full argmax (B, T), and
        whether that argmax is a draft token (B, T)."""
        with torch.no_grad(), amp():
            logits, f = target(windows, features=head_cfg.features)  # (B, T, V), (B, T, k C)
        logits = logits.float()
        best = logits.argmax(-1)  # (B, T)
        return f, logits[..., ids].softmax(-1), best, model.t2d[best]

    def losses(windows: torch.Tensor, positions: int, evaluate: bool = False):
        """Per draft position k: the masked soft cross-entropy, and (``evaluate``) the share of slots where the
        head's argmax (as a target id) is the target's."""
        f, p, best, keep = batch(windows)
        out = []
        with amp():
            hs = unroll(model, target.embed(windows[:, 1:]), f[:, :-1], positions)  # positions x (B, T-1, C)
            logits = [model.logits(hk[:, k:], model.lm_head.weight) for k, hk in enumerate(hs)]  # (B, T-1-k, N)
        for k, lk in enumerate(logits, 1):
            lq = lk.float().log_softmax(-1)  # (B, T-k, N)
            m = keep[:, k:].float()  # (B, T-k) slot j predicts the token after x_{j+1}: p at j + 1
            ce = (-(p[:, k:] * lq).sum(-1) * m).sum() / m.sum().clamp_min(1)
            match = (ids[lq.argmax(-1)] == best[:, k:]).float().mean() if evaluate else None
            out.append((ce, match))
        return out

    weights = [cfg.decay ** k for k in range(cfg.ttt)]
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.0)
    curve, step, total, t_train, eval_s, step_s = [], 0, steps, time.perf_counter(), 0.0, []

    def evaluate(loss: float) -> float:
        t = time.perf_counter()
        with torch.no_grad():
            ev = losses(held, EVAL_POSITIONS, evaluate=True)
        curve.append({"step": step, "seconds": round(time.perf_counter() - t_train, 1), "train_loss": round(loss, 4),
                      "heldout_loss": [round(ce.item(), 4) for ce, _ in ev],
                      "heldout_greedy_match": [round(m.item(), 4) for _, m in ev]})
        say(f"step {step}/{total}: train loss {loss:.3f}, held-out per draft position: loss "
            f"{curve[-1]['heldout_loss']}, greedy match {curve[-1]['heldout_greedy_match']}, "
            f"{curve[-1]['seconds']:.0f} s")
        return time.perf_counter() - t

    while total is None or step < total:
        lr = cfg.lr * ((step + 1) / cfg.warmup if step < cfg.warmup or total is None else
                       0.1 + 0.45 * (1 + math.cos(math.pi * (step - cfg.warmup) / max(1, total - cfg.warmup))))
        for group in opt.param_groups:
            group["lr"] = lr
        t0 = time.perf_counter()
        starts = torch.randint(0, len(train_ids) - T, (cfg.batch_size,), generator=gen)  # (B,)
        windows = train_ids[starts[:, None] + torch.arange(T)]  # (B, T)
        parts = losses(windows, cfg.ttt)
        loss = sum(w * ce for w, (ce, _) in zip(weights, parts)) / sum(weights)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        if step > 1:  # the first step also warms torch up
            step_s.append(time.perf_counter() - t0)
        if steps is None and (step == PROBE_STEPS or total is not None and step % cfg.eval_every == 0):
            # plan the rest of the budget at the pace of the steps since the last plan (on a shared machine the
            # pace changes several-fold as other jobs come and go); the cosine follows the new total
            eval_s = max(eval_s, evaluate(loss.item()))
            pace = sum(step_s[-cfg.eval_every :]) / len(step_s[-cfg.eval_every :])
            left = end - time.perf_counter() - 5.0  # writing the head
            total = step + max(0, int((left - eval_s) / (pace + eval_s / cfg.eval_every)))
            say(f"{pace:.2f} s a step, {eval_s:.2f} s an evaluation: {total} steps")
        elif steps is None and total is not None and step < total and \
                time.perf_counter() + 2 * step_s[-1] + eval_s + 5.0 > end:
            total = step  # slower than planned: stop here, with time for the last evaluation
        if (step % cfg.eval_every == 0 or step == total) and not (curve and curve[-1]["step"] == step):
            evaluate(loss.item())
    record = {
        "target": target_name, "train_config": dataclasses.asdict(cfg), "features": list(head_cfg.features),
        "draft_vocab": N, "parameters": sum(p.numel() for p in model.parameters()),
        "data": f"{len(train_ids):,} training tokens ("
                + ("the standard library's training modules" if target_name in EMBEDDED else
                   "the Python documentation's topics and the standard library's training modules")
                + f"); {cfg.batch_size} windows of {T} tokens a step, at random offsets",
        "tokens_read": total * cfg.batch_size * T, "steps": total,
        "train_seconds": round(time.perf_counter() - t_train, 1), "seconds": round(time.perf_counter() - start, 1),
        "budget_seconds": None if steps else round(60 * minutes, 1),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        "heldout_draft_vocab_mass": _mass(target, held, ids),
        "curve": curve, "python": platform.python_version(), "torch": torch.__version__,
        "threads": torch.get_num_threads(),
    }
    save_head(model, out_dir, getattr(torch, cfg.save_dtype), record)
    return record


@torch.no_grad()
def _mass(target, windows: torch.Tensor, ids: torch.Tensor) -> float:
    """The target's mean probability mass inside the draft vocabulary on ``windows`` (acceptance's ceiling)."""
    return round(target(windows).softmax(-1)[..., ids].sum(-1).mean().item(), 4)
