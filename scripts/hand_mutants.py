"""Wrong versions of the draft side made by hand (issue 23's five, and variants): each must fail a test.

Each wrong version keeps the output exact and only lowers acceptance (or reuses random numbers), so no
exactness test can see it. For each one this script copies the package to a temporary folder, applies
the change, runs the given tests in the copy (so that the copy is the package they import) and reports the tests
that fail. A wrong version that fails no test is a hole in the suite; the script exits 1 then.

    python scripts/hand_mutants.py                 # all of them (a few minutes on 2 cores)
    python scripts/hand_mutants.py --only compact  # the ones whose name contains "compact"
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# name: (file, the exact text replaced, its wrong version, the tests that must catch it)
MUTANTS = {
    "draft cache not compacted after a tree step": (
        "minispec/drafts/model.py", "        self.cache.compact(root, slots)", "        pass",
        ["tests/drafts/test_tokens_per_step.py"]),
    "static tree: the draft's mask plain causal (nodes see their cousins)": (
        "minispec/drafts/tree.py", "mask = TreeMask(self.root + 1, positions[:, :hi], anc[:, lo:hi, :hi])",
        "mask = TreeMask(self.root + 1, positions[:, :hi], torch.ones(hi, hi, dtype=torch.bool, device=dev)"
        ".tril()[lo:hi].expand(B, -1, -1))",
        ["tests/drafts/test_tokens_per_step.py"]),
    "dynamic tree: the draft's mask plain causal (nodes see their cousins)": (
        "minispec/drafts/tree.py", "TreeMask(self.root + 1, positions, vis[:, f:])",
        "TreeMask(self.root + 1, positions, torch.ones(f + k, f + k, dtype=torch.bool, device=dev)"
        ".tril()[f:].expand(B, -1, -1))",
        ["tests/drafts/test_tokens_per_step.py"]),
    "EAGLE hot vocabulary: the draft -> target id map shifted by one": (
        "minispec/drafts/eagle.py", "full.index_copy_(-1, self.draft.hot, logits)",
        "full.index_copy_(-1, self.draft.hot.roll(1), logits)",
        ["tests/drafts/test_tokens_per_step.py"]),
    "EAGLE tree: draft nodes' positions shifted by one": (
        "minispec/drafts/eagle.py", "tree = TreeMask(tree.base - 1, tree.positions - 1, tree.visible)",
        "tree = TreeMask(tree.base - 1, tree.positions, tree.visible)",
        ["tests/drafts/test_tokens_per_step.py"]),
    "EAGLE tree: positions below depth 1 shifted by one": (
        "minispec/drafts/eagle.py", "tree = TreeMask(tree.base - 1, tree.positions - 1, tree.visible)",
        "tree = TreeMask(tree.base - 1, tree.positions - 1 + (tree.positions > tree.base[:, None]), tree.visible)",
        ["tests/drafts/test_tokens_per_step.py"]),
    "Philox counter: the position folded into the index word (numbers reused across steps)": (
        "minispec/decoding/sampling.py",
        "counter = torch.stack([j.expand(len(keys), n), position[:, None].expand(-1, n),",
        "counter = torch.stack([j + position[:, None], torch.zeros_like(position[:, None]).expand(-1, n),",
        ["tests/decoding/test_random_numbers_once.py"]),
    "Philox counter: the stream dropped (the accept test reuses the draft's numbers)": (
        "minispec/decoding/sampling.py", "torch.full_like(position[:, None], stream).expand(-1, n),",
        "torch.zeros_like(position[:, None]).expand(-1, n),",
        ["tests/decoding/test_random_numbers_once.py"]),
}


def run(name: str, file: str, old: str, new: str, tests: list[str]) -> tuple[list[str], float]:
    """The tests that fail with the wrong version; and the seconds it took."""
    with tempfile.TemporaryDirectory() as tmp:
        for part in ("minispec", "tests"):  # the tests run in the copy, so the copy is the package they import
            shutil.copytree(ROOT / part, Path(tmp) / part, ignore=shutil.ignore_patterns("__pycache__"))
        shutil.copy(ROOT / "pyproject.toml", tmp)
        path = Path(tmp) / file
        text = path.read_text()
        if text.count(old) != 1:
            raise SystemExit(f"{name}: the text to replace occurs {text.count(old)} times in {file}; update the script")
        path.write_text(text.replace(old, new))
        env = dict(os.environ, MINISPEC_EXPECT_PACKAGE=str(Path(tmp) / "minispec"))
        start = time.perf_counter()
        out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2", *tests],
                             cwd=tmp, env=env, capture_output=True, text=True)
        failed = sorted(set(re.findall(r"^FAILED (.+?)(?: - .*)?$", out.stdout, re.M)))
        if out.returncode not in (0, 1, 2) or (out.returncode in (1, 2) and not failed):  # 2: stopped by -x
            raise SystemExit(f"{name}: pytest did not run cleanly (exit {out.returncode}):\n"
                             f"{out.stdout[-3000:]}{out.stderr[-3000:]}")
        return failed, time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="", help="run the wrong versions whose name contains this")
    ap.add_argument("--tests", help="pytest arguments to run instead of each one's own tests, e.g. "
                    "--tests='tests/drafts -m \"not slow\" -x'")
    args = ap.parse_args()
    holes = 0
    for name, (file, old, new, tests) in MUTANTS.items():
        if args.only not in name:
            continue
        failed, seconds = run(name, file, old, new, shlex.split(args.tests) if args.tests else tests)
        holes += not failed
        print(f"{'caught' if failed else 'SURVIVED'}: {name} ({file}; {seconds:.0f} s)")
        for test in failed:
            print(f"    fails {test}")
    sys.exit(1 if holes else 0)


if __name__ == "__main__":
    main()
