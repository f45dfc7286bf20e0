"""The house: the folders are layers, imports run one way between them, and each module states one job."""

import ast
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

PACKAGE = pathlib.Path(__file__).parent.parent / "minispec"

# Bottom to top. A module may import from its own layer or a lower one, never a higher one, not even inside a
# function. cli.py is the top; minispec/__init__.py (the public API) and __main__.py re-export and are exempt.
LAYERS = ("model", "roofline", "decoding", "drafts", "speculative", "engine", "serving", "course", "tools", "cli")
EXEMPT = ("__init__", "__main__")


def module_name(path: pathlib.Path, package: pathlib.Path) -> str:
    """``decoding.plain`` for minispec/decoding/plain.py, ``drafts`` for minispec/drafts/__init__.py."""
    parts = path.relative_to(package).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(package: pathlib.Path = PACKAGE) -> dict[str, set[str]]:
    """minispec module -> the minispec modules it imports, at the top or inside a function (``from minispec.tools
    import bench`` imports tools.bench; ``from minispec.roofline import ModelShape`` imports roofline)."""
    paths = {module_name(p, package): p for p in sorted(package.rglob("*.py")) if p.stem not in EXEMPT[1:]}
    paths.pop("", None)  # minispec/__init__.py
    known = set(paths)
    edges = {m: set() for m in paths}
    for m, path in paths.items():
        for node in ast.walk(ast.parse(path.read_text())):
            found = []
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "minispec":
                base = node.module.removeprefix("minispec").lstrip(".")
                for alias in node.names:
                    sub = f"{base}.{alias.name}" if base else alias.name
                    found.append(sub if sub in known else base)
            elif isinstance(node, ast.Import):
                found += [a.name.removeprefix("minispec.") for a in node.names if a.name.startswith("minispec.")]
            edges[m] |= {f for f in found if f and f != m}
    return edges


def layer(module: str) -> str:
    return module.split(".")[0]


def upward(edges: dict[str, set[str]]) -> list[str]:
    """Every import that runs from a layer to a higher one, as 'a -> b (layer -> higher layer)'."""
    rank = {name: i for i, name in enumerate(LAYERS)}
    return [f"{a} -> {b} ({layer(a)} -> {layer(b)})" for a in sorted(edges) for b in sorted(edges[a])
            if rank[layer(b)] > rank[layer(a)]]


def test_every_module_sits_in_a_layer():
    unplaced = sorted({layer(m) for m in imports()} - set(LAYERS))
    assert not unplaced, f"place {unplaced} in LAYERS (bottom to top)"


def test_imports_run_one_way_between_layers():
    assert not upward(imports()), "\n".join(upward(imports()))


def test_the_layer_check_fails_on_an_upward_import(tmp_path):
    """A copy of the package with one upward import, hidden inside a function: the check names it."""
    copy = tmp_path / "minispec"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("assets", "__pycache__"))
    llama = copy / "model" / "llama.py"
    llama.write_text(llama.read_text() + "\n\ndef _peek():\n    from minispec.tools import bench\n    return bench\n")
    assert upward(imports(copy)) == ["model.llama -> tools.bench (model -> tools)"]
    assert not upward(imports(PACKAGE))


def test_no_import_cycle_inside_the_package():
    edges, state, cycles = imports(), {}, []

    def walk(u, path):
        state[u] = "open"
        for v in sorted(edges.get(u, ())):
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


def test_no_module_grows_past_one_reading():
    """About 400 lines at most: a module a reader takes in at one sitting."""
    lines = {str(p.relative_to(PACKAGE)): len(p.read_text().splitlines()) for p in PACKAGE.rglob("*.py")}
    long = {name: n for name, n in lines.items() if n > 420}
    assert not long, long


def test_importing_the_decoder_loads_no_benchmark_or_course_module():
    """``import minispec`` (which importing any submodule runs first) gets the grader without the lessons'
    model choosing, the benchmark, the simulator or the CLI."""
    code = ("import sys, minispec.speculative.loop; "
            "print(sorted(m for m in sys.modules if m.startswith('minispec')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    loaded = set(eval(out))
    assert "minispec.speculative.loop" in loaded
    assert "minispec.course.grader" in loaded
    assert not {m for m in loaded if m.startswith(("minispec.tools", "minispec.serving"))}
    assert not loaded & {"minispec.cli", "minispec.course.models", "minispec.course.site"}


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
    for path in sorted(PACKAGE.rglob("*.py")):
        doc = ast.get_docstring(ast.parse(path.read_text()))
        out[str(path.relative_to(PACKAGE))] = ((doc or "").strip().splitlines()[:1] or [""])[0], statement_problems(doc)
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
