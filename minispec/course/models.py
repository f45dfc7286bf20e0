"""What the lessons share: the models and texts they run on, chosen for the device at hand."""

from __future__ import annotations

import os

import torch

from minispec.model.load import load, sample_text

# Real pairs a GPU lesson uses when the local Hugging Face cache holds both (target, draft); no download.
HUB_PAIRS = (
    ("HuggingFaceTB/SmolLM2-1.7B-Instruct", "HuggingFaceTB/SmolLM2-135M-Instruct"),
    ("Qwen/Qwen2.5-7B-Instruct", "Qwen/Qwen2.5-0.5B-Instruct"),
    ("meta-llama/Llama-3.1-8B-Instruct", "meta-llama/Llama-3.2-1B-Instruct"),
)
SYNTHETIC_ALPHA = 0.8  # the acceptance rate lessons time with when the pair is random weights


def _cached(repo: str):
    """The local snapshot directory of ``repo`` in the Hugging Face cache, or None (never downloads)."""
    try:
        from huggingface_hub import snapshot_download

        return snapshot_download(repo, local_files_only=True)
    except Exception:  # not cached, or huggingface_hub missing
        return None


def course_models(device=None) -> dict:
    """What a lesson runs on, chosen from the environment.

    - ``MINISPEC_TARGET`` and ``MINISPEC_DRAFT`` set: those checkpoints (directories, or names
      :func:`minispec.model.load` knows), sharing a tokenizer.
    - On a CPU: the embedded trio (``tiny-code-target``, ``tiny-code-draft``, ``tiny-prose-draft``).
    - On a GPU: the first pair of :data:`HUB_PAIRS` the local Hugging Face cache holds, in bfloat16;
      failing that, random-weight Llama-3-8B and two-layer 1B-shaped draft (``minispec.model.random.SHAPES``), for
      which ``synthetic_alpha`` says the lessons time acceptance with ``SyntheticAcceptance``.

    Returns a dict: target, draft, prose_draft (the embedded prose draft, or None where the
    vocabularies differ), tokenizer (None for random weights), device, code and prose (the shipped
    held-out samples as text), embedded (the CPU trio?), name, synthetic_alpha (None for real pairs),
    batch_invariant: whether a row with its own seed decodes alone as it does in a batch. True only in
    float32 on a CPU (the embedded models give a row bitwise the same logits at batch 1 and 3 there, measured).
    In bf16 on a GPU the kernels, and so the order of each sum, change with the batch's shape: logits move in
    their last bits and a near-tie can flip (vLLM promises invariance only with batch-invariant kernels).
    """
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    code, prose = sample_text("code").decode("utf-8", "replace"), sample_text("prose").decode()
    out = {"device": device, "code": code, "prose": prose, "synthetic_alpha": None, "prose_draft": None}
    if "MINISPEC_TARGET" in os.environ:
        pair = (os.environ["MINISPEC_TARGET"], os.environ.get("MINISPEC_DRAFT", "tiny-code-draft"))
    elif device.type == "cpu":
        pair = ("tiny-code-target", "tiny-code-draft")
    else:
        pair = next(((t, d) for t, d in HUB_PAIRS if _cached(t) and _cached(d)), None)
        pair = pair and (_cached(pair[0]), _cached(pair[1]))
    if pair is None:  # bench (random weights) is imported only here, so importing minispec stays light
        from minispec.model.random import random_model

        target = random_model("llama-8b", device, torch.bfloat16)
        draft = random_model("llama-draft-2l", device, torch.bfloat16, seed=1)
        return out | {"target": target, "draft": draft, "tokenizer": None, "embedded": False,
                      "name": "random llama-8b / llama-draft-2l", "synthetic_alpha": SYNTHETIC_ALPHA,
                      "batch_invariant": False}  # bf16
    dtype = None if device.type == "cpu" else torch.bfloat16
    target, tok = load(pair[0], device=device, dtype=dtype)
    if tok is None:
        raise ValueError(f"{pair[0]} has no tokenizer files (tokenizer.json or "
                         "tokenizer_config.json); the lessons need one to encode text")
    draft, _ = load(pair[1], device=device, dtype=target.dtype)
    if target.config.vocab_size == 256:
        out["prose_draft"] = load("tiny-prose-draft", device=device, dtype=target.dtype)[0]
    return out | {"target": target, "draft": draft, "tokenizer": tok, "embedded": pair[0] == "tiny-code-target",
                  "name": f"{pair[0]} / {pair[1]}",
                  "batch_invariant": device.type == "cpu" and target.dtype == torch.float32}

