"""A target and a draft named on the command line: checked before anything loads, then loaded.

:func:`check_pair` resolves and checks the names the ``minispec`` command takes (an embedded or
fetched model, a Hugging Face directory, a .gguf file, ``shape:NAME`` for random weights; a draft
model, ``ngram``, ``layerskip:N`` or an EAGLE head; a tree around a model-based draft) from config
files alone, so that a bad name fails in a second, not after a model load; :func:`load_pair` then
builds the pair. :func:`parse_tree` reads ``--tree``; :func:`prompt_tokens` reads a prompts file.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from minispec.drafts.eagle import SHIPPED, EagleConfig, EagleDraft
from minispec.drafts.eagle3 import SHIPPED as SHIPPED3
from minispec.drafts.eagle3 import Eagle3Config, Eagle3Draft, head_path, is_eagle3
from minispec.drafts.lookup import PromptLookupDraft
from minispec.drafts.model import LayerSkipDraft
from minispec.drafts.suffix import SuffixDraft
from minispec.drafts.tree import TreeDraft, check_tree
from minispec.model.config import config_from_hf
from minispec.model.load import ASSETS, load, resolve, sample_text
from minispec.model.random import SHAPES, random_model

DRAFTS = "a draft checkpoint (named as the target is), ngram (prompt lookup), layerskip:N (the target's first N " \
         f"layers), an EAGLE head ({', '.join(SHIPPED)} or its folder) or an EAGLE-3 head ({', '.join(SHIPPED3)}, " \
         "eagle3:DIR or its folder)"
TREE_KEYS = {"branching": "children per node at each depth", "budget": "nodes verified (dynamic tree)",
             "depth": "draft passes (dynamic tree)", "topk": "children per expanded node (dynamic tree; default 4)"}
SUFFIX = ("suffix", "suffix:tree")  # suffix decoding (no model): a chain as vLLM's "suffix", or Arctic's trees


@dataclass(frozen=True)
class Pair:
    """What a command named, checked; nothing loaded."""

    target: str
    draft: str | None  # as given
    kind: str | None  # None (plain decoding), "model", "ngram", "layerskip", "eagle", "eagle3"
    tree: dict | None  # TreeDraft's keywords, checked
    hot_vocab: int | None  # an EAGLE head's hot vocabulary (None: the head's own)
    device: torch.device
    dtype: torch.dtype | None
    max_positions: int | None  # the target's maximum length from its config (None: a GGUF file or a shape)


def parse_tree(text: str | None) -> dict | None:
    """``--tree`` as TreeDraft's keywords: ``"budget=16,depth=5"`` or ``"branching=4,2,1"`` (a value runs on
    over the commas until the next ``key=``)."""
    if text is None:
        return None
    spec, key = {}, None
    for part in (p.strip() for p in text.split(",")):
        if "=" in part:
            key, part = (s.strip() for s in part.split("=", 1))
            if key not in TREE_KEYS or key in spec:
                raise ValueError(f"--tree takes {', '.join(f'{k}= ({v})' for k, v in TREE_KEYS.items())}; "
                                 f"got {text!r}")
            spec[key] = []
        if key is None or not part.isdigit():
            raise ValueError(f"--tree takes key=integers, e.g. budget=16,depth=5 or branching=4,2,1; got {text!r}")
        spec[key].append(int(part))
    for k, v in spec.items():
        if k != "branching" and len(v) != 1:
            raise ValueError(f"--tree {k}= takes one integer, got {','.join(map(str, v))}")
    tree = {k: tuple(v) if k == "branching" else v[0] for k, v in spec.items()}
    check_tree(**tree)
    return tree


def _config(name: str, what: str):
    """The ModelConfig of a checkpoint from its config.json (None for a .gguf file: read when loaded)."""
    if _is_eagle(name) or is_eagle3(name):
        raise ValueError(f"{name} is an EAGLE head, not a {what}; pass it as the draft (--draft {name})")
    path = resolve(name)
    if path.is_file():
        return None
    raw = json.loads((path / "config.json").read_text())
    try:
        return config_from_hf(raw)
    except ValueError as e:
        raise ValueError(f"{what} {name}: {e}") from None


def check_pair(target: str, draft: str | None = None, device=None, dtype=None, tree: dict | str | None = None,
               hot_vocab: int | None = None) -> Pair:
    """Check every name and option of a pair from config files alone (no weights read). See :func:`load_pair`."""
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
    if target.startswith("shape:"):
        if target.removeprefix("shape:") not in SHAPES:
            raise ValueError(f"unknown shape {target!r}; shapes: {', '.join('shape:' + s for s in SHAPES)}")
        tc = None
    else:
        tc = _config(target, "target")
    tree = parse_tree(tree) if isinstance(tree, str) else tree
    if tree is not None:
        check_tree(**tree)
        if draft is None:
            raise ValueError("a tree grows from a draft: name one (a draft model, layerskip:N or an EAGLE head)")
        if draft == "ngram":
            raise ValueError("a tree grows from a model-based draft (a draft model, layerskip:N or an EAGLE head), "
                             "not from ngram prompt lookup")
    kind = None if draft is None else "ngram" if draft == "ngram" else "layerskip" if draft.startswith(
        "layerskip:") else "eagle" if _is_eagle(draft) else "eagle3" if is_eagle3(draft) else "model"
    if draft is not None and draft.split(":")[0] == "suffix":  # suffix decoding: no model
        if draft not in SUFFIX:
            raise ValueError(f"suffix decoding is --draft suffix (a chain, as vLLM's) or suffix:tree (Arctic's trees), "
                             f"got {draft!r}")
        if tree is not None:
            raise ValueError("suffix decoding grows its own trees: --draft suffix:tree, without --tree")
        kind = "suffix"
    if hot_vocab is not None and kind == "eagle3":
        raise ValueError("an EAGLE-3 head drafts over its own draft vocabulary; a hot vocabulary is an EAGLE-1 head's")
    if hot_vocab is not None and kind != "eagle":
        raise ValueError("a hot vocabulary is an EAGLE head's: name one as the draft")
    if kind == "layerskip":
        n, L = draft.removeprefix("layerskip:"), tc and tc.num_hidden_layers
        if not n.isdigit() or not 1 <= int(n) <= (L or int(n)):
            raise ValueError(f"layerskip:N takes a number of layers from 1 to the target's {L or 'layers'}, "
                             f"got {draft!r}")
    elif kind == "eagle":
        _check_eagle(draft, target, tc, hot_vocab)
    elif kind == "eagle3":
        _check_eagle3(draft, target, tc)
    elif kind == "model":
        if draft.startswith("shape:"):
            if draft.removeprefix("shape:") not in SHAPES:
                raise ValueError(f"unknown shape {draft!r}; shapes: {', '.join('shape:' + s for s in SHAPES)}")
        elif (dc := _config(draft, "draft")) and tc and dc.vocab_size != tc.vocab_size:
            raise ValueError(f"draft {draft} has a {dc.vocab_size}-token vocabulary and target {target} "
                             f"{tc.vocab_size}: they must share one")
    return Pair(target, draft, kind, tree, hot_vocab, device, dtype, tc.max_position_embeddings if tc else None)


def _is_eagle(name: str) -> bool:
    if name in SHIPPED:
        return True
    config = Path(name).expanduser() / "config.json"
    return config.is_file() and json.loads(config.read_text()).get("architectures") == ["EagleDraft"]


def _check_eagle(name: str, target: str, tc, hot_vocab) -> None:
    path = ASSETS / name if name in SHIPPED else Path(name).expanduser()
    if not (path / "model.safetensors").is_file():
        raise ValueError(f"EAGLE head {name}: {path} has no model.safetensors")
    head = EagleConfig.from_dict(json.loads((path / "config.json").read_text()))
    _check_reads("EAGLE head", name, head, target, tc)
    V = head.layer.vocab_size
    if hot_vocab is not None and (isinstance(hot_vocab, bool) or not isinstance(hot_vocab, int)
                                  or not 1 <= hot_vocab <= V):
        raise ValueError(f"hot vocabulary must be an integer from 1 to the vocabulary's {V}, got {hot_vocab!r}")


def _check_eagle3(name: str, target: str, tc) -> None:
    head = Eagle3Config.from_dict(json.loads((head_path(name) / "config.json").read_text()),
                                  tc and tc.num_hidden_layers)
    _check_reads("EAGLE-3 head", name, head, target, tc)


def _check_reads(kind: str, name: str, head, target: str, tc) -> None:
    """A head's config against the target's (None: a .gguf file, read when loaded): vocabulary, width, layers."""
    if tc is not None:
        want = (head.layer.vocab_size, head.layer.hidden_size, head.target_layers)
        have = (tc.vocab_size, tc.hidden_size, tc.num_hidden_layers)
        if want != have:
            raise ValueError(f"{kind} {name} reads a target with vocabulary {want[0]}, hidden size {want[1]} and "
                             f"{want[2]} layers; {target} has {have[0]}, {have[1]} and {have[2]}")


def load_pair(target: str, draft: str | None = None, device=None, dtype=None, tree: dict | str | None = None,
              hot_vocab: int | None = None):
    """(target, tokenizer, draft) from names, every name checked first (:func:`check_pair`).

    ``target``: what :func:`minispec.model.load` takes (an embedded name, a checkpoint directory, a fetched
    name), or ``shape:NAME`` for random weights of a :data:`SHAPES` shape (tokenizer None). ``draft``:
    a checkpoint named the same way, ``ngram`` (prompt lookup), ``layerskip:N`` (the target's first N
    layers), an EAGLE head (a shipped name or a folder; ``hot_vocab`` its hot vocabulary), or None.
    ``tree``: TreeDraft's keywords or ``--tree``'s text, a tree grown by the draft. ``device``: default
    CUDA when it is available, else the CPU (as transformers' ``pipeline`` does). ``dtype``: a torch dtype
    or its name; default the checkpoint's, bfloat16 for a shape.
    """
    pair = check_pair(target, draft, device, dtype, tree, hot_vocab)
    device, dtype = pair.device, pair.dtype

    def checkpoint(name, dtype):
        if name.startswith("shape:"):
            return random_model(name.removeprefix("shape:"), device, dtype or torch.bfloat16), None
        return load(name, device=device, dtype=dtype)

    model, tok = checkpoint(target, dtype)
    if pair.kind is None:
        return model, tok, None
    if pair.kind == "ngram":
        drafter = PromptLookupDraft()
    elif pair.kind == "suffix":
        drafter = SuffixDraft(use_tree_spec=draft == "suffix:tree")
    elif pair.kind == "layerskip":
        drafter = LayerSkipDraft(model, int(draft.removeprefix("layerskip:")))
    elif pair.kind == "eagle":
        drafter = EagleDraft.from_pretrained(draft, model, hot_vocab)
    elif pair.kind == "eagle3":
        drafter = Eagle3Draft.from_pretrained(draft, model)
    else:
        drafter = checkpoint(draft, model.dtype)[0]
    return model, tok, drafter if pair.tree is None else TreeDraft(drafter, **pair.tree)


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
