"""Issue 36, what a new user hit after the demo: plots without matplotlib, a gamma larger than a call can use,
sampling settings that cannot act, flags and help text, serve-bench with a tree, and whitespace-only output."""

import json
import re
import subprocess
import sys
import warnings

import pytest
from support import random_model

from minispec.cli import build_parser, main
from minispec.decoding.plain import generate
from minispec.decoding.sampling import SamplingParams
from minispec.drafts.base import DraftRun
from minispec.drafts.tree import TreeDraft
from minispec.roofline.policy import FixedPolicy
from minispec.serving import Lengths
from minispec.speculative.loop import speculative_generate
from minispec.tools.serve_bench import LoadConfig, goodput_text, report, serve_bench

pytestmark = pytest.mark.usefixtures("one_thread")  # a spinning second thread on 2 shared cores: many times slower
PROMPT = "def _current(self):\n"  # the README's prompt: the embedded pair writes code after it
TINY = LoadConfig(rates=(8.0,), min_requests=4, max_requests=4, prompt=Lengths(8, "uniform"),
                  output=Lengths(8, "uniform"), max_num_seqs=4, tpot_slo_s=1.0, ttft_slo_s=10.0)
TEXT = list(range(1, 60)) * 10


@pytest.fixture
def no_matplotlib(monkeypatch):
    """As in `pip install minispec-decoding` without extras: importing matplotlib fails."""
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # None in sys.modules: ImportError on import


@pytest.fixture
def nothing_loads(monkeypatch):
    """Any model load fails the test: the errors must come first."""
    import minispec.tools.pair

    monkeypatch.setattr(minispec.tools.pair, "load", lambda *a, **k: pytest.fail("a model was loaded"))
    monkeypatch.setattr(minispec.tools.pair, "random_model", lambda *a, **k: pytest.fail("a model was built"))


@pytest.fixture(scope="module")
def code_pair():
    import minispec

    target, tok = minispec.load("tiny-code-target")
    draft, _ = minispec.load("tiny-code-draft")
    return target, draft, tok


# --- 1. plots without matplotlib ----------------------------------------------------------------

def test_roofline_plot_without_matplotlib_prints_the_table_and_says_how_to_get_the_plot(no_matplotlib, capsys,
                                                                                        tmp_path):
    png = tmp_path / "s.png"
    assert main(["roofline", "--batches", "1,8", "--plot", str(png)]) == 0
    out, err = capsys.readouterr()
    assert "break-even (speedup 1.0) at batch" in out and not png.exists()
    assert err.index("matplotlib is not installed") < err.index("plot skipped")  # said up front, and at the end
    assert 'pip install "minispec-decoding[lessons]"' in err and "pip install matplotlib" in err


def test_bench_plot_without_matplotlib_runs_the_sweep(no_matplotlib, capsys, tmp_path):
    png, rows = tmp_path / "b.png", tmp_path / "rows.jsonl"
    assert main(["bench", "--batches", "1", "--gammas", "2", "--max-new-tokens", "4", "--repeats", "1", "--warmup",
                 "0", "--prompts", __file__, "--threads", "1", "--out", str(rows), "--plot", str(png)]) == 0
    out, err = capsys.readouterr()
    assert "speedup" in out and rows.exists() and not png.exists()
    assert err.index("matplotlib is not installed") < err.index("plot skipped") and "pip install" in err


def test_plot_functions_say_what_to_install(no_matplotlib):
    from minispec.course.plots import plot_speedup_vs_batch

    with pytest.raises(ImportError, match=r'pip install "minispec-decoding\[lessons\]"'):
        plot_speedup_vs_batch({"x": [(1, 1.0), (2, 1.5)]})


def test_serve_bench_without_matplotlib_writes_the_rest_and_warns_before_any_work(no_matplotlib, tmp_path):
    target, draft = random_model(seed=0), random_model(seed=1, layers=1, hidden=32, heads=2, kv_heads=1)
    said = []
    rows = serve_bench(target, {"plain": {}, "gamma 2": dict(draft=draft, gamma=2)}, TINY, TEXT, tmp_path / "sb",
                       simulate_too=False, progress=said.append)
    assert said[0].startswith("minispec: warning: matplotlib is not installed")  # before the first step measured
    assert "pip install" in said[0] and "plot skipped" in said[-1]
    assert "Goodput" in (tmp_path / "sb.txt").read_text() and not (tmp_path / "sb.png").exists()
    assert len((tmp_path / "sb.jsonl").read_text().splitlines()) == len(rows) == 2


def test_serve_bench_command_without_matplotlib_prints_its_report(no_matplotlib, capsys, tmp_path):
    argv = ["serve-bench", "--rates", "8", "--requests", "3,3", "--lengths", "8,8", "--max-num-seqs", "2",
            "--no-simulate", "--threads", "1", "--out", str(tmp_path / "sb")]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert out.startswith("Measured (nothing simulated):") and "Goodput" in out
    assert 'pip install "minispec-decoding[lessons]"' in err.splitlines()[0]  # the first line, before measuring
    assert "plot skipped" in err and not (tmp_path / "sb.png").exists() and (tmp_path / "sb.txt").exists()


# --- 2. a gamma larger than a call can use ------------------------------------------------------

@pytest.mark.parametrize("gamma", [10_000, 10**6])
def test_a_huge_gamma_is_capped_at_what_the_call_can_use(code_pair, monkeypatch, gamma):
    """gamma 10^6 with 8 new tokens ran for minutes (a million draft passes a step, a million cache slots): it now
    drafts at most max_new_tokens - 1 = 7 a step, in caches of that size, with one warning, and the same tokens."""
    target, draft, tok = code_pair
    asked, slots = [], []
    propose, new_cache = DraftRun.propose, type(target).new_cache  # new_cache: the target's and the draft's alike

    def spy_propose(self, state, g):
        asked.append(g)
        assert g <= 100, f"drafting {g} tokens a step"  # fail here, not after minutes of drafting
        return propose(self, state, g)

    def spy_cache(self, B, S, *a, **kw):
        slots.append(S)
        assert S <= 1000, f"a cache of {S} slots a row"  # fail here, not after allocating gigabytes
        return new_cache(self, B, S, *a, **kw)

    monkeypatch.setattr(DraftRun, "propose", spy_propose)
    monkeypatch.setattr(type(target), "new_cache", spy_cache)
    ids = [tok.encode(PROMPT)]
    with pytest.warns(UserWarning, match=f"gamma {gamma} is more than this call can use.*at most 7"):
        spec = speculative_generate(target, draft, ids, gamma=gamma, max_new_tokens=8)
    assert spec.tokens == generate(target, ids, max_new_tokens=8).tokens
    assert asked and max(asked) == 7 and set(spec.stats.gamma_per_step) == {7} and spec.stats.gamma == 7
    assert max(slots) <= len(ids[0]) + 8 + 7 + 1


def test_the_default_gamma_and_a_policy_are_capped_silently(pair):
    target, draft = pair
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning: the caller set no gamma, or a policy that only bounds it
        short = speculative_generate(target, draft, [[1, 2, 3]], max_new_tokens=3)
        policy = speculative_generate(target, draft, [[1, 2, 3]], gamma=FixedPolicy(10**6), max_new_tokens=5)
    assert set(short.stats.gamma_per_step) == {2} and set(policy.stats.gamma_per_step) == {4}
    assert short.tokens == generate(target, [[1, 2, 3]], max_new_tokens=3).tokens


def test_a_gamma_the_call_can_use_is_kept(pair):
    target, draft = pair
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = speculative_generate(target, draft, [[1, 2, 3]], gamma=7, max_new_tokens=8)
    assert out.stats.gamma == 7 and out.stats.gamma_per_step[0] == 7


def test_generate_command_with_gamma_1000(capsys):
    with pytest.warns(UserWarning, match="gamma 1000 is more than this call can use"):
        assert main(["generate", PROMPT, "--draft", "tiny-code-draft", "--gamma", "1000", "--max-new-tokens", "32",
                     "--threads", "1"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith(PROMPT) and re.search(r"gamma  31\n", err)


# --- 3. top-p or top-k at temperature 0 -----------------------------------------------------------

@pytest.mark.parametrize("kw, named", [(dict(top_p=0.9), "top_p=0.9 cannot act"),
                                       (dict(top_k=5), "top_k=5 cannot act"),
                                       (dict(top_k=5, top_p=0.5), "top_k=5 and top_p=0.5 cannot act")])
def test_top_p_or_top_k_at_temperature_0_warns(kw, named):
    with pytest.warns(UserWarning, match=named):
        SamplingParams(0.0, **kw)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        SamplingParams(0.7, **kw)  # they act at a temperature
        SamplingParams(0.0)


def test_one_warning_per_call_not_per_step(pair):
    """The loops build their sampling settings once per call: sixteen steps, one warning even when every warning is
    shown. The engine checks each request twice; Python's default filter shows one for the run."""
    from minispec.engine import Engine, Request

    target, draft = pair
    for run in (lambda: generate(target, [[1, 2, 3]], top_p=0.9, max_new_tokens=16),
                lambda: speculative_generate(target, draft, [[1, 2, 3]], top_p=0.9, gamma=2, max_new_tokens=16)):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            run()
        assert [str(w.message)[:24] for w in caught] == ["top_p=0.9 cannot act at "]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")  # what a user's script gets
        Engine(target, draft, gamma=2).run([Request([1, 2, 3 + i], 8, top_p=0.9) for i in range(3)])
    assert [str(w.message)[:24] for w in caught if "cannot act" in str(w.message)] == ["top_p=0.9 cannot act at "]


def test_the_command_shows_each_warning_once_in_its_own_words():
    """In a terminal: "minispec: warning: ..." once each, no source path or Python line."""
    out = subprocess.run([sys.executable, "-m", "minispec", "generate", PROMPT, "--draft", "tiny-code-draft",
                          "--gamma", "1000", "--top-p", "0.9", "--max-new-tokens", "16", "--threads", "1"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stderr.count("minispec: warning: top_p=0.9 cannot act at temperature 0") == 1
    assert out.stderr.count("minispec: warning: gamma 1000 is more than this call can use") == 1
    assert "UserWarning" not in out.stderr and ".py:" not in out.stderr


# --- 4. flags, help, the empty prompt, the demo ---------------------------------------------------

@pytest.mark.parametrize("rates, bad", [("-1,4", "-1"), ("4,-0.5", "-0.5"), ("0", "0"), ("8,inf", "inf")])
def test_bad_rates_give_one_clear_error_in_both_spellings(nothing_loads, capsys, tmp_path, rates, bad):
    errors = []
    for argv in (["--rates", rates], [f"--rates={rates}"]):
        assert main(["serve-bench", *argv, "--out", str(tmp_path / "x")]) == 2
        errors.append(capsys.readouterr().err)
    assert errors[0] == errors[1] == f"minispec: error: --rates: need positive rates (requests/s, each finite), " \
                                     f"got {bad}\n"
    assert not list(tmp_path.iterdir())


def test_serve_bench_lengths_and_requests_are_integers(nothing_loads, capsys):
    for argv, message in [(["--requests", "1.5,4"], "--requests takes 2 comma-separated integers, got '1.5,4'"),
                          (["--lengths", "0,8"], "--lengths takes mean PROMPT,OUTPUT tokens, each >= 1"),
                          (["--requests", "9,4"], "need 1 <= min_requests <= max_requests, got 9 and 4")]:
        assert main(["serve-bench", *argv]) == 2
        err = capsys.readouterr().err
        assert message in err and "LoadConfig(" not in err


def _options(parser):
    """(command, option, its lines in the command's --help) for every flag with a default to show (argparse has no
    public walk of its subcommands)."""
    import argparse

    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                lines = sub.format_help().splitlines()
                for a in sub._actions:
                    if a.option_strings and not (a.default is None or a.default is False or
                                                 a.default == argparse.SUPPRESS):
                        i = next(i for i, x in enumerate(lines) if x.lstrip().startswith(a.option_strings[0] + " "))
                        end = next((j for j in range(i + 1, len(lines)) if lines[j].startswith("  -")
                                    or not lines[j].strip()), len(lines))
                        yield name, a.option_strings[-1], " ".join(" ".join(lines[i:end]).split())
                yield from ((f"{name} {n}", o, t) for n, o, t in _options(sub))


def test_help_is_plain_text_and_shows_every_default(monkeypatch):
    monkeypatch.setenv("COLUMNS", "1000")  # one line per flag
    parser = build_parser()
    top = parser.format_help()
    assert "``" not in top and "3.3M" in top and "def _current(self)" in top
    shown = list(_options(parser))
    assert len(shown) > 40
    for command, option, text in shown:
        assert "default" in text and "``" not in text, (command, option, text)
    helps = {(c, o): t for c, o, t in shown}
    for key, needle in ((("generate", "--max-new-tokens"), "tokens to generate at most (default: 128)"),
                        (("generate", "--temperature"), "(default: 0.0)"),
                        (("serve-bench", "--max-num-seqs"), "MAX_NUM_SEQS default: 64"),
                        (("bench", "--gammas"), "(default: 4)"), (("demo", "--gamma"), "(default: 4)")):
        assert needle in helps[key], (key, helps[key])


def test_the_empty_prompt_is_refused_before_any_load(nothing_loads, capsys):
    assert main(["generate", ""]) == 2
    assert "the prompt is empty" in capsys.readouterr().err


def test_the_demo_says_how_its_acceptance_figures_differ_and_marks_with_carets():
    from minispec.tools.demo import demo

    d = demo(max_new_tokens=24, repeats=1, batches=())
    text = str(d)
    for needle in ("acceptance rate: accepted / drafted", "per-position: the share of steps",
                   "alpha, below: accepted / tested", "mean acceptance length: tokens a step"):
        assert needle in text
    assert "«" not in text and "»" not in text and "marked by a ^ under each of their characters" in text


def test_carets_sit_under_the_accepted_characters_and_leave_the_text_whole():
    """One byte per token: "ab\\n  c\\n" with b, the newline, the two spaces and c accepted."""
    from minispec.tools.demo import _marked

    class Bytes:
        def decode(self, ids, skip_special_tokens=True):
            return bytes(ids).decode()

    text = "ab\n  c\nd"
    tokens, accepted = list(text.encode()), [False, True, True, True, True, True, False, False]
    marked = _marked(Bytes(), tokens, accepted, "carets", head="> ")
    assert marked == "> ab\n   ^^\n  c\n^^^\nd"
    lines = marked.split("\n")
    assert "\n".join(lines[i] for i in (0, 2, 4)) == "> " + text  # the caret lines removed: the text itself
    assert _marked(Bytes(), tokens, accepted, "brackets") == "a«b\n  c»\nd"


def test_goodput_says_when_it_is_only_a_bound():
    rows = [{"setting": "s", "source": "measured", "rate": r, "slo_met": m} for r, m in ((4, 1.0), (16, 1.0),
                                                                                          (64, 0.5))]
    assert goodput_text(rows, "s") == "16"
    assert goodput_text([dict(r, slo_met=1.0) for r in rows], "s") == ">= 64"
    assert goodput_text([dict(r, slo_met=0.0) for r in rows], "s") == "< 4"


def test_the_report_without_simulation_has_no_simulated_columns():
    m = dict(setting="gamma 4", source="measured", rate=8, tpot_p50_s=0.01, tpot_p99_s=0.02, ttft_p99_s=0.1,
             throughput=100.0, slo_met=1.0, mean_batch=2.0, mean_gamma=4.0, preemptions=0)
    text = report([m], TINY)
    assert text.startswith("Measured (nothing simulated):") and "sim" not in text.split("\n")[1]
    assert "gamma 4 >= 8" in text and "the goodput may be higher" in text


# --- 5. serve-bench with a tree, to the end -------------------------------------------------------

def test_serve_bench_with_a_tree_runs_to_the_end_and_fits_its_steps(tmp_path):
    """A tree's row feeds 1 + its node budget tokens a step, more than 1 + gamma: counted as prefill, every step of
    it was a prefill and the step-time fit had no decode step to fit (the crash after the sweep)."""
    target, draft = random_model(seed=0), random_model(seed=1, layers=1, hidden=32, heads=2, kv_heads=1)
    tree = TreeDraft(draft, budget=6, depth=2)
    rows = serve_bench(target, {"plain": {}, "tree budget=6,depth=2": dict(draft=tree, gamma=2)}, TINY, TEXT,
                       tmp_path / "sb", progress=lambda line: None)
    assert {r["source"] for r in rows} == {"measured", "simulated", "simulated, step table"}
    fitted = json.loads((tmp_path / "sb_steps.json").read_text())["tree budget=6,depth=2"]
    assert {w for _, w, _ in fitted["step_s"]} >= {3}  # decode steps at gamma 2 were fitted


def test_serve_bench_command_with_a_tree_labels_its_rows_by_the_tree(capsys, tmp_path):
    argv = ["serve-bench", "--tree", "budget=6,depth=3", "--rates", "8", "--requests", "3,3", "--lengths", "8,8",
            "--max-num-seqs", "2", "--slo", "100,10000", "--threads", "1", "--out", str(tmp_path / "tree")]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert re.search(r"^8\s+tree budget=6,depth=3\s", out, re.M) and "gamma 4" not in out
    assert out.startswith("Measured, and simulated") and "tree budget=6,depth=3 >= 8" in out


# --- 6. the embedded model's whitespace -------------------------------------------------------------

def test_whitespace_only_output_comes_with_a_hint(capsys):
    from minispec.tools.demo import complete

    fib = complete("def fib(n):", max_new_tokens=24)
    assert fib.continuation and not fib.continuation.strip()  # the 3.3M model's greedy habit after a short opening
    assert "--temperature 0.8" in fib.hint and "def _current(self)" in fib.hint
    assert complete(PROMPT, max_new_tokens=24).hint is None
    assert main(["generate", "def fib(n):", "--max-new-tokens", "24", "--threads", "1"]) == 0
    assert "minispec: note: the continuation is only whitespace" in capsys.readouterr().err


def test_the_cpu_names_its_threads():
    from minispec.roofline.hardware import calibrate

    name = calibrate("cpu").name
    assert "torch thread" in name and not re.search(r" x\d", name)
