"""The baseline a user would pick instead: Hugging Face transformers' ``generate`` on the same inputs.

The same checkpoint and prompt, decoded plainly, with an assistant model, or with prompt lookup.
"""

from __future__ import annotations

import statistics
from pathlib import Path

import torch

from minispec.decoding.plain import generate
from minispec.drafts.lookup import PromptLookupDraft
from minispec.model.load import load
from minispec.roofline.hardware import median_time
from minispec.speculative.loop import speculative_generate


def transformers_runner(hf, prompt: list[int], max_new_tokens: int, eos_token_id: int | None = None,
                        gamma: int = 4, lookup: bool = False, assistant=None):
    """``run() -> new tokens``: transformers' greedy ``generate`` of one prompt, configured as minispec
    decodes it: plain; prompt lookup (``lookup``: ``prompt_lookup_num_tokens=gamma``, n-grams up to 3);
    or assisted by ``assistant`` (a transformers model) with a constant ``num_assistant_tokens=gamma``
    and no early stop on the draft's confidence. All through one ``GenerationConfig``."""
    from transformers import GenerationConfig
    from transformers.utils import logging as hf_logging

    cfg = dict(max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=eos_token_id,
               pad_token_id=eos_token_id if eos_token_id is not None else 0)
    if lookup:
        cfg |= dict(prompt_lookup_num_tokens=gamma, max_matching_ngram_size=3)
    if assistant is not None:
        cfg |= dict(num_assistant_tokens=gamma, num_assistant_tokens_schedule="constant",
                    assistant_confidence_threshold=0.0)
    gen_cfg, ids, kw = GenerationConfig(**cfg), torch.tensor([prompt]), {"assistant_model": assistant}

    def run() -> list[int]:
        # transformers' assisted generation calls the assistant's generate with both a generation config and
        # max_new_tokens, and warns about its own call; its logger is quietened for this call only.
        level = hf_logging.get_verbosity()
        if assistant is not None:
            hf_logging.set_verbosity_error()
        try:
            with torch.inference_mode():
                return hf.generate(ids, generation_config=gen_cfg, **kw)[0, len(prompt):].tolist()
        finally:
            hf_logging.set_verbosity(level)

    return run


def transformers_baseline(target_dir: str | Path, prompt: list[int], max_new_tokens: int = 128,
                          draft: str | Path | None = None, gamma: int = 4, repeats: int = 3,
                          eos_token_id: int | None = None) -> dict:
    """Greedy decoding of one prompt at batch 1 by transformers and by minispec, side by side.

    ``draft``: None for plain decoding, ``"ngram"`` for prompt lookup (minispec's
    ``PromptLookupDraft()``), or a draft checkpoint directory (assisted generation); transformers is
    configured by :func:`transformers_runner`. Both run on the CPU in float32 and stop at
    ``eos_token_id`` (None: never). The two run in turn, ``repeats`` times; returns the median
    tokens/s of each, the median of the per-round ratios, and whether the tokens are identical.
    """
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(target_dir), dtype=torch.float32).eval()
    target, _ = load(target_dir, dtype=torch.float32)
    assistant, ms_draft = None, None
    if draft == "ngram":
        ms_draft = PromptLookupDraft()
    elif draft is not None:
        assistant = AutoModelForCausalLM.from_pretrained(str(draft), dtype=torch.float32).eval()
        ms_draft, _ = load(draft, dtype=torch.float32)
    hf_run = transformers_runner(hf, prompt, max_new_tokens, eos_token_id, gamma, draft == "ngram", assistant)

    def ms_run():
        kw = dict(max_new_tokens=max_new_tokens, eos_token_id=eos_token_id)
        if ms_draft is None:
            return generate(target, [prompt], **kw).tokens[0]
        return speculative_generate(target, ms_draft, [prompt], gamma=gamma, **kw).tokens[0]

    hf_tokens, ms_tokens = hf_run(), ms_run()  # warm-up, and the tokens to compare
    cpu, hf_s, ms_s = torch.device("cpu"), [], []
    for _ in range(repeats):  # side by side, so that a busy moment slows both sides of one ratio
        hf_s.append(median_time(hf_run, cpu, 1, warmup=0))
        ms_s.append(median_time(ms_run, cpu, 1, warmup=0))
    ratio = statistics.median((len(ms_tokens) / m) / (len(hf_tokens) / h) for h, m in zip(hf_s, ms_s))
    return {"draft": "none" if draft is None else str(draft), "gamma": gamma if draft is not None else None,
            "hf_tokens_per_s": len(hf_tokens) / statistics.median(hf_s),
            "minispec_tokens_per_s": len(ms_tokens) / statistics.median(ms_s),
            "minispec_over_hf": ratio,
            "identical_greedy_tokens": hf_tokens == ms_tokens, "new_tokens": len(ms_tokens),
            "max_new_tokens": max_new_tokens, "prompt_len": len(prompt), "threads": torch.get_num_threads()}
