"""Write the embedded models' model card: ``minispec/assets/evaluation.json`` and ``minispec/assets/README.md``.

    PYTHONPATH=. python scripts/write_model_card.py

Every figure is recomputed from the shipped checkpoints and samples by
:func:`minispec.tools.train.evaluate_embedded`; ``tests/model/test_embedded.py`` checks the card against it.
"""

import json

from minispec.model.load import ASSETS
from minispec.tools.train import PRESETS, evaluate_embedded


def write_model_card() -> dict:
    """Evaluate the shipped models and write ``assets/evaluation.json`` and ``assets/README.md``."""
    ev = evaluate_embedded()
    (ASSETS / "evaluation.json").write_text(json.dumps(ev, indent=2) + "\n")
    runs = {n: json.loads((ASSETS / n / "training.json").read_text()) for n in PRESETS}
    shape = lambda c: (f"{c.num_hidden_layers} layer{'s' * (c.num_hidden_layers > 1)}, hidden {c.hidden_size}, "  # noqa: E731
                       f"{c.num_attention_heads} heads "
                       f"({c.num_key_value_heads} KV), head dim {c.head_dim}, MLP {c.intermediate_size}")
    rows = "\n".join(
        f"| `{n}` | {PRESETS[n].corpus} | {shape(PRESETS[n].model)} | {ev['parameters'][n]:,} | {r['steps']} x "
        f"{PRESETS[n].batch_size} x {PRESETS[n].seq_len} bytes | {r['seconds'] / 60:.0f} min "
        f"({r['threads']} thread{'s' * (r['threads'] > 1)}) | "
        f"{ev['heldout_loss'][n]['code']:.3f} | {ev['heldout_loss'][n]['prose']:.3f} |" for n, r in runs.items())
    cols = ["model", "corpus", "shape", "parameters", "training (steps x batch x length)", "time on 2 CPU cores",
            "held-out code loss", "held-out prose loss"]
    header = "| " + " | ".join(cols) + " |\n" + "| --- " * len(cols) + "|"
    acc = "\n".join(f"| `{d}` | {k} | {v['greedy_match']:.3f} | {v['overlap']:.3f} |"
                    for d, by in ev["acceptance"].items() for k, v in by.items())
    card = f"""# Embedded models: model card

Three byte-level Llama models (vocabulary: the 256 byte values, no special tokens) that ship with
minispec so that the demo, the tests and the lessons run offline. They are written in Hugging Face
format (config.json + model.safetensors, `LlamaForCausalLM`), so transformers loads them too.
Every figure below is computed by `scripts/write_model_card.py` from the shipped files;
`tests/model/test_embedded.py` recomputes it.

{header}
{rows}

Losses are nats per byte on the shipped held-out samples `code_heldout.txt` (24 KiB: 1.5 KiB of whole
lines from the middle of each of the 16 held-out standard-library modules) and `prose_heldout.txt`
(the first 24 KiB of Revelation). Tied embeddings, RMSNorm eps 1e-6, rope theta 10,000, 512 positions.
Training times are wall-clock on a shared 2-core machine that was doing other work at the same time;
on an idle one the target takes about 1.8 s a step (one hour).

## Acceptance against `tiny-code-target` (teacher-forced on the held-out samples)

| draft | text | greedy match (temperature 0) | mean sum_v min(p, q) (temperature 1) |
| --- | --- | --- | --- |
{acc}

Teacher forcing feeds both models the true text at every position: greedy match is the share of
positions where their argmax agree, the second column the probability that speculative sampling
accepts a draft token there. Greedy continuations of models this small fall into loops, which inflates
acceptance measured on their own output; these figures are the honest ones.

## Corpora and licences

- **Code**: the top-level `*.py` modules of CPython 3.11.7's standard library (found through
  `sysconfig.get_paths()["stdlib"]`), Python Software Foundation License. Modules whose file name has
  CRC-32 = 0 mod 10 are held out (16 of 168). The bytes differ between Python versions, so retraining
  reproduces these runs exactly only on Python 3.11.
- **Prose**: the King James Bible (public domain), from Debian's `bible-kjv` package:
  `apt-get install bible-kjv && bible -f "Gen1:1-Rev22:21" > kjv.txt`; verse references stripped,
  the book of Revelation held out.

## Training

AdamW (betas 0.9, 0.95, weight decay 0.1 on matrices), peak learning rate 3e-3 after 100 warm-up
steps, cosine decay to 10 %, gradient clipping at 1.0, seed 0, random windows of the training bytes.
Reproduce with `minispec train <name> --out DIR [--prose-file kjv.txt]`; each `training.json` records
the held-out loss every 100 steps, and `--stop-after N` retraces the first N steps of the same run.

The EAGLE heads that ship beside these models (`tiny-code-eagle`, `smollm2-135m-eagle`) have a card of
their own: [EAGLE.md](EAGLE.md).
"""
    (ASSETS / "README.md").write_text(card)
    return ev


if __name__ == "__main__":
    write_model_card()
