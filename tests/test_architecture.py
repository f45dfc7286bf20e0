"""The house: imports run one way, and a module's first docstring line says its one job."""

import ast
import pathlib
import subprocess
import sys

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
    above = {"bench", "cli", "course", "baselines", "serving", "train", "plots"}
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


def test_importing_the_decoder_loads_no_benchmark_module():
    code = ("import sys, minispec.speculative; "
            "print(sorted(m for m in sys.modules if m.startswith('minispec')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    loaded = set(eval(out))
    assert "minispec.speculative" in loaded
    assert not loaded & {"minispec.bench", "minispec.cli", "minispec.baselines", "minispec.train", "minispec.serving"}


def test_every_module_states_its_job():
    for path in sorted(PACKAGE.glob("*.py")):
        doc = ast.get_docstring(ast.parse(path.read_text()))
        assert doc and len(doc.splitlines()[0]) > 20, f"{path.name} has no one-line statement of its job"
