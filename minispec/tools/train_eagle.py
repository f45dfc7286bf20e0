"""Train an EAGLE head for any target on a CPU within a wall-clock budget, by self-distillation.

The head reads the target's features (see :mod:`minispec.drafts.eagle`); training unrolls its own
hidden states for several positions (the training-time test), and a hot vocabulary is cut from the
tokens the target expects most often.
"""

from __future__ import annotations

import dataclasses
import json
import math
import platform
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import torch
import torch.nn.functional as F

from minispec.model.config import config_from_hf
from minispec.model.llama import Model, native_bf16
from minispec.model.load import EMBEDDED, load, resolve, sample_text
from minispec.tools.train import code_files

EVAL_POSITIONS = 4  # draft positions the held-out evaluation unrolls (gamma 4)
PROBE_STEPS = 5  # training steps before the first evaluation and plan of a time budget (replanned at each one)


# Chat prompts for self-distillation: tasks x subjects. The benchmark's held-out prompts are none of these.
_TASKS = ("Explain {} to a ten-year-old.", "Write a short paragraph about {}.", "Give three facts about {}.",
          "What are common misconceptions about {}?", "Write a short poem about {}.", "What is the history of {}?",
          "How does {} affect everyday life?", "Describe {} in three sentences.")


_SUBJECTS = ("the ocean", "volcanoes", "photosynthesis", "the moon", "bicycles", "coffee", "democracy",
             "electricity", "honey bees", "the Roman Empire", "rainbows", "sleep", "Python lists", "recursion",
             "sorting algorithms", "unit tests")


@dataclass(frozen=True)
class EagleTrainConfig:
    features: tuple[int, ...] | None = None  # target layers read; None: (L,), after the last layer, pre-norm
    hot_vocab: int | None = None  # train and draft over this many hot tokens; None: the full vocabulary
    ttt: int = 2  # draft positions unrolled per window (training-time test); 1: teacher-forced only
    ttt_from: float = 0.8  # ... from this share of the steps on (before it: position 1 only, a third of the cost)
    seq_len: int = 256  # tokens per window
    batch_size: int = 8  # windows per step
    lr: float = 5e-3  # peak AdamW learning rate, cosine-decayed to 10 % after a linear warm-up
    warmup: int = 20  # steps
    data_share: float = 0.4  # share of the time budget for data (self-distillation and the features pass)
    distill_tokens: int = 160  # new tokens per self-distilled answer (0: no self-distillation)
    data_dtype: str = "auto"  # the target's dtype in the data pass; auto: bfloat16 where native_bf16() (else float32)
    save_dtype: str = "float32"  # the checkpoint's weights ("bfloat16" halves it; loading casts to the target's)
    reg: float = 1.0  # weight of the regression of the head's hidden state onto the target's next one (EAGLE-1)
    seed: int = 0
    eval_every: int = 25  # steps between held-out evaluations


class _Keys:
    """Stands in for a KV cache in the unrolled forward: the keys and values of the earlier draft positions."""

    def __init__(self):
        self.k, self.v = [], []

    def update(self, layer, k, v):
        self.k.append(k)
        self.v.append(v)
        return torch.cat(self.k, 2), torch.cat(self.v, 2)  # (B, K, steps * T, D) each


def unroll(model, emb: torch.Tensor, f: torch.Tensor, steps: int) -> list[torch.Tensor]:
    """The head's hidden states (B, T, C) at draft positions 1..steps for every pair slot j (training-time test).

    emb (B, T, C): embeddings of x_{j+1}; f (B, T, F): the target's features at j. Position 1 reads f_j;
    position k > 1 reads its own position k - 1's hidden state at slot j - 1 and sees, as the draft's cache
    would hold them at inference, the target-fed slots up to j - k + 1 and its own positions 2..k at slots
    j - k + 2 .. j. Slots j < k - 1 have no such history: leave them out of the loss.
    """
    from minispec.drafts.eagle import rotary

    T = emb.shape[1]
    j, s = torch.arange(T)[:, None], torch.arange(T)[None, :]  # (T, 1), (1, T) query and key slots
    cos, sin = rotary(torch.arange(T)[None], model.inv_freq, emb.dtype)
    keys, hs, g = _Keys(), [], f
    for k in range(1, steps + 1):
        seen = [s <= j - k + 1] + [s == j - k + i for i in range(2, k + 1)]  # k x (T, T)
        h = model.layer(model.fuse(emb, g, k == 1), cos, sin, {None: torch.cat(seen, 1)[None, None]}, keys)
        hs.append(h)  # (B, T, C)
        g = torch.cat([torch.zeros_like(h[:, :1]), h[:, :-1]], 1)  # (B, T, C) slot j reads slot j - 1's state
    return hs


def _eagle_corpus(target_name: str, tok) -> tuple[list[list[list[int]]], list[list[int]]]:
    """(groups of training documents, held-out documents) as token lists. Training, in the order the data pass
    reads them: for a subword tokenizer the Python documentation's prose topics (``pydoc_data``), then the
    standard library's training modules (for the byte-level targets: those alone, their own training corpus).
    Held out: the shipped code sample (and for a subword tokenizer the prose sample too)."""
    from pydoc_data.topics import topics

    train_files, _ = code_files()
    if target_name in EMBEDDED:
        return [[list(b"\n".join(f.read_bytes() for f in train_files))]], [list(sample_text("code"))]
    enc = lambda s: tok(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    prose = [enc(topics[k]) for k in sorted(topics)]
    code = [enc(f.read_text(encoding="utf-8")) for f in train_files]
    return [prose, code], [enc(sample_text(k).decode("utf-8")) for k in ("prose", "code")]


def _self_distill(target: Model, tok, new_tokens: int, seed: int, deadline: float, say) -> list[list[int]]:
    """The target's own answers (temperature 0.7, one seed per prompt) to the chat prompts, prompt + answer per
    document, as far as they get by ``deadline`` (perf_counter seconds). All prompts are answered a few tokens at a
    time: a row's random numbers depend on its seed and position only, so the pieces are the tokens one call would
    give. Each piece is as long as the last one's prefill and step times say fits before the deadline."""
    from minispec.decoding.plain import generate

    chats = [[{"role": "user", "content": t.format(s)}] for t in _TASKS for s in _SUBJECTS]
    prompts = [tok.apply_chat_template(c, add_generation_prompt=True, tokenize=True)["input_ids"] for c in chats]
    docs, seeds = [list(p) for p in prompts], [seed + i for i in range(len(prompts))]
    open_rows = set(range(len(prompts)))  # rows whose answer has not ended
    t0, made, piece, cost = time.perf_counter(), 0, 2, None  # cost(n): predicted seconds of a piece of n tokens
    while made < new_tokens and open_rows:
        left = deadline - time.perf_counter()
        if cost is not None:
            piece = max((n for n in range(1, new_tokens - made + 1) if cost(n) <= left), default=0)
        if piece < 1 or left <= 0:
            break
        rows = sorted(open_rows)
        out = generate(target, [docs[i] for i in rows], piece, temperature=0.7, seed=[seeds[i] for i in rows],
                       eos_token_id=tok.eos_token_id)
        step = (out.stats.wall_s - out.stats.ttft_s) / max(piece - 1, 1)  # seconds per token after the first
        grow = (sum(len(docs[i]) for i in rows) + piece * len(rows)) / sum(len(docs[i]) for i in rows)
        cost = lambda n, first=out.stats.ttft_s * grow, step=step: first + (n - 1) * step  # noqa: E731
        for i, o in zip(rows, out.tokens):
            docs[i] += o
            if len(o) < piece or not o or o[-1] == tok.eos_token_id:
                open_rows.discard(i)
        made += piece
        say(f"self-distillation: {made}/{new_tokens} tokens for {len(prompts)} answers, "
            f"{time.perf_counter() - t0:.0f} s")
    return [d for d, p in zip(docs, prompts) if len(d) > len(p)]


def _pack(docs: list[list[int]], seq_len: int, sep: int, gen: torch.Generator) -> torch.Tensor:
    """Windows (N, seq_len) of the documents joined by ``sep``, in a seeded random order."""
    ids = torch.tensor([t for d in docs for t in [*d, sep]], dtype=torch.long)
    n = len(ids) // seq_len * seq_len
    windows = ids[:n].view(-1, seq_len)  # (N, T)
    return windows[torch.randperm(len(windows), generator=gen)]


@torch.inference_mode()
def _features(target: Model, windows: torch.Tensor, layers: tuple[int, ...], deadline: float, say,
              counts: torch.Tensor | None = None) -> torch.Tensor:
    """The target's residual stream after ``layers`` (N', T, F) for the first N' windows done before ``deadline``
    (perf_counter seconds; at least one batch); adds each position's p to ``counts`` (V,) if given."""
    out, t0 = [], time.perf_counter()
    for i in range(0, len(windows), 4):
        logits, h = target(windows[i : i + 4], features=layers)  # (b, T, V), (b, T, F)
        out.append(h.to(torch.bfloat16))
        if counts is not None:
            counts += logits.float().softmax(-1).sum((0, 1)).double()
        if (i // 4) % 10 == 0:
            say(f"features: {i + len(h)}/{len(windows)} windows, {time.perf_counter() - t0:.0f} s")
        if time.perf_counter() > deadline:
            break
    return torch.cat(out)


class EagleData(NamedTuple):
    """What the head trains on: windows, the target's stored features, a held-out set, expected token counts."""

    windows: torch.Tensor  # (N, T) token ids
    features: torch.Tensor  # (N, T, F) bf16: the target's residual stream after ``layers``
    layers: tuple[int, ...]  # the stored layers: the head's features and the target's last layer
    heldout: torch.Tensor  # (8, T)
    heldout_features: torch.Tensor  # (8, T, F)
    counts: torch.Tensor  # (V,) float64: sum over the training positions of the target's p
    distilled: int  # self-distilled answers among the documents
    seconds: float


def eagle_data(target_name: str, features: tuple[int, ...], cfg: EagleTrainConfig, deadline: float,
               windows: int | None = None, say=print) -> EagleData:
    """Documents, windows and one teacher-forced pass of ``target_name`` (in ``cfg.data_dtype``) over as many
    windows as fit before ``deadline`` (perf_counter seconds), or over ``windows`` of them. A chat target's
    self-distilled answers take half the time left once the corpora are read (all of them when ``windows`` is
    given)."""
    start = time.perf_counter()
    target, tok = load(target_name, dtype=getattr(torch, cfg.data_dtype))
    L, V = target.config.num_hidden_layers, target.config.vocab_size
    layers = tuple(sorted(set(features) | {L}))
    gen = torch.Generator().manual_seed(cfg.seed)
    groups, held_docs = _eagle_corpus(target_name, tok)
    distilled = []
    if cfg.distill_tokens and getattr(tok, "chat_template", None):  # half the data time left, the rest for features
        until = math.inf if windows is not None else (time.perf_counter() + deadline) / 2
        distilled = _self_distill(target, tok, cfg.distill_tokens, cfg.seed, until, say)
    sep = ord("\n") if target_name in EMBEDDED else tok.eos_token_id
    # the target's own answers first (the closest to what the head will draft), then the corpora in order
    pool = torch.cat([_pack(docs, cfg.seq_len, sep, gen) for docs in [distilled, *groups] if docs])  # (N, T)
    counts = torch.zeros(V, dtype=torch.float64)
    feats = _features(target, pool[:windows], layers, deadline if windows is None else math.inf, say, counts)
    held = _pack(held_docs, cfg.seq_len, sep, torch.Generator().manual_seed(0))[:8]  # (8, T)
    held_feats = _features(target, held, layers, math.inf, lambda *a: None)
    return EagleData(pool[: len(feats)], feats, layers, held, held_feats, counts, len(distilled),
                     time.perf_counter() - start)


def train_eagle(target_name: str, out_dir: str | Path, hot_vocab: int | None = None, minutes: float = 10.0,
                seed: int = 0, *, steps: int | None = None, windows: int | None = None, threads: int | None = None,
                config: EagleTrainConfig | None = None, data: EagleData | None = None, progress: bool = True) -> dict:
    """Train an EAGLE head for ``target_name`` (any name :func:`minispec.model.load` takes) in about ``minutes`` on this
    CPU; write it to ``out_dir`` (``config.json``, ``model.safetensors``, ``training.json``) for
    :meth:`minispec.EagleDraft.from_pretrained`; return what ``training.json`` records.

    ``hot_vocab``: draft over the N tokens the target expects most often in the training data (FR-Spec);
    None: the full vocabulary. ``minutes`` bounds the whole call, loading, data, training, the held-out
    evaluations and writing the head: ``config.data_share`` of it for the data (self-distillation for a chat
    model, then the target's features over as many windows as fit), the rest for as many steps as fit,
    planned from the speed of the first five steps and the time of one evaluation, and cut short if the
    machine slows down. ``windows`` and ``steps`` fix both instead (the record gives the values a run used:
    passing them again, with the same seed and threads, repeats it). ``threads``: torch's intra-op threads for
    the run (on a shared CPU 1 is often faster than 2). ``data``: reuse what :func:`eagle_data` made (its time
    is then not in the budget).
    """
    from minispec.drafts.eagle import EagleConfig

    cfg = dataclasses.replace(config or EagleTrainConfig(), hot_vocab=hot_vocab, seed=seed)
    if cfg.data_dtype == "auto":  # resolved here, so that the training record says which ran
        cfg = dataclasses.replace(cfg, data_dtype="bfloat16" if native_bf16() else "float32")
    if isinstance(minutes, bool) or not isinstance(minutes, (int, float)) or not minutes > 0:
        raise ValueError(f"minutes must be a number > 0, got {minutes!r}")
    for name, v in (("steps", steps), ("windows", windows), ("threads", threads)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise ValueError(f"{name} must be an integer >= 1 or None, got {v!r}")
    if Path(out_dir).expanduser().exists() and not Path(out_dir).expanduser().is_dir():
        raise ValueError(f"out_dir {out_dir} is a file; name a folder to write the head in")
    path = resolve(target_name)  # a name that is no checkpoint fails here, before anything loads
    if path.is_dir():  # the head's shape against the target's config (a GGUF file's is read when it loads)
        EagleConfig.for_target(config_from_hf(json.loads((path / "config.json").read_text())), cfg.features, hot_vocab)
    old_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    say = print if progress else (lambda *a: None)
    try:
        with warnings.catch_warnings():
            # Under autocast, rms_norm of a bf16 input by a float32 weight falls back to an unfused kernel and says
            # so: the result is right and a caller can do nothing about it, so the warning is not passed on.
            warnings.filterwarnings("ignore", "Mismatch dtype between input and weight", UserWarning)
            return _train(target_name, out_dir, hot_vocab, minutes, seed, steps, windows, cfg, data, say)
    finally:
        torch.set_num_threads(old_threads)


def _train(target_name, out_dir, hot_vocab, minutes, seed, steps, windows, cfg, data, say) -> dict:
    """:func:`train_eagle` once its arguments are checked."""
    import resource

    from minispec.drafts.eagle import EagleConfig, EagleModel, save_head

    start, budget = time.perf_counter(), 60 * minutes
    end = start + budget
    target, _ = load(target_name, dtype=torch.float32)
    head_cfg = EagleConfig.for_target(target.config, cfg.features, hot_vocab)  # checks features and hot_vocab
    L, V, C, eps = (target.config.num_hidden_layers, target.config.vocab_size, target.config.hidden_size,
                    target.config.rms_norm_eps)
    torch.manual_seed(seed)
    if data is None:
        data = eagle_data(target_name, head_cfg.features, cfg, start + cfg.data_share * budget, windows, say)
    say(f"data: {len(data.windows)} windows of {data.windows.shape[1]} tokens ({data.distilled} self-distilled "
        f"answers), {data.seconds:.0f} s")
    gen = torch.Generator().manual_seed(seed + 1)
    model = EagleModel(head_cfg)
    model.ranking = data.counts.argsort(descending=True, stable=True)  # (V,) most expected first
    with torch.no_grad():
        model.norm.copy_(target.norm)
        model.fc.weight[:, C:] += torch.eye(C)  # start from "the layer reads the feature"
    rows = model.ranking[:hot_vocab].sort().values if hot_vocab else torch.arange(V)  # (N,) target ids
    head = target.lm_head.weight[rows]  # (N, C) frozen: the target's rows
    pick = [data.layers.index(i) for i in head_cfg.features]
    last = data.layers.index(L)
    norm = lambda t: F.rms_norm(t, (C,), None, eps)  # noqa: E731

    def losses(x, h, positions, evaluate=False):
        """Per draft position k: soft cross-entropy to p (over the head's rows), the regression of the head's
        normalised hidden state onto the target's at j + 1, and (``evaluate``) the share of slots where the
        head's argmax is the target's over the full vocabulary; windows x (B, T), stored features h (B, T, F)."""
        h = h.float()
        f_last = h[..., last * C : (last + 1) * C]  # (B, T, C)
        with torch.no_grad():
            p = F.linear(F.rms_norm(f_last[:, 1:], (C,), target.norm, eps), head).float().softmax(-1)  # (B, T-1, N)
            best = (F.linear(F.rms_norm(f_last[:, 1:], (C,), target.norm, eps), target.lm_head.weight).argmax(-1)
                    if evaluate else None)  # (B, T-1) the target's greedy token after x_{j+1}
        f = torch.cat([h[:, :-1, i * C : (i + 1) * C] for i in pick], -1)  # (B, T-1, k C)
        out = []
        for k, hk in enumerate(unroll(model, target.embed(x[:, 1:]), f, positions), 1):
            lq = model.logits(hk[:, k - 1 :], head).float().log_softmax(-1)  # (B, T-k, N)
            ce = -(p[:, k - 1 :] * lq).sum(-1).mean()
            reg = (norm(hk[:, k - 1 :].float()) - norm(f_last[:, k:])).pow(2).mean()
            match = (rows[lq.argmax(-1)] == best[:, k - 1 :]).float().mean() if evaluate else None
            out.append((ce, reg, match))
        return out

    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.0)
    curve, t_train, total, step, warmup, eval_s = [], time.perf_counter(), steps, 0, cfg.warmup, 0.0
    unroll_from = None if steps is None else math.ceil(cfg.ttt_from * steps)  # the first step unrolling ttt positions
    timing = {1: [0.0, 0], cfg.ttt: [0.0, 0]}  # seconds and steps by positions unrolled (the first step left out)
    pace = lambda k: (timing[k][0] / timing[k][1] if timing[k][1] else k * timing[1][0] / max(1, timing[1][1]))  # noqa: E731

    def evaluate(loss) -> float:
        t = time.perf_counter()
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=native_bf16()):
            ev = losses(data.heldout, data.heldout_features, EVAL_POSITIONS, evaluate=True)
        curve.append({"step": step, "seconds": round(time.perf_counter() - t_train, 1),
                      "train_loss": round(loss.item(), 4), "heldout_loss": [round(ce.item(), 4) for ce, _, _ in ev],
                      "heldout_greedy_match": [round(m.item(), 4) for _, _, m in ev]})
        say(f"step {step}/{total}: train loss {loss.item():.3f}, held-out per draft position: loss "
            f"{curve[-1]['heldout_loss']}, greedy match {curve[-1]['heldout_greedy_match']}, "
            f"{curve[-1]['seconds']:.0f} s")
        return time.perf_counter() - t

    while total is None or step < total:
        warm = (step + 1) / warmup
        decay = 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, (total or step + 1) - warmup)))
        for group in opt.param_groups:
            group["lr"] = cfg.lr * (warm if step < warmup or total is None else 0.1 + 0.9 * decay)
        idx = torch.randint(0, len(data.windows), (cfg.batch_size,), generator=gen)  # (B,)
        t_step = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=native_bf16()):
            unrolled = cfg.ttt if unroll_from is not None and step >= unroll_from else 1
            parts = losses(data.windows[idx], data.features[idx], unrolled)
        loss = sum(ce + cfg.reg * reg for ce, reg, _ in parts) / len(parts)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step:  # the first step also warms torch up
            timing[unrolled][0] += time.perf_counter() - t_step
            timing[unrolled][1] += 1
        step += 1
        due = step % cfg.eval_every == 0 or step == total
        if steps is None and (step == PROBE_STEPS or due and total is not None):  # evaluate, then plan the rest
            eval_s = max(eval_s, evaluate(loss))
            first = total is None
            total, unroll_from = _plan(end - time.perf_counter() - eval_s, step, pace(1), pace(cfg.ttt), eval_s,
                                       cfg, unroll_from if unroll_from is not None and step >= unroll_from else None)
            if first:
                warmup = max(1, min(cfg.warmup, total // 4))
                say(f"{pace(1):.2f} s a step, {eval_s:.2f} s an evaluation: {total} steps")
        elif total is not None and steps is None and step < total and \
                time.perf_counter() + pace(cfg.ttt if step >= unroll_from else 1) + 2 * eval_s > end:
            total = step  # slower than planned: stop here, with time for the last evaluation and the writing
        if (due or step == total) and not (curve and curve[-1]["step"] == step):
            evaluate(loss)
    record = {
        "target": target_name,
        "train_config": dataclasses.asdict(cfg),
        "features": list(head_cfg.features),
        "parameters": sum(p.numel() for p in model.parameters()),
        "windows": len(data.windows), "self_distilled_answers": data.distilled, "tokens": data.windows.numel(),
        "steps": total, "data_seconds": round(data.seconds, 1),
        "train_seconds": round(time.perf_counter() - t_train, 1),
        "seconds": round(data.seconds + time.perf_counter() - t_train, 1),
        "budget_seconds": None if steps else round(budget, 1),
        "call_seconds": round(time.perf_counter() - start, 1),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        "heldout_tokens": data.heldout.numel(), "heldout_hot_mass": _hot_mass(target, data, rows, last),
        "curve": curve,
        "python": platform.python_version(), "torch": torch.__version__, "threads": torch.get_num_threads(),
    }
    save_head(model, out_dir, getattr(torch, cfg.save_dtype), record)
    return record


def _plan(seconds: float, step: int, plain_s: float, unrolled_s: float, eval_s: float, cfg: EagleTrainConfig,
          unroll_from: int | None) -> tuple[int, int]:
    """(total steps, the first step that unrolls ``cfg.ttt`` positions): the most steps whose cost after ``step``
    fits in ``seconds``, plain steps at ``plain_s`` each, unrolled ones (from ``cfg.ttt_from`` of the run on, or from
    ``unroll_from`` once they have begun) at ``unrolled_s``, and an evaluation every ``cfg.eval_every`` steps and at
    the end at ``eval_s``. Never fewer than ``step``: with no time left the run ends where it is."""
    def split(total: int) -> int:
        return unroll_from if unroll_from is not None else max(step, math.ceil(cfg.ttt_from * total))

    def cost(total: int) -> float:
        first = split(total)
        evals = total // cfg.eval_every - step // cfg.eval_every + (total % cfg.eval_every != 0)
        return plain_s * (first - step) + unrolled_s * (total - first) + eval_s * evals

    total = step
    while cost(total + 1) <= seconds and total < 10**6:
        total += 1
    return total, split(total)


@torch.no_grad()
def _hot_mass(target: Model, data: EagleData, rows: torch.Tensor, last: int) -> float:
    """The target's mean probability mass inside ``rows`` on the held-out windows (the hot set's ceiling)."""
    C = target.config.hidden_size
    f = data.heldout_features[..., last * C : (last + 1) * C].float()  # (8, T, C)
    p = target.lm_head(F.rms_norm(f, (C,), target.norm, target.config.rms_norm_eps)).softmax(-1)  # (8, T, V)
    return round(p[..., rows].sum(-1).mean().item(), 4)
