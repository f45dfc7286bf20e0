"""Predict decode and speculative step times per operator from the roofline of the hardware.

The cost model, in six modules read in this order: :mod:`~minispec.roofline.hardware` (ceilings: datasheet
presets and a calibration of this device), :mod:`~minispec.roofline.shapes` (what a model reads and
multiplies), :mod:`~minispec.roofline.chain` (a chain of gamma drafts), :mod:`~minispec.roofline.profile`
(which child of a tree node is accepted), :mod:`~minispec.roofline.tree` (trees),
:mod:`~minispec.roofline.export` (vLLM's and SGLang's settings); :mod:`~minispec.roofline.policy` turns it into
a gamma per step at run time. Every public name of the first five is importable from here.

Notation (Leviathan et al. 2023): p = target distribution, q = draft distribution,
gamma = draft tokens per step, alpha = acceptance rate of one draft token, c = the cost of one
draft step as a fraction of a plain target step at the same batch and context.

One forward of a model over T tokens in each of B rows (N = B * T tokens), each row holding
``context`` tokens of KV cache, runs two kinds of kernel, and each is bound either by memory
traffic or by compute:

    t(B, T) = max(W(N) / bandwidth, 2 * P_active * N / peak)             weight matmuls
            + max(B * context * kv / bandwidth, A * context * N / peak)    attention      (seconds)

    W(N)      weight bytes the step reads: params * bytes per weight for a dense model
    P_active  parameters one token multiplies (2 FLOPs each): all of them for a dense model
    kv        KV bytes per token = 2 (K and V) * layers * kv_heads * head_dim * bytes per KV element
    A         attention FLOPs per query token per cached token = 4 * layers * heads * head_dim (QK^T, PV)

With ``context=0`` this is the reference model, max(weight bytes / bandwidth, 2 * params * N / peak).
The two kernels are summed, not put under one max: the KV read cannot hide the matmuls' FLOPs.
Attention runs at heads / kv_heads * T FLOPs per KV byte, far below every ridge here, so at long
context its KV read is what costs. Left out: activations, norms, softmax, kernel launches, and the
causal half of a prefill's attention.

Mixture of experts (MoESD, Huang et al. 2025): of E experts per layer each token routes to k; N tokens
touch E * (1 - (1 - k/E)^N) distinct experts per layer on average, and W(N) counts the shared weights
plus those; P_active counts the shared weights plus k experts. Verifying gamma + 1 tokens per row reads
more experts than decoding one, so verification is not free at batch 1; at a moderate batch every
expert is read anyway and it is again. Quantized weights (W4A16: 0.5 bytes per weight, 16-bit compute)
cut W but not the FLOPs, so the matmuls turn compute-bound at a quarter of the BF16 batch.

A speculative step drafts gamma tokens, then verifies B * (gamma + 1), and yields
E = (1 - alpha^(gamma+1)) / (1 - alpha) tokens per row (Leviathan et al. 2023; Chen et al. 2023):

    speedup = E * t(B, 1) / (t(B, gamma + 1) + gamma * t_q(B))
    t_q(B)  = c * t(B, 1)                       the reference: c a constant
            = t_draft(B, 1) at min(context, window)   a draft shape: c = t_q / t(B, 1) varies with B and context

At small batch the weight read sets both t(B, 1) and t(B, gamma + 1), so the speedup is Leviathan's
E / (1 + gamma c). Verification turns compute-bound gamma + 1 times sooner than plain decoding
(295 / 5 = 59 rows for an 8B BF16 target on an H100). At long context the KV read, paid by plain and
speculative steps alike, dilutes that extra compute; and a draft whose KV is bounded to a window
(StreamingLLM, Xiao et al. 2023) gets cheaper relative to the target as the batch grows, so the
speedup can rise with batch (MagicDec, Sadhukhan et al. 2024). Choosing gamma per batch, 0 included,
is SmartSpec's goodput rule (Liu et al. 2024) and what vLLM's dynamic speculative decoding reads as
``num_speculative_tokens_per_batch_size``.

A tree step (SpecInfer, Medusa, EAGLE-2, Sequoia) verifies T draft nodes per row in one pass: t(B, T + 1), the
root (the last accepted token) included. It is drafted in one pass per level, pass i over the w_i nodes of depth
i - 1 that get children, each c * t(B, w_i) (or a draft shape's own step). From an acceptance profile by child
rank (Sequoia's positional acceptance vector: P(the accepted child is the one of rank k)), a node is accepted
with the product of the profile along its path, and E = 1 + the sum over nodes; the best tree of n nodes is the
n most probable nodes (:mod:`~minispec.roofline.profile`: a profile assumed from alpha, or measured, or
conditioned on the parent's rank). At batch 1 verification is free up to 295 tokens per row on an H100, so the
best tree has 294 nodes and raises E from 3.4 (a chain of 4) to 7.1 at alpha 0.8; but every row verifies every
node, so the weights turn compute-bound at B (T + 1) = 295 tokens, and the best budget falls with the batch (72
nodes at 4 rows, 17 at 16), to a chain and then to 0 (:func:`best_tree_budget`).

A draft's cost includes its LM head, vocab x hidden: most of a one-layer EAGLE head on a large vocabulary
(68 % of one on Llama-3-8B, 96 % on Gemma-3-270M). A hot vocabulary (FR-Spec, Zhao et al. 2025; EAGLE-3's 32k
draft vocabulary) keeps only N rows, and ``ModelShape.hot_vocab`` reads only N of a full head's rows.

"""

from minispec.roofline.chain import (  # noqa: F401 re-exported
    VOCAB_TARGETS,
    best_gamma,
    break_even_batch,
    compute_bound_batch,
    draft_cost_by_vocab,
    expected_tokens,
    leviathan_speedup,
    max_batch,
    modelled_draft_cost,
    speculative_speedup,
    speculative_step_time,
    speedup_table,
    step_time,
)
from minispec.roofline.export import (  # noqa: F401 re-exported
    sglang_eagle_args,
    sglang_speculative_config,
    vllm_config_from_speedup,
    vllm_speculative_config,
)
from minispec.roofline.hardware import H100_SXM, H200, Hardware  # noqa: F401 re-exported
from minispec.roofline.profile import EMBEDDED_PROFILE, RankProfile, default_profile  # noqa: F401 re-exported
from minispec.roofline.shapes import (  # noqa: F401 re-exported
    EAGLE_8B,
    GEMMA3_270M,
    GEMMA3_270M_CONFIG,
    LLAMA3_8B_CONFIG,
    LLAMA_1B,
    LLAMA_8B,
    LLAMA_70B,
    MIXTRAL_8X7B,
    MODEL_SHAPES,
    SMOLLM2_135M,
    SMOLLM2_135M_CONFIG,
    ModelShape,
    MoE,
    check_arguments,
    eagle_head_shape,
    quantized,
)
from minispec.roofline.tree import (  # noqa: F401 re-exported
    SEARCH_LIMIT,
    TreeShape,
    best_tree,
    best_tree_budget,
    tree_expected_tokens,
    tree_speculative_step_time,
    tree_speedup,
    tree_speedup_table,
    tree_step_time,
)
