"""results/cpu/mutation.md from results/cpu/mutation.json, and from nothing else.

    python scripts/mutation.py run ...        # writes each module's entry of the JSON as it finishes
    python scripts/hand_mutants.py --record   # writes the hand-made wrong versions' entry
    python scripts/mutation_report.py         # this: the report (--check: fail if the committed one differs)

Score = (killed + timeout) / (killed + timeout + survived - equivalent + no tests): a timeout counts as killed (the
mutant made a test hang), a mutant no selected test reaches counts as missed, a survivor listed as equivalent (with
its reason) counts as neither. Where a module ran a sample, the interval is Wilson's 95 % score interval for the
module's score from that sample.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
JSON = ROOT / "results" / "cpu" / "mutation.json"
REPORT = ROOT / "results" / "cpu" / "mutation.md"
OTHER = ("suspicious", "skipped", "interrupted", "segfault", "type_check")


def pct(x: float | None) -> str:
    return "" if x is None else f"{100 * x:.1f}%"


def command(module: str, e: dict) -> str:
    sample = f" --sample {e['fraction']} --seed {e['seed']}" if "fraction" in e else ""
    return f"python scripts/mutation.py run --module {module}{sample}"


def render(data: dict) -> str:
    mods = data.get("modules", {})
    total = {k: sum(e.get(k, 0) for e in mods.values()) for k in
             ("generated", "device", "run", "killed", "timeout", "survived", "equivalent", "no_tests", "not_run")}
    commits = sorted({c for e in mods.values() for c in (e.get("commits") or {e["commit"]: 1}) if c})
    out = [
        "# Mutation testing",
        "",
        f"Rendered by `scripts/mutation_report.py` from `results/cpu/mutation.json` (written by "
        f"`scripts/mutation.py`): mutmut {data.get('mutmut')}, Python {data.get('python')}, {data.get('machine')}. "
        f"Each module ran on the commit named in its row (one exported with `git archive`, never a working tree), "
        f"each mutant in a process of its own with one torch thread, one or two at a time (`--max-children`). Tests: "
        + ", ".join(f"`{t}`" for t in data.get("tests", [])) + ", less the slow ones; each mutant runs the tests "
        "that reach its function, quickest first, stopping at the first failure.",
        "",
        f"**What ran:** {len(mods)} of the {len(data.get('configured', []))} configured modules; "
        f"{total['run']} mutants run of {total['generated']} generated in those modules "
        f"({total['device']} device-keyword mutants counted apart, not run; the rest sampled where the row says). "
        f"Commits: {', '.join(c[:12] for c in commits)}.",
        "",
        "| module | commit | generated | device | sampled | run | killed | timeout | survived | of which equivalent "
        "| no tests | other | not run | score | 95% interval |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for module, e in mods.items():
        commit = e["commit"][:12] if e.get("commit") else ""
        if e.get("commits"):
            commit += " (" + ", ".join(f"{n} on {c[:12]}" for c, n in e["commits"].items()) + ")"
        sampled = f"{e['sampled']} ({e['fraction']:.0%}, seed {e['seed']})" if "fraction" in e else "all"
        other = ", ".join(f"{e[k]} {k}" for k in OTHER if e.get(k)) or "0"
        ci = f"{pct(e['ci95'][0])}-{pct(e['ci95'][1])}" if e.get("ci95") else ""
        out.append(f"| {module} | {commit} | {e['generated']} | {e['device']} | {sampled} | {e['run']} | "
                   f"{e['killed']} | {e['timeout']} | {e['survived']} | {e['equivalent']} | {e['no_tests']} | "
                   f"{other} | {e['not_run']} | {pct(e['score'])} | {ci} |")
    missing = [m for m in data.get("configured", []) if m not in mods]
    if missing:
        out += ["", "**Not run yet** (configured, no result in the JSON): " + ", ".join(f"`{m}`" for m in missing)
                + "."]
    out += ["", "Each row's command (resumable; `--minutes N` stops it in time):", "", "```"]
    out += [command(m, e) for m, e in mods.items()] + ["python scripts/mutation_report.py", "```"]
    hand = data.get("hand_mutants")
    if hand:
        out += ["", "## Wrong versions made by hand (`scripts/hand_mutants.py`)", "",
                f"At {hand['commit'][:12]}: each is applied as a textual patch to a copy of the package and the tests "
                "named with it run there; each must fail one.", "", "| wrong version | file | tests that fail |",
                "| --- | --- | --- |"]
        for name, h in hand["mutants"].items():
            fails = "<br>".join(f"`{t}`" for t in h["fails"]) if h["fails"] else "**none: survived**"
            out.append(f"| {name} | `{h['file']}` | {fails} |")
    out += ["", "## Survivors", ""]
    for module, e in mods.items():
        if not e["survivors"] and not e.get("stale_equivalent"):
            continue
        out += [f"### {module}", ""]
        for s in e["survivors"]:
            tag = f"equivalent: {s['equivalent']}" if s["equivalent"] else "**survived: no test yet**"
            out += [f"`{s['name']}` ({tag})", "", "```diff", *s["change"], "```", ""]
        if e.get("stale_equivalent"):
            out += ["Stale entries in scripts/mutation_equivalent.txt (function or change gone; re-triage): "
                    + ", ".join(f"`{n}`" for n in e["stale_equivalent"]), ""]
    return "\n".join(out).rstrip() + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if results/cpu/mutation.md is not the rendering")
    args = ap.parse_args()
    text = render(json.loads(JSON.read_text()))
    if args.check:
        sys.exit(0 if REPORT.exists() and REPORT.read_text() == text else f"{REPORT} is not rendered from {JSON}")
    REPORT.write_text(text)
    print(f"wrote {REPORT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
