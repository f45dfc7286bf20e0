"""``minispec train``: an embedded model or an EAGLE / EAGLE-3 head, from the command line's flags."""

from __future__ import annotations

import os
import warnings
from pathlib import Path


def from_args(args) -> None:
    """Train what ``args.name`` names: an embedded byte-level model, or an EAGLE (``eagle``) or EAGLE-3
    (``eagle3``) head for ``args.target``; print where it went."""
    from minispec.tools.train import train
    from minispec.tools.train_eagle import train_eagle

    check_out_dir(args.out)
    if args.name in ("eagle", "eagle3") and (args.target is None or args.prose_file or args.stop_after is not None):
        raise ValueError(f"minispec train {args.name} takes --target NAME [--hot-vocab N] [--minutes M] [--seed S] "
                         "[--threads T] --out DIR (not --prose-file or --stop-after)")
    if args.name == "eagle3":
        from minispec.tools.train_eagle3 import Eagle3TrainConfig, train_eagle3

        record = train_eagle3(args.target, args.out, minutes=args.minutes, threads=args.threads,
                              config=Eagle3TrainConfig(draft_vocab=args.hot_vocab, seed=args.seed))
        print(f"EAGLE-3 head for {args.target}: {record['steps']} steps in {record['seconds'] / 60:.1f} min; load it "
              f"with minispec.Eagle3Draft.from_pretrained({str(args.out)!r}, target), or in vLLM with "
              f"speculative_config={{'method': 'eagle3', 'model': {str(args.out)!r}}}")
        return
    if args.name == "eagle":
        with warnings.catch_warnings():
            # torch, under CPU autocast, on a bf16 input beside a float32 norm weight: "cannot dispatch to fused
            # implementation". A note about torch's kernel choice that a user cannot act on.
            warnings.filterwarnings("ignore", message="Mismatch dtype between input and weight", category=UserWarning)
            record = train_eagle(args.target, args.out, hot_vocab=args.hot_vocab, minutes=args.minutes,
                                 seed=args.seed, threads=args.threads)
        print(f"EAGLE head for {args.target}: {record['steps']} steps in {record['seconds'] / 60:.1f} min; "
              f"load it with minispec.EagleDraft.from_pretrained({str(args.out)!r}, target)")
        return
    if args.target is not None or args.hot_vocab is not None:
        raise ValueError("--target and --hot-vocab are for minispec train eagle")
    record = train(args.name, args.out, prose_file=args.prose_file, stop_after=args.stop_after)
    print(f"{args.name}: held-out loss {record['heldout_loss']:.4f} nats/byte after {record['steps']} steps "
          f"({record['seconds']:.0f} s); checkpoint in {args.out}")


def check_out_dir(out: str) -> None:
    """A checkpoint folder to write: not a file, and inside a folder this process may write to."""
    path = Path(out).expanduser()
    if path.exists() and not path.is_dir():
        raise ValueError(f"--out {out} is a file; name a folder to write the checkpoint in")
    parent = next(p for p in (path, *path.parents) if p.exists())
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(f"--out {out}: {parent} is not writable")
