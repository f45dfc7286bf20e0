"""The house: imports run one way, and a module's first docstring line says its one job."""

import ast
import pathlib
import re
import subprocess
import sys

import pytest

PACKAGE = pathlib.Path(__file__).parent.parent / "minispec"


def imports() -> dict[str, set[str]]:
    """minispec module -> the minispec modules it imports, at the top or inside a function."""
    mods = {p.stem: p for p in PACKAGE.glob("*.py") if p.stem not in ("__init__", "__main__")}
    edges = {m: set() for m in mods}
    for m, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("minispec"):
                parts = node.module.split(".")
                names = [parts[1]] if len(parts) > 1 else [a.name for a in node.names]
                edges[m] |= {n for n in names if n in mods and n != m}
            elif isinstance(node, ast.Import):
                edges[m] |= {a.name.split(".")[1] for a in node.names if a.name.startswith("minispec.")}
    return edges


def test_no_import_cycle_inside_the_package():
    edges, state, cycles = imports(), {}, []

    def walk(u, path):
        state[u] = "open"
        for v in sorted(edges[u]):
            if state.get(v) == "open":
                cycles.append(path[path.index(v):] + [v])
            elif v not in state:
                walk(v, path + [v])
        state[u] = "done"

    for m in sorted(edges):
        if m not in state:
            walk(m, [m])
    assert not cycles, " -> ".join(cycles[0])


def test_the_cycle_check_can_fail(tmp_path, monkeypatch):
    """The same walk finds a cycle when there is one."""
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}}
    monkeypatch.setattr(sys.modules[__name__], "imports", lambda: edges)
    try:
        test_no_import_cycle_inside_the_package()
    except AssertionError as e:
        assert "a -> b -> c -> a" in str(e)
    else:
        raise AssertionError("a cycle went unnoticed")


def test_layers():
    """The decoding core never reaches up to the benchmark, the course, the CLI or training."""
    edges, core = imports(), ("model", "kv_cache", "sampling", "decode", "drafts", "speculative", "timing", "stats")
    above = {"bench", "cli", "course", "grader", "demo", "baselines", "serving", "train", "plots"}
    reach = {}
    for m in core:
        seen, todo = set(), [m]
        while todo:
            for v in edges[todo.pop()] - seen:
                seen.add(v)
                todo.append(v)
        reach[m] = seen
        assert not seen & above, f"{m} reaches {seen & above}"
    assert "roofline" not in reach["model"] and "policy" in reach["speculative"]


def test_importing_the_decoder_loads_no_benchmark_or_course_module():
    """``import minispec`` (which importing any submodule runs first) gets the grader without the lessons'
    model choosing, the benchmark or the CLI."""
    code = ("import sys, minispec.speculative; "
            "print(sorted(m for m in sys.modules if m.startswith('minispec')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    loaded = set(eval(out))
    assert "minispec.speculative" in loaded
    assert "minispec.grader" in loaded
    assert not loaded & {"minispec.bench", "minispec.cli", "minispec.baselines", "minispec.train", "minispec.serving",
                         "minispec.course", "minispec.demo"}


GRAB_BAG = {"utilities", "utils", "helpers", "misc", "miscellaneous", "various", "stuff", "etc"}


def statement_problems(doc: str | None) -> list[str]:
    """What is wrong with a module docstring's statement of its job: its first paragraph, which must be
    one sentence (ending with a period, wrapped onto two lines at most) of six words or more, not a grab bag,
    that does not join a second job on with ", and"."""
    if not doc or not doc.strip():
        return ["no docstring"]
    lines = doc.strip().split("\n\n")[0].splitlines()
    statement = " ".join(line.strip() for line in lines)
    words = re.findall(r"[A-Za-z][A-Za-z'-]*", statement)
    checks = [(len(lines) <= 2, "the statement runs past two lines"),
              (statement.endswith("."), "the statement does not end with a period"),
              (not re.search(r"(?<!\be\.g)(?<!\bi\.e)[.!?] +[A-Z`]", statement), "more than one sentence"),
              (len(words) >= 6, f"{len(words)} words cannot state a job"),
              (not GRAB_BAG & {w.lower() for w in words}, "a grab bag ('helpers', 'utilities', ...) is no one job"),
              (not re.search(r",\s+and\s", statement), "', and' joins a second job on")]
    return [problem for ok, problem in checks if not ok]


def statements() -> dict[str, tuple[str, list[str]]]:
    """module name -> (its statement's first line, what is wrong with it)."""
    out = {}
    for path in sorted(PACKAGE.glob("*.py")):
        doc = ast.get_docstring(ast.parse(path.read_text()))
        out[path.stem] = ((doc or "").strip().splitlines()[:1] or [""])[0], statement_problems(doc)
    return out


def test_every_module_states_its_job():
    found = statements()
    wrong = {m: p for m, (_, p) in found.items() if p}
    assert not wrong, wrong
    first = [line for line, _ in found.values()]
    assert len(set(first)) == len(first), "two modules state the same job"


@pytest.mark.parametrize("doc, problem", [
    (None, "no docstring"),
    ("Helpers for the CLI, the bench and the lessons.", "grab bag"),
    ("Utilities.", "words cannot state a job"),
    ("Loads checkpoints. Also plots the roofline.", "more than one sentence"),
    ("Checkpoints to models: Hugging Face directories, GGUF files and the embedded models\nwithout a period", "period"),
    ("One\ntwo\nthree\nfour lines of a statement that never stops.", "past two lines"),
    # course.py's statement before the grader moved out: two jobs, caught.
    ("What the lessons share: the models and texts they run on, chosen for the device at hand, and the\n"
     "grader of an accept rule a student writes (:func:`grade_accept_rule`).", "', and' joins a second job on"),
])
def test_the_statement_check_can_fail(doc, problem):
    assert any(problem in p for p in statement_problems(doc)), statement_problems(doc)
    assert not statement_problems("Grade an accept rule a student writes, e.g. yours, against its exact law.")
