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
    import minispec.tools.bench

    monkeypatch.setattr(minispec.tools.bench, "sweep", lambda *a, **k: pytest.fail("the sweep ran"))
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
    from minispec.model.load import fetch

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


def test_roofline_quantizes_with_the_library(capsys):
    """--weight-bits goes through roofline.quantized: the table's speedup is the library's W4 one, not BF16's."""
    from minispec.roofline import LLAMA_8B, quantized, speculative_speedup

    assert main(["roofline", "--weight-bits", "4", "--batches", "64"]) == 0
    out = capsys.readouterr().out
    w4, bf16 = (f"{speculative_speedup(64, model=m):.2f}x" for m in (quantized(LLAMA_8B, 4), LLAMA_8B))
    assert "Llama-3-8B W4 (8B params x 0.5 B)" in out and w4 in out and w4 != bf16


def test_device_defaults_agree_across_commands(capsys):
    """demo, generate and bench leave --device unset, say the same rule in --help, and one loader applies it."""
    from minispec.cli import build_parser

    parser = build_parser()
    for argv in (["demo"], ["generate", "x"], ["bench"]):
        assert parser.parse_args(argv).device is None
        with pytest.raises(SystemExit):
            parser.parse_args([argv[0], "--help"])
        assert "(default: cuda when torch sees a CUDA device, else cpu)" in " ".join(capsys.readouterr().out.split())


def test_device_default_is_cuda_when_available(monkeypatch):
    import torch

    from minispec.tools.pair import load_pair

    assert load_pair("shape:tiny-draft")[0].device.type == ("cuda" if torch.cuda.is_available() else "cpu")
    if not torch.cuda.is_available():  # pretend there is one: the loader then builds on "cuda", which fails here
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        with pytest.raises((AssertionError, RuntimeError), match="CUDA"):
            load_pair("shape:tiny-draft")


def test_a_device_that_is_not_there_is_named(capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert main(["generate", "x", "--device", "cuda"]) == 2
    assert "torch sees no CUDA device" in capsys.readouterr().err
    assert main(["generate", "x", "--device", "tpu9"]) == 2
    assert "unknown device 'tpu9'" in capsys.readouterr().err


def test_bench_flags_are_checked(capsys):
    assert main(["bench", "--vllm", "--plot", "x.png"]) == 2
    assert "--plot and --hf-baseline need the sweep" in capsys.readouterr().err
    assert main(["bench", "--batches", "1,two"]) == 2
    assert "--batches takes comma-separated integers, got '1,two'" in capsys.readouterr().err
    assert main(["bench", "--accept-rate", "1.5"]) == 2
    assert "synthetic acceptance rate must be in [0, 1]" in capsys.readouterr().err


def test_course_build_calls_the_site_builder(tmp_path, monkeypatch, capsys):
    """``minispec course build --out DIR`` hands DIR to minispec.course.site.build (faked here: the real one executes
    every lesson) and says where the pages are; a lesson that fails makes it exit 1 with the builder's words."""
    import types
    from pathlib import Path

    calls = []

    class LessonError(RuntimeError):
        pass

    def build(out_dir="site", lessons_dir=None, timeout=300, execute=True):
        calls.append(out_dir)
        if out_dir == "broken":
            raise LessonError("02_speculative_sampling_is_exact.ipynb, cell 16: NotImplementedError")
        return [Path(out_dir) / "index.html", Path(out_dir) / "00_quickstart.html"]

    site = types.ModuleType("minispec.course.site")
    site.build, site.LessonError = build, LessonError
    monkeypatch.setitem(sys.modules, "minispec.course.site", site)
    assert main(["course", "build", "--out", str(tmp_path)]) == 0
    assert calls == [str(tmp_path)]
    assert capsys.readouterr().out == f"2 pages in {tmp_path}; open {tmp_path / 'index.html'}\n"
    assert main(["course", "build"]) == 0 and calls[-1] == "site"
    assert main(["course", "build", "--out", "broken"]) == 1
    assert "cell 16: NotImplementedError" in capsys.readouterr().err


def test_bench_vllm_prints_the_table_vllm_reads(tmp_path, capsys):
    """--vllm: one JSON line with vLLM's keys, gamma within 0..largest --gammas for every listed batch, and
    the same table in vllm_speculative_config.json beside --out."""
    import json

    assert main(["bench", "--vllm", "--batches", "1,2", "--gammas", "2", "--repeats", "1", "--accept-rate", "0.7",
                 "--out", str(tmp_path / "rows.jsonl")]) == 0
    captured = capsys.readouterr()
    table = json.loads(captured.out)
    assert set(table) == {"num_speculative_tokens", "num_speculative_tokens_per_batch_size"}
    assert all(0 <= g <= 2 for _, _, g in table["num_speculative_tokens_per_batch_size"])
    assert json.loads((tmp_path / "vllm_speculative_config.json").read_text()) == table
    assert "alpha 0.700 (given)" in captured.err


def test_train_eagle_calls_the_trainer_with_its_flags(tmp_path, monkeypatch, capsys):
    import minispec.tools.train_eagle

    calls = []
    monkeypatch.setattr(minispec.tools.train_eagle, "train_eagle", lambda *a, **k: calls.append((a, k)) or
                        {"steps": 3, "seconds": 60.0})
    assert main(["train", "eagle", "--target", "tiny-code-target", "--hot-vocab", "64", "--minutes", "2",
                 "--out", str(tmp_path / "head"), "--threads", "1"]) == 0
    assert calls == [(("tiny-code-target", str(tmp_path / "head")),
                      dict(hot_vocab=64, minutes=2.0, seed=0, threads=1))]
    assert "EagleDraft.from_pretrained" in capsys.readouterr().out
    assert main(["train", "eagle", "--out", str(tmp_path / "x")]) == 2  # no --target: named, nothing trained
    assert "--target" in capsys.readouterr().err and len(calls) == 1


# --- threads, drafts, marks and errors before work (issue 26) -----------------------------------

def test_decoding_commands_take_threads_and_warn_under_load(monkeypatch, capsys):
    """--threads sets torch's threads for the command (default: half the logical CPUs, said in --help) and puts
    them back; a load average above the cores gives one warning line, a quiet machine none."""
    import os

    import torch

    import minispec.tools.demo
    from minispec.cli import build_parser, default_threads

    parser = build_parser()
    for argv in (["demo"], ["generate", "x"], ["bench"]):
        assert parser.parse_args([*argv, "--threads", "3"]).threads == 3
        with pytest.raises(SystemExit):
            parser.parse_args([*argv, "--threads", "0"])
        with pytest.raises(SystemExit):
            parser.parse_args([argv[0], "--help"])
        helped = " ".join(capsys.readouterr().out.split())
        assert f"half the logical CPUs, at least 1; {default_threads()} here" in helped
    assert default_threads() == max(1, (os.cpu_count() or 1) // 2)

    seen = []
    monkeypatch.setattr(minispec.tools.demo, "complete",
                        lambda *a, **k: seen.append(torch.get_num_threads()) or _FakeCompletion())
    before = torch.get_num_threads()
    for argv, load in ((["--threads", "3"], 99.0), ([], 0.0)):
        monkeypatch.setattr(os, "getloadavg", lambda load=load: (load, load, load))
        assert main(["generate", "x", *argv]) == 0
        err = capsys.readouterr().err
        assert err.count("warning: load average") == (load > 0)
        if load:
            assert f"load average 99.0 on {os.cpu_count()} cores" in err and len(err.split("warning")) == 2
    assert seen == [3, default_threads()] and torch.get_num_threads() == before


class _FakeCompletion:
    hint = None  # no note about the text

    def __str__(self):
        return "text"

    def summary(self):
        return "new tokens  1"


@pytest.fixture
def nothing_loads(monkeypatch):
    """Any model load fails the test: the errors must come first."""
    import minispec.tools.pair

    monkeypatch.setattr(minispec.tools.pair, "load", lambda *a, **k: pytest.fail("a model was loaded"))
    monkeypatch.setattr(minispec.tools.pair, "random_model", lambda *a, **k: pytest.fail("a model was built"))


@pytest.mark.parametrize("argv, message", [
    (["--draft", "nosuchdraft"], "'nosuchdraft' is neither a directory"),
    (["--draft", "smollm2-135m-eagle"], "EAGLE head smollm2-135m-eagle reads a target with vocabulary 49152"),
    (["--draft", "layerskip:9"], "from 1 to the target's 8, got 'layerskip:9'"),
    (["--draft", "layerskip:x"], "layerskip:N takes a number of layers"),
    (["--draft", "tiny-code-draft", "--hot-vocab", "8"], "a hot vocabulary is an EAGLE head's"),
    (["--draft", "tiny-code-eagle", "--hot-vocab", "300"], "from 1 to the vocabulary's 256, got 300"),
    (["--draft", "tiny-code-draft", "--tree", "branching=64,64,64"], "266,304 nodes per row; a tree may have at most"),
    (["--draft", "tiny-code-draft", "--tree", "budget=16"], "depth must be an integer >= 1, got None"),
    (["--draft", "tiny-code-draft", "--tree", "width=3"], "--tree takes branching="),
    (["--draft", "ngram", "--tree", "budget=16,depth=5"], "not from ngram prompt lookup"),
    (["--tree", "budget=16,depth=5"], "a tree grows from a draft"),
    (["--show-accepted"], "--show-accepted marks the draft's tokens"),
    (["--model", "tiny-code-eagle"], "tiny-code-eagle is an EAGLE head, not a target"),
    (["--max-new-tokens", "100000"], "leaves no room for a prompt within tiny-code-target's maximum length"),
    (["--temperature", "-1"], "temperature must be a number >= 0"),
    (["--top-p", "1.5"], "top_p must be in (0, 1]"),
])
def test_generate_checks_every_name_before_any_load(nothing_loads, capsys, argv, message):
    assert main(["generate", "def f(x):", *argv]) == 2
    assert message in capsys.readouterr().err


def test_demo_and_bench_check_the_draft_before_any_load(nothing_loads, capsys):
    for command in ("demo", "bench"):
        assert main([command, "--draft", "tiny-code-eagle-typo", "--batches", "1"]) == 2
        assert "'tiny-code-eagle-typo' is neither" in capsys.readouterr().err


def test_generate_marks_the_accepted_draft_tokens_of_an_eagle_tree():
    """An EAGLE head by name and by folder, inside a static tree: the marks sit on the plain text (removing them
    gives it back) and cover exactly the accepted draft tokens (one byte per token here); the summary gives the
    tree's depth and nodes, not a gamma."""
    from minispec.model.load import ASSETS
    from minispec.tools.demo import complete

    prompt = "def _current(self):\n"
    plain = complete(prompt, max_new_tokens=40)
    for head in ("tiny-code-eagle", str(ASSETS / "tiny-code-eagle")):
        done = complete(prompt, draft=head, tree="branching=3,2,1", max_new_tokens=40, mark="brackets")
        assert done.text == plain.text and str(done) == done.marked
        assert re.sub("[«»]", "", done.marked) == plain.text
        inside = re.findall("«(.*?)»", done.marked, re.S)
        assert sum(map(len, inside)) == done.stats.accepted_tokens > 10
        assert "tree  depth 3, 15 nodes per step" in done.summary() and "gamma" not in done.summary()
        assert "node acceptance rate" in done.summary()
    coloured = complete(prompt, draft="tiny-code-eagle", max_new_tokens=40, mark="color").marked
    assert "\x1b[32m" in coloured and re.sub(r"\x1b\[(32|0)m", "", coloured) == plain.text


def test_generate_prints_the_stats_below_the_text():
    """stdout is flushed before the stats go to stderr: merged into one stream, the text comes first and the stats
    start on a line of their own (a pipe buffers stdout, so without the flush they came first)."""
    import os

    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # a user's default: a pipe is buffered
    out = subprocess.run([sys.executable, "-m", "minispec", "generate", "def _current(self):\n", "--max-new-tokens",
                          "16", "--threads", "1"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         timeout=120, env=env).stdout
    assert out.startswith("def _current(self):\n") and out.index("new tokens") > out.index("if self")
    assert re.search(r"^\s+new tokens  16$", out, re.M)


def test_train_checks_out_and_the_target_before_training(tmp_path, monkeypatch, capsys):
    """--out naming a file, and a hot vocabulary larger than the target's, fail before anything loads or trains
    (before: a raw FileExistsError after the whole training run)."""
    import minispec.tools.train_eagle

    monkeypatch.setattr(minispec.tools.train_eagle, "load", lambda *a, **k: pytest.fail("the target was loaded"))
    monkeypatch.setattr(minispec.tools.train_eagle, "eagle_data", lambda *a, **k: pytest.fail("training started"))
    file = tmp_path / "passwd"
    file.write_text("root:x:0:0\n")
    assert main(["train", "eagle", "--target", "tiny-code-target", "--out", str(file)]) == 2
    assert f"--out {file} is a file" in capsys.readouterr().err
    assert main(["train", "tiny-code-draft", "--out", str(file)]) == 2
    with pytest.raises(ValueError, match="is a file"):
        minispec.tools.train_eagle.train_eagle("tiny-code-target", file)
    with pytest.raises(ValueError, match="hot_vocab must be an integer in 1..256"):
        minispec.tools.train_eagle.train_eagle("tiny-code-target", tmp_path / "head", hot_vocab=1000)
    with pytest.raises(ValueError, match="'nosuchtarget' is neither"):
        minispec.tools.train_eagle.train_eagle("nosuchtarget", tmp_path / "head")


def test_train_eagle_hides_torchs_dtype_note(tmp_path, monkeypatch):
    """torch's "Mismatch dtype between input and weight" UserWarning under CPU autocast (a kernel choice no user
    can act on) does not reach the user of `minispec train eagle`; other warnings still do."""
    import warnings

    import minispec.tools.train_eagle

    def train(*a, **k):
        warnings.warn("Mismatch dtype between input and weight: input dtype = c10::BFloat16", UserWarning, stacklevel=2)
        warnings.warn("something the user can act on", UserWarning, stacklevel=2)
        return {"steps": 1, "seconds": 1.0}

    monkeypatch.setattr(minispec.tools.train_eagle, "train_eagle", train)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert main(["train", "eagle", "--target", "tiny-code-target", "--out", str(tmp_path / "head")]) == 0
    assert [str(w.message) for w in caught] == ["something the user can act on"]
