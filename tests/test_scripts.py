"""The prepared GPU script runs its code paths on a CPU with --small."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent


@pytest.mark.slow
def test_gpu_bench_small_runs_on_the_cpu(tmp_path):
    run = subprocess.run([sys.executable, "scripts/gpu_bench.py", "--out", str(tmp_path), "--small"], cwd=ROOT,
                         capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert run.returncode == 0, run.stderr[-2000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["target"] == "tiny" and set(summary["measured_speedup_by_batch"]) == {"1", "2", "4"}
    rows = [json.loads(line) for line in (tmp_path / "sweep.jsonl").read_text().splitlines()]
    assert [r["batch_size"] for r in rows] == [1, 2, 4] and all(r["synthetic"] for r in rows)
    assert (tmp_path / "speedup_vs_batch.png").stat().st_size > 0


SOLUTIONS = sorted((ROOT / "lessons" / "solutions").glob("*.py"))


@pytest.mark.slow
@pytest.mark.parametrize("path", SOLUTIONS, ids=[p.stem for p in SOLUTIONS])
def test_lesson_solution_runs(path):
    """Every exercise solution runs from the repository root and its asserts hold."""
    run = subprocess.run([sys.executable, str(path.relative_to(ROOT))], cwd=ROOT, capture_output=True, text=True,
                         timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT), "MPLBACKEND": "Agg"})
    assert run.returncode == 0, (run.stdout[-1500:], run.stderr[-3000:])


def test_every_lesson_has_a_solution_file():
    lessons = {p.stem for p in (ROOT / "lessons").glob("*.ipynb")}
    assert lessons and lessons == {p.stem for p in SOLUTIONS}
