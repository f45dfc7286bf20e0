"""The cost model's answer as engine settings: vLLM's K per batch size and SGLang's EAGLE tree per batch.

vLLM's dynamic speculative decoding reads ``num_speculative_tokens_per_batch_size`` ([start_bs, end_bs, K]
ranges, K = 0 meaning no drafting); SGLang's EAGLE worker reads ``--speculative-num-steps``,
``--speculative-eagle-topk`` and ``--speculative-num-draft-tokens``. Both are filled here from the model (or,
in :mod:`minispec.tools.bench`, from measured step times).
"""

from __future__ import annotations

import math

from minispec.roofline.chain import break_even_batch, max_batch, speculative_speedup
from minispec.roofline.hardware import H100_SXM, Hardware
from minispec.roofline.shapes import LLAMA_8B, ModelShape, check_arguments
from minispec.roofline.tree import TreeShape, _best_tree_at


def vllm_config_from_speedup(speedup, largest_batch: int, gamma_max: int = 8) -> dict:
    """vLLM's dynamic speculative decoding keys from any ``speedup(batch, gamma) -> float``.

    Each batch 1..``largest_batch`` gets the gamma in 1..gamma_max with the highest speedup (the
    smallest on a tie) if that speedup exceeds 1, else 0; neighbouring batches with the same K merge
    into one inclusive range [start_bs, end_bs, K]. vLLM applies the last range's K to larger batches.
    ``num_speculative_tokens`` is the largest K used (vLLM's maximum draft window; it must be >= 1).
    """
    if not largest_batch >= 1 or largest_batch != int(largest_batch):
        raise ValueError(f"largest_batch must be an integer >= 1, got {largest_batch}")
    check_arguments(gamma=gamma_max)
    ranges: list[list[int]] = []
    for B in range(1, int(largest_batch) + 1):
        gain = {g: speedup(B, g) for g in range(1, gamma_max + 1)}
        g = max(gain, key=lambda g: (gain[g], -g), default=0)
        K = g if g and gain[g] > 1 else 0
        if ranges and ranges[-1][2] == K:
            ranges[-1][1] = B
        else:
            ranges.append([B, B, K])
    K_max = max(K for _, _, K in ranges)
    if K_max == 0:
        raise ValueError(f"no gamma in 1..{gamma_max} pays at any batch up to {largest_batch}: "
                         "leave speculative decoding off (no --speculative-config)")
    return {"num_speculative_tokens": K_max, "num_speculative_tokens_per_batch_size": ranges}


def vllm_speculative_config(alpha: float = 0.8, gamma_max: int = 8, draft_cost: float = 0.05,
                            hardware: Hardware = H100_SXM, model: ModelShape = LLAMA_8B, context: float = 0, *,
                            draft: ModelShape | None = None, draft_kv_window: int | None = None,
                            usable_fraction: float = 0.9, largest_batch: int | None = None) -> dict:
    """The modelled best gamma per batch as keys of vLLM's ``--speculative-config`` (JSON-ready dict).

    The ranges run from 1 to ``largest_batch``: by default the largest batch that fits in memory
    (:func:`max_batch`), or, where a row needs no memory (context 0), the first batch past every
    gamma's break-even, from which K stays 0.
    """
    kw = dict(draft=draft, draft_kv_window=draft_kv_window)
    if largest_batch is None:
        largest_batch = max_batch(hardware, model, context, draft, usable_fraction, draft_kv_window=draft_kv_window)
        if largest_batch == 0:
            raise ValueError(f"the weights do not fit in {usable_fraction:.0%} of {hardware.name}'s memory")
        if largest_batch == math.inf:
            off = max(break_even_batch(alpha, g, draft_cost, hardware, model, context, **kw)
                      for g in range(1, gamma_max + 1))
            if off == math.inf:
                raise ValueError("speculation pays at every batch and a row needs no memory: pass largest_batch")
            largest_batch = math.floor(off) + 1
    return vllm_config_from_speedup(
        lambda B, g: speculative_speedup(B, alpha, g, draft_cost, hardware, model, context, **kw),
        largest_batch, gamma_max)


def sglang_eagle_args(tree: TreeShape) -> dict:
    """SGLang's EAGLE server arguments that can build ``tree``: depth, top-k, and nodes verified with the root.

    - ``speculative_num_steps``: draft passes = the tree's depth;
    - ``speculative_eagle_topk``: children per node and frontier width per pass, so the most of either;
    - ``speculative_num_draft_tokens``: tokens verified per row, the root included: nodes + 1. SGLang keeps the
      ``num_verify_tokens - 1`` best-scored draft tokens and puts the verified token in front of them
      (``build_tree_kernel_efficient_preprocess``, python/sglang/srt/speculative/build_eagle_tree.py), and with
      top-k 1 it sets num_draft_tokens = num_steps + 1 (docs/advanced_features/speculative_decoding.md).

    SGLang then picks its own best nodes from the draft's scores; these settings give it room for this tree.
    """
    if not tree.nodes:
        raise ValueError("an empty tree is plain decoding: launch SGLang without --speculative-algorithm")
    return {"speculative_num_steps": tree.depth,
            "speculative_eagle_topk": max(max(tree.branching), max(tree.expanded)),
            "speculative_num_draft_tokens": tree.nodes + 1}


def sglang_speculative_config(alpha: float = 0.8, budgets=None, draft_cost: float = 0.05,
                              hardware: Hardware = H100_SXM, model: ModelShape = LLAMA_8B, context: float = 0, *,
                              profile=None, draft: ModelShape | None = None, draft_kv_window: int | None = None,
                              max_depth: int = 12, usable_fraction: float = 0.9,
                              largest_batch: int | None = None) -> dict:
    """The modelled best tree per batch as SGLang's EAGLE arguments (JSON-ready), beside vLLM's table.

    ``{"server_args_per_batch_size": [[start_bs, end_bs, args], ...]}``: inclusive ranges from batch 1 to
    ``largest_batch``, neighbours with the same arguments merged; ``args`` is :func:`sglang_eagle_args` of the
    best tree, or ``{}`` where plain decoding is fastest (launch without speculation). SGLang takes the three
    arguments once per server (its ``--speculative-adaptive`` mode moves only num_steps, with top-k 1), so pick
    the range of the batch the server will run at (``--speculative-adaptive``: adaptive_spec_params.py in
    python/sglang/srt/speculative/). ``largest_batch``: by default the largest batch that fits in
    memory (:func:`max_batch`), or, where a row needs no memory (context 0), the first batch at which no tree
    pays, found by doubling and bisection (which assumes, as the tests check, that the budget never rises with
    batch there).
    """
    args = (alpha, budgets, draft_cost, hardware, model, context, profile, draft, draft_kv_window, max_depth)
    if largest_batch is None:
        largest_batch = max_batch(hardware, model, context, draft, usable_fraction, draft_kv_window=draft_kv_window)
        if largest_batch == 0:
            raise ValueError(f"the weights do not fit in {usable_fraction:.0%} of {hardware.name}'s memory")
        if largest_batch == math.inf:
            pays = lambda B: _best_tree_at(B, *args)[1] > 0  # noqa: E731
            lo, hi = 0, 1
            while pays(hi):
                lo, hi = hi, 2 * hi
                if hi > 2 ** 24:
                    raise ValueError("a tree pays at every batch and a row needs no memory: pass largest_batch")
            while hi - lo > 1:  # the first batch that does not pay is in (lo, hi]
                mid = (lo + hi) // 2
                lo, hi = (mid, hi) if pays(mid) else (lo, mid)
            largest_batch = hi
    if not largest_batch >= 1 or largest_batch != int(largest_batch):
        raise ValueError(f"largest_batch must be an integer >= 1, got {largest_batch}")
    ranges: list[list] = []
    for B in range(1, int(largest_batch) + 1):
        found = _best_tree_at(B, *args)[2]
        settings = sglang_eagle_args(found[3]) if found else {}
        if ranges and ranges[-1][2] == settings:
            ranges[-1][1] = B
        else:
            ranges.append([B, B, settings])
    return {"server_args_per_batch_size": ranges}
