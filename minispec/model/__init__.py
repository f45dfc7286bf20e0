"""The model layer: a Llama-family decoder in plain PyTorch with its preallocated KV cache and checkpoint loading.

  config.py     ModelConfig; Hugging Face's config.json and weight names in and out
  llama.py      the decoder (Llama, Llama-3 rope, Mistral windows, Qwen2 biases); forward(tokens, cache, tree)
  kv_cache.py   preallocated per-layer K/V with per-row lengths; rollback copies nothing
  load.py       checkpoints -> Model: HF directories, GGUF files, embedded and fetched models
  tokenizer.py  the embedded models' byte-level tokenizer
  random.py     random-weight models of named shapes, for timing without a download

Imports nothing else from minispec: every layer above stands on this one.
"""
