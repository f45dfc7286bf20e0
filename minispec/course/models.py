"""What the lessons share: the models and texts they run on, chosen for the device at hand."""

from __future__ import annotations

import json
import os
from dataclasses import replace

import torch
from torch import nn

from minispec.drafts.eagle import SHIPPED as SHIPPED_HEADS
from minispec.model.llama import Model
from minispec.model.load import ASSETS, load, resolve, sample_text

# Real pairs a GPU lesson uses when the local Hugging Face cache holds both (target, draft); no download.
HUB_PAIRS = (
    ("HuggingFaceTB/SmolLM2-1.7B-Instruct", "HuggingFaceTB/SmolLM2-135M-Instruct"),
    ("Qwen/Qwen2.5-7B-Instruct", "Qwen/Qwen2.5-0.5B-Instruct"),
    ("meta-llama/Llama-3.1-8B-Instruct", "meta-llama/Llama-3.2-1B-Instruct"),
)
# The draft model each target named in MINISPEC_TARGET gets when MINISPEC_DRAFT is not set.
DEFAULT_DRAFTS = {"tiny-code-target": "tiny-code-draft"}
SYNTHETIC_ALPHA = 0.8  # the acceptance rate lessons time with when the pair is random weights


def _cached(repo: str):
    """The local snapshot directory of ``repo`` in the Hugging Face cache, or None (never downloads)."""
    try:
        from huggingface_hub import snapshot_download

        return snapshot_download(repo, local_files_only=True)
    except Exception:  # not cached, or huggingface_hub missing
        return None


def first_layers(target: Model, n: int) -> Model:
    """The target's first ``n`` layers, then its final norm and LM head, as a draft model of its own (its own KV
    cache, no weight copied): what ``MINISPEC_DRAFT=layerskip:N`` gives, for a target with no smaller sibling."""
    L = target.config.num_hidden_layers
    if not 1 <= n < L:
        raise ValueError(f"layerskip:N needs N from 1 to {L - 1} (the target has {L} layers), got {n}")
    window = target.config.sliding_window
    cfg = replace(target.config, num_hidden_layers=n, sliding_window=window and window[:n])
    with torch.device("meta"):
        draft = Model(cfg)
    draft.embed, draft.norm, draft.lm_head = target.embed, target.norm, target.lm_head
    draft.layers = nn.ModuleList(list(target.layers[:n]))
    draft.inv_freq, draft.windows = target.inv_freq, sorted({b.window for b in draft.layers}, key=lambda w: w or 0)
    return draft.eval()


def shipped_head(target_name: str) -> str | None:
    """The name of the EAGLE head shipped for ``target_name`` (``EagleDraft.from_pretrained`` loads it), or None."""
    try:
        where = resolve(target_name).resolve()
    except ValueError:
        return None
    for head in SHIPPED_HEADS:
        trained_on = json.loads((ASSETS / head / "training.json").read_text())["target"]
        try:
            if resolve(trained_on).resolve() == where:
                return head
        except ValueError:  # trained on a checkpoint this machine lacks
            continue
    return None


def _same_tokens(target_name, draft_name, target, draft, tok, draft_tok):
    """Refuse, before a lesson starts, a pair whose vocabularies differ: the accept rule compares token ids."""
    fix = ("set MINISPEC_DRAFT to a checkpoint that shares the target's tokenizer, or to layerskip:N (the target's "
           f"own first N of its {target.config.num_hidden_layers} layers)")
    if target.config.vocab_size != draft.config.vocab_size:
        raise ValueError(f"MINISPEC_TARGET={target_name} ({target.config.vocab_size:,} tokens) and MINISPEC_DRAFT="
                         f"{draft_name} ({draft.config.vocab_size:,} tokens) cannot go together: {fix}")
    if hasattr(tok, "get_vocab") and hasattr(draft_tok, "get_vocab") and tok.get_vocab() != draft_tok.get_vocab():
        raise ValueError(f"MINISPEC_TARGET={target_name} and MINISPEC_DRAFT={draft_name} have as many tokens but "
                         f"different tokenizers, so the same id means different text: {fix}")


def course_models(device=None, *, embedded: bool = False) -> dict:
    """What a lesson runs on, chosen from the environment.

    - ``embedded=True``: the embedded trio on the CPU, whatever is set (lessons that need a trained byte-level pair).
    - ``MINISPEC_TARGET`` set: that checkpoint (a directory, or a name :func:`minispec.model.load` knows), with the
      draft ``MINISPEC_DRAFT`` names: a checkpoint sharing its tokenizer, or ``layerskip:N`` (:func:`first_layers`).
      Unset, the draft is :data:`DEFAULT_DRAFTS`'s for that target; a target with none, or a pair whose tokenizers
      differ, raises ValueError saying what to set. On a GPU both load in bfloat16.
    - Else on a CPU: the embedded trio (``tiny-code-target``, ``tiny-code-draft``, ``tiny-prose-draft``).
    - Else on a GPU: the first pair of :data:`HUB_PAIRS` the local Hugging Face cache holds, in bfloat16;
      failing that, random-weight Llama-3-8B and two-layer 1B-shaped draft (``minispec.model.random.SHAPES``), for
      which ``synthetic_alpha`` says the lessons time acceptance with ``SyntheticAcceptance``.

    Returns a dict: target, draft, prose_draft (the embedded prose draft, or None where the
    vocabularies differ), tokenizer (None for random weights), device, code and prose (the shipped
    held-out samples as text), embedded (the CPU trio?), name, synthetic_alpha (None for real pairs),
    eagle (the name of the EAGLE head shipped for this target, or None), batch_invariant: whether a row with its
    own seed decodes alone as it does in a batch. True only in float32 on a CPU (the embedded models give a row
    bitwise the same logits at batch 1 and 3 there, measured). In bf16 on a GPU the kernels, and so the order of
    each sum, change with the batch's shape: logits move in their last bits and a near-tie can flip (vLLM promises
    invariance only with batch-invariant kernels).
    """
    device = torch.device("cpu" if embedded else device or ("cuda" if torch.cuda.is_available() else "cpu"))
    code, prose = sample_text("code").decode("utf-8", "replace"), sample_text("prose").decode()
    out = {"device": device, "code": code, "prose": prose, "synthetic_alpha": None, "prose_draft": None,
           "eagle": None}
    if "MINISPEC_TARGET" in os.environ and not embedded:
        name = os.environ["MINISPEC_TARGET"]
        pair = (name, os.environ.get("MINISPEC_DRAFT") or DEFAULT_DRAFTS.get(name))
        if pair[1] is None:
            raise ValueError(f"MINISPEC_TARGET={name} has no draft model shipped beside it: set MINISPEC_DRAFT to a "
                             "checkpoint that shares its tokenizer, or to layerskip:N (its own first N layers)")
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
    if pair[1].startswith("layerskip:"):
        n = pair[1].removeprefix("layerskip:")
        if not n.isdigit():
            raise ValueError(f"MINISPEC_DRAFT={pair[1]}: layerskip:N takes a number of layers")
        draft = first_layers(target, int(n))
    else:
        draft, draft_tok = load(pair[1], device=device, dtype=target.dtype)
        _same_tokens(pair[0], pair[1], target, draft, tok, draft_tok)
    if target.config.vocab_size == 256:
        out["prose_draft"] = load("tiny-prose-draft", device=device, dtype=target.dtype)[0]
    return out | {"target": target, "draft": draft, "tokenizer": tok, "name": f"{pair[0]} / {pair[1]}",
                  "embedded": pair == ("tiny-code-target", "tiny-code-draft"), "eagle": shipped_head(pair[0]),
                  "batch_invariant": device.type == "cpu" and target.dtype == torch.float32}
