"""Peak memory of one prompt-lookup step at B 64, gamma 8, V 128k, measured as the process's peak RSS.

    python scripts/prompt_lookup_memory.py [PACKAGE_ROOT]

PACKAGE_ROOT (default: this checkout) is put first on sys.path, so the same script measures an older
checkout too (``git worktree add /tmp/before <commit>``). One speculative_generate call of one step
(max_new_tokens=2, greedy) on a 2-layer Llama with a 131,072-token vocabulary whose embedding is zero,
so its greedy token is always 0; each prompt holds one earlier 0, so prompt lookup proposes 8 tokens in
every row. Prints one JSON line.
"""

import json
import resource
import sys
from pathlib import Path

sys.path.insert(0, sys.argv[1] if len(sys.argv) > 1 else str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

import minispec  # noqa: E402
from minispec.model.config import ModelConfig
from minispec.model.llama import Model  # noqa: E402


def rss() -> int:
    return int(Path("/proc/self/statm").read_text().split()[1]) * 4096


torch.manual_seed(0)
cfg = ModelConfig(vocab_size=131_072, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512)
target = Model(cfg).eval().requires_grad_(False)
target.embed.weight.data.zero_()  # every logit 0: the greedy token is always 0, which each prompt holds once
prompts = [[b + 1, 0] + list(range(1, 20)) for b in range(64)]  # after the new 0, lookup proposes 1, 2, ..., 8
minispec.generate(target, prompts[:1], max_new_tokens=2)  # warm up
base = rss()
out = minispec.speculative_generate(target, minispec.PromptLookupDraft(), prompts, gamma=8, max_new_tokens=2)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({"package": minispec.__file__, "batch": 64, "gamma": 8, "vocab": cfg.vocab_size,
                  "draft_tokens": out.stats.draft_tokens, "peak_above_baseline_mb": round((peak - base) / 2**20),
                  "baseline_mb": round(base / 2**20)}))
