"""Mutation testing with mutmut: one command for all of it, results in results/cpu/mutation.json.

    python scripts/mutation.py run                                     # every module of [tool.mutmut] only_mutate
    python scripts/mutation.py run --module minispec/decoding/stats.py # one module (repeat --module for more)
    python scripts/mutation.py run --module minispec/drafts/eagle.py --sample 0.4 --seed 1   # a uniform sample
    python scripts/mutation.py run --max-children 1 --minutes 90       # one core; stop after 90 min (run it again
                                                                       # to resume where it stopped)
    python scripts/mutation.py run --module minispec/drafts/tree.py --rerun-survivors   # after new tests: the
                                                                       # module's survivors again, at HEAD (not
                                                                       # those listed as equivalent)
    python scripts/mutation.py survivors [--module ...]                # each survivor's change, for triage
    python scripts/mutation_report.py                                  # results/cpu/mutation.md from the JSON

**What runs.** A commit, not the working tree: ``run`` exports HEAD (or ``--commit``) with ``git archive`` into
``mutants/tree/`` and runs mutmut there, so other people's uncommitted edits never reach a run and every verdict
names the commit it ran on (``mutants/tree/ran_on.json``, per mutant). A later ``run`` at a newer commit updates
that export in place; mutmut's own bookkeeping then resets the mutants of every function whose source changed, and
only those (and the ones not yet run) run again. ``--fresh`` starts over.

**Which mutants.** mutmut's, all of them. One class is counted in the ``device`` column and not run: a call in
torch's namespace whose ``device=`` keyword is replaced by None or dropped (``torch.zeros(n, device=x.device)`` ->
``torch.zeros(n)``). The device then defaults to torch's, the CPU, where every tensor already is on this CPU-only
machine, so such a mutant cannot fail a test here, and no GPU test reaches the EAGLE or engine paths to show it
elsewhere; it is counted, not dropped. Every other device argument (positional, ``.to(x.device)``, minispec's own
functions') is a mutant like any. ``--sample F --seed N`` runs a uniform random sample of a fraction F of each
module's other mutants (mutant sampling: Gopinath et al. 2015, Papadakis et al. 2019's survey): a mutant is in the
sample when its rank by a hash of (seed, name) is below ceil(F x N), so the sample is fixed by the seed and a later
edit of one function changes only that function's members. Modules with at most ``--full-below`` mutants (default
150) run in full.

**Statuses.** Every exit status mutmut gives is counted in one column (killed, survived, timeout, no_tests,
suspicious, skipped, interrupted, segfault, type_check), plus ``not_run`` for sampled mutants without a verdict
yet. A survivor listed in scripts/mutation_equivalent.txt (matched by the hash of its function and its change, so an
edit of the function makes the entry stale instead of marking another mutant) is counted as ``equivalent`` too.
Score = (killed + timeout) / (killed + timeout + survived - equivalent + no_tests), with a Wilson 95 % interval.

This file is the one place that reads mutmut's private modules (mutmut.__main__, mutmut.stats, the ``.meta`` and
``.spans`` files it writes); it refuses any mutmut but the version pinned below.
"""

from __future__ import annotations

import argparse
import ast
import copy
import difflib
import hashlib
import io
import json
import math
import os
import platform
import shutil
import signal
import subprocess
import sys
import tarfile
import textwrap
import time
from datetime import datetime, timezone
from importlib.metadata import version
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]
WORK = ROOT / "mutants" / "tree"  # the exported commit; mutmut's own folder is WORK / "mutants"
RESULT = ROOT / "results" / "cpu" / "mutation.json"
EQUIVALENT = ROOT / "scripts" / "mutation_equivalent.txt"
EXTRA_TESTS = ROOT / "scripts" / "mutation_tests.txt"
RECORD_EVERY_S = 600  # a running run rewrites the JSON this often
MUTMUT = "3.8.1"  # the dev extra pins it: the private names below are this version's
EXPORTED = ("minispec", "tests", "pyproject.toml")  # what the tests need of a commit
STATUSES = {"killed": "killed", "survived": "survived", "timeout": "timeout", "no tests": "no_tests",
            "suspicious": "suspicious", "skipped": "skipped", "check was interrupted by user": "interrupted",
            "segfault": "segfault", "caught by type check": "type_check"}  # mutmut's status names -> the JSON's


# --- mutmut's private interface: everything this project reads of mutmut's internals is in this section ----------

def check_mutmut() -> None:
    if version("mutmut") != MUTMUT:
        sys.exit(f"scripts/mutation.py reads mutmut {MUTMUT}'s private modules; found mutmut {version('mutmut')}: "
                 f"pip install mutmut=={MUTMUT} (the dev extra pins it)")


def status_of(code: int | None) -> str | None:
    """The JSON column of a mutmut exit code; None: not run yet. An unknown status stops the script."""
    if code is None:
        return None
    from mutmut.stats import status_by_exit_code

    name = status_by_exit_code[code]
    if name not in STATUSES:
        raise SystemExit(f"mutmut status {name!r} (exit code {code}) has no column in scripts/mutation.py")
    return STATUSES[name]


def read_meta(work: Path, module: str) -> dict:
    """mutmut's record of one module: exit_code_by_key, hash_by_function_name, durations_by_key, ..."""
    path = work / "mutants" / (module + ".meta")
    return json.loads(path.read_text()) if path.exists() else {}


def reset_verdicts(work: Path, module: str, names: set[str]) -> None:
    """Forget the verdicts of ``names`` (to rerun them and know afterwards which ran)."""
    path = work / "mutants" / (module + ".meta")
    meta = json.loads(path.read_text())
    for name in names:
        meta["exit_code_by_key"][name] = None
    path.write_text(json.dumps(meta, indent=4))


def function_sources(work: Path, module: str, names: list[str]) -> list[str]:
    """The source of generated functions (a mutant, or ``<function>__mutmut_orig``) out of mutmut's mutated copy of
    ``module``, through the line index mutmut writes beside it."""
    spans = json.loads((work / "mutants" / (module + ".spans")).read_text())
    if spans.get("version") != 1:
        raise SystemExit(f"unknown mutmut span index version in {module}.spans")
    lines = (work / "mutants" / module).read_text().splitlines(keepends=True)
    out = []
    for name in names:
        start, end = spans["spans"][name]
        out.append("".join(lines[start - 1: end]))
    return out


def function_of(name: str) -> str:
    """A mutant's key (``minispec.x.y.xǁClassǁmethod__mutmut_3``) -> its function's mangled name."""
    return name.rpartition(".")[2].rpartition("__mutmut_")[0]


def generate(max_children: int) -> None:
    """mutmut's mutant generation (the first part of ``mutmut run``), in the current folder."""
    from mutmut.__main__ import (
        copy_also_copy_files,
        copy_src_dir,
        create_mutants,
        setup_source_paths,
        store_lines_covered_by_tests,
    )

    os.makedirs("mutants", exist_ok=True)
    copy_src_dir()
    copy_also_copy_files()
    setup_source_paths()
    store_lines_covered_by_tests()
    create_mutants(max_children)


def run_mutants(names: list[str], max_children: int) -> None:
    """``mutmut run NAMES``: the named mutants, whatever verdicts they had. Each mutant's tests run quickest first
    (mutmut passes them in a set's order): a killed mutant then costs its quickest failing test, not a 30-second
    statistical test that happened to come first. pytest runs node ids in the order given. mutmut's map from
    functions to tests gets :data:`EXTRA_TESTS`' tests added (:func:`extra_tests`)."""
    import mutmut.__main__ as main
    from mutmut.__main__ import _run, get_module_from_key, mangled_name_from_mutant_name
    from mutmut.state import state
    from mutmut.workers.isolation import ForkServerRunner

    collect, extra = main.collect_or_load_stats, extra_tests()

    def collect_then_add(*args, **kwargs):
        collect(*args, **kwargs)
        took = state().duration_by_test  # an extra test outside the selection has no time: the longest is assumed
        longest = max(took.values(), default=1.0)  # (a generous time limit, never a false timeout; it runs last)
        for test in set().union(*extra.values()):
            took.setdefault(test, longest)
        for name in names:
            module = get_module_from_key(name).replace(".", "/") + ".py"
            state().tests_by_mangled_function_name[mangled_name_from_mutant_name(name)] |= extra.get(module, set())

    main.collect_or_load_stats = collect_then_add
    submit = ForkServerRunner.submit

    def quickest_first(self, mutant_name, tests, cpu_time_limit, estimated_time):
        took = state().duration_by_test
        return submit(self, mutant_name, sorted(tests, key=lambda t: (took.get(t, 0.0), t)), cpu_time_limit,
                      estimated_time)

    ForkServerRunner.submit = quickest_first
    _run(names, max_children)


# --- which mutants: device arguments, the sample ---------------------------------------------------------------

def extra_tests() -> dict[str, set[str]]:
    """{module: tests} from :data:`EXTRA_TESTS`: tests that reach every function of a module but that mutmut's map
    may not name. mutmut maps a function to the tests during which it ran, so a model or a draft built once by a
    cached or module-scoped fixture is mapped to the first test that built it, and a mutant of its construction is
    then tested against that test alone; the file also names tests outside ``pytest_add_cli_args_test_selection``.
    Extra tests only add chances to fail: a kill they give is a real failing test."""
    out = {}
    for line in EXTRA_TESTS.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            module, *tests = line.split()
            out.setdefault(module, set()).update(tests)
    return out


def torch_call(call: ast.Call) -> bool:
    """A call of a function in torch's namespace: ``torch.zeros(...)``, ``torch.nn.functional.pad(...)``."""
    f = call.func
    while isinstance(f, ast.Attribute):
        f = f.value
    return isinstance(f, ast.Name) and f.id == "torch" and isinstance(call.func, ast.Attribute)


def device_variants(source: str) -> set[str]:
    """ast.dump of every version of a function that mutmut's argument mutation makes from the ``device=`` keyword of
    a call in torch's namespace (replaced by None, or dropped from a call of two or more arguments): the device then
    defaults to torch's default, the CPU, which on this CPU-only machine is where every tensor is. Other device
    arguments (a positional one, ``.to(x.device)``, minispec's own functions' ``device``) are mutants like any."""
    tree = ast.parse(textwrap.dedent(source))
    tree.body[0].name = "f"
    out = set()
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)]
    for k, call in enumerate(calls):
        if not torch_call(call):
            continue
        for i, item in enumerate(call.keywords):
            if item.arg != "device":
                continue
            for drop in (False, True):
                if drop and len(call.args) + len(call.keywords) < 2:
                    continue
                copied = copy.deepcopy(tree)
                target = [n for n in ast.walk(copied) if isinstance(n, ast.Call)][k]
                if drop:
                    del target.keywords[i]
                else:
                    target.keywords[i].value = ast.Constant(None)
                out.add(ast.dump(copied))
    return out


def normalised(source: str) -> str:
    tree = ast.parse(textwrap.dedent(source))
    tree.body[0].name = "f"
    return ast.dump(tree)


def change(orig: str, mutant: str, orig_name: str, mutant_name: str) -> list[str]:
    """The lines a mutant changes: '-' the original's, '+' the mutant's (the generated names made the same)."""
    a, b = orig.splitlines(), mutant.replace(mutant_name + "(", orig_name + "(").splitlines()
    return [line.rstrip() for line in difflib.unified_diff(a, b, lineterm="", n=0)
            if line[:1] in "+-" and line[:3] not in ("+++", "---")]


def fingerprint(function_hash: str, lines: list[str]) -> str:
    """An equivalent-list key: the function as mutmut hashed it, and the mutant's change."""
    return hashlib.sha256((function_hash + "\n" + "\n".join(lines)).encode()).hexdigest()[:12]


def rank(seed: int, name: str) -> str:
    return hashlib.sha256(f"{seed}:{name}".encode()).hexdigest()


def sample(names: list[str], fraction: float, seed: int) -> list[str]:
    """A uniform random sample of ceil(fraction x n) names: those first in the order of a hash of (seed, name)."""
    k = math.ceil(fraction * len(names))
    return sorted(sorted(names, key=lambda n: rank(seed, n))[:k])


def module_key(module: str) -> str:
    return module.removesuffix(".py").replace("/", ".")


# --- the plan and the run (inside the export) ------------------------------------------------------------------

def describe(work: Path, module: str) -> dict:
    """Per mutant of ``module``: whether it is a device mutant, its change and its fingerprint."""
    meta = read_meta(work, module)
    keys = sorted(meta.get("exit_code_by_key", {}))
    functions = sorted({function_of(k) for k in keys})
    origs = dict(zip(functions, function_sources(work, module, [f + "__mutmut_orig" for f in functions])))
    variants = {f: device_variants(src) for f, src in origs.items()}
    sources = dict(zip(keys, function_sources(work, module, [k.rpartition(".")[2] for k in keys])))
    out = {}
    for k in keys:
        f = function_of(k)
        lines = change(origs[f], sources[k], f + "__mutmut_orig", k.rpartition(".")[2])
        out[k] = {"device": normalised(sources[k]) in variants[f], "change": lines,
                  "fingerprint": fingerprint(meta["hash_by_function_name"].get(f, ""), lines)}
    return out


def child(args) -> None:
    """In the export: generate, plan each module's mutants, run those without a verdict (and the survivors again with
    --rerun-survivors), and note the commit each one ran on."""
    commit = (WORK / "COMMIT").read_text().strip()
    os.chdir(WORK)
    generate(args.max_children)
    plan_path, ran_path = WORK / "plan.json", WORK / "ran_on.json"
    plans = json.loads(plan_path.read_text()) if plan_path.exists() else {}
    ran_on = json.loads(ran_path.read_text()) if ran_path.exists() else {}
    todo, reset, listed = [], {}, equivalent_list()
    for module in args.modules:
        described = describe(WORK, module)
        device = sorted(k for k, d in described.items() if d["device"])
        population = sorted(k for k, d in described.items() if not d["device"])
        full = args.sample >= 1 or len(population) <= args.full_below
        chosen = population if full else sample(population, args.sample, args.seed)
        plans[module] = {"generated": len(described), "device": device, "fraction": None if full else args.sample,
                         "seed": None if full else args.seed, "sample": chosen}
        codes = read_meta(WORK, module)["exit_code_by_key"]
        again = {k for k in chosen if args.rerun_survivors and status_of(codes[k]) in ("survived", "no_tests")
                 and described[k]["fingerprint"] not in listed}  # a listed one has its reason: not rerun; a mutant
        #   with no test may have one now (scripts/mutation_tests.txt)
        reset[module] = again
        todo += [k for k in chosen if codes[k] is None or k in again]
        print(f"{module}: {len(described)} mutants ({len(device)} device), {len(chosen)} in the plan, "
              f"{sum(codes[k] is None for k in chosen)} without a verdict, {len(again)} survivors to rerun",
              flush=True)
    plan_path.write_text(json.dumps(plans, indent=1))
    for module, names in reset.items():
        if names:
            reset_verdicts(WORK, module, names)
    # every name to run has no verdict now (reruns were reset above), so any verdict it gets comes from this commit
    ran_path.write_text(json.dumps(ran_on | dict.fromkeys(todo, commit), indent=0))
    start = time.time()
    try:
        if todo:
            run_mutants(todo, args.max_children)
    except KeyboardInterrupt:
        print("stopped: run the same command again to resume", flush=True)
    finally:
        with open(WORK / "log.jsonl", "a") as log:
            log.write(json.dumps({"commit": commit, "modules": args.modules, "mutants": len(todo),
                                  "max_children": args.max_children, "seconds": round(time.time() - start),
                                  "end": datetime.now(timezone.utc).isoformat(timespec="seconds")}) + "\n")


# --- the parent: export, launch, record --------------------------------------------------------------------------

def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, check=True, capture_output=True, text=True).stdout.strip()


def export(commit: str, fresh: bool) -> None:
    """The commit's package, tests and pyproject.toml in WORK (mutmut's folder kept unless ``fresh``)."""
    if fresh and WORK.exists():
        shutil.rmtree(WORK)
    WORK.mkdir(parents=True, exist_ok=True)
    if (WORK / "COMMIT").exists() and (WORK / "COMMIT").read_text().strip() == commit:
        return prune()
    for part in EXPORTED:
        path = WORK / part
        shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
    data = subprocess.run(["git", "archive", "--format=tar", commit, *EXPORTED], cwd=ROOT, check=True,
                          capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(WORK, filter="data")
        now = time.time()  # mutmut regenerates a module's mutants only if its source is newer than them, and git
        for member in tar.getmembers():  # archive dates files by the commit: an older commit would look unchanged
            if member.isfile():
                os.utime(WORK / member.name, (now, now))
    (WORK / "COMMIT").write_text(commit + "\n")
    prune()
    print(f"exported {commit[:12]} to {WORK.relative_to(ROOT)}", flush=True)


def prune() -> None:
    """Drop from mutmut's copy what the exported commit does not have: mutmut copies files but deletes none, and a
    test file left from another commit would still be collected (and a module's records with it)."""
    copied = WORK / "mutants"
    for path in sorted(copied.glob("*/**/*"), reverse=True) if copied.exists() else []:
        if path.is_file() and path.relative_to(copied).parts[0] in ("minispec", "tests") \
                and "__pycache__" not in path.parts:
            source = WORK / str(path.relative_to(copied)).removesuffix(".meta").removesuffix(".spans")
            if not source.exists():
                path.unlink()


def configured(work: Path) -> dict:
    return tomllib.loads((work / "pyproject.toml").read_text())["tool"]["mutmut"]


def run(args) -> None:
    commit = git("rev-parse", args.commit or "HEAD")
    export(commit, args.fresh)
    cfg = configured(WORK)
    modules = args.module or cfg["only_mutate"]
    unknown = [m for m in modules if m not in cfg["only_mutate"]]
    if unknown:
        sys.exit(f"{unknown} not in [tool.mutmut] only_mutate at {commit[:12]}: add them there first")
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", HF_HUB_OFFLINE="1")  # a child: one core
    deadline = time.time() + args.minutes * 60 if args.minutes else math.inf
    # One mutmut run for all the modules: mutmut checks that their tests pass unmutated once per run (a full run of
    # the selection, the costliest fixed part), then tests the mutants quickest first; the JSON is rewritten every
    # few minutes, so a stopped run leaves its verdicts recorded.
    cmd = [sys.executable, str(Path(__file__).resolve()), "_child", "--modules", *modules, "--sample",
           str(args.sample), "--seed", str(args.seed), "--full-below", str(args.full_below), "--max-children",
           str(args.max_children)] + (["--rerun-survivors"] if args.rerun_survivors else [])
    print(f"mutmut {MUTMUT} at {commit[:12]} over {len(modules)} modules, {args.max_children} children; log: "
          f"{(WORK / 'run.log').relative_to(ROOT)}", flush=True)
    start = time.time()
    with open(WORK / "run.log", "a") as out:
        proc = subprocess.Popen(cmd, cwd=WORK, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)  # its own process group: mutmut's workers stop with it
        while True:
            try:
                proc.wait(timeout=max(1.0, min(RECORD_EVERY_S, deadline - time.time())))
                break
            except subprocess.TimeoutExpired:
                if time.time() >= deadline:
                    print("time is up: stopping (run the same command again to resume)", flush=True)
                    stop(proc)
                    break
                if (WORK / "plan.json").exists():
                    record(modules, quiet=True)
            except KeyboardInterrupt:
                stop(proc)
                break
    print(f"{time.time() - start:.0f} s", flush=True)
    record(modules)
    if proc.returncode not in (0, -signal.SIGINT, -signal.SIGTERM, 130):
        sys.exit(f"mutmut stopped with exit code {proc.returncode}: see {WORK / 'run.log'}")


def stop(proc: subprocess.Popen) -> None:
    """mutmut stops on SIGINT between mutants (each verdict is saved as it comes); in its unmutated check it may not
    answer, so after a minute its whole process group is terminated."""
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait()


def wilson(k: int, n: int, z: float = 1.96) -> list[float] | None:
    """Wilson's 95 % score interval for k successes in n (no finite-population correction: conservative)."""
    if n == 0:
        return None
    p = k / n
    centre, half = p + z * z / (2 * n), z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return [round((centre - half) / (1 + z * z / n), 4), round((centre + half) / (1 + z * z / n), 4)]


def equivalent_list() -> dict[str, tuple[str, str]]:
    """fingerprint -> (mutant name when listed, reason), from scripts/mutation_equivalent.txt."""
    out = {}
    for line in EQUIVALENT.read_text().splitlines() if EQUIVALENT.exists() else []:
        if line.strip() and not line.startswith("#"):
            head, _, why = line.partition("#")
            name, digest = head.split()
            out[digest.removeprefix("@")] = (name, why.strip())
    return out


def summarise(module: str, plan: dict, meta: dict, described: dict, ran_on: dict, eq: dict) -> dict:
    codes = meta["exit_code_by_key"]
    chosen = plan["sample"]
    counts = dict.fromkeys(list(STATUSES.values()) + ["not_run"], 0)
    for k in chosen:
        counts[status_of(codes.get(k)) or "not_run"] += 1
    survivors = [k for k in chosen if status_of(codes.get(k)) == "survived"]
    listed = {k: eq[described[k]["fingerprint"]][1] for k in survivors if described[k]["fingerprint"] in eq}
    commits = {}
    for k in chosen:
        if codes.get(k) is not None:
            c = ran_on.get(k, "unknown")
            commits[c] = commits.get(c, 0) + 1
    detected = counts["killed"] + counts["timeout"]
    scored = detected + counts["survived"] - len(listed) + counts["no_tests"]
    entry = {"commit": max(commits, key=commits.get) if commits else None}
    if len(commits) > 1:
        entry["commits"] = commits  # mutants per commit they ran on (survivors rerun after new tests, ...)
    entry["generated"] = plan["generated"]
    entry["device"] = len(plan["device"])
    if plan["fraction"] is not None:
        entry.update(sampled=len(chosen), fraction=plan["fraction"], seed=plan["seed"])
    entry["run"] = len(chosen) - counts["not_run"]
    entry.update((k, v) for k, v in counts.items() if k not in ("survived",))
    entry["survived"] = counts["survived"]
    entry["equivalent"] = len(listed)
    entry["score"] = round(detected / scored, 4) if scored else None
    entry["ci95"] = wilson(detected, scored)
    entry["mutant_seconds"] = round(sum(v for k, v in meta.get("durations_by_key", {}).items() if k in chosen))
    entry["survivors"] = [{"name": k, "change": described[k]["change"], "equivalent": listed.get(k)}
                          for k in survivors]
    entry["untested"] = [{"name": k, "change": described[k]["change"]} for k in chosen
                         if status_of(codes.get(k)) == "no_tests"]  # in code no selected test runs
    return entry


def record(modules: list[str] | None = None, quiet: bool = False) -> None:
    """Write the modules' entries of results/cpu/mutation.json from the export's mutmut folder (a running mutmut
    may be writing a module's record: then it is read again)."""
    for _attempt in range(5):
        try:
            return _record(modules, quiet)
        except json.JSONDecodeError:
            time.sleep(1)
    _record(modules, quiet)


def _record(modules: list[str] | None, quiet: bool) -> None:
    plans = json.loads((WORK / "plan.json").read_text())
    ran_on = json.loads((WORK / "ran_on.json").read_text()) if (WORK / "ran_on.json").exists() else {}
    data = json.loads(RESULT.read_text()) if RESULT.exists() else {}
    eq = equivalent_list()
    data["about"] = ("scripts/mutation.py run; each module's commit is the one its mutants ran on (commits: "
                     "how many ran on each, where more than one); the top-level commit is the checkout that wrote "
                     "this file; results/cpu/mutation.md is rendered from it by scripts/mutation_report.py")
    data["commit"] = git("rev-parse", "HEAD")
    data["mutmut"], data["python"] = MUTMUT, platform.python_version()
    data["machine"] = f"{os.cpu_count()} CPU cores, {platform.machine()}, no GPU"
    data["configured"] = configured(WORK)["only_mutate"]
    data["tests"] = configured(WORK)["pytest_add_cli_args_test_selection"]
    data.setdefault("modules", {})
    for module in modules or sorted(plans):
        meta = read_meta(WORK, module)  # empty where mutmut's record is not in this checkout (mutants/ is not in git)
        described = describe(WORK, module) if meta else {}
        entry = summarise(module, plans[module], meta, described, ran_on, eq) if meta else None
        if entry is None or (entry["run"] == 0 and data["modules"].get(module, {}).get("run")):  # none ran here
            if not quiet:
                print(f"{module}: no mutant has run here; its entry in {RESULT.name} is kept")
            continue
        seen = {d["fingerprint"] for d in described.values()}
        stale = [name for digest, (name, _) in eq.items() if name.startswith(module_key(module) + ".")
                 and digest not in seen]
        if stale:
            entry["stale_equivalent"] = stale  # listed for a function or change that is gone: re-triage
        data["modules"][module] = entry
        if not quiet:
                print(f"{module}: {entry['run']} run of {entry.get('sampled', entry['generated'] - entry['device'])}, "
                  f"killed {entry['killed']}, survived {entry['survived']} ({entry['equivalent']} equivalent), "
                  f"score {entry['score']} {entry['ci95']}" + (f"; STALE equivalent entries: {stale}" if stale else ""))
    data["modules"] = dict(sorted(data["modules"].items()))
    RESULT.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n")


def survivors(args) -> None:
    data = json.loads(RESULT.read_text())
    for module, e in data["modules"].items():
        if args.module and module not in args.module:
            continue
        for s in e["survivors"]:
            tag = f"EQUIVALENT ({s['equivalent']})" if s["equivalent"] else "SURVIVED"
            print(f"\n{tag}: {s['name']}  @{fingerprint_of(module, s['name'])}\n" + "\n".join(s["change"]))


def fingerprint_of(module: str, name: str) -> str:
    return describe(WORK, module)[name]["fingerprint"]


def main() -> None:
    check_mutmut()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="run mutmut over the modules (all of [tool.mutmut] only_mutate by default)")
    r.add_argument("--module", action="append", help="a module path, e.g. minispec/decoding/stats.py (repeatable)")
    r.add_argument("--sample", type=float, default=1.0, help="fraction of each module's mutants to run (default 1)")
    r.add_argument("--seed", type=int, default=0, help="the sample's seed")
    r.add_argument("--full-below", type=int, default=150, help="modules with at most this many mutants run in full")
    r.add_argument("--max-children", type=int, default=1, help="mutants tested at once (one core each)")
    r.add_argument("--minutes", type=float, help="stop after this long (resume by running the command again)")
    r.add_argument("--commit", help="the commit to run on (default HEAD)")
    r.add_argument("--fresh", action="store_true", help="discard mutants/tree and start over")
    r.add_argument("--rerun-survivors", action="store_true",
                   help="run the modules' survivors and mutants without a test again (not those listed as equivalent)")
    s = sub.add_parser("survivors", help="each survivor's change, from results/cpu/mutation.json")
    s.add_argument("--module", action="append")
    sub.add_parser("record", help="rewrite results/cpu/mutation.json from mutants/tree")
    c = sub.add_parser("_child")  # internal: inside the export
    c.add_argument("--modules", nargs="+")
    for name, kind in (("--sample", float), ("--seed", int), ("--full-below", int), ("--max-children", int)):
        c.add_argument(name, type=kind)
    c.add_argument("--rerun-survivors", action="store_true")
    args = ap.parse_args()
    {"run": run, "survivors": survivors, "record": lambda a: record(), "_child": child}[args.command](args)


if __name__ == "__main__":
    main()
