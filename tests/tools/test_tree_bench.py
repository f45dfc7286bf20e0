"""scripts/tree_bench.py: --quick runs every code path; its rows agree with the library; bad input stops it."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from minispec import roofline
from minispec.roofline import TreeShape

ROOT = Path(__file__).parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "MPLBACKEND": "Agg"}


def bench(*args, timeout=600):
    return subprocess.run([sys.executable, "scripts/tree_bench.py", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env=ENV)


@pytest.mark.slow
def test_quick_run_writes_rows_that_agree_with_the_library(tmp_path):
    run = bench("--quick", "--out", str(tmp_path))
    assert run.returncode == 0, run.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "trees.jsonl").read_text().splitlines()]
    assert [r["row"] for r in rows[:2]] == ["run", "profile"] and rows[0]["quick"]
    profile = rows[1]["profile"]
    assert abs(sum(rows[1]["raw"]) - 1) < 1e-6 and all(a >= b for a, b in zip(profile, profile[1:]))
    points = [r for r in rows if r["row"] == "point"]
    assert {(p["batch"], p["kind"], p["budget"]) for p in points} == {
        (b, k, n) for b in (1, 4) for k, n in [("static", 1), ("chain", 1), ("static", 4), ("chain", 4),
                                               ("dynamic", 4), ("static", 16), ("dynamic", 16)]}
    for p in points:
        tree = TreeShape.from_paths(p["best_tree_paths"])  # run as TreeDraft(paths=...); a dynamic tree's model
        assert set(tree.paths) == set(roofline.best_tree(p["budget"], profile=profile).paths)
        assert p["modelled_tokens_per_step"] == pytest.approx(roofline.tree_expected_tokens(tree, profile=profile))
        assert p["same_tokens_as_plain"] and p["nodes_per_step"] == p["budget"] and p["speedup"] > 0
        assert sum(p["accepted_per_rank"]) == sum(p["accepted_per_position"])  # every accepted node counted once
    for b in (1, 4):  # a chain drafted by the chain loop and by TreeDraft accepts the same tokens
        same = {p["kind"]: p["tokens_per_step"] for p in points if p["batch"] == b and p["budget"] == 4}
        assert same["chain"] == same["static"]
    fallback = next(r for r in rows if r["row"] == "fallback")
    assert fallback["grid"] == [1, 4] and [b["batch"] for b in fallback["batches"]] == [1, 4]
    for ref in (r for r in rows if r["row"] == "reference"):
        budgets = [t["budget"] for t in ref["table"]]
        assert budgets == sorted(budgets, reverse=True) and budgets[0] > 64  # a big tree at batch 1, shrinking
        assert ref["chain_from_batch"] < ref["off_from_batch"]
    text = (tmp_path / "trees.txt").read_text()
    assert "Falls back to a chain" in text and "H100 SXM, 8B reference" in text and "H200, 8B reference" in text
    assert (tmp_path / "trees.png").stat().st_size > 10_000
    (tmp_path / "trees.txt").unlink()
    assert bench("--replot", "--out", str(tmp_path), timeout=120).returncode == 0  # redrawn from the JSONL alone
    assert (tmp_path / "trees.txt").read_text() == text


@pytest.mark.parametrize("args, message", [(["--rounds", "0"], "--rounds must be >= 1"),
                                           (["--out", "README.md"], "is a file"),
                                           (["--replot", "--out", "lessons"], "no lessons/trees.jsonl")])
def test_bad_input_stops_before_any_work(args, message):
    run = bench(*args, timeout=60)
    assert run.returncode != 0 and message in run.stderr
