"""Lessons and worked solutions assert what they compute in the run, never a figure read from a committed file.

A committed ``results/`` file was measured once, on one machine: a student's run on other hardware would fail an
assert on it, or pass it without measuring anything. Such a file may be shown, labelled with its source; the check
below follows every value read from a path with a ``results`` folder in it (through assignments, loops,
comprehensions, function returns and arguments, in the order the cells run) and fails on any ``assert`` that
reads one.
"""

import ast
import json
import re
from pathlib import Path

import pytest

LESSONS = Path(__file__).parents[2] / "lessons"
RESULTS_PATH = re.compile(r"^(?:[\w.-]+/)*results(?:/[\w./-]*)?$")  # "results", "results/cpu/x.json"; not prose


def sources() -> dict[str, list[tuple[int, str]]]:
    """Each lesson's code cells (1-based cell number, source without IPython magics) and each solution's file."""
    out = {}
    for nb in sorted(LESSONS.glob("[0-9][0-9]_*.ipynb")):
        cells = json.loads(nb.read_text(encoding="utf-8"))["cells"]
        out[nb.name] = [(i, "\n".join("" if line.lstrip().startswith(("%", "!")) else line
                                      for line in "".join(c["source"]).splitlines()))
                        for i, c in enumerate(cells, 1) if c["cell_type"] == "code"]
    for py in sorted((LESSONS / "solutions").glob("[0-9][0-9]_*.py")):
        out[f"solutions/{py.name}"] = [(0, py.read_text(encoding="utf-8"))]
    return out


def _bound(target) -> tuple[set, set]:
    """(names a target rebinds, names it only writes into: ``x[i] = ...``, ``x.a = ...``)."""
    if isinstance(target, ast.Name):
        return {target.id}, set()
    if isinstance(target, (ast.Tuple, ast.List)):
        parts = [_bound(t) for t in target.elts]
        return set().union(*(p[0] for p in parts)), set().union(*(p[1] for p in parts))
    if isinstance(target, ast.Starred):
        return _bound(target.value)
    base = target
    while isinstance(base, (ast.Subscript, ast.Attribute)):
        base = base.value
    return set(), ({base.id} if isinstance(base, ast.Name) else set())


class Taint:
    """Which names hold a value read from a committed results file, statement by statement."""

    def __init__(self):
        self.found, self.functions, self.calls = [], {}, []  # asserts that read one; local defs; tainted calls

    def expr(self, node, names: set) -> bool:
        if node is None:
            return False
        if isinstance(node, ast.Constant):
            return isinstance(node.value, str) and bool(RESULTS_PATH.match(node.value))
        if isinstance(node, ast.Name):
            return node.id in names
        if isinstance(node, (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)):
            local, hit = set(names), False
            for gen in node.generators:
                read = self.expr(gen.iter, local)
                hit |= read
                bound = _bound(gen.target)[0]
                local = local | bound if read else local - bound
                hit |= any(self.expr(cond, local) for cond in gen.ifs)
            parts = [node.key, node.value] if isinstance(node, ast.DictComp) else [node.elt]
            return hit or any(self.expr(p, local) for p in parts)
        if isinstance(node, ast.Lambda):
            return self.expr(node.body, names - {a.arg for a in node.args.args})
        if isinstance(node, ast.Call):
            args = [a.value if isinstance(a, ast.Starred) else a for a in node.args]
            flags = [self.expr(a, names) for a in args]
            if isinstance(node.func, ast.Name) and node.func.id in self.functions and any(flags):
                self.calls.append((node.func.id, flags))
            return self.expr(node.func, names) or any(flags) or any(self.expr(k.value, names) for k in node.keywords)
        return any(self.expr(child, names) for child in ast.iter_child_nodes(node))

    def block(self, body, names: set, where: str) -> set:
        for stmt in body:
            names = self.stmt(stmt, names, where)
        return names

    def stmt(self, s, names: set, where: str) -> set:
        names = set(names)
        if isinstance(s, ast.Assert):
            if self.expr(s.test, names):
                self.found.append(f"{where}: assert {ast.unparse(s.test)[:120]}")
        elif isinstance(s, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            read = self.expr(s.value, names) or (isinstance(s, ast.AugAssign) and self.expr(s.target, names))
            for target in s.targets if isinstance(s, ast.Assign) else [s.target]:
                rebound, written = _bound(target)
                names = (names | rebound | written) if read else (names - rebound)
        elif isinstance(s, (ast.For, ast.AsyncFor)):
            rebound = _bound(s.target)[0]
            names = names | rebound if self.expr(s.iter, names) else names - rebound
            for _ in range(2):  # twice: what one iteration taints, the next reads
                names |= self.block(s.body, names, where)
            names = self.block(s.orelse, names, where)
        elif isinstance(s, (ast.With, ast.AsyncWith)):
            for item in s.items:
                if item.optional_vars is not None and self.expr(item.context_expr, names):
                    names |= _bound(item.optional_vars)[0]
            names = self.block(s.body, names, where)
        elif isinstance(s, (ast.If, ast.While)):
            self.expr(s.test, names)
            names = self.block(s.body, names, where) | self.block(s.orelse, names, where)
        elif isinstance(s, ast.Try):
            names = self.block(s.body, names, where)
            for handler in s.handlers:
                names |= self.block(handler.body, names, where)
            names = self.block(s.orelse + s.finalbody, names, where)
        elif isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef)):
            self.functions[s.name] = (s, where, set(names))
            inner = self.block(s.body, names, f"{where}, {s.name}()")
            if any(self.expr(r.value, inner) for r in ast.walk(s) if isinstance(r, ast.Return)):
                names.add(s.name)  # a function that returns such a value: its calls read one
            else:
                names.discard(s.name)
        elif isinstance(s, ast.ClassDef):
            self.block(s.body, names, where)
        elif isinstance(s, ast.Expr):
            self.expr(s.value, names)
        return names

    def arguments(self):
        """Run each local function again with the parameters a call passed such a value to."""
        seen = set()
        while self.calls:
            name, flags = self.calls.pop()
            fn, where, names = self.functions[name]
            params = {a.arg for a, hit in zip(fn.args.args, flags) if hit}
            if (name, frozenset(params)) not in seen:
                seen.add((name, frozenset(params)))
                self.block(fn.body, names | params, f"{where}, {name}() given such an argument")


def asserts_on_committed_files(cells: list[tuple[int, str]]) -> list[str]:
    """The asserts in ``cells`` (run in order) that read a value loaded from a committed results file."""
    taint, names = Taint(), set()
    for cell, code in cells:
        names = taint.block(ast.parse(code).body, names, f"cell {cell}" if cell else "line")
    taint.arguments()
    return [f.replace("line, ", "") for f in dict.fromkeys(taint.found)]


@pytest.mark.parametrize("name", sorted(sources()))
def test_no_assert_reads_a_committed_results_file(name):
    assert asserts_on_committed_files(sources()[name]) == []


def test_the_check_finds_an_assert_on_a_saved_figure():
    """The ways a saved figure reaches an assert: directly, through a loop, a helper's return value or argument."""
    saved = [(3, 'import json\nfrom pathlib import Path\nsaved = json.loads((Path("..") / "results" / "cpu" / '
                 '"eagle.json").read_text())\nb1 = saved["code"]["by_batch"]["1"]'),
             (5, "measured = 3.8\nfor n in b1:\n    ref = b1[n]\n    assert abs(measured - ref['length']) < 0.03\n"
                 "assert b1['x']['c'] < 0.2"),
             (7, "def load():\n    return json.loads(Path('results/cpu/trees.jsonl').read_text())\n"
                 "def check(row):\n    assert row['speedup'] > 1\nrows = load()\ncheck(rows[0])\nassert len(rows)")]
    found = asserts_on_committed_files(saved)
    assert found == ["cell 5: assert abs(measured - ref['length']) < 0.03", "cell 5: assert b1['x']['c'] < 0.2",
                     "cell 7: assert len(rows)", "cell 7, check() given such an argument: assert row['speedup'] > 1"]


def test_the_check_leaves_computed_values_alone():
    """A name reused for a computed value, a figure only printed, and prose naming the file are not flagged."""
    fine = [(2, 'saved = json.loads(open("results/cpu/eagle.json").read())\nprint(saved["code"])\n'
                'rows = [r for r in saved]\nrows = [1, 2, 3]\nassert len(rows) == 3\n'
                'assert all(r > 0 for r in rows), "unlike results/cpu/eagle.json"\n'
                'print("measured earlier: results/cpu/trees.jsonl")')]
    assert asserts_on_committed_files(fine) == []
