"""Where speculation stops paying in the engine on this CPU, for a target whose verify is compute-bound here.

    PYTHONPATH=. python scripts/engine_crossover.py [--out results/cpu/engine_crossover.txt]

The embedded target is so small that per-operation overhead, not arithmetic, sets its step time, and a 5-token
verify still pays at the largest batches this engine runs (scripts/engine_load.py). Here the target is a
random-weight byte-level Llama of 1024 hidden units and 8 layers (about 100M parameters, float32), the draft two
layers of 256, and acceptance is synthetic: each draft token accepted with probability alpha = 0.8 until a row's
first rejection (minispec.tools.bench.SyntheticAcceptance; the tokens then do not follow p, the timing does).
Step times are measured through the engine (closed loop: B requests at once, the median step where all B decode).
"""

import argparse
import os

import torch

from minispec.model.config import ModelConfig
from minispec.model.llama import Model
from minispec.roofline import expected_tokens
from minispec.tools.bench import SyntheticAcceptance
from minispec.tools.serve_bench import engine_step_table

ALPHA, GAMMA, CONTEXT = 0.8, 4, 64
BATCHES = (1, 2, 4, 8, 16, 32, 64)


def byte_llama(hidden: int, layers: int, heads: int, kv_heads: int, ff: int, seed: int) -> Model:
    torch.manual_seed(seed)
    cfg = ModelConfig(vocab_size=256, hidden_size=hidden, intermediate_size=ff, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=hidden // heads,
                      max_position_embeddings=512)
    return Model(cfg).eval().requires_grad_(False)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="results/cpu/engine_crossover.txt")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    target, draft = byte_llama(1024, 8, 8, 2, 2816, 0), byte_llama(256, 2, 4, 2, 688, 1)
    text = torch.randint(0, 256, (1 << 14,), generator=torch.Generator().manual_seed(0)).tolist()
    load0 = os.getloadavg()[0]
    steps = engine_step_table(target, draft, BATCHES, (0, GAMMA), (CONTEXT,), text, rule=SyntheticAcceptance(ALPHA))
    table, E = steps.tables[0], expected_tokens(ALPHA, GAMMA)
    lines = [f"Random byte-level Llama, {target.config.num_parameters / 1e6:.0f}M parameters (hidden 1024, 8 layers), "
             f"float32, draft {draft.config.num_parameters / 1e6:.1f}M; synthetic alpha {ALPHA}, gamma {GAMMA}: E = "
             f"{E:.2f} tokens a row a step; context {CONTEXT}; {torch.get_num_threads()} thread(s); load average "
             f"{load0:.1f} before, {os.getloadavg()[0]:.1f} after.",
             "batch  plain ms  gamma-4 ms  verify/plain  speedup (E x plain / gamma-4)"]
    for B in BATCHES:
        plain, spec = table.target(B), table.target(B, GAMMA + 1)
        lines.append(f"{B:>5} {1e3 * plain:9.1f} {1e3 * spec:11.1f} {spec / plain:13.2f} {E * plain / spec:9.2f}x")
    text_out = "\n".join(lines) + "\n"
    open(args.out, "w").write(text_out)
    print(text_out)
