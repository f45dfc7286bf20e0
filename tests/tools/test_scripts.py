"""The GPU check's code paths, run on a CPU: gpu_bench.py --small, the lesson runner, gpu_bench.sh's lanes; the
mutation script's extra tests."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]


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
    compiled = json.loads((tmp_path / "compile.json").read_text())  # a budget of 2 shapes: 2 compiled, 1 refused
    assert compiled["graphs"] == 2 and compiled["third_shape"].startswith("refused") and summary["compile"] == compiled


def _notebook(path, *cells):
    nbformat = pytest.importorskip("nbformat")
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(c) for c in cells]
    nbformat.write(nb, path)
    return path


@pytest.mark.slow
def test_the_lesson_runner_counts_compiles_and_keeps_what_a_failed_or_cut_lesson_had(tmp_path):
    """Three notebooks: one compiles two shapes (Dynamo's eager backend), one fails, one outruns its time."""
    pytest.importorskip("nbclient")
    compiles = _notebook(tmp_path / "compiles.ipynb",
                         "from minispec.model.random import random_model\n"
                         "from minispec.tools.steps import measure_step_time",
                         "m = random_model('tiny-draft').compile(mode=None, backend='eager', recompile_limit=2)\n"
                         "for T in (1, 2):\n    measure_step_time(m, 1, T, context=8, repeats=1)")
    fails = _notebook(tmp_path / "fails.ipynb", "print('before')", "assert 1 == 2, 'wrong'", "print('never')")
    slow = _notebook(tmp_path / "slow.ipynb", "print('started')", "import time\ntime.sleep(120)")
    out = tmp_path / "out"
    run = subprocess.run([sys.executable, "scripts/gpu_bench.py", "--out", str(out), "--lesson-timeout", "20",
                          "--lessons", str(compiles), str(fails), str(slow), str(tmp_path / "missing.ipynb")],
                         cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "TORCH_LOGS": "recompiles"})
    assert run.returncode == 0, run.stderr[-2000:]
    rows = {r["lesson"]: r for r in map(json.loads, (out / "lessons.jsonl").read_text().splitlines())}
    assert rows["compiles"]["status"] == "ok" and rows["compiles"]["graphs_compiled"] == 2
    assert rows["compiles"]["recompiles_logged"] == 1 and not rows["compiles"]["recompile_limit_hit"]
    assert rows["fails"]["status"] == "failed" and "wrong" in rows["fails"]["error"]
    assert rows["slow"]["status"] == "timeout" and rows["slow"]["seconds"] < 60
    assert rows["missing"]["status"] == "failed" and "No such file" in rows["missing"]["error"]
    saved = {name: (out / f"{name}.ipynb").read_text() for name in ("fails", "slow")}
    assert "before" in saved["fails"] and "never" not in json.dumps(json.loads(saved["fails"])["cells"][2]["outputs"])
    assert "started" in saved["slow"]  # the outputs a cut lesson had are kept


def test_gpu_bench_sh_runs_every_lesson_once():
    """A lesson left out of the lanes would never run on the GPU; one in two lanes would run twice at once."""
    script = (ROOT / "scripts" / "gpu_bench.sh").read_text()
    assert subprocess.run(["bash", "-n", str(ROOT / "scripts" / "gpu_bench.sh")]).returncode == 0
    assert "TORCH_LOGS=recompiles" in script
    laned = re.findall(r"lessons/(\d\d)_\*\.ipynb", "".join(re.findall(r"^  lane [a-z] .*$", script, re.M)))
    assert sorted(laned) == sorted(p.name[:2] for p in (ROOT / "lessons").glob("*.ipynb"))


SOLUTIONS = sorted((ROOT / "lessons" / "solutions").glob("*.py"))


@pytest.mark.slow
@pytest.mark.parametrize("path", SOLUTIONS, ids=[p.stem for p in SOLUTIONS])
def test_lesson_solution_runs(path):
    """Every exercise solution runs from the repository root and its asserts hold. The timeout catches a hang, not a
    slow machine: lesson 12's solution (it trains several small heads) took 618-729 s on a 2-core AVX2 machine while
    its trainers autocast to bfloat16, which that CPU emulates; 138 s once they kept float32 there (2026-12-04).
    Beside another worker, one OpenMP thread."""
    one = {"OMP_NUM_THREADS": "1"} if os.environ.get("PYTEST_XDIST_WORKER") else {}
    run = subprocess.run([sys.executable, str(path.relative_to(ROOT))], cwd=ROOT, capture_output=True, text=True,
                         timeout=900, env={**os.environ, "PYTHONPATH": str(ROOT), "MPLBACKEND": "Agg", **one})
    assert run.returncode == 0, (run.stdout[-1500:], run.stderr[-3000:])


def test_every_lesson_has_a_solution_file():
    lessons = {p.stem for p in (ROOT / "lessons").glob("*.ipynb")}
    assert lessons and lessons == {p.stem for p in SOLUTIONS}


def test_mutations_extra_tests_name_tests_that_exist_for_configured_modules():
    """scripts/mutation_tests.txt adds tests to mutmut's map: a renamed test or module must fail here, not drop out
    of the next run silently (pytest would run nothing for a node id that names no test)."""
    import importlib.util

    import tomllib

    spec = importlib.util.spec_from_file_location("mutation", ROOT / "scripts" / "mutation.py")
    mutation = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mutation)
    configured = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mutmut"]["only_mutate"]
    extra = mutation.extra_tests()
    assert extra and set(extra) <= set(configured), set(extra) - set(configured)
    for tests in extra.values():
        for node in tests:
            path, name = node.split("::")
            assert f"def {name}(" in (ROOT / path).read_text(), node


def test_the_eagle3_benchs_replay_starts_each_draft_after_the_last_steps_bonus_token():
    """scripts/eagle3_bench.py replays greedy drafting from teacher-forced predictions (docs/EAGLE3.md compares it
    with the measured acceptance): slot j predicts x_{j+2}; a draft from root t reads slots t - 1, t, ...; after n
    accepted tokens and the bonus token the next root is t + n + 1."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        from eagle3_bench import replay
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    import torch

    best = torch.arange(8)[None]  # (1, 8) the target's argmax at each index
    right = [best[:, 1:].clone(), best[:, 1:].clone()]  # (1, 7) each: every prediction the target's
    assert replay(right, best, 1, 6) == [1.0, 1.0]  # roots 1 and 4: both drafts accept 2
    wrong = [right[0].clone(), right[1]]
    wrong[0][0, 3] = -1  # position 1 from root 4 (slot 3) misses
    assert replay(wrong, best, 1, 6) == [2 / 3, 2 / 3]  # roots 1 (2 accepted), 4 (none: its bonus is 5), 5 (2)
    wrong[0][0, 3], wrong[1][0, 1] = 4, -1  # now position 2 from root 1 (slot 1) misses
    assert replay(wrong, best, 1, 6) == [1.0, 0.5]  # roots 1 (1 accepted) and 3 (2); index 6, the last, is reached
