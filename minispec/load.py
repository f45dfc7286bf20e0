"""Checkpoints to models: Hugging Face directories, hub names and the embedded models."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from minispec.model import Model, config_from_hf, from_hf_state_dict
from minispec.tokenizer import ByteTokenizer

ASSETS = Path(__file__).parent / "assets"
EMBEDDED = ("tiny-code-target", "tiny-code-draft", "tiny-prose-draft")


def _resolve(source: str | Path) -> Path:
    """A local checkpoint directory for ``source``: a path, an embedded name, or a hub name."""
    if str(source) in EMBEDDED:
        return ASSETS / str(source)
    path = Path(source).expanduser()
    if path.exists():
        if not (path / "config.json").is_file():
            raise ValueError(f"{path} has no config.json; expected a Hugging Face checkpoint directory")
        return path
    if str(source).count("/") != 1 or str(source).startswith((".", "/", "~")):
        raise ValueError(f"{source!r} is neither a directory, an embedded model ({', '.join(EMBEDDED)}) "
                         "nor a hub name (owner/name)")
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(str(source), allow_patterns=["*.json", "*.safetensors", "*.model", "*.txt"]))
    except Exception as e:  # offline, unknown repo, gated model ...
        raise ValueError(
            f"could not download {source!r} from the Hugging Face hub ({type(e).__name__}: {e}). "
            f"Without a reachable hub, pass a local directory instead: on a machine with network run "
            f"`huggingface-cli download {source} --local-dir DIR` (or save_pretrained(DIR)), copy DIR "
            f"here and call minispec.load(DIR)."
        ) from e


def _read_weights(path: Path) -> dict[str, torch.Tensor]:
    """All tensors of a checkpoint directory, sharded (model.safetensors.index.json) or not."""
    from safetensors.torch import load_file

    index = path / "model.safetensors.index.json"
    if index.is_file():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    else:
        files = sorted(p.name for p in path.glob("*.safetensors"))
    if not files:
        raise ValueError(f"{path} has no .safetensors weights (pytorch_model.bin is not read; re-save with "
                         "save_pretrained(..., safe_serialization=True))")
    weights = {}
    for f in files:
        weights |= load_file(str(path / f))
    return weights


def load(source: str | Path, device: str | torch.device | None = None, dtype: torch.dtype | None = None):
    """Load ``(model, tokenizer)`` from an embedded name, a local HF directory or a hub name.

    ``dtype`` defaults to the checkpoint's own (``torch_dtype``/``dtype`` in config.json, else
    float32); ``device`` defaults to the CPU. The embedded models come with a
    :class:`~minispec.tokenizer.ByteTokenizer`; other checkpoints with transformers'
    ``AutoTokenizer`` (None when the directory has no tokenizer files).
    """
    from transformers import AutoConfig

    path = _resolve(source)
    hf_config = AutoConfig.from_pretrained(str(path))
    cfg = config_from_hf(hf_config)
    if dtype is None:
        raw = json.loads((path / "config.json").read_text())
        name = raw.get("dtype") or raw.get("torch_dtype") or "float32"
        dtype = getattr(torch, name)
    device = torch.device(device or "cpu")
    with torch.device("meta"):
        model = Model(cfg)
    state = from_hf_state_dict(_read_weights(path), cfg)
    missing = set(model.state_dict()) - set(state)
    if missing:
        raise ValueError(f"{path}: checkpoint lacks weights {sorted(missing)[:5]}")
    model.load_state_dict(state, assign=True, strict=True)
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.embed.weight
    model = model.to(device=device, dtype=dtype)  # also rebuilds the rotary buffer off the meta device
    return model.eval().requires_grad_(False), _tokenizer(source, path)


def _tokenizer(source, path: Path):
    if str(source) in EMBEDDED:
        return ByteTokenizer()
    if not any((path / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")):
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path))
