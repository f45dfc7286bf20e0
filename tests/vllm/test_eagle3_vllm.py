"""The EAGLE-3 head in minispec and in vLLM's CPU build (``method: "eagle3"``): the same greedy tokens and the same
per-position accepted counts on the same prompts, through ``speculative_generate`` and through the ``Engine``.

vLLM reads the embedded target's folder and the shipped head's folder as they are (the head is saved in its
layout: ``LlamaForCausalLMEagle3``, ``midlayer.*``, ``fc``, ``d2t``/``t2d``; see minispec/drafts/eagle3.py). It runs
in a child process (this file run as a script, as vLLM's engine core spawns and needs a ``__main__`` guard), one
engine at a time, with ``VLLM_CPU_KVCACHE_SPACE=1``. Skipped where vLLM is not installed: run it in the vLLM lane,
``bash scripts/vllm_env.sh && . .venv-vllm/bin/activate``, then
``python -m pytest tests/vllm/test_eagle3_vllm.py -p no:xdist``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ASSETS = Path(__file__).resolve().parents[2] / "minispec" / "assets"
NEW_TOKENS = 48
RESULT = "minispec-eagle3-vllm: "  # the child's result line, among vLLM's own log lines on stdout


def vllm_missing() -> str | None:
    """Why vLLM cannot run here, or None. A bare ``import vllm`` could find tests/vllm as a namespace package."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or spec.origin is None:
        return "vLLM is not installed here; run this test in the vLLM lane (scripts/vllm_env.sh)"
    return None


def code_prompts(n: int = 8, length: int = 64) -> list[list[int]]:
    """n prompts of ``length`` bytes from line starts spread over the shipped held-out code (as in
    scripts/eagle_bench.py)."""
    text = (ASSETS / "code_heldout.txt").read_bytes()
    starts = [i + 1 for i, c in enumerate(text) if c == ord("\n") and i + 1 + length < len(text)]
    return [list(text[s : s + length]) for s in starts[:: len(starts) // n][:n]]


def vllm_run(head: str, gamma: int, prompts: list[list[int]], new_tokens: int) -> dict:
    """vLLM's greedy tokens and spec-decode counters for the embedded target with the EAGLE-3 head in ``head``."""
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.v1.metrics.reader import Counter, Vector

    llm = LLM(model=str(ASSETS / "tiny-code-target"), skip_tokenizer_init=True, max_model_len=512, dtype="float32",
              enforce_eager=True, disable_log_stats=False, seed=0,
              speculative_config={"method": "eagle3", "model": head, "num_speculative_tokens": gamma})
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts],
                        SamplingParams(temperature=0.0, max_tokens=new_tokens, ignore_eos=True, detokenize=False))
    found = {}
    for m in llm.get_metrics():
        if isinstance(m, Counter) and m.name.startswith("vllm:spec_decode"):
            found[m.name] = m.value
        elif isinstance(m, Vector) and m.name == "vllm:spec_decode_num_accepted_tokens_per_pos":
            found[m.name] = m.values
    return {"tokens": [list(o.outputs[0].token_ids) for o in outs], "num_drafts": found["vllm:spec_decode_num_drafts"],
            "draft_tokens": found["vllm:spec_decode_num_draft_tokens"],
            "accepted": found["vllm:spec_decode_num_accepted_tokens"],
            "accepted_per_position": found["vllm:spec_decode_num_accepted_tokens_per_pos"]}


def padded(counts, gamma: int) -> list[int]:
    """minispec's per-position counts stop at the last position that accepted anything; vLLM's have gamma entries."""
    return list(counts) + [0] * (gamma - len(counts))


def in_vllm(head: Path, gamma: int, prompts: list[list[int]], new_tokens: int) -> dict:
    """:func:`vllm_run` in a child process (vLLM's engine core is spawned)."""
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", MINISPEC_EAGLE3_ARGS=json.dumps(
        {"head": str(head), "gamma": gamma, "prompts": prompts, "new_tokens": new_tokens}))
    done = subprocess.run([sys.executable, __file__], env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(next(line for line in done.stdout.splitlines() if line.startswith(RESULT))[len(RESULT):])


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.parametrize("gamma", [3, 4])
def test_eagle3_accepts_what_vllm_accepts(gamma):
    if vllm_missing():
        pytest.skip(vllm_missing())
    import minispec

    target, _ = minispec.load("tiny-code-target")
    head = minispec.Eagle3Draft.from_pretrained("tiny-code-eagle3", target)
    prompts = code_prompts()
    theirs = in_vllm(ASSETS / "tiny-code-eagle3", gamma, prompts, NEW_TOKENS)
    ours = minispec.speculative_generate(target, head, prompts, gamma=gamma, max_new_tokens=NEW_TOKENS)
    assert ours.tokens == theirs["tokens"] == minispec.generate(target, prompts, NEW_TOKENS).tokens
    s = ours.stats
    assert sum(theirs["accepted_per_position"]) > theirs["num_drafts"]  # a head that accepts: counts that can differ
    assert (s.num_drafts, s.draft_tokens, s.accepted_tokens) == (theirs["num_drafts"], theirs["draft_tokens"],
                                                                 theirs["accepted"])
    assert padded(s.accepted_per_position, gamma) == theirs["accepted_per_position"]
    engine = minispec.Engine(target, head, gamma=gamma)
    outs = engine.run([minispec.Request(p, NEW_TOKENS) for p in prompts])
    assert [o.tokens for o in outs] == theirs["tokens"]
    assert padded(engine.stats.accepted_per_position, gamma) == theirs["accepted_per_position"]
    assert engine.stats.num_drafts == theirs["num_drafts"]


if __name__ == "__main__":  # the child process of in_vllm
    args = json.loads(os.environ["MINISPEC_EAGLE3_ARGS"])
    print(RESULT + json.dumps(vllm_run(args["head"], args["gamma"], args["prompts"], args["new_tokens"])), flush=True)
