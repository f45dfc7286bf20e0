"""Where a gamma-4 step stops paying as the batch grows, measured through the engine on this CPU.

    PYTHONPATH=. python scripts/engine_crossover.py [--out results/cpu/engine_crossover.txt]

Step times are measured through the engine (closed loop: B requests at once, the median of at least 8 steps in
which all B decode), plain against gamma 4, and the speedup is E(alpha, 4) x plain / gamma-4.

1. The embedded pair (the draft model, the EAGLE head and the EAGLE-3 head), alpha as each accepts on held-out
   code. The target is so small that per-operation overhead, not arithmetic, sets its step time.
2. A target whose verify is compute-bound here: a random-weight byte-level Llama of 1024 hidden units and 8
   layers (about 100M parameters, float32), a two-layer draft of 256, and synthetic acceptance (each draft token
   accepted with probability alpha = 0.8 until a row's first rejection: SyntheticAcceptance; the tokens then do
   not follow p, the timing does).
"""

import argparse
import os

import torch

import minispec
from minispec.engine import Engine, Request
from minispec.model.config import ModelConfig
from minispec.model.llama import Model
from minispec.model.load import sample_text
from minispec.roofline import expected_tokens
from minispec.tools.bench import SyntheticAcceptance, environment
from minispec.tools.serve_bench import engine_step_table

ALPHA, GAMMA, CONTEXT = 0.8, 4, 64
BATCHES = (1, 2, 4, 8, 16, 32, 64)  # the embedded pair; the random target also at 128 (verify past its ridge)


def byte_llama(hidden: int, layers: int, heads: int, kv_heads: int, ff: int, seed: int) -> Model:
    torch.manual_seed(seed)
    cfg = ModelConfig(vocab_size=256, hidden_size=hidden, intermediate_size=ff, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=hidden // heads,
                      max_position_embeddings=512)
    return Model(cfg).eval().requires_grad_(False)


def crossover(target, draft, text, alpha, rule=None, label="", batches=BATCHES) -> list[str]:
    steps = engine_step_table(target, draft, batches, (0, GAMMA), (CONTEXT,), text, rule=rule, min_steps=8)
    table, E = steps.tables[0], expected_tokens(alpha, GAMMA)
    lines = [f"{label}; alpha {alpha:.2f}, gamma {GAMMA}: E = {E:.2f} tokens a row a step; context {CONTEXT}",
             "batch  plain ms  gamma-4 ms  gamma-4/plain  speedup (E x plain / gamma-4)"]
    for B in batches:
        plain, spec = table.target(B), table.target(B, GAMMA + 1)
        lines.append(f"{B:>5} {1e3 * plain:9.1f} {1e3 * spec:11.1f} {spec / plain:14.2f} {E * plain / spec:9.2f}x")
    return lines


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="results/cpu/engine_crossover.txt")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    load0, lines = os.getloadavg()[0], []
    target, _ = minispec.load("tiny-code-target")
    code = list(sample_text("code"))
    for name, draft in (("draft model", minispec.load("tiny-code-draft")[0]),
                        ("EAGLE head", minispec.EagleDraft.from_pretrained("tiny-code-eagle", target)),
                        ("EAGLE-3 head", minispec.Eagle3Draft.from_pretrained("tiny-code-eagle3", target))):
        probe = Engine(target, draft, gamma=GAMMA)  # alpha as this pair accepts on held-out code
        probe.run([Request(code[i * 997: i * 997 + CONTEXT], 64) for i in range(8)])
        lines += crossover(target, draft, code, probe.stats.alpha_estimate, label=f"tiny-code-target, {name}") + [""]
    target, draft = byte_llama(1024, 8, 8, 2, 2816, 0), byte_llama(256, 2, 4, 2, 688, 1)
    noise = torch.randint(0, 256, (1 << 14,), generator=torch.Generator().manual_seed(0)).tolist()
    lines += crossover(target, draft, noise, ALPHA, SyntheticAcceptance(ALPHA),
                       f"random byte-level Llama, {target.config.num_parameters / 1e6:.0f}M parameters (hidden "
                       f"1024, 8 layers), draft {draft.config.num_parameters / 1e6:.1f}M, synthetic acceptance",
                       (1, 4, 16, 32, 64, 128))
    lines.append(f"\nfloat32, {torch.get_num_threads()} thread(s); load average {load0:.1f} before, "
                 f"{os.getloadavg()[0]:.1f} after; git {environment(target.device, target.dtype)['git_revision']}")
    text_out = "\n".join(lines) + "\n"
    open(args.out, "w").write(text_out)
    print(text_out)
