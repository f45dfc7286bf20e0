"""Train the embedded byte-level models on a CPU, reproducibly, with their evaluation on held-out text.

A target and two drafts (code, prose) from Python's standard library and the King James Bible
(``PRESETS``); :func:`teacher_forced_acceptance` measures a pair's acceptance on held-out text.
"""

from __future__ import annotations

import dataclasses
import json
import math
import platform
import re
import sysconfig
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from minispec.model.config import ModelConfig, to_hf_state_dict
from minispec.model.llama import Model
from minispec.model.load import EMBEDDED, load, sample_text


@dataclass(frozen=True)
class TrainConfig:
    model: ModelConfig
    corpus: str  # "code" or "prose"
    steps: int
    batch_size: int = 16  # sequences per step
    seq_len: int = 256  # bytes per sequence
    lr: float = 3e-3  # peak AdamW learning rate, cosine-decayed to 10 % after a linear warm-up
    warmup: int = 100  # steps
    weight_decay: float = 0.1
    seed: int = 0
    eval_every: int = 100  # steps between held-out evaluations (recorded in training.json)


def _byte_llama(layers: int, hidden: int, heads: int, kv_heads: int, ff: int) -> ModelConfig:
    return ModelConfig(vocab_size=256, hidden_size=hidden, intermediate_size=ff, num_hidden_layers=layers,
                       num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=hidden // heads,
                       max_position_embeddings=512, tie_word_embeddings=True)


PRESETS = {
    "tiny-code-target": TrainConfig(_byte_llama(8, 192, 4, 2, 512), "code", steps=2000, seq_len=512, batch_size=8),
    "tiny-code-draft": TrainConfig(_byte_llama(1, 128, 4, 4, 384), "code", steps=1200, seq_len=512, batch_size=8),
    "tiny-prose-draft": TrainConfig(_byte_llama(1, 128, 4, 4, 384), "prose", steps=1200, seq_len=512, batch_size=8),
}


def code_files() -> tuple[list[Path], list[Path]]:
    """The standard library's top-level modules, split into (train, held-out)."""
    files = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))
    held = [f for f in files if zlib.crc32(f.name.encode()) % 10 == 0]
    return [f for f in files if f not in held], held


def prose_verses(path: str | Path) -> tuple[str, str]:
    """(train, held-out) text from ``bible -f`` output: references stripped, Revelation held out."""
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    ref = re.compile(r"^(\w+?)\d+:\d+ ")
    train, held = [], []
    for line in lines:
        m = ref.match(line)
        if m:
            (held if m.group(1) == "Rev" else train).append(line[m.end():])
    return "\n".join(train), "\n".join(held)


def corpus(kind: str, prose_file: str | Path | None = None) -> tuple[bytes, bytes]:
    """(train bytes, held-out bytes) of one corpus."""
    if kind == "code":
        train, held = code_files()
        return b"\n".join(f.read_bytes() for f in train), b"\n".join(f.read_bytes() for f in held)
    if kind == "prose":
        if prose_file is None:
            raise ValueError("the prose corpus needs --prose-file: apt-get install bible-kjv && "
                             "bible -f 'Gen1:1-Rev22:21' > kjv.txt")
        train, held = prose_verses(prose_file)
        return train.encode(), held.encode()
    raise ValueError(f"unknown corpus {kind!r} (code, prose)")


def _windows(data: bytes, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Consecutive windows of ``data``: inputs and next-byte targets (N, T) each."""
    x = torch.tensor(list(data), dtype=torch.long)
    n = (len(x) - 1) // seq_len * seq_len
    return x[:n].view(-1, seq_len), x[1 : n + 1].view(-1, seq_len)


@torch.inference_mode()
def _log_probs(model: Model, inp: torch.Tensor) -> torch.Tensor:
    """Next-byte log-probabilities (N, T, V) of every window, 8 windows per forward pass."""
    return torch.cat([model(inp[i : i + 8]).log_softmax(-1) for i in range(0, len(inp), 8)])


def _acceptance(logp: torch.Tensor, logq: torch.Tensor) -> dict:
    p, q = logp.exp(), logq.exp()  # (N, T, V) each
    return {"greedy_match": (p.argmax(-1) == q.argmax(-1)).float().mean().item(),
            "overlap": torch.minimum(p, q).sum(-1).mean().item()}


def _nll(logp: torch.Tensor, tgt: torch.Tensor) -> float:
    """Mean negative log-likelihood in nats of targets (N, T) under log-probabilities (N, T, V)."""
    return -logp.gather(-1, tgt[..., None]).mean().item()


def heldout_loss(model: Model, data: bytes, seq_len: int = 512) -> float:
    """Mean next-byte cross-entropy in nats per byte over consecutive windows of ``data``."""
    model.eval()
    inp, tgt = _windows(data, seq_len)
    loss = _nll(_log_probs(model, inp), tgt)
    model.train()
    return loss


def save_checkpoint(model: Model, out: Path, extra: dict | None = None) -> None:
    """Write a Hugging Face checkpoint: config.json + model.safetensors (+ training.json)."""
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(model.config.to_hf_dict(), indent=2) + "\n")
    save_file(to_hf_state_dict(model), str(out / "model.safetensors"), metadata={"format": "pt"})
    if extra is not None:
        (out / "training.json").write_text(json.dumps(extra, indent=2) + "\n")


def train(name: str, out: str | Path, prose_file: str | Path | None = None, stop_after: int | None = None,
          progress: bool = True) -> dict:
    """Train preset ``name``; write the checkpoint to ``out``; return what training.json records.

    ``stop_after`` ends the run early at that step while keeping the full run's learning-rate
    schedule, so a short run retraces the beginning of the shipped one.
    """
    from tqdm.auto import tqdm

    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; presets: {', '.join(PRESETS)}")
    cfg = PRESETS[name]
    steps = cfg.steps if stop_after is None else min(stop_after, cfg.steps)
    train_bytes, _ = corpus(cfg.corpus, prose_file)
    heldout = sample_text(cfg.corpus)
    torch.manual_seed(cfg.seed)
    model = Model(cfg.model)
    data = torch.tensor(list(train_bytes), dtype=torch.uint8)
    gen = torch.Generator().manual_seed(cfg.seed)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    other = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                             {"params": other, "weight_decay": 0.0}], lr=cfg.lr, betas=(0.9, 0.95))

    def lr_at(step: int) -> float:
        if step < cfg.warmup:
            return cfg.lr * (step + 1) / cfg.warmup
        t = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
        return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))

    curve, start = [], time.perf_counter()
    bar = tqdm(range(steps), desc=name, disable=not progress)
    for step in bar:
        idx = torch.randint(0, len(data) - cfg.seq_len - 1, (cfg.batch_size,), generator=gen)  # (B,)
        chunk = torch.stack([data[i : i + cfg.seq_len + 1] for i in idx.tolist()]).long()  # (B, T+1)
        logits = model(chunk[:, :-1])  # (B, T, V)
        loss = F.cross_entropy(logits.flatten(0, 1), chunk[:, 1:].flatten())
        for group in opt.param_groups:
            group["lr"] = lr_at(step)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if (step + 1) % cfg.eval_every == 0 or step + 1 == steps:
            curve.append({"step": step + 1, "heldout_loss": round(heldout_loss(model, heldout), 4),
                          "seconds": round(time.perf_counter() - start, 1)})
            bar.set_postfix(train=f"{loss.item():.3f}", heldout=f"{curve[-1]['heldout_loss']:.3f}")
    record = {
        "preset": name,
        "train_config": {k: v for k, v in dataclasses.asdict(cfg).items() if k != "model"},
        "parameters": cfg.model.num_parameters,
        "steps": steps,
        "train_bytes": len(train_bytes),
        "seconds": round(time.perf_counter() - start, 1),
        "heldout_loss": curve[-1]["heldout_loss"],
        "curve": curve,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
    }
    save_checkpoint(model, Path(out), record)
    return record


def teacher_forced_acceptance(target: Model, draft: Model, data: bytes, seq_len: int = 512) -> dict:
    """How well a draft predicts a target on ``data``, every position fed the true text.

    ``greedy_match``: the share of positions where both models' argmax agree (the acceptance
    rate of greedy speculation); ``overlap``: the mean of sum_v min(p, q) at temperature 1 (the
    probability that speculative sampling accepts a draft token). Teacher forcing keeps the
    figures honest: the models' own greedy continuations of this size loop, which inflates them.
    """
    inp, _ = _windows(data, seq_len)
    return _acceptance(_log_probs(target, inp), _log_probs(draft, inp))


def evaluate_embedded() -> dict:
    """The model card's figures, from the shipped checkpoints and samples only (each model reads
    each sample once)."""
    names = EMBEDDED
    models = {name: load(name)[0] for name in names}
    out = {"heldout_loss": {name: {} for name in names},
           "parameters": {name: m.config.num_parameters for name, m in models.items()},
           "acceptance": {n: {} for n in names[1:]}}
    for kind in ("code", "prose"):
        inp, tgt = _windows(sample_text(kind), 512)
        logp = {name: _log_probs(m, inp) for name, m in models.items()}  # (N, T, V) each
        for name in names:
            out["heldout_loss"][name][kind] = round(_nll(logp[name], tgt), 4)
        for draft in names[1:]:
            acc = _acceptance(logp[names[0]], logp[draft])
            out["acceptance"][draft][kind] = {k: round(v, 4) for k, v in acc.items()}
    return out
