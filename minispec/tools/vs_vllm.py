"""``minispec vs-vllm``: the same requests through minispec's engine and through vLLM's, plain and speculative.

Two workloads, each with its own request list per seed (prompts, prompt and output lengths, Poisson
arrival gaps, sampling seeds), served at every arrival rate by both engines one after the other:

  smollm2  SmolLM2-135M-Instruct (``minispec fetch smollm2``), answers that copy from their prompts
           ("add comments to this function", "reformat this list", ...: :func:`copy_prompts`, from the
           shipped held-out code in the model's chat template), prompts 64-512 tokens, outputs 32-128,
           stopping at the model's EOS; speculation: minispec's ``PromptLookupDraft`` against vLLM's ``ngram``.
  pair     the embedded byte-level pair, windows of held-out code as token ids (prompts 64-320, outputs
           32-128, no EOS); speculation: the draft model in both (vLLM's ``draft_model``), and, with
           ``--k-table``, vLLM's ``num_speculative_tokens_per_batch_size`` in both (issue 31's item 4).

Per (setting, seed, rate) minispec's :class:`~minispec.engine.Engine` serves the requests, then vLLM's
engine (:class:`~minispec.tools.vllm_side.VllmServer`, started once per setting and idle while minispec
runs: the two never run at once). The same rates go to both engines, interleaved, so a change in the
machine's load falls on both. **The clock** is the engine's own convention (``Engine.run(realtime=False)``)
for both: the wall clock with idle gaps skipped, so every step costs what it took and arrivals keep their
times; ``--realtime`` sleeps through the gaps instead.

**Steady state.** At rate r a seed's sequence gives max(min, r x window) requests (at most max); arrivals
are its unit gaps divided by r, so every rate serves the same requests. Latencies and the SLO attainment
count the requests between the first and last ``--exclude`` shares of arrivals; throughput counts the
tokens produced between the first and last counted arrival. **Goodput** (DistServe): per seed, the highest
rate at which >= 90 % of counted requests meet both SLOs, located by bisecting (``--bisect`` steps, at the
geometric mean) between the highest passing and the lowest failing rate. **Static batches**: B requests at
t = 0 (at least 8 requests per batch size, in rounds of B).

The report: :mod:`minispec.tools.vs_vllm_report`. The vLLM side: :mod:`minispec.tools.vllm_side`. The command line:
:mod:`minispec.tools.vs_vllm_cli`.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from minispec.engine import Engine, Request
from minispec.tools import vs_vllm_report as report
from minispec.tools.vllm_side import Served, VllmServer, VllmSettings, available, cpu_seconds
from minispec.tools.vs_vllm_workload import (
    LENGTHS,
    MAX_MODEL_LEN,
    Job,
    jobs,
    metadata,
    minispec_engines,
    roofline_inputs,
    static_jobs,
    vllm_spec,
    workload,
)


@dataclass(frozen=True)
class VsConfig:
    workloads: tuple[str, ...] = ("smollm2", "pair")
    engines: tuple[str, ...] = ("minispec", "vllm")
    rates: dict | None = None  # workload -> requests/s (default RATES)
    slo: dict | None = None  # workload -> (TTFT s, TPOT s) (default SLO)
    seeds: tuple[int, ...] = (0, 1, 2)
    window_s: float = 60.0  # about this long of arrivals at each rate
    min_requests: int = 16
    max_requests: int = 400
    exclude: tuple[float, float] = (0.1, 0.1)  # shares of arrivals (first, last) served but not counted
    attainment: float = 0.9  # goodput: the highest rate at which this share meets both SLOs
    bisect: int = 2  # bisection steps per (engine, setting, seed) between grid rates
    static_batches: tuple[int, ...] = (1, 8, 32)
    static_min: int = 8  # requests per static batch size at least (rounds of B, one after another)
    static_repeat: int = 1  # runs of each static batch per engine, the engines alternated (the report takes medians)
    gamma: int = 4  # K: draft tokens per step, both engines
    ngram: tuple[int, int] = (4, 2)  # prompt lookup's largest and smallest n-gram (vLLM's prompt_lookup_max/min)
    lookup_rule: str = "vllm"  # PromptLookupDraft's rule: "vllm" drafts as vLLM's ngram does; "latest": minispec's
    k_table: str | None = "measure"  # None, "measure" (minispec bench --vllm, here) or a JSON file of vLLM's keys
    temperature: float = 0.0
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    kv_tokens: dict | None = None  # workload -> KV slots (default KV_TOKENS): small enough to preempt at the top
    lengths: dict | None = None  # workload -> ((prompt min, max), (output min, max)) tokens (default LENGTHS)
    realtime: bool = False
    threads: int = 1
    prepack: bool = True  # minispec's linears through oneDNN with prepacked weights (Engine's default), as vLLM's are
    compile: bool = False  # minispec's Engine(compile=True): layers through torch.compile, as vLLM compiles by default
    vllm: VllmSettings = VllmSettings()

    def __post_init__(self):
        for name in ("rates", "slo", "kv_tokens", "lengths"):  # a typo would fall back to the defaults unseen
            unknown = set(getattr(self, name) or {}) - set(RATES)
            if unknown:
                raise ValueError(f"{name} names no workload: {sorted(unknown)} (workloads are {', '.join(RATES)})")
        bad = set(self.workloads) - set(RATES) or set(self.engines) - {"minispec", "vllm"}
        if bad or not self.workloads or not self.engines:
            raise ValueError(f"workloads are {', '.join(RATES)} and engines minispec, vllm; got {sorted(bad)}")
        rates = [r for w in self.workloads for r in self.rates_of(w)]
        if not rates or min(rates) <= 0 or not self.seeds or self.window_s <= 0:
            raise ValueError("need positive rates, at least one seed and a positive window")
        if not 1 <= self.min_requests <= self.max_requests or not 0 <= sum(self.exclude) < 0.9:
            raise ValueError("need 1 <= min_requests <= max_requests and exclude shares summing below 0.9")
        if self.gamma < 1 or not 1 <= self.ngram[1] <= self.ngram[0] or self.temperature < 0:
            raise ValueError("need gamma >= 1, 1 <= smallest n-gram <= largest, temperature >= 0")
        if (any(b < 1 for b in self.static_batches) or self.static_repeat < 1 or self.bisect < 0
                or not 0 < self.attainment <= 1):
            raise ValueError("static batches and repeats must be >= 1, bisect >= 0, attainment in (0, 1]")
        for w in self.workloads:
            (p0, p1), (o0, o1) = self.lengths_of(w)
            if not (1 <= p0 <= p1 and 1 <= o0 <= o1) or p1 + o1 > MAX_MODEL_LEN[w]:
                raise ValueError(f"{w}: prompt and output lengths need 1 <= min <= max and the longest prompt plus "
                                 f"the longest output within {MAX_MODEL_LEN[w]} tokens, got prompts {p0}-{p1}, "
                                 f"outputs {o0}-{o1}")

    def rates_of(self, workload: str) -> tuple[float, ...]:
        return tuple((self.rates or {}).get(workload, RATES[workload]))

    def slo_of(self, workload: str) -> tuple[float, float]:
        return tuple((self.slo or {}).get(workload, SLO[workload]))

    def lengths_of(self, workload: str) -> tuple[tuple[int, int], tuple[int, int]]:
        return (self.lengths or {}).get(workload, LENGTHS[workload])

    def kv_of(self, workload: str) -> int:
        return (self.kv_tokens or {}).get(workload, KV_TOKENS[workload])


RATES = {"smollm2": (0.25, 0.5, 1.0, 2.0, 4.0), "pair": (2.0, 4.0, 8.0, 16.0, 32.0, 64.0)}  # requests/s
SLO = {"smollm2": (2.0, 0.15), "pair": (1.0, 0.05)}  # TTFT s, TPOT s
KV_TOKENS = {"smollm2": 16384, "pair": 8192}  # about 40 and 30 average requests: preemption binds at the top rates
QUICK = dict(workloads=("pair",), rates={"pair": (4.0, 16.0)}, seeds=(0,), window_s=3.0, min_requests=8,
             bisect=0, static_batches=(1, 8), static_min=2, k_table=None)


def served_by_minispec(engine: Engine, batch: list[Job], realtime: bool) -> tuple[list[Served], dict]:
    """Serve ``batch`` with minispec's engine; the same records and counters as :meth:`VllmServer.serve`."""
    outs = engine.run([Request(list(j.prompt), j.max_new_tokens, j.temperature, seed=j.seed, arrival_s=j.arrival_s,
                               eos_token_id=j.eos) for j in batch], realtime=realtime)
    errors = [o.error for o in outs if o.finish_reason == "error"]
    if errors:
        raise ValueError("minispec's engine refused requests: " + "; ".join(errors[:3]))
    s = engine.stats
    return [Served(o.arrival_s, list(o.tokens), step_events(o), o.preemptions) for o in outs], {
        "num_drafts": s.num_drafts, "draft_tokens": s.draft_tokens, "accepted_tokens": s.accepted_tokens,
        "accepted_per_position": list(s.accepted_per_position), "preemptions": s.preemptions, "steps": s.steps}


def step_events(out) -> list[tuple[float, int]]:
    """(clock, tokens) for each step that gave a request tokens. A step gives accepted draft tokens then one token
    of the target's own (``accepted`` False), except where max_new_tokens or EOS cut it; the step times are the
    first token's and then the inter-token gaps."""
    times = [out.first_token_s]
    for gap in out.itl_s:
        times.append(times[-1] + gap)
    counts, run = [], 0
    for a in out.accepted:
        run += 1
        if not a:
            counts.append(run)
            run = 0
    if run:
        counts.append(run)
    if len(counts) != len(times):
        raise RuntimeError(f"{len(times)} step times but {len(counts)} groups of tokens")
    return list(zip(times, counts))


# --- the run ------------------------------------------------------------------------------------------------

def run(cfg: VsConfig, out: str | Path | None = "results/cpu/vs_vllm", progress=print) -> list[dict]:
    """Every row (one per engine x setting x rate or batch x seed), appended to ``out``.jsonl as they come; then
    the table (.txt) and the plot (.png), and the K table's comparison beside them when asked for."""
    if "vllm" in cfg.engines and (why := available()) is not None:
        raise ValueError(why + " (or pass --engines minispec)")
    table = k_table(cfg, progress)
    meta = metadata(cfg) | {"k_table": table, "roofline": roofline_inputs(cfg, "calibrated at the run's start")}
    out = None if out is None else Path(out)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.with_suffix(".jsonl").write_text(json.dumps({"meta": meta}) + "\n")  # the first line: the run's metadata
    rows: list[dict] = []

    def emit(row: dict) -> None:
        rows.append(row)
        progress(report.progress_line(row))
        if out is not None:
            with open(out.with_suffix(".jsonl"), "a") as f:
                f.write(json.dumps(row) + "\n")

    for name in cfg.workloads:
        w = workload(name, cfg.lengths_of(name))
        engines = minispec_engines(w, cfg, table if name == "pair" else None)
        for setting, engine in engines.items():
            serve_setting(w, setting, engine, cfg, table, meta, emit, progress)
    if out is not None:
        report.write(rows, cfg, meta, out, table)
    return rows


def serve_setting(w, setting, engine, cfg, table, meta, emit, progress) -> None:
    """Every rate, seed and static batch of one setting, both engines; then the goodput bisection."""
    server = None
    if "vllm" in cfg.engines:
        server = VllmServer(w["target"], vllm_spec(w, setting, cfg, table), settings=cfg.vllm,
                            kv_tokens=cfg.kv_of(w["name"]), max_num_seqs=cfg.max_num_seqs,
                            max_num_batched_tokens=cfg.max_num_batched_tokens, max_model_len=w["max_model_len"],
                            tokenizer=w["tokenizer"])
        progress(f"{w['name']} {setting}: vLLM started in {server.startup_s:.0f} s")
    try:
        serve = {"minispec": lambda b: served_by_minispec(engine, b, cfg.realtime)}
        if server is not None:
            serve["vllm"] = lambda b: server.serve(b, cfg.realtime)
        serve = {e: serve[e] for e in cfg.engines}
        warm = [replace(j, arrival_s=0.0, max_new_tokens=8) for j in static_jobs(
            w["prompts"], w["outputs"], 4, cfg, w["eos"])[0]]
        for fn in serve.values():  # first calls: allocators, caches
            fn(warm)
        base = dict(workload=w["name"], setting=setting, run=meta["id"])
        slo = cfg.slo_of(w["name"])
        grid = {}
        for seed in cfg.seeds:
            for rate in cfg.rates_of(w["name"]):
                batch = jobs(w["prompts"], w["outputs"], seed, rate, cfg, w["eos"])
                got = {e: measure(e, fn, [batch], cfg) for e, fn in serve.items()}
                for e, (row, served) in got.items():
                    row |= base | dict(engine=e, mode="load", rate=rate, seed=seed, bisect=False)
                    row |= report.latency(served, batch, cfg, slo) | tokens_equal(got, e)
                    grid[e, seed, rate] = row["slo_met"]
                    emit(row)
        for e, fn in serve.items():
            for seed in cfg.seeds:
                tried = {r: ok for (e2, s2, r), ok in grid.items() if (e2, s2) == (e, seed)}
                for _ in range(cfg.bisect):
                    rate = report.next_bisection(tried, cfg.attainment)
                    if rate is None:
                        break
                    batch = jobs(w["prompts"], w["outputs"], seed, rate, cfg, w["eos"])
                    row, served = measure(e, fn, [batch], cfg)
                    row |= base | dict(engine=e, mode="load", rate=rate, seed=seed, bisect=True)
                    row |= report.latency(served, batch, cfg, slo)
                    tried[rate] = row["slo_met"]
                    emit(row)
        for B in cfg.static_batches:
            rounds = static_jobs(w["prompts"], w["outputs"], B, cfg, w["eos"])
            for repeat in range(cfg.static_repeat):  # minispec, vLLM, minispec, ...: a slow minute hits both
                got = {e: measure(e, fn, rounds, cfg) for e, fn in serve.items()}
                for e, (row, served) in got.items():
                    row |= base | dict(engine=e, mode="static", batch=B, seed=0, bisect=False, repeat=repeat)
                    row |= report.static(served, rounds) | tokens_equal(got, e)
                    emit(row)
    finally:
        if server is not None:
            server.close()


SETTLE_S = 1.5  # s of rest before each measured run: vLLM's idle worker polls its queue for about 1 s after a run


def measure(engine: str, serve, batches: list[list[Job]], cfg: VsConfig) -> tuple[dict, list[list[Served]]]:
    """Serve each list of jobs in turn with ``serve`` (``engine``'s; ``cfg.threads`` torch threads for minispec); the
    counters, the wall time and the CPU time the engine's processes used."""
    torch.set_num_threads(cfg.threads)
    time.sleep(SETTLE_S)
    children = engine == "vllm"  # vLLM's engine core and worker are processes of their own
    load0, t0, cpu0 = os.getloadavg()[0], time.perf_counter(), cpu_seconds(children)
    served, total = [], {}
    for b in batches:
        s, stats = serve(b)
        served.append(s)
        total = report.add_counters(total, stats)
    cpu = cpu_seconds(children) - cpu0
    tokens = sum(len(r.tokens) for s in served for r in s)
    row = {"wall_s": time.perf_counter() - t0, "cpu_s": cpu, "cpu_ms_per_token": 1e3 * cpu / max(tokens, 1),
           "loadavg_before": load0, "loadavg_after": os.getloadavg()[0],
           "torch_threads": torch.get_num_threads()} | report.acceptance(total)
    return row, served


def tokens_equal(got: dict, engine: str) -> dict:
    """The share of requests whose tokens equal the other engine's (greedy: both should give the same)."""
    if len(got) < 2:
        return {}
    (_, mine), (_, theirs) = got[engine], next(v for e, v in got.items() if e != engine)
    pairs = [(a.tokens, b.tokens) for x, y in zip(mine, theirs) for a, b in zip(x, y)]
    a, b = got[engine][0], next(v for e, v in got.items() if e != engine)[0]
    return {"tokens_equal": sum(x == y for x, y in pairs) / len(pairs), "counters_equal": report.same_counters(a, b)}


def k_table(cfg: VsConfig, progress) -> dict | None:
    """vLLM's batch-size K table: measured here as ``minispec bench --vllm`` makes it, or read from a file."""
    if cfg.k_table is None or "pair" not in cfg.workloads:
        return None
    if cfg.k_table != "measure":
        return json.loads(Path(cfg.k_table).read_text())
    from minispec.tools.bench import BenchConfig, vllm_table

    torch.set_num_threads(cfg.threads)
    t = vllm_table("tiny-code-target", "tiny-code-draft", BenchConfig(
        batches=(1, 2, 4, 8, 16, 32, cfg.max_num_seqs), gammas=(cfg.gamma,), repeats=3))
    progress(f"K table (minispec bench --vllm, measured now): {json.dumps(t.config)}; {t.note}")
    return t.config | {"note": t.note}
