"""A target and a draft named on the command line, loaded: checkpoints, shapes, ngram or layerskip:N.

:func:`load_pair` resolves the names the ``minispec`` command takes (an embedded or fetched model, a
Hugging Face directory, a .gguf file, ``shape:NAME`` for random weights) and builds the draft;
:func:`prompt_tokens` reads a prompts file.
"""

from __future__ import annotations

from pathlib import Path

import torch

from minispec.drafts.lookup import PromptLookupDraft
from minispec.drafts.model import LayerSkipDraft
from minispec.model.load import load, sample_text
from minispec.model.random import random_model


def load_pair(target: str, draft: str | None = None, device=None, dtype=None):
    """(target, tokenizer, draft) from names.

    ``target``: what :func:`minispec.model.load` takes (an embedded name, a checkpoint directory, a fetched
    name), or ``shape:NAME`` for random weights of a :data:`SHAPES` shape (tokenizer None). ``draft``:
    a checkpoint named the same way, ``ngram`` (prompt lookup), ``layerskip:N`` (the target's first N
    layers), or None. ``device``: default CUDA when it is available, else the CPU (as transformers'
    ``pipeline`` does). ``dtype``: a torch dtype or its name; default the checkpoint's, bfloat16 for a shape.
    """
    try:
        device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    except RuntimeError as e:
        raise ValueError(f"unknown device {device!r}: {str(e).splitlines()[0]}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device} asked for, but torch sees no CUDA device here")
    if isinstance(dtype, str):
        if dtype not in ("float32", "bfloat16", "float16"):
            raise ValueError(f"dtype must be float32, bfloat16 or float16, got {dtype!r}")
        dtype = getattr(torch, dtype)
    if draft is not None and draft.startswith("layerskip:") and not draft.removeprefix("layerskip:").isdigit():
        raise ValueError(f"draft layerskip:N takes a number of layers, got {draft!r}")

    def checkpoint(name, dtype):
        if name.startswith("shape:"):
            return random_model(name.removeprefix("shape:"), device, dtype or torch.bfloat16), None
        return load(name, device=device, dtype=dtype)

    model, tok = checkpoint(target, dtype)
    if draft is None:
        return model, tok, None
    if draft == "ngram":
        return model, tok, PromptLookupDraft()
    if draft.startswith("layerskip:"):
        return model, tok, LayerSkipDraft(model, int(draft.removeprefix("layerskip:")))
    return model, tok, checkpoint(draft, model.dtype)[0]


def prompt_tokens(tok, prompts_file: str | None = None) -> list[int] | None:
    """Real text to cut prompts from, encoded: ``prompts_file``, else the shipped held-out code and prose
    samples; None for a model without a tokenizer (random ids are then all there is)."""
    if prompts_file is not None:
        if not Path(prompts_file).is_file():
            raise ValueError(f"prompts file {prompts_file}: no such file")
        text = Path(prompts_file).read_text(encoding="utf-8")
    elif tok is None:
        return None
    else:
        text = (sample_text("code") + b"\n" + sample_text("prose")).decode("utf-8", "replace")
    return tok.encode(text) if tok is not None else list(text.encode())
