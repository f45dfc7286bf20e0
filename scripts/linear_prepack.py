"""Linear layers on this CPU: torch's F.linear against oneDNN with a prepacked weight (Model.prepack, vLLM's CPU path).

    python scripts/linear_prepack.py [--threads 1] [--out results/cpu/linear_prepack.txt]
    .venv-vllm/bin/python scripts/linear_prepack.py   # and vLLM's own oneDNN linear beside them

Where vLLM imports (its CPU build, ``scripts/vllm_env.sh``), a third kernel joins each cell: the one vLLM 0.32's CPU
model runner calls for a float32 linear (``vllm._custom_ops.create_onednn_mm`` / ``onednn_mm``, chosen in
``vllm/model_executor/layers/utils.py``), on the same weight and input.

SmolLM2-135M's four weight shapes (q/k/v fused, gate/up fused, down, the LM head) and three of the embedded target's
at 1 to 512 tokens a pass, float32; each time the median of alternated rounds, both kernels timed in the same process.
Then whole-model forward passes of SmolLM2-135M (random weights of its shape: the time does not depend on the values)
at the same token counts, unpacked against :meth:`Model.prepack` (which sends products under
``PACKED_MIN_MACS`` multiply-adds through F.linear).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import time

import torch
import torch.nn.functional as F

SHAPES = {"qkv 576->960": (576, 960), "gate/up 576->3072": (576, 3072), "down 1536->576": (1536, 576),
          "lm_head 576->49152": (576, 49152),  # SmolLM2-135M
          "pair qkv 192->384": (192, 384), "pair gate/up 192->1024": (192, 1024), "pair down 512->192": (512, 192)}


def timed(f, *inputs, rounds: int) -> float:
    """The median seconds of ``f(*inputs)`` over ``rounds`` calls after one warm-up."""
    f(*inputs)
    out = []
    for _ in range(rounds):
        t = time.perf_counter()
        f(*inputs)
        out.append(time.perf_counter() - t)
    return statistics.median(out)


def vllm_linear():
    """W (N, K) -> vLLM's CPU linear x -> x W^T (what its model runner builds for an unquantized float32 layer), or
    None where vLLM's CPU build is not importable."""
    try:
        from vllm import _custom_ops as ops
    except ImportError:
        return None
    if not getattr(ops, "_supports_onednn", False):
        return None

    def make(W):
        handler = ops.create_onednn_mm(W.t(), 32)  # as dispatch_cpu_unquantized_gemm calls it
        return lambda x: ops.onednn_mm(handler, x, None)
    return make


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--tokens", default="1,2,5,8,16,40,128,512")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--out", default="results/cpu/linear_prepack.txt")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    tokens = [int(t) for t in args.tokens.split(",")]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    vllm_mm = vllm_linear()
    names = "F.linear / prepacked" + (" / vLLM onednn_mm" if vllm_mm else "")
    lines = [f"# linear layers: {names} (Model.prepack; ratios: F.linear / prepacked"
             f"{', prepacked / vLLM' if vllm_mm else ''}); {platform.machine()} CPU, torch "
             f"{torch.__version__}, {args.threads} thread(s), float32, commit {commit}, load average before "
             f"{os.getloadavg()[0]:.1f}", "", "| tokens | " + " | ".join(SHAPES) + " |",
             "| --- |" + " --- |" * len(SHAPES)]
    torch.manual_seed(0)
    with torch.inference_mode():
        for M in tokens:
            cells = []
            for K, N in SHAPES.values():
                W, x = torch.randn(N, K), torch.randn(M, K)
                packed = torch.ops.mkldnn._reorder_linear_weight(W, None)
                a = timed(F.linear, x, W, rounds=args.rounds)
                b = timed(torch.ops.mkldnn._linear_pointwise, x, packed, None, "none", [], "", rounds=args.rounds)
                if vllm_mm is None:
                    cells.append(f"{1e3 * a:.2f} / {1e3 * b:.2f} ms ({a / b:.2f}x)")
                    continue
                c = timed(vllm_mm(W), x, rounds=args.rounds)
                cells.append(f"{1e3 * a:.2f} / {1e3 * b:.2f} / {1e3 * c:.2f} ms ({a / b:.2f}x, {b / c:.2f}x)")
            lines.append(f"| {M} | " + " | ".join(cells) + " |")
            print(lines[-1], flush=True)
        from minispec.model.config import ModelConfig
        from minispec.model.llama import Model

        cfg = ModelConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                          num_attention_heads=9, num_key_value_heads=3, head_dim=64, max_position_embeddings=2048,
                          tie_word_embeddings=True, rope_theta=100000.0)
        plain, packed = Model(cfg).eval(), Model(cfg).eval()
        packed.load_state_dict(plain.state_dict())
        packed.prepack()
        lines += ["", "Whole SmolLM2-135M-shaped forward, no cache (F.linear / Model.prepack):", "",
                  "| tokens | F.linear | prepacked | ratio |", "| --- | --- | --- | --- |"]
        for M in tokens:
            x = torch.randint(0, 49152, (1, M))
            a, b = timed(plain, x, rounds=args.rounds), timed(packed, x, rounds=args.rounds)
            lines.append(f"| {M} | {1e3 * a:.1f} ms | {1e3 * b:.1f} ms | {a / b:.2f}x |")
            print(lines[-1], flush=True)
    lines.append(f"\nload average after {os.getloadavg()[0]:.1f}")
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
