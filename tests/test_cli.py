"""The command line: the roofline table, the demo's structure, errors."""

import re
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


@pytest.mark.parametrize("draft", ["ngram", "layerskip:4"])
def test_generate_with_free_drafts(capsys, draft):
    assert main(["generate", "def f(x):\n    return x\n\ndef f(", "--draft", draft, "--max-new-tokens", "12"]) == 0
    captured = capsys.readouterr()
    assert captured.out.startswith("def f(x):") and "acceptance rate" in captured.err and "Draft(" in captured.err


def test_bench_checks_out_before_any_work(tmp_path, capsys, monkeypatch):
    import minispec.bench

    monkeypatch.setattr(minispec.bench, "sweep", lambda *a, **k: pytest.fail("the sweep ran"))
    assert main(["bench", "--out", str(tmp_path), "--batches", "1"]) == 2
    assert "is a directory" in capsys.readouterr().err
    monkeypatch.undo()
    out = tmp_path / "new" / "folder" / "rows.jsonl"
    assert main(["bench", "--out", str(out), "--batches", "1", "--max-new-tokens", "4", "--repeats", "1",
                 "--prompts", __file__]) == 0
    assert out.exists() and (out.parent / "summary.json").exists()


@pytest.mark.slow
def test_generate_applies_the_chat_template_of_a_real_checkpoint(capsys):
    """An instruct model asked a bare question answers its end-of-turn token at once; with the template
    (the default when the tokenizer has one) it answers, and the printed text has no special tokens."""
    from minispec.load import fetch

    try:
        fetch("smollm2")
    except ValueError as e:
        pytest.skip(f"SmolLM2-135M-Instruct is not cached and cannot be fetched: {str(e)[:80]}")
    assert main(["generate", "What is the capital of France?", "--model", "smollm2-135m-instruct",
                 "--max-new-tokens", "12", "--draft", "ngram"]) == 0
    answered = capsys.readouterr()
    assert "<|im" not in answered.out and len(answered.out.strip()) > 5
    assert main(["generate", "What is the capital of France?", "--model", "smollm2-135m-instruct",
                 "--max-new-tokens", "12", "--no-chat"]) == 0
    assert re.search(r"new tokens\s+1\n", capsys.readouterr().err)  # bare: the end-of-turn token at once
