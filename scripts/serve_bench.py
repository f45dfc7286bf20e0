"""Measured under load: the engine serving Poisson traffic, plain decoding against speculative settings.

For each arrival rate, the same requests (prompts cut from held-out code, Poisson arrivals) are served
by one engine per setting, interleaved rate by rate so that a change in the machine's load falls on
every setting alike. Per (rate, setting): TTFT and TPOT p50/p99, throughput, the share of requests
that meet both SLOs, token goodput, the mean running batch and gamma, acceptance. Goodput as
DistServe (Zhong et al. 2024) defines it: the highest rate at which at least ``attainment`` of the
requests meet both SLOs.

The engine's clock skips idle gaps (``Engine.run(realtime=False)``): every step costs what it took,
but the run does not wait for arrivals, so a light rate costs its compute only.
"""

from __future__ import annotations

import json
import os
import random
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch

from minispec.bench import environment
from minispec.engine import Engine, Request
from minispec.serving import Lengths, Traffic, Workload, poisson_requests
from minispec.serving import Request as SimRequest
from minispec.stats import percentile


@dataclass(frozen=True)
class LoadConfig:
    rates: tuple[float, ...] = (1, 2, 4, 8, 16, 32)  # requests/s
    seconds: float = 8.0  # arrivals span about this long at each rate, within the request bounds below
    min_requests: int = 48
    max_requests: int = 256
    prompt: Lengths = Lengths(64, "uniform")  # tokens (32..96)
    output: Lengths = Lengths(64, "uniform")  # tokens (32..96)
    temperature: float = 0.0
    ttft_slo_s: float = 1.0
    tpot_slo_s: float = 0.03
    attainment: float = 0.9  # DistServe's goodput: the highest rate at which this share meets both SLOs
    max_num_seqs: int = 64
    seed: int = 0
    settings: tuple[str, ...] = field(default=())  # filled in by the caller, for the record


def traffic(rate: float, cfg: LoadConfig, text: list[int]) -> tuple[list[Request], list[SimRequest]]:
    """The requests at ``rate``: the engine's (prompts cut from ``text``) and the simulator's (lengths only), one
    for one. The same seed at another rate draws the same lengths, the arrivals scaled (see poisson_requests)."""
    n = min(cfg.max_requests, max(cfg.min_requests, round(rate * cfg.seconds)))
    sims = _poisson(rate, n, cfg)
    rng = random.Random(cfg.seed + 1)
    reqs = []
    for r in sims:
        start = rng.randrange(len(text) - r.prompt_tokens)
        reqs.append(Request(text[start: start + r.prompt_tokens], r.output_tokens, temperature=cfg.temperature,
                            seed=rng.getrandbits(63), arrival_s=r.arrival_s))
    return reqs, sims


def _poisson(rate: float, n: int, cfg: LoadConfig) -> list[SimRequest]:
    """The first ``n`` requests of a Poisson stream at ``rate`` (the simulator's draw, cut to n)."""
    mix = (Traffic("code", 0.0, 1.0, cfg.prompt, cfg.output),)
    sims = poisson_requests(Workload(rate=rate, duration_s=2 * n / rate + 10 / rate, mix=mix, seed=cfg.seed))
    if len(sims) < n:
        raise RuntimeError(f"drew {len(sims)} requests, wanted {n}")
    return sims[:n]


def summarise(outs, engine: Engine, cfg: LoadConfig) -> dict:
    """One (rate, setting) point from the engine's outputs and stats."""
    tpots = [o.tpot_s for o in outs if len(o.tokens) > 1]
    met = [o.ttft_s <= cfg.ttft_slo_s and not o.tpot_s > cfg.tpot_slo_s for o in outs]
    span = max(o.finish_s for o in outs) - min(o.arrival_s for o in outs)
    s = engine.stats
    decode_s = sum(t for t, b in zip(s.step_s, s.batch_per_step) if b)
    weighted = lambda xs: sum(x * t for x, t, b in zip(xs, s.step_s, s.batch_per_step) if b) / decode_s  # noqa: E731
    return {
        "requests": len(outs), "output_tokens": sum(len(o.tokens) for o in outs),
        "ttft_p50_s": percentile([o.ttft_s for o in outs], 50), "ttft_p99_s": percentile([o.ttft_s for o in outs], 99),
        "tpot_p50_s": percentile(tpots, 50), "tpot_p99_s": percentile(tpots, 99),
        "itl_p50_s": percentile([g for o in outs for g in o.itl_s], 50),
        "itl_p99_s": percentile([g for o in outs for g in o.itl_s], 99),
        "throughput": sum(len(o.tokens) for o in outs) / span,  # output tokens/s, first arrival to last finish
        "goodput": sum(len(o.tokens) for o, m in zip(outs, met) if m) / span,  # tokens/s of requests within SLOs
        "slo_met": sum(met) / len(outs),
        "mean_batch": weighted(s.batch_per_step), "mean_gamma": weighted(s.gamma_per_step),
        "max_batch": max(s.batch_per_step), "steps": s.steps, "preemptions": s.preemptions,
        "acceptance_rate": s.acceptance_rate, "alpha_estimate": s.alpha_estimate,
        "mean_acceptance_length": s.mean_acceptance_length, "engine_s": s.wall_s, "phase_s": s.phase_s,
        "step_s": s.step_s, "batch_per_step": s.batch_per_step, "gamma_per_step": s.gamma_per_step,
        "prefill_tokens_per_step": [t - b * (1 + g) if g or b else t for t, b, g in
                                    zip(s.tokens_per_step, s.batch_per_step, s.gamma_per_step)],
    }


def sweep(target, settings: dict[str, dict], cfg: LoadConfig, text: list[int], out: Path | None = None,
          progress=print) -> list[dict]:
    """Every (rate, setting): one row. ``settings`` maps a name to Engine keyword arguments (draft, gamma, ...)."""
    engines = {name: Engine(target, max_num_seqs=cfg.max_num_seqs, **kw) for name, kw in settings.items()}
    warm = traffic(cfg.rates[0], replace(cfg, min_requests=4, max_requests=4), text)[0]
    for e in engines.values():
        e.run([replace(r, arrival_s=0.0, max_new_tokens=8) for r in warm])  # first calls: Philox, allocators
    env = environment(target.device, target.dtype) | {"threads": torch.get_num_threads()}
    rows = []
    for rate in cfg.rates:
        reqs, _ = traffic(rate, cfg, text)
        for name, engine in engines.items():
            load0, t0 = os.getloadavg()[0], time.perf_counter()
            row = {"setting": name, "rate": rate} | summarise(engine.run(reqs), engine, cfg)
            row |= {"wall_s": time.perf_counter() - t0, "loadavg_before": load0, "loadavg_after": os.getloadavg()[0],
                    "ttft_slo_s": cfg.ttft_slo_s, "tpot_slo_s": cfg.tpot_slo_s} | env
            rows.append(row)
            progress(f"rate {rate:g}/s {name:>16}: TPOT p50 {1e3 * row['tpot_p50_s']:.1f} ms p99 "
                     f"{1e3 * row['tpot_p99_s']:.1f}, TTFT p99 {row['ttft_p99_s']:.2f} s, "
                     f"{row['throughput']:.0f} tok/s, "
                     f"SLOs met {row['slo_met']:.0%}, batch {row['mean_batch']:.1f}, gamma {row['mean_gamma']:.1f} "
                     f"({row['wall_s']:.0f} s, load {load0:.1f})")
            if out is not None:
                with open(out, "a") as f:
                    f.write(json.dumps(row) + "\n")
    return rows


def engine_step_table(target, draft, batches, gammas, contexts: tuple[int, ...], text: list[int],
                      progress=print) -> dict:
    """Step times measured through the engine, for the simulator: closed-loop runs of B requests, all at once, with
    prompts of each of ``contexts`` tokens, one run per (batch, gamma, context) (gamma 0: a plain engine).

    Returns ``{"step_s": {context: {(B, gamma + 1): s}}, "prefill": {"plain": [(tokens, s)], "draft": [...]}}``:
    the median full-batch decode step (every row decoding, no prefill) and the prefill-only steps by their tokens.
    """
    import numpy as np

    Engine(target, draft, gamma=max(gammas)).run([Request(text[:64], 8)] * 4)  # first calls: Philox, allocators
    steps, prefill = {c: {} for c in contexts}, {"plain": {}, "draft": {}}
    for context in contexts:
        for B in batches:
            for g in gammas:
                engine = Engine(target, draft if g else None, gamma=g or 1, max_num_seqs=B,
                                max_num_batched_tokens=B * (context + 1 + g))  # every prompt in one prefill step
                starts = range(0, len(text) - context, max(1, (len(text) - context) // B))
                engine.run([Request(text[i: i + context], 6 * (1 + g)) for i in list(starts)[:B]])
                s = engine.stats
                full = [t for t, b, p in zip(s.step_s, s.batch_per_step, s.prefill_per_step) if b == B and not p]
                steps[context][(B, g + 1)] = float(np.median(full))
                prefill["draft" if g else "plain"].update(
                    {n: t for n, t, b in zip(s.tokens_per_step, s.step_s, s.batch_per_step) if not b})
                progress(f"context {context} batch {B:>3} gamma {g}: {1e3 * steps[context][(B, g + 1)]:.1f} ms a "
                         f"step ({len(full)} steps)")
    return {"step_s": steps, "prefill": {k: sorted(v.items()) for k, v in prefill.items() if v}}


class EngineSteps:
    """The simulator's step times from :func:`engine_step_table`: a decode step by (batch, gamma), interpolated in
    batch and, between the measured contexts, linearly in the batch's longest row (the engine pads every row's
    attention to it); a prefill pass by its tokens, interpolated likewise."""

    def __init__(self, table: dict):
        from minispec.policy import StepTable

        self.contexts = sorted(table["step_s"])
        self.tables = [StepTable(table["step_s"][c], {1: 0.0}) for c in self.contexts]
        self.fit = table["prefill"]

    def _decode(self, context, tokens_per_row: int) -> float:
        at = [t.target(len(context), tokens_per_row) for t in self.tables]
        if len(at) == 1:
            return at[0]
        (c0, c1), (s0, s1) = self.contexts[:2], at[:2]  # two contexts: linear in the longest row, beyond them too
        return max(0.0, s0 + (s1 - s0) * (float(max(context)) - c0) / (c1 - c0))

    def plain(self, context):
        return self._decode(context, 1)

    def speculative(self, context, gamma):
        return self._decode(context, gamma + 1)

    def prefill(self, batch, prompt_tokens, draft=False):
        from minispec.policy import _interp

        return _interp(self.fit["draft" if draft and "draft" in self.fit else "plain"], batch * prompt_tokens)

    def kv_budget(self, draft=False):
        return None


def goodput_rate(rows: list[dict], setting: str, attainment: float = 0.9) -> float:
    """DistServe's goodput: the highest rate at which ``attainment`` of the requests met both SLOs (0: none)."""
    return max((r["rate"] for r in rows if r["setting"] == setting and r["slo_met"] >= attainment), default=0.0)


def plot(rows: list[dict], cfg: LoadConfig, title: str = ""):
    """TTFT p99, TPOT p50/p99, SLO attainment and throughput against the arrival rate, one colour per setting."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(12, 8), layout="constrained")
    (ttft, tpot), (met, thr) = fig.subplots(2, 2)
    for setting in dict.fromkeys(r["setting"] for r in rows):
        mine = sorted((r for r in rows if r["setting"] == setting), key=lambda r: r["rate"])
        x = [r["rate"] for r in mine]
        (line,) = tpot.plot(x, [1e3 * r["tpot_p50_s"] for r in mine], "o-", label=f"{setting} p50")
        c = line.get_color()
        tpot.plot(x, [1e3 * r["tpot_p99_s"] for r in mine], ":", color=c, label=f"{setting} p99")
        ttft.plot(x, [r["ttft_p99_s"] for r in mine], "o-", color=c, label=setting)
        met.plot(x, [100 * r["slo_met"] for r in mine], "o-", color=c, label=setting)
        thr.plot(x, [r["throughput"] for r in mine], "o-", color=c, label=setting)
    tpot.axhline(1e3 * cfg.tpot_slo_s, color="gray", ls="--", lw=1)
    ttft.axhline(cfg.ttft_slo_s, color="gray", ls="--", lw=1)
    met.axhline(100 * cfg.attainment, color="gray", ls="--", lw=1)
    for ax, ylabel, t in ((ttft, "TTFT p99 (s)", "time to first token"), (tpot, "TPOT (ms)", "time per output token"),
                          (met, "% of requests", "meeting both SLOs"), (thr, "output tokens/s", "throughput")):
        ax.set(xlabel="arrival rate (requests/s)", ylabel=ylabel, title=t, xscale="log")
        ax.set_xticks(list(cfg.rates), [f"{r:g}" for r in cfg.rates])
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="x-small")
    if title:
        fig.suptitle(title)
    return fig


if __name__ == "__main__":
    import argparse

    import minispec
    from minispec.bench import BenchConfig, vllm_table
    from minispec.load import sample_text
    from minispec.policy import BatchTablePolicy

    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--rates", default="1,2,4,8,16,32")
    p.add_argument("--out", default="results/cpu/engine_load")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--min-requests", type=int, default=48)
    p.add_argument("--max-requests", type=int, default=256)
    p.add_argument("--settings", default="plain,gamma 4,auto,vllm table,eagle gamma 4")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    target, _ = minispec.load("tiny-code-target")
    draft, _ = minispec.load("tiny-code-draft")
    eagle = minispec.EagleDraft.from_pretrained("tiny-code-eagle", target)
    cfg = LoadConfig(rates=tuple(float(r) for r in args.rates.split(",")), seconds=args.seconds,
                     min_requests=args.min_requests, max_requests=args.max_requests)
    wanted = args.settings.split(",")
    settings = {"plain": {}, "gamma 4": dict(draft=draft, gamma=4), "auto": dict(draft=draft, gamma="auto"),
                "eagle gamma 4": dict(draft=eagle, gamma=4)}
    if "vllm table" in wanted:
        table = vllm_table("tiny-code-target", "tiny-code-draft", BenchConfig(batches=(1, 2, 4, 8, 16, 32, 64),
                                                                              gammas=(6,), repeats=3))
        print("vLLM table:", table, table.note)
        settings["vllm table"] = dict(draft=draft, gamma=BatchTablePolicy.from_config(table.config))
    settings = {k: settings[k] for k in wanted}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    jsonl = out.with_suffix(".jsonl")
    jsonl.unlink(missing_ok=True)
    cfg = replace(cfg, settings=tuple(settings))
    rows = sweep(target, settings, cfg, list(sample_text("code")), jsonl)
    plot(rows, cfg, "tiny-code-target on this CPU").savefig(out.with_suffix(".png"), dpi=120)
    print({s: goodput_rate(rows, s, cfg.attainment) for s in settings})
    print(json.dumps(asdict(cfg), default=str))
