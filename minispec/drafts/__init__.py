"""What proposes draft tokens: a smaller model, the target's own first layers, the text itself, or a tree of them.

  ModelDraft        (model.py) a separate, smaller model with its own KV cache (Leviathan et al. 2023)
  LayerSkipDraft    (model.py) the target's first N layers, then its final norm and LM head: self-speculation
                    with no new weights (after LayerSkip); its own N-layer KV cache, filled by reading
                    the prompt again, is this package's choice (LayerSkip shares the target's cache)
  PromptLookupDraft (lookup.py) the tokens that followed the last n-gram's most recent earlier occurrence in the
                    row's own prompt and output (Saxena 2023; vLLM's "ngram", Hugging Face's
                    prompt_lookup_num_tokens): no model, no memory, c ~ 0
  SuffixDraft       (suffix.py, suffix_tree.py) suffix decoding (SuffixDecoding; Arctic Inference; vLLM's "suffix"):
                    what followed the row's latest tokens in its prompt and output and in earlier requests' outputs,
                    counted in suffix trees, as a chain or a tree sized by those counts: no model, c ~ 0
  TreeDraft         (tree.py) a tree of drafts from a draft model: a static shape (Medusa, SpecInfer) or a
                    dynamic tree grown by cumulative draft probability (EAGLE-2)

  EagleDraft        (eagle.py) one decoder layer reading the target's hidden states (EAGLE), with an
                    optional hot vocabulary
  Eagle3Draft       (eagle3.py) EAGLE-3: the target's low, middle and high layers fused, its own LM head over a
                    draft vocabulary; saved in vLLM's eagle3 layout

The protocol they share (:class:`~minispec.drafts.base.Draft`, :class:`~minispec.drafts.base.DraftRun`,
:class:`~minispec.drafts.base.Proposal`) is in base.py.
"""
