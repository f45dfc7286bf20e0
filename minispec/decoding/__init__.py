"""The decoding layer: sampling, one call's tokens and progress, the plain loop, tree masks, stats and timers.

  sampling.py  temperature / top-k / top-p; Philox4x32-10 and an exact inverse-CDF draw, no host sync
  plain.py     plain batched decoding (the baseline) and a call's state (DecodeState), shared by every loop
  tree.py      the shape of a tree of drafts and its attention mask
  stats.py     TTFT, TPOT, ITL and acceptance with vLLM's names
  timing.py    phase timers (CUDA events on a GPU)

Stands on :mod:`minispec.model`; the drafts and the speculative loop stand on it.
"""
