"""The mutation score per module from a mutmut run, and every surviving mutant with its change.

    python scripts/mutation.py run --max-children 2   # mutmut over the decoding core (hours on 2 cores), then
    python scripts/mutation_report.py                 # the table, from mutants/ as the last run left it
    python scripts/mutation_report.py --survivors     # and each survivor's diff, marked where it is listed as
                                                      # equivalent in scripts/mutation_equivalent.txt

Score = killed / (killed + survived), a mutant killed when a test fails (a timeout counts as killed: the mutant
made a test hang). "no tests" mutants are in code no selected test runs; they are counted apart.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KILLED, SURVIVED, NO_TESTS, TIMEOUT = {1, 3}, {0}, {5, 33}, {24, -24, 36, 152, 255}


def equivalent() -> dict[str, tuple[str, str]]:
    """Mutant name -> (the hash mutmut gave its function, why it cannot change behaviour), from
    scripts/mutation_equivalent.txt ('name  @hash  # reason'). An edit of a function renumbers its mutants, so an
    entry counts only while the function's hash is the one it was read with."""
    path = ROOT / "scripts" / "mutation_equivalent.txt"
    out = {}
    for line in path.read_text().splitlines() if path.exists() else []:
        if line.strip() and not line.startswith("#"):
            head, _, why = line.partition("#")
            name, digest = head.split()
            out[name] = (digest.removeprefix("@"), why.strip())
    return out


def results(mutants: Path) -> dict[str, tuple[dict[str, int | None], dict[str, str]]]:
    """Module path -> ({mutant name: exit code (None: not run)}, {mutant name: its function's hash})."""
    out = {}
    for meta in sorted(mutants.rglob("*.py.meta")):
        module = str(meta.relative_to(mutants)).removesuffix(".meta")
        data = json.loads(meta.read_text())
        codes, hashes = data["exit_code_by_key"], data["hash_by_function_name"]
        out[module] = codes, {k: hashes.get(k.rpartition(".")[2].rpartition("__mutmut_")[0]) for k in codes}
    return out


def classify(code: int | None) -> str:
    if code is None:
        return "not run"
    for name, codes in (("killed", KILLED), ("survived", SURVIVED), ("no tests", NO_TESTS), ("timeout", TIMEOUT)):
        if code in codes:
            return name
    return "other"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mutants", type=Path, default=ROOT / "mutants", help="mutmut's folder (default: ./mutants)")
    ap.add_argument("--survivors", action="store_true", help="print each survivor's diff")
    args = ap.parse_args()
    if not args.mutants.is_dir():
        sys.exit(f"{args.mutants} does not exist: run python scripts/mutation.py run first")
    eq, table, survivors, current = equivalent(), results(args.mutants), [], set()
    print("| module | mutants | killed | survived | of which equivalent | no tests | score "
          "| score, equivalent left out |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    total = Counter()
    for module, (codes, hashes) in table.items():
        c = Counter(classify(v) for v in codes.values())
        c["killed"] += c.pop("timeout", 0)
        lived = [k for k, v in codes.items() if classify(v) == "survived"]
        current |= {k for k in lived if k in eq and eq[k][0] == hashes[k]}  # listed for the function as it is
        c["equivalent"] = sum(k in current for k in lived)
        survivors += [(module, k) for k in lived]
        total += c | Counter(mutants=len(codes))
        print(row(module, c, len(codes)))
    print(row("**all**", total, total["mutants"]))
    if total["not run"]:
        print(f"\n{total['not run']} mutants were not run (an interrupted run): the score counts the others.")
    if args.survivors:
        os.chdir(args.mutants.parent)  # mutmut reads its configuration from the project's pyproject.toml
        from mutmut.__main__ import get_diff_for_mutant

        for module, name in survivors:
            diff = get_diff_for_mutant(name, path=Path(module))
            change = [line for line in diff.splitlines() if line[:1] in "+-" and line[:3] not in ("+++", "---")]
            tag = (f"EQUIVALENT ({eq[name][1]})" if name in current else "SURVIVED (listed as equivalent for an "
                   "earlier version of its function: read it again)" if name in eq else "SURVIVED")
            print(f"\n{tag}: {name}\n" + "\n".join(change))


def row(name: str, c: Counter, n: int) -> str:
    killed, lived, eq = c["killed"], c["survived"], c["equivalent"]
    score = f"{killed / (killed + lived):.1%}" if killed + lived else ""
    strict = f"{killed / (killed + lived - eq):.1%}" if killed + lived - eq else ""
    return f"| {name} | {n} | {killed} | {lived} | {eq} | {c['no tests']} | {score} | {strict} |"


if __name__ == "__main__":
    main()
