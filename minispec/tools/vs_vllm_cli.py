"""``minispec vs-vllm``'s command line: its flags turned into a checked config before any work starts.

:func:`cli_config` checks them, :func:`from_args` runs them (:mod:`minispec.tools.vs_vllm` does the work), and
:func:`redraw` draws a finished run's table and plot again from its .jsonl.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

from minispec.drafts.lookup import PromptLookupDraft
from minispec.model.load import resolve
from minispec.roofline.policy import BatchTablePolicy
from minispec.tools import vs_vllm_report as report
from minispec.tools.vllm_side import VllmSettings, available
from minispec.tools.vs_vllm import QUICK, RATES, VsConfig, run
from minispec.tools.vs_vllm_workload import LENGTHS, roofline_inputs


def config_from_meta(meta: dict) -> VsConfig:
    """The VsConfig a run's metadata records (its JSON lists back as tuples)."""
    d = dict(meta["config"])
    tup = lambda v: tuple(map(tup, v)) if isinstance(v, list) else v  # noqa: E731
    d = {k: ({w: tup(x) for w, x in v.items()} if isinstance(v, dict) and k != "vllm" else tup(v))
         for k, v in d.items()}
    older = {"numba": "default"}  # a record made before VllmSettings.numba ran vLLM on numba's default layer
    return VsConfig(**d | {"vllm": VllmSettings(**older | d["vllm"])})


def redraw(path: str | Path) -> str:
    """The table and plot of a finished run again, from its .jsonl (e.g. where matplotlib is installed). A run
    recorded before the roofline lines existed gets them from a calibration made now, and the report says so."""
    rows, meta = report.read(path)
    cfg = config_from_meta(meta)
    if "roofline" not in meta:
        meta["roofline"] = roofline_inputs(cfg, f"calibrated when redrawn, {time.strftime('%Y-%m-%d')}, not during "
                                                "the run")
    report.write(rows, cfg, meta, Path(path).with_suffix(""), meta.get("k_table"))
    return report.text(rows, cfg, meta)


def cli_config(args) -> tuple[VsConfig, str]:
    """The parsed flags as a config and the output prefix; everything is checked here, before any work."""
    def floats(text: str, flag: str, n: int | None = None) -> tuple[float, ...]:
        try:
            values = tuple(float(x) for x in text.split(",") if x.strip())
        except ValueError:
            values = ()
        if not values or (n is not None and len(values) != n) or not all(math.isfinite(v) for v in values):
            raise ValueError(f"{flag} takes {n or 'some'} comma-separated numbers, got {text!r}")
        return values

    kw = dict(QUICK) if args.quick else {}
    if args.workloads is not None:
        kw["workloads"] = tuple(x.strip() for x in args.workloads.split(","))
    for flag, key in (("rates_smollm2", "smollm2"), ("rates_pair", "pair")):
        if getattr(args, flag) is not None:
            flag_name = "--" + flag.replace("_", "-")
            kw["rates"] = dict(kw.get("rates") or {}) | {key: floats(getattr(args, flag), flag_name)}
    slo = {k: (lambda v: (v[0], v[1] / 1e3))(floats(getattr(args, f"slo_{k}"), f"--slo-{k}", 2))
           for k in ("smollm2", "pair") if getattr(args, f"slo_{k}") is not None}
    lengths = {}
    for k in ("smollm2", "pair"):
        if getattr(args, f"lengths_{k}") is not None:
            v = floats(getattr(args, f"lengths_{k}"), f"--lengths-{k}", 4)
            if any(x != int(x) for x in v):
                raise ValueError(f"--lengths-{k} takes whole token counts, got {getattr(args, f'lengths_{k}')!r}")
            lengths[k] = ((int(v[0]), int(v[1])), (int(v[2]), int(v[3])))
    for key, value in (("seeds", args.seeds and tuple(int(s) for s in floats(args.seeds, "--seeds"))),
                       ("window_s", args.window), ("bisect", args.bisect), ("slo", slo or None),
                       ("lengths", lengths or None),
                       ("static_batches", args.static and tuple(int(b) for b in floats(args.static, "--static"))),
                       ("static_repeat", args.repeat),
                       ("exclude", args.exclude and floats(args.exclude, "--exclude", 2))):
        if value is not None:
            kw[key] = value
    if args.requests is not None:
        kw["min_requests"], kw["max_requests"] = (int(x) for x in floats(args.requests, "--requests", 2))
    if args.k_table is not None:
        if args.k_table not in ("measure", "none") and not Path(args.k_table).is_file():
            raise ValueError(f"--k-table {args.k_table}: no such file (or measure, or none)")
        if args.k_table not in ("measure", "none"):
            try:
                BatchTablePolicy.from_config(json.loads(Path(args.k_table).read_text()))
            except (ValueError, KeyError, TypeError) as e:
                raise ValueError(f"--k-table {args.k_table}: not vLLM's speculative-config keys ({e})") from None
        kw["k_table"] = None if args.k_table == "none" else args.k_table
    threads = args.threads or 1
    vllm_threads = threads if args.vllm_threads is None else args.vllm_threads
    cfg = VsConfig(engines=tuple(x.strip() for x in args.engines.split(",")), gamma=args.gamma,
                   ngram=tuple(int(x) for x in floats(args.ngram, "--ngram", 2)), lookup_rule=args.lookup_rule,
                   temperature=args.temperature, realtime=args.realtime, threads=threads, prepack=args.prepack,
                   compile=args.compile,
                   vllm=VllmSettings(vllm_threads, args.vllm_omp, args.vllm_bind, not args.vllm_compile,
                                     args.vllm_numba), **kw)
    PromptLookupDraft(*cfg.ngram, rule=cfg.lookup_rule)  # raises where the rule is unknown
    if "smollm2" in cfg.workloads:
        resolve("smollm2-135m-instruct")  # raises, naming `minispec fetch smollm2`, when it is missing
    if "vllm" in cfg.engines and (why := available()) is not None:
        raise ValueError(why + " (or pass --engines minispec)")
    out = args.out or ("results/cpu/vs_vllm_quick" if args.quick else "results/cpu/vs_vllm")
    return cfg, out


def add_arguments(p) -> None:
    """``minispec vs-vllm``'s flags (the command line adds --threads: minispec's torch threads, and vLLM's worker
    threads unless --vllm-threads says otherwise)."""
    p.add_argument("--quick", action="store_true", help="the embedded pair only, rates 4 and 16, one seed, 3 s of "
                   "arrivals, static batches 1 and 8, no bisection (about 2-3 minutes with vLLM's start-ups)")
    p.add_argument("--workloads", default=None, help="smollm2,pair (default both; --quick: pair)")
    p.add_argument("--engines", default="minispec,vllm", help="minispec,vllm (default both)")
    p.add_argument("--rates-smollm2", default=None, help=f"requests/s (default {','.join(map(str, RATES['smollm2']))})")
    p.add_argument("--rates-pair", default=None, help=f"requests/s (default {','.join(map(str, RATES['pair']))})")
    p.add_argument("--seeds", default=None, help="request-sequence seeds (default 0,1,2)")
    p.add_argument("--window", type=float, default=None, help="seconds of arrivals at each rate (default 60)")
    p.add_argument("--requests", default=None, help="MIN,MAX requests a rate (default 16,400)")
    p.add_argument("--exclude", default=None, help="shares of arrivals, first,last, not counted (default 0.1,0.1)")
    p.add_argument("--bisect", type=int, default=None, help="goodput bisection steps per seed (default 2)")
    p.add_argument("--static", default=None, help="static batch sizes, all at t=0 (default 1,8,32)")
    p.add_argument("--repeat", type=int, default=None, help="runs of each static batch per engine, alternated; the "
                   "table gives medians (default 1)")
    p.add_argument("--slo-smollm2", default=None, help="TTFT s,TPOT ms (default 2,150)")
    p.add_argument("--slo-pair", default=None, help="TTFT s,TPOT ms (default 1,50)")
    for w, ((p0, p1), (o0, o1)) in LENGTHS.items():
        p.add_argument(f"--lengths-{w}", default=None, metavar="P0,P1,O0,O1",
                       help=f"prompt and output token ranges (default {p0},{p1},{o0},{o1}): other prompts, e.g. short "
                            "ones with long answers")
    p.add_argument("--gamma", type=int, default=4, help="K, draft tokens per step in both engines (default 4)")
    p.add_argument("--ngram", default="4,2", help="prompt lookup's largest,smallest n-gram (default 4,2)")
    p.add_argument("--lookup-rule", default="vllm", help="PromptLookupDraft's rule: vllm (the same proposals as "
                   "vLLM's ngram; the default) or latest (minispec's own)")
    p.add_argument("--k-table", default=None, metavar="measure|FILE|none",
                   help="vLLM's num_speculative_tokens_per_batch_size on the pair, in both engines, beside a fixed K: "
                        "measure (minispec bench --vllm, at the start; the default, not with --quick), a JSON file "
                        "of vLLM's keys, or none")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--no-prepack", dest="prepack", action="store_false",
                   help="minispec's linears through F.linear (Engine(prepack=False)) instead of oneDNN with prepacked "
                        "weights, as vLLM's CPU build and the Engine by default run them")
    p.add_argument("--compile", action="store_true",
                   help="minispec's Engine(compile=True): its layers through torch.compile, attention opaque, as "
                        "vLLM's CPU build compiles by default (--vllm-compile)")
    p.add_argument("--realtime", action="store_true", help="sleep through idle gaps (default: skip them)")
    p.add_argument("--vllm-threads", type=int, default=None,
                   help="vLLM's worker threads where they differ from minispec's (default: --threads). On 2 cores "
                        "vLLM's scheduler and frontend run beside its worker; minispec's one process can use both")
    p.add_argument("--vllm-omp", default="gomp", choices=("gomp", "iomp"),
                   help="gomp: vLLM's default OpenMP; iomp: Intel OpenMP in LD_PRELOAD")
    p.add_argument("--vllm-bind", default=None,
                   help="VLLM_CPU_OMP_THREADS_BIND (default: the first --threads CPUs; nobind: OMP_NUM_THREADS)")
    p.add_argument("--vllm-compile", action="store_true", help="let vLLM compile (default enforce_eager)")
    p.add_argument("--vllm-numba", default="workqueue", choices=("workqueue", "default"),
                   help="the threads of vLLM's n-gram proposer (NUMBA_THREADING_LAYER): workqueue, or numba's default "
                        "(OpenMP here, which slowed vLLM's n-gram steps 1.4-1.7x beside torch's threads)")
    p.add_argument("--from-jsonl", default=None, metavar="FILE",
                   help="run nothing: write the .txt table and .png plot of a finished run from its .jsonl again")
    p.add_argument("--out", default=None, help="path prefix of .jsonl/.txt/.png (default results/cpu/vs_vllm)")


def from_args(args, progress=print) -> str:
    """Run ``minispec vs-vllm`` from its parsed flags; the table."""
    if args.from_jsonl is not None:
        if not Path(args.from_jsonl).is_file():
            raise ValueError(f"--from-jsonl {args.from_jsonl}: no such file")
        return redraw(args.from_jsonl)
    cfg, out = cli_config(args)
    t0, wall = time.perf_counter(), time.time()
    rows = run(cfg, out, progress)
    written = [s for s in (".jsonl", ".txt", ".png")  # the plot only where matplotlib imports: what is on disk says
               if (f := Path(out).with_suffix(s)).is_file() and f.stat().st_mtime >= wall]
    return report.text(rows, cfg) + f"({time.perf_counter() - t0:.0f} s; written to {out}{', '.join(written)})"
