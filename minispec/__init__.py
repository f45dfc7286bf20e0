"""minispec: an educational speculative decoder in plain PyTorch.

    import minispec
    target, tok = minispec.load("tiny-code-target")
    draft, _ = minispec.load("tiny-code-draft")
    out = minispec.speculative_generate(target, draft, [tok.encode("def main(")], gamma=4, max_new_tokens=64)
    print(tok.decode(out.tokens[0]), out.stats.acceptance_rate)

Drafts that need no draft model: ``minispec.PromptLookupDraft()``, ``minispec.SuffixDraft()`` (suffix decoding) and
``minispec.LayerSkipDraft(target, n)``.
A tree of drafts verified in one pass: ``minispec.TreeDraft(draft, branching=(4, 2, 2, 1))`` or
``minispec.TreeDraft(draft, budget=16, depth=5)`` (EAGLE-2's dynamic tree). Under load, requests that come and go:
``minispec.Engine(target, draft).run([minispec.Request(prompt, 64), ...])`` (continuous batching, paged KV).
"""

from minispec.course.grader import grade_accept_rule
from minispec.decoding.plain import GenerationResult, generate
from minispec.decoding.sampling import SamplingParams
from minispec.decoding.stats import Stats
from minispec.drafts.base import Draft
from minispec.drafts.eagle import EagleDraft
from minispec.drafts.eagle3 import Eagle3Draft
from minispec.drafts.lookup import PromptLookupDraft
from minispec.drafts.model import LayerSkipDraft, ModelDraft
from minispec.drafts.suffix import SuffixDraft
from minispec.drafts.tree import TreeDraft
from minispec.engine import Engine, Request
from minispec.model.config import ModelConfig
from minispec.model.llama import Model
from minispec.model.load import EMBEDDED, fetch, load
from minispec.model.tokenizer import ByteTokenizer
from minispec.roofline import (
    ModelShape,
    break_even_batch,
    compute_bound_batch,
    expected_tokens,
    leviathan_speedup,
    speculative_speedup,
    step_time,
)
from minispec.roofline.hardware import H100_SXM, H200, Hardware
from minispec.speculative.loop import speculative_generate
from minispec.speculative.rule import accept_reject

__all__ = [
    "EMBEDDED", "H100_SXM", "H200", "ByteTokenizer", "Draft", "GenerationResult", "Hardware", "LayerSkipDraft",
    "Model", "ModelConfig", "ModelDraft", "ModelShape", "PromptLookupDraft", "SamplingParams", "Stats", "TreeDraft",
    "EagleDraft", "Eagle3Draft", "Engine", "Request", "accept_reject", "break_even_batch", "compute_bound_batch",
    "expected_tokens", "fetch", "generate", "grade_accept_rule", "leviathan_speedup", "load", "speculative_generate",
    "speculative_speedup", "step_time", "SuffixDraft",
]
