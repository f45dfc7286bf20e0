"""The command line: the roofline table, the demo's structure, errors."""

import subprocess
import sys

import pytest

from minispec.cli import main


def test_roofline_prints_the_reference_table(capsys):
    assert main(["roofline"]) == 0
    out = capsys.readouterr().out
    for figure in ("2.80x", "2.62x", "1.42x", "0.74x", "batch 59.0", "batch 186.7"):
        assert figure in out


def test_roofline_flags_and_plot(capsys, tmp_path):
    assert main(["roofline", "--hardware", "h200", "--alpha", "0.3", "--batches", "1", "--plot",
                 str(tmp_path / "s.png")]) == 0
    assert "H200" in capsys.readouterr().out and (tmp_path / "s.png").stat().st_size > 0


def test_demo_runs_end_to_end(capsys):
    assert main(["demo", "--max-new-tokens", "24", "--repeats", "1", "--batches", "1,2"]) == 0
    out = capsys.readouterr().out
    for needle in ("output tokens/s", "TPOT p99 ms", "acceptance rate", "per-position acceptance",
                   "time in verify ms", "measured speedup", "Leviathan", "generated text", "batch sweep"):
        assert needle in out


def test_generate_speculatively(capsys):
    assert main(["generate", "def f(x):", "--draft", "tiny-code-draft", "--max-new-tokens", "8"]) == 0
    assert capsys.readouterr().out.startswith("def f(x):")


def test_bad_input_exits_with_a_message(capsys):
    assert main(["generate", "x", "--max-new-tokens", "100000"]) == 2
    assert "maximum length" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["-m", "minispec", "--help"]])
def test_python_dash_m(argv):
    out = subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "demo" in out.stdout
