"""The speculative layer: the exact accept rules and the draft-verify loop that uses them.

  rule.py  accept_reject (a chain) and verify_tree (a tree): the rule, with its proof
  loop.py  speculative_step (draft, verify, accept, roll back: one screen) and speculative_generate

Stands on :mod:`minispec.drafts` (what proposes), :mod:`minispec.decoding` and :mod:`minispec.roofline`
(gamma="auto").
"""
