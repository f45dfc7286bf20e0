"""What the lessons share: the models and texts they run on."""

from __future__ import annotations

import os

import torch

from minispec.load import load, sample_text


def course_models(device=None) -> dict:
    """What a lesson runs on, chosen from the environment.

    The embedded trio (``tiny-code-target``, ``tiny-code-draft``, ``tiny-prose-draft``) and the
    shipped held-out samples, on ``device`` (default: CUDA when available). Set
    ``MINISPEC_TARGET`` and ``MINISPEC_DRAFT`` to local Hugging Face checkpoint directories
    sharing a tokenizer to run the lessons on real models instead (the prose draft then stays
    the embedded one, and only where the vocabularies match).
    """
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    name = os.environ.get("MINISPEC_TARGET", "tiny-code-target")
    target, tok = load(name, device=device)
    if tok is None:
        raise ValueError(f"{name} has no tokenizer files (tokenizer.json or "
                         "tokenizer_config.json); the lessons need one to encode text")
    draft, _ = load(os.environ.get("MINISPEC_DRAFT", "tiny-code-draft"), device=device, dtype=target.dtype)
    prose_draft, _ = load("tiny-prose-draft", device=device, dtype=target.dtype)
    return {"target": target, "draft": draft, "prose_draft": prose_draft, "tokenizer": tok, "device": device,
            "code": sample_text("code").decode("utf-8", "replace"), "prose": sample_text("prose").decode(),
            "embedded": "MINISPEC_TARGET" not in os.environ}
