"""The report of ``minispec vs-vllm``: each run's figures, the tables with minispec / vLLM ratios, the plot.

Per row (:func:`latency`, :func:`static`, :func:`acceptance`): TTFT and TPOT p50/p99 of the counted
requests, output throughput, the share meeting both SLOs, acceptance rate (accepted / draft tokens) and
mean acceptance length (1 + accepted / drafts, vLLM's definitions), the mean K drafted, preemptions, and the
CPU time the engine's processes used per output token (vLLM's three processes, minispec's one: on shared cores
a steadier figure than wall time, and one that shows what vLLM's extra processes cost).
Across seeds the tables show medians; goodput (DistServe) is per seed, shown as mean [min-max].
A ratio is minispec's figure divided by vLLM's: above 1 is better for minispec on throughput, goodput,
acceptance and SLOs met, worse on TTFT and TPOT.
"""

from __future__ import annotations

import functools
import json
import math
import statistics
from pathlib import Path

from minispec.decoding.stats import percentile
from minispec.roofline import ModelShape, step_time
from minispec.roofline.hardware import Hardware
from minispec.tools.bench import text_table

NAN = float("nan")


# --- one run ------------------------------------------------------------------------------------------------

def latency(served: list[list], batch: list, cfg, slo: tuple[float, float]) -> dict:
    """Latency, SLOs and throughput of one load run; ``served[0]`` holds its requests in ``batch``'s order."""
    s = served[0]
    n = len(s)
    order = sorted(range(n), key=lambda i: s[i].arrival_s)
    lo, hi = math.floor(cfg.exclude[0] * n), n - math.floor(cfg.exclude[1] * n)
    counted = [s[i] for i in order[lo: max(hi, lo + 1)]]
    ttft = [r.first_token_s - r.arrival_s for r in counted]
    tpot = [(r.finish_s - r.first_token_s) / (len(r.tokens) - 1) for r in counted if len(r.tokens) > 1]
    met = [r.first_token_s - r.arrival_s <= slo[0] and not (
        len(r.tokens) > 1 and (r.finish_s - r.first_token_s) / (len(r.tokens) - 1) > slo[1]) for r in counted]
    a, b = counted[0].arrival_s, counted[-1].arrival_s
    span_all = max(r.finish_s for r in s) - min(r.arrival_s for r in s)
    tokens = sum(len(r.tokens) for r in s)
    window = sum(k for r in s for t, k in r.events if a <= t <= b) / (b - a) if b > a else NAN
    return {"requests": n, "counted": len(counted), "output_tokens": tokens,
            "ttft_p50_s": percentile(ttft, 50), "ttft_p99_s": percentile(ttft, 99),
            "tpot_p50_s": percentile(tpot, 50), "tpot_p99_s": percentile(tpot, 99),
            "throughput": window, "throughput_all": tokens / span_all, "slo_met": sum(met) / len(met),
            "ttft_slo_s": slo[0], "tpot_slo_s": slo[1], "window_s": [a, b]}


def static(served: list[list], rounds: list[list]) -> dict:
    """Throughput and TPOT of static batches: every round's requests at t = 0, rounds one after another."""
    makespan = sum(max(r.finish_s for r in s) for s in served)
    reqs = [r for s in served for r in s]
    tpot = [(r.finish_s - r.first_token_s) / (len(r.tokens) - 1) for r in reqs if len(r.tokens) > 1]
    tokens = sum(len(r.tokens) for r in reqs)
    return {"requests": len(reqs), "rounds": len(rounds), "output_tokens": tokens, "throughput": tokens / makespan,
            "tpot_p50_s": percentile(tpot, 50), "tpot_p99_s": percentile(tpot, 99),
            "ttft_p50_s": percentile([r.first_token_s - r.arrival_s for r in reqs], 50)}


def acceptance(c: dict) -> dict:
    """vLLM's acceptance figures from the counters (None without drafts)."""
    d, t, a = c.get("num_drafts", 0), c.get("draft_tokens", 0), c.get("accepted_tokens", 0)
    return {"num_drafts": d, "draft_tokens": t, "accepted_tokens": a, "preemptions": c.get("preemptions", 0),
            "steps": c.get("steps", 0), "accepted_per_position": c.get("accepted_per_position", []),
            "acceptance_rate": a / t if t else None, "mean_acceptance_length": 1 + a / d if d else None,
            "mean_k": t / d if d else None}


def same_counters(a: dict, b: dict) -> bool:
    """Drafts, draft tokens, accepted tokens and accepted per position alike (vLLM's per-position vector runs to
    num_speculative_tokens, so trailing zeros do not count)."""
    strip = lambda xs: list(xs[: max((i + 1 for i, x in enumerate(xs) if x), default=0)])  # noqa: E731
    return all(a[k] == b[k] for k in ("num_drafts", "draft_tokens", "accepted_tokens")) and strip(
        a["accepted_per_position"]) == strip(b["accepted_per_position"])


def add_counters(total: dict, more: dict) -> dict:
    """Counters of several runs summed (lists position by position)."""
    out = dict(total)
    for k, v in more.items():
        if isinstance(v, list):
            old = out.get(k, [])
            out[k] = [(old[i] if i < len(old) else 0) + (v[i] if i < len(v) else 0) for i in range(max(len(old),
                                                                                                     len(v)))]
        else:
            out[k] = out.get(k, 0) + v
    return out


# --- goodput ------------------------------------------------------------------------------------------------

def goodput(tried: dict[float, float], attainment: float) -> float:
    """DistServe's goodput from {rate: share meeting both SLOs}: the highest rate at or below which every tried
    rate met ``attainment`` (0 when the lowest did not)."""
    good = 0.0
    for r in sorted(tried):
        if tried[r] < attainment:
            break
        good = r
    return good


def next_bisection(tried: dict[float, float], attainment: float) -> float | None:
    """The next rate to try: the geometric mean of the goodput and the lowest failing rate above it, or half the
    lowest rate when none passed (the knee is below the grid); None when every rate passed or the two are within 5 %."""
    good = goodput(tried, attainment)
    above = [r for r in tried if r > good and tried[r] < attainment]
    if not above or (good and min(above) / good < 1.05):
        return None
    return math.sqrt(good * min(above)) if good else min(above) / 2


# --- tables -------------------------------------------------------------------------------------------------

def _med(rows: list[dict], key: str):
    xs = [r[key] for r in rows if r.get(key) is not None and not (isinstance(r[key], float) and math.isnan(r[key]))]
    return statistics.median(xs) if xs else None


def _fmt(x, scale=1.0, spec="{:.2f}"):
    return "-" if x is None else spec.format(scale * x)


def _ratio(a, b):
    return "-" if a is None or b is None or b == 0 else f"{a / b:.2f}x"


COLUMNS = (("TTFT p50 s", "ttft_p50_s", 1, "{:.3f}"), ("TTFT p99 s", "ttft_p99_s", 1, "{:.3f}"),
           ("TPOT p50 ms", "tpot_p50_s", 1e3, "{:.1f}"), ("TPOT p99 ms", "tpot_p99_s", 1e3, "{:.1f}"),
           ("tok/s", "throughput", 1, "{:.0f}"), ("tok/s all", "throughput_all", 1, "{:.0f}"),
           ("accept", "acceptance_rate", 1, "{:.2f}"),
           ("accept len", "mean_acceptance_length", 1, "{:.2f}"), ("SLOs met", "slo_met", 100, "{:.0f}%"),
           ("CPU ms/tok", "cpu_ms_per_token", 1, "{:.1f}"))


def grouped(rows: list[dict], mode: str = "load") -> dict:
    """(workload, setting, rate or batch) -> engine -> the grid rows of every seed (bisection rows left out)."""
    out: dict = {}
    key = "rate" if mode == "load" else "batch"
    for r in rows:
        if r["mode"] == mode and not r.get("bisect"):
            out.setdefault((r["workload"], r["setting"], r[key]), {}).setdefault(r["engine"], []).append(r)
    return out


def load_table(rows: list[dict]) -> str:
    cells = [["workload", "setting", "rate", "engine", *(c[0] for c in COLUMNS), "preempt", "same tokens"]]
    for (w, setting, rate), by in grouped(rows).items():
        for e in ("minispec", "vllm"):
            if e in by:
                rs = by[e]
                cells.append([w, setting, f"{rate:g}", e, *(_fmt(_med(rs, k), s, f) for _, k, s, f in COLUMNS),
                              _fmt(_med(rs, "preemptions"), 1, "{:.0f}"),
                              _fmt(_med(rs, "tokens_equal"), 100, "{:.0f}%")])
        if len(by) == 2:
            cells.append(["", "", "", "ratio", *(_ratio(_med(by["minispec"], k), _med(by["vllm"], k))
                                                 for _, k, _, _ in COLUMNS), "", ""])
    return text_table(cells, left=4)


def paired(rows: list[dict]) -> list[tuple[dict, dict]]:
    """(minispec's row, vLLM's row) for every grid or static run both engines served."""
    key = lambda r: tuple(r.get(k) for k in ("workload", "setting", "mode", "rate", "batch", "seed", "repeat"))  # noqa
    vllm = {key(r): r for r in rows if r["engine"] == "vllm" and not r.get("bisect")}
    return [(r, vllm[key(r)]) for r in rows if r["engine"] == "minispec" and not r.get("bisect") and key(r) in vllm]


def goodputs(rows: list[dict], attainment: float) -> dict:
    """(workload, setting, engine) -> [goodput of each seed]."""
    tried: dict = {}
    for r in rows:
        if r["mode"] == "load":
            tried.setdefault((r["workload"], r["setting"], r["engine"]), {}).setdefault(r["seed"], {})[r["rate"]] = \
                r["slo_met"]
    return {k: [goodput(t, attainment) for _, t in sorted(v.items())] for k, v in tried.items()}


def goodput_table(rows: list[dict], attainment: float) -> str:
    g = goodputs(rows, attainment)
    cells = [["workload", "setting", "minispec req/s", "vLLM req/s", "ratio"]]
    for w, setting in dict.fromkeys((k[0], k[1]) for k in g):
        m, v = g.get((w, setting, "minispec")), g.get((w, setting, "vllm"))
        show = lambda xs: "-" if not xs else f"{statistics.mean(xs):.3g} [{min(xs):.3g}-{max(xs):.3g}]"  # noqa: E731
        cells.append([w, setting, show(m), show(v), _ratio(m and statistics.mean(m), v and statistics.mean(v))])
    return text_table(cells, left=2)


def static_table(rows: list[dict]) -> str:
    cells = [["workload", "setting", "batch", "minispec tok/s", "vLLM tok/s", "ratio", "minispec TPOT p50 ms",
              "vLLM TPOT p50 ms", "ratio", "minispec CPU ms/tok", "vLLM CPU ms/tok", "ratio", "same tokens"]]
    for (w, setting, B), by in grouped(rows, "static").items():
        m, v = by.get("minispec", []), by.get("vllm", [])
        cells.append([w, setting, str(B), _fmt(_med(m, "throughput"), 1, "{:.0f}"),
                      _fmt(_med(v, "throughput"), 1, "{:.0f}"), _ratio(_med(m, "throughput"), _med(v, "throughput")),
                      _fmt(_med(m, "tpot_p50_s"), 1e3, "{:.1f}"), _fmt(_med(v, "tpot_p50_s"), 1e3, "{:.1f}"),
                      _ratio(_med(m, "tpot_p50_s"), _med(v, "tpot_p50_s")),
                      _fmt(_med(m, "cpu_ms_per_token"), 1, "{:.1f}"), _fmt(_med(v, "cpu_ms_per_token"), 1, "{:.1f}"),
                      _ratio(_med(m, "cpu_ms_per_token"), _med(v, "cpu_ms_per_token")),
                      _fmt(_med(m + v, "tokens_equal"), 100, "{:.0f}%")])
    return text_table(cells, left=3)


def crossover(rows: list[dict], attainment: float) -> list[str]:
    """Where speculation stops paying, per workload, engine and speculative setting: the first rate at which its
    TPOT p50 is no better than plain decoding's, the first static batch at which its throughput is below plain's,
    and its goodput beside plain's."""
    lines, load, stat, g = [], grouped(rows), grouped(rows, "static"), goodputs(rows, attainment)
    settings = dict.fromkeys((r["workload"], r["setting"], r["engine"]) for r in rows if r["setting"] != "plain")
    for w, setting, e in settings:
        ratios = [(rate, _med(by[e], "tpot_p50_s"), _med(load[w, "plain", rate].get(e, []), "tpot_p50_s"))
                  for (w2, s2, rate), by in load.items() if (w2, s2) == (w, setting) and e in by]
        ratios = [(r, a / b) for r, a, b in ratios if a is not None and b]
        stops = next((r for r, x in ratios if x >= 1), None)
        sb = [(B, _med(by[e], "throughput"), _med(stat[w, "plain", B].get(e, []), "throughput"))
              for (w2, s2, B), by in stat.items() if (w2, s2) == (w, setting) and e in by]
        sb = [(B, a / b) for B, a, b in sb if a is not None and b]
        stops_b = next((B for B, x in sb if x < 1), None)
        gs, gp = g.get((w, setting, e)), g.get((w, "plain", e))
        lines.append(f"{w}, {setting}, {e}: speculative / plain TPOT p50 by rate "
            + ", ".join(f"{r:g}: {x:.2f}" for r, x in ratios)
            + (f" -> no gain from rate {stops:g} req/s" if stops is not None else " -> gains at every rate tried")
            + "; throughput by static batch " + ", ".join(f"{B}: {x:.2f}" for B, x in sb)
            + (f" -> below plain from batch {stops_b}" if stops_b is not None else (" -> above plain at every batch"
                                                                                     if sb else ""))
            + (f"; goodput {statistics.mean(gs):.3g} vs plain {statistics.mean(gp):.3g} req/s" if gs and gp else ""))
    return lines


def predicted_ratio(B: float, E: float, K: float, hardware: Hardware, target: ModelShape, draft: ModelShape | None,
                    context: float) -> float:
    """The roofline's speculative / plain throughput at batch B: E tokens per row for a pass over 1 + K tokens per
    row plus K passes of the draft (None: a free draft), against one token per row for one pass."""
    draft_s = 0.0 if draft is None else K * step_time(B, 1, hardware, draft, context)
    return E * step_time(B, 1, hardware, target, context) / (step_time(B, 1 + K, hardware, target, context) + draft_s)


def roofline(rows: list[dict], inputs: dict) -> list[str]:
    """The roofline's speculative / plain throughput at each static batch, beside the measured one: per workload and
    speculative setting, this CPU's calibrated ceilings (``inputs["hardware"]``), the workload's shapes and mean
    context (``inputs["workloads"]``), and minispec's measured acceptance length E and draft tokens K per draft at
    that batch: E x t(B, 1) / (t(B, 1 + K) + K x t_draft(B, 1)), prompt lookup's draft free. Then the first batch
    (powers of two to 4,096, E and K of the largest batch measured) at which it predicts a loss."""
    if not inputs:
        return []
    hw = Hardware(**inputs["hardware"])
    lines, stat = [], grouped(rows, "static")
    head = (f"roofline on this CPU's ceilings ({hw.memory_bandwidth / 1e9:.1f} GB/s, {hw.peak_flops / 1e9:.0f} "
            f"GFLOP/s at {inputs['threads']} thread(s), {inputs['when']}) with minispec's measured acceptance:")
    for w, setting in dict.fromkeys((r["workload"], r["setting"]) for r in rows
                                    if r["mode"] == "static" and r["setting"] != "plain"):
        shapes = inputs["workloads"].get(w)
        if shapes is None:
            continue
        target, ctx = ModelShape(**shapes["target"]), shapes["context"]
        draft = None if shapes["draft"] is None or setting == "ngram" else ModelShape(**shapes["draft"])
        predicted = functools.partial(predicted_ratio, hardware=hw, target=target, draft=draft, context=ctx)
        points = []
        for (w2, s2, B), by in stat.items():
            E, K = (_med(by.get("minispec", []), k) for k in ("mean_acceptance_length", "mean_k"))
            if (w2, s2) != (w, setting) or E is None or K is None:
                continue
            plain = {e: _med(stat.get((w, "plain", B), {}).get(e, []), "throughput") for e in ("minispec", "vllm")}
            seen = {e: _med(by.get(e, []), "throughput") for e in ("minispec", "vllm")}
            points.append((B, E, K, predicted(B, E, K), *(seen[e] / plain[e] if seen[e] and plain[e] else None
                                                           for e in ("minispec", "vllm"))))
        if not points:
            continue
        *_, (_, E, K, *_) = sorted(points)
        stops = next((B for B in (2 ** i for i in range(13)) if predicted(B, E, K) < 1), None)
        lines.append(f"{w}, {setting}: " + ", ".join(
            f"batch {B}: {x:.2f} predicted (E {E:.2f}, K {K:.2f}), measured minispec {_fmt(a)}, vLLM {_fmt(b)}"
            for B, E, K, x, a, b in sorted(points))
            + (f" -> predicted to stop paying from batch {stops}" if stops else " -> predicted to pay to batch 4,096"))
    return [head, *lines] if lines else []


def text(rows: list[dict], cfg, meta: dict | None = None) -> str:
    """The whole report as text."""
    slos = "; ".join(f"{w}: TTFT <= {cfg.slo_of(w)[0]:g} s, TPOT <= {1e3 * cfg.slo_of(w)[1]:g} ms"
                     for w in cfg.workloads)
    parts = ["Under Poisson load (medians over seeds " + ",".join(map(str, cfg.seeds)) + "; ratio = minispec / vLLM):",
             load_table(rows),
             f"\nGoodput (DistServe): the highest rate at which >= {cfg.attainment:.0%} of counted requests meet both "
             f"SLOs ({slos}), per seed, bisected {cfg.bisect} step(s) between grid rates; mean [min-max] over seeds:",
             goodput_table(rows, cfg.attainment)]
    if any(r["mode"] == "static" for r in rows):
        runs = f"; medians of {cfg.static_repeat} runs an engine, alternated" if cfg.static_repeat > 1 else ""
        parts += [f"\nStatic batches (all requests at t = 0, rounds of B, at least {cfg.static_min} requests{runs}):",
                  static_table(rows)]
    parts += ["\nWhere speculation stops paying (measured):", *crossover(rows, cfg.attainment)]
    if meta and meta.get("roofline"):
        parts += ["", *roofline(rows, meta["roofline"])]
    both = [r for r in rows if "tokens_equal" in r and r["engine"] == "minispec"]
    if both:
        pairs = paired(rows)
        fixed = [same_counters(m, v) for m, v in pairs if m["setting"] != "plain" and "K table" not in m["setting"]]
        table = [same_counters(m, v) for m, v in pairs if "K table" in m["setting"]]
        same = sum(r["tokens_equal"] == 1 for r in both)
        parts.append(f"\nThe same tokens from both engines in {same} of {len(both)} runs; the same acceptance "
                     f"counters (drafts, draft tokens, accepted per position) in {sum(fixed)} of {len(fixed)} "
                     "speculative runs at a fixed K (under load the engines preempt different rows at different "
                     "steps, and a preempted row's pending draft is dropped; where a drafted EOS is accepted, vLLM "
                     "also counts the draft tokens accepted after it, minispec's counts stop at the EOS)" + (
                         f" and {sum(table)} of {len(table)} with the K table (vLLM looks K up by every request "
                         "scheduled in a step, prefill chunks included; minispec by the rows decoding)" if table
                         else "") + ".")
    loads = [x for r in rows for x in (r["loadavg_before"], r["loadavg_after"])]
    parts.append(
        f"\nClock: each engine's own steps, idle gaps {'slept through (realtime)' if cfg.realtime else 'skipped'}; "
        f"arrivals over about {cfg.window_s:g} s per rate (at least {cfg.min_requests}, at most {cfg.max_requests} "
        f"requests); the first {cfg.exclude[0]:.0%} and last {cfg.exclude[1]:.0%} of arrivals served but not counted; "
        f"throughput = tokens produced between the first and last counted arrival / that time. K = {cfg.gamma}, "
        f"n-grams {cfg.ngram[0]}..{cfg.ngram[1]} (minispec's rule {cfg.lookup_rule!r}), temperature "
        f"{cfg.temperature:g}, minispec's linears {'prepacked (oneDNN)' if cfg.prepack else 'F.linear'}"
        f"{', its layers compiled' if cfg.compile else ''}, vLLM {'eager' if cfg.vllm.eager else 'compiled'}, threads: "
        f"minispec {cfg.threads}, vLLM's worker {cfg.vllm.threads}, max_num_seqs {cfg.max_num_seqs}, "
        f"max_num_batched_tokens {cfg.max_num_batched_tokens}, KV tokens "
        + ", ".join(f"{w} {cfg.kv_of(w)}" for w in cfg.workloads) + "; prompt and output tokens "
        + ", ".join(f"{w} {p0}-{p1} and {o0}-{o1}" for w in cfg.workloads for (p0, p1), (o0, o1) in [cfg.lengths_of(w)])
        + f". Load average {min(loads):.1f}-{max(loads):.1f} during the runs.")
    if meta:
        parts.append("Run: " + json.dumps({k: meta[k] for k in ("git_revision", "started", "cpu", "cores", "threads",
                                                                  "torch", "vllm", "transformers", "python",
                                                                  "vllm_env", "argv") if k in meta}))
    return "\n".join(parts) + "\n"


def k_table_text(rows: list[dict], cfg, table: dict) -> str:
    """vLLM (and minispec) with the batch-size K table against a fixed K on the same traffic: which wins."""
    keep = [r for r in rows if r["workload"] == "pair" and r["setting"] in ("draft", "draft, K table")]
    out = [f"The K table: {json.dumps({k: v for k, v in table.items() if k != 'note'})}"
           + (f" ({table['note']})" if "note" in table else ""),
           f"against a fixed K = {cfg.gamma}, the embedded pair with its draft model, the same traffic:\n",
           load_table(keep), "", goodput_table(keep, cfg.attainment)]
    if any(r["mode"] == "static" for r in keep):
        out += ["", static_table(keep)]
    g, load = goodputs(keep, cfg.attainment), grouped(keep)
    for e in dict.fromkeys(r["engine"] for r in keep):
        fixed, tab = g.get(("pair", "draft", e)), g.get(("pair", "draft, K table", e))
        wins = [(rate, _med(by.get(e, []), "tpot_p50_s"), _med(load.get(("pair", "draft", rate), {}).get(e, []),
                                                                "tpot_p50_s"))
                for (_, s, rate), by in load.items() if s == "draft, K table"]
        better = sum(1 for _, a, b in wins if a is not None and b is not None and a < b)
        ks = [x for x in (_med(load[k].get(e, []), "mean_k") for k in load if k[1] == "draft, K table") if x]
        out.append(f"{e}: the table's TPOT p50 beats fixed K at {better} of {len(wins)} rates; goodput "
                   + (f"{statistics.mean(tab):.3g} (table) vs {statistics.mean(fixed):.3g} (fixed)" if fixed and tab
                      else "-") + (f"; mean K drafted with the table {min(ks):.2f}-{max(ks):.2f}" if ks else ""))
    return "\n".join(out) + "\n"


def write(rows: list[dict], cfg, meta: dict, out: Path, table: dict | None) -> None:
    """The .txt table and .png plot beside the .jsonl; vllm_k_table.txt and .jsonl when the K table ran."""
    body = text(rows, cfg, meta)
    try:
        plot(rows, cfg).savefig(out.with_suffix(".png"), dpi=120)
    except ImportError:  # the vLLM environment may lack matplotlib: redraw from the .jsonl where it is installed
        body += (f"(no plot: matplotlib is not installed here; `minispec vs-vllm --from-jsonl {out}.jsonl` redraws the "
                 "table and the plot where it is)\n")
    out.with_suffix(".txt").write_text(body)
    if table is not None:
        kt = out.with_name("vllm_k_table")
        kt.with_suffix(".txt").write_text(k_table_text(rows, cfg, table))
        keep = [r for r in rows if r["workload"] == "pair" and r["setting"] in ("draft", "draft, K table")]
        kt.with_suffix(".jsonl").write_text("".join(json.dumps(r) + "\n" for r in [{"k_table": table, "meta": meta},
                                                                                   *keep]))


def _series(pts, key: str, scale: float = 1.0) -> list[float]:
    """Medians of ``key`` at each (rate, rows) point; nan where none."""
    return [NAN if (v := _med(rs, key)) is None else scale * v for _, rs in pts]


def plot(rows: list[dict], cfg):
    """TPOT p50 and throughput against the arrival rate, per workload: both engines, every setting."""
    from matplotlib.figure import Figure

    ws = list(dict.fromkeys(r["workload"] for r in rows))
    fig = Figure(figsize=(11, 4 * len(ws)), layout="constrained")
    axes = fig.subplots(len(ws), 2, squeeze=False)
    colors, styles = {"minispec": "tab:blue", "vllm": "tab:orange"}, ["o-", "s--", "^:", "d-."]
    for (tpot, thr), w in zip(axes, ws):
        settings = list(dict.fromkeys(r["setting"] for r in rows if r["workload"] == w))
        for e in colors:
            for setting, style in zip(settings, styles):
                pts = sorted((rate, by[e]) for (ww, s, rate), by in grouped(rows).items()
                             if ww == w and s == setting and e in by)
                if pts:
                    x = [p[0] for p in pts]
                    tpot.plot(x, _series(pts, "tpot_p50_s", 1e3), style, color=colors[e], label=f"{e}, {setting}")
                    thr.plot(x, _series(pts, "throughput"), style, color=colors[e], label=f"{e}, {setting}")
        tpot.axhline(1e3 * cfg.slo_of(w)[1], color="gray", ls="--", lw=1)
        rates = sorted({r["rate"] for r in rows if r["workload"] == w and r["mode"] == "load" and not r["bisect"]})
        for ax, ylabel in ((tpot, "TPOT p50 (ms)"), (thr, "output tokens/s (steady state)")):
            ax.set(xlabel="arrival rate (requests/s)", ylabel=ylabel, xscale="log", title=f"{w}: {ylabel}")
            ax.set_xticks(rates, [f"{r:g}" for r in rates])
            ax.minorticks_off()
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize="x-small")
    return fig


def read(path: str | Path) -> tuple[list[dict], dict]:
    """The rows and the run's metadata (its first line) of a vs-vllm .jsonl file."""
    lines = [json.loads(x) for x in Path(path).read_text().splitlines() if x.strip()]
    if not lines or "meta" not in lines[0]:
        raise ValueError(f"{path}: not a minispec vs-vllm .jsonl (its first line holds the run's metadata)")
    return lines[1:], lines[0]["meta"]


def progress_line(r: dict) -> str:
    at = f"rate {r['rate']:g}/s seed {r['seed']}" + (" (bisect)" if r.get("bisect") else "") if r["mode"] == "load" \
        else f"static batch {r['batch']}"
    acc = f", accept {r['acceptance_rate']:.2f}" if r.get("acceptance_rate") is not None else ""
    slo = f", SLOs {r['slo_met']:.0%}" if "slo_met" in r else ""
    return (f"{r['workload']} {r['setting']:>14} {r['engine']:>8} {at}: TPOT p50 {_fmt(r['tpot_p50_s'], 1e3, '{:.1f}')}"
            f" ms, {r['throughput']:.0f} tok/s{acc}{slo} ({r['wall_s']:.0f} s, load {r['loadavg_before']:.1f})")
