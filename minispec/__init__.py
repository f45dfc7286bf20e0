"""minispec: an educational speculative decoder in plain PyTorch.

    import minispec
    target, tok = minispec.load("tiny-code-target")
    draft, _ = minispec.load("tiny-code-draft")
    out = minispec.speculative_generate(target, draft, [tok.encode("def main(")], gamma=4, max_new_tokens=64)
    print(tok.decode(out.tokens[0]), out.stats.acceptance_rate)

Drafts that need no draft model: ``minispec.PromptLookupDraft()`` and ``minispec.LayerSkipDraft(target, n)``.
A tree of drafts verified in one pass: ``minispec.TreeDraft(draft, branching=(4, 2, 2, 1))`` or
``minispec.TreeDraft(draft, budget=16, depth=5)`` (EAGLE-2's dynamic tree).
"""

from minispec.decode import GenerationResult, generate
from minispec.drafts import Draft, LayerSkipDraft, ModelDraft, PromptLookupDraft, TreeDraft
from minispec.eagle import EagleDraft
from minispec.grader import grade_accept_rule
from minispec.hardware import H100_SXM, H200, Hardware
from minispec.load import EMBEDDED, fetch, load
from minispec.model import Model, ModelConfig
from minispec.roofline import (
    ModelShape,
    break_even_batch,
    compute_bound_batch,
    expected_tokens,
    leviathan_speedup,
    speculative_speedup,
    step_time,
)
from minispec.sampling import SamplingParams
from minispec.speculative import accept_reject, speculative_generate
from minispec.stats import Stats
from minispec.tokenizer import ByteTokenizer

__all__ = [
    "EMBEDDED", "H100_SXM", "H200", "ByteTokenizer", "Draft", "GenerationResult", "Hardware", "LayerSkipDraft",
    "Model", "ModelConfig", "ModelDraft", "ModelShape", "PromptLookupDraft", "SamplingParams", "Stats", "TreeDraft",
    "EagleDraft", "accept_reject", "break_even_batch", "compute_bound_batch", "expected_tokens", "fetch", "generate",
    "grade_accept_rule", "leviathan_speedup", "load", "speculative_generate", "speculative_speedup", "step_time",
]
