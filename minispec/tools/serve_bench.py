"""Measure the engine under load, with the simulator's prediction for the same traffic beside it.

:func:`serve_bench` (``minispec serve-bench``) serves Poisson traffic with :class:`minispec.engine.Engine`
at each arrival rate, once per setting (plain decoding, a fixed gamma, the roofline-gated policy, vLLM's
batch-size table), the same requests for every setting, interleaved rate by rate so that a change in the
machine's load falls on all of them alike. Per (rate, setting): TTFT and TPOT p50/p99, throughput, the
share of requests meeting both SLOs, token goodput, the mean running batch and gamma, acceptance.
Goodput as DistServe (Zhong et al. 2024) defines it: the highest rate at which at least ``attainment``
of the requests meet both SLOs (:func:`goodput_rate`).

The report and the plot are :mod:`minispec.tools.serve_report`'s. Beside each measured row,
:func:`minispec.serving.simulate` serves the same requests: the engine's own
scheduler and cache size, step times measured through the engine (:func:`engine_step_table`), and
acceptance coins at the rates the engine measured per draft position there.

The engine's clock skips idle gaps (``Engine.run(realtime=False)``): every step costs what it took,
but a light rate costs its compute only, not its wall-clock span.
"""

from __future__ import annotations

import json
import math
import os
import random
import statistics
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from minispec.course.plots import matplotlib_missing
from minispec.decoding.stats import percentile
from minispec.drafts.model import as_draft
from minispec.engine import Engine, Request
from minispec.roofline import expected_tokens, vllm_config_from_speedup
from minispec.roofline.policy import BatchTablePolicy, GammaPolicy
from minispec.serving import EngineSteps, Lengths, Scheduler, Traffic, Workload, conditional, poisson_requests, simulate
from minispec.speculative.loop import gamma_policy
from minispec.tools.bench import environment, processor

# the report's names, re-exported too: the lessons read the report, the plot and the goodput from here
from minispec.tools.serve_report import TABLE_SOURCE, goodput_rate, goodput_text, plot, report  # noqa: F401


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
    tpot_slo_s: float = 0.05
    attainment: float = 0.9  # DistServe's goodput: the highest rate at which this share meets both SLOs
    max_num_seqs: int = 64
    seed: int = 0

    def __post_init__(self):
        bad = [r for r in self.rates if isinstance(r, bool) or not isinstance(r, (int, float)) or not 0 < r < math.inf]
        if not self.rates or bad:
            raise ValueError(f"need positive rates (requests/s, each finite), got {bad[0] if bad else 'none'!r}")
        if not 1 <= self.min_requests <= self.max_requests:
            raise ValueError(f"need 1 <= min_requests <= max_requests, got {self.min_requests} and {self.max_requests}")
        if not self.prompt.mean >= 1 or not self.output.mean >= 1:
            raise ValueError(f"need prompt and output lengths of at least 1 token, got {self.prompt.mean} and "
                             f"{self.output.mean}")
        if not 0 < self.ttft_slo_s < math.inf or not 0 < self.tpot_slo_s < math.inf:
            raise ValueError(f"need positive, finite SLOs, got TTFT {self.ttft_slo_s} s and TPOT {self.tpot_slo_s} s")
        if not self.max_num_seqs >= 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")


def traffic(rate: float, cfg: LoadConfig, text: list[int]) -> tuple[list, list]:
    """The requests at ``rate``: the engine's (prompts cut from ``text``) and the simulator's (lengths), one for
    one. Another rate draws the same lengths and prompts, with the arrivals scaled by the rates' ratio."""
    n = min(cfg.max_requests, max(cfg.min_requests, round(rate * cfg.seconds)))
    mix = (Traffic("code", 0.0, 1.0, cfg.prompt, cfg.output),)
    sims = poisson_requests(Workload(rate=rate, duration_s=(2 * n + 10) / rate, mix=mix, seed=cfg.seed))[:n]
    rng = random.Random(cfg.seed + 1)
    reqs = []
    for r in sims:
        start = rng.randrange(len(text) - r.prompt_tokens)
        reqs.append(Request(text[start: start + r.prompt_tokens], r.output_tokens, temperature=cfg.temperature,
                            seed=rng.getrandbits(63), arrival_s=r.arrival_s))
    return reqs, sims


def summarise(outs, engine: Engine, cfg: LoadConfig) -> dict:
    """One measured (rate, setting) point from the engine's outputs and stats."""
    tpots = [o.tpot_s for o in outs if len(o.tokens) > 1]
    met = [o.ttft_s <= cfg.ttft_slo_s and not o.tpot_s > cfg.tpot_slo_s for o in outs]
    span = max(o.finish_s for o in outs) - min(o.arrival_s for o in outs)
    s = engine.stats
    decode_s = sum(t for t, b in zip(s.step_s, s.batch_per_step) if b) or 1.0
    weighted = lambda xs: sum(x * t for x, t, b in zip(xs, s.step_s, s.batch_per_step) if b) / decode_s  # noqa: E731
    ttft = [o.ttft_s for o in outs]
    return {
        "source": "measured", "requests": len(outs), "output_tokens": sum(len(o.tokens) for o in outs),
        "ttft_p50_s": percentile(ttft, 50), "ttft_p99_s": percentile(ttft, 99),
        "tpot_p50_s": percentile(tpots, 50), "tpot_p99_s": percentile(tpots, 99),
        "itl_p50_s": percentile([g for o in outs for g in o.itl_s], 50),
        "itl_p99_s": percentile([g for o in outs for g in o.itl_s], 99),
        "throughput": sum(len(o.tokens) for o in outs) / span,  # output tokens/s, first arrival to last finish
        "goodput": sum(len(o.tokens) for o, m in zip(outs, met) if m) / span,  # tokens/s of requests within SLOs
        "slo_met": sum(met) / len(outs), "mean_batch": weighted(s.batch_per_step),
        "mean_gamma": weighted(s.gamma_per_step), "max_batch": max(s.batch_per_step), "steps": s.steps,
        "preemptions": s.preemptions, "acceptance_rate": s.acceptance_rate, "alpha_estimate": s.alpha_estimate,
        "per_position_acceptance_rates": s.per_position_acceptance_rates, "phase_s": s.phase_s,
        "synthetic": s.synthetic,
    }


def engine_step_table(target, draft, batches, gammas, contexts, text: list[int], progress=print,
                      rule=None, min_steps: int = 3) -> EngineSteps:
    """Step times measured through the engine: closed-loop runs of B requests with ``context``-token prompts, all
    at once, one per (context, batch, gamma) (gamma 0: a plain engine). A decode step's time is the median of the
    steps where every row decoded and nothing was prefilled; the prefill-only steps give prefill times. ``rule``:
    the speculative runs' accept rule (a synthetic one for random weights); ``min_steps``: full-batch steps a
    point's median takes at least."""
    Engine(target, draft, gamma=max(max(gammas), 1)).run([Request(text[:64], 8)] * 4)  # first calls: allocators
    steps, prefill = {c: {} for c in contexts}, {"plain": {}, "draft": {}}
    for context in contexts:
        for B in batches:
            for g in gammas:
                engine = Engine(target, draft if g else None, gamma=g or 1, max_num_seqs=B,
                                max_num_batched_tokens=B * (context + 1 + g),  # every prompt in one prefill step
                                **({} if rule is None else {"rule": rule}))
                stride = max(1, (len(text) - context) // B)
                n = (min_steps + 1) * (1 + g)  # tokens a row: min_steps steps even if every draft is accepted
                engine.run([Request(text[i * stride: i * stride + context], n) for i in range(B)])
                s = engine.stats
                full = [t for t, b, p in zip(s.step_s, s.batch_per_step, s.prefill_per_step) if b == B and not p]
                steps[context][(B, g + 1)] = statistics.median(full)
                prefill["draft" if g else "plain"].update(
                    {n: t for n, t, b in zip(s.tokens_per_step, s.step_s, s.batch_per_step) if not b})
                progress(f"engine step, context {context}, batch {B}, gamma {g}: "
                         f"{1e3 * steps[context][(B, g + 1)]:.1f} ms ({len(full)} steps)")
    return EngineSteps(steps, {k: sorted(v.items()) for k, v in prefill.items() if v})


TABLE_K = 4  # the largest K the measured vLLM table may choose


def _blocks(cfg: LoadConfig, block_size: int = 16) -> int:
    """One cache size for every setting: room for max_num_seqs of the longest requests and a step's lookahead,
    so memory is not what the sweep compares (the engine preempts when it runs out; the simulator too)."""
    longest = 2 * cfg.prompt.mean + 2 * cfg.output.mean + 16  # uniform lengths reach 1.5 x the mean
    return cfg.max_num_seqs * -(-longest // block_size)


def _gamma_max(gamma) -> int:
    """The longest draft a setting's gamma may take: an int, "auto" (AUTO_GAMMA_MAX), "table" or a policy's."""
    from minispec.speculative.loop import AUTO_GAMMA_MAX
    if isinstance(gamma, GammaPolicy):
        return gamma.gamma_max
    return {"auto": AUTO_GAMMA_MAX, "table": TABLE_K}.get(gamma, gamma)


def vllm_batch_table(steps: EngineSteps, alpha: float, gamma_max: int, largest_batch: int) -> BatchTablePolicy:
    """vLLM's batch-size table from engine step times: per batch, the K whose E(alpha, K) tokens a row per step
    beat plain decoding by the most (0 where none does, everywhere if none ever does), at the smallest context
    measured."""
    table = steps.tables[0]
    speedup = lambda B, g: expected_tokens(alpha, g) * table.target(B) / table.target(B, g + 1)  # noqa: E731
    try:
        return BatchTablePolicy.from_config(vllm_config_from_speedup(speedup, largest_batch, gamma_max))
    except ValueError:  # no K pays at any batch: vLLM would run without speculation
        return BatchTablePolicy(ranges=[[1, largest_batch, 0]])


def measure(target, settings: dict[str, dict], cfg: LoadConfig, text: list[int], out: Path | None = None,
            progress=print) -> list[dict]:
    """Every (rate, setting) measured, one row each (appended to ``out`` as they come). ``settings``: name ->
    Engine keyword arguments."""
    engines = {name: Engine(target, max_num_seqs=cfg.max_num_seqs, num_blocks=_blocks(cfg), **kw)
               for name, kw in settings.items()}
    # the lookahead a decoding row feeds besides its last token: gamma for a chain, a tree's nodes for a tree
    widths = {name: (lambda g: g) if kw.get("draft") is None else as_draft(kw["draft"]).width
              for name, kw in settings.items()}
    warm = traffic(cfg.rates[0], replace(cfg, min_requests=4, max_requests=4), text)[0]
    for e in engines.values():
        e.run([replace(r, arrival_s=0.0, max_new_tokens=8) for r in warm])  # first calls: Philox, allocators
    env = environment(target.device, target.dtype) | {"threads": torch.get_num_threads()}
    rows = []
    for rate in cfg.rates:
        reqs, _ = traffic(rate, cfg, text)
        for name, engine in engines.items():
            if engine.draft is not None:  # suffix decoding's global tree: every rate serves the same prompts, so
                engine.draft.reset()  # each starts empty, not holding these requests' outputs from the rate before
            load0, t0 = os.getloadavg()[0], time.perf_counter()
            row = {"setting": name, "rate": rate} | summarise(engine.run(reqs), engine, cfg)
            # each step: decoding rows, gamma, prompt tokens prefilled (none without a prefilling row; else the
            # step's tokens less each decoding row's 1 + lookahead, fewer by any draft the engine cut short), s
            s, width = engine.stats, widths[name]
            row["steps_taken"] = [(b, g, max(0, n - b * (1 + (width(g) if g else 0))) if pre else 0, t)
                                  for b, g, n, t, pre in zip(s.batch_per_step, s.gamma_per_step, s.tokens_per_step,
                                                             s.step_s, s.prefill_per_step)]
            row |= {"wall_s": time.perf_counter() - t0, "loadavg_before": load0, "loadavg_after": os.getloadavg()[0],
                    "ttft_slo_s": cfg.ttft_slo_s, "tpot_slo_s": cfg.tpot_slo_s} | env
            rows.append(row)
            progress(f"rate {rate:g}/s {name:>14}: TPOT p50 {1e3 * row['tpot_p50_s']:.1f} ms, p99 "
                     f"{1e3 * row['tpot_p99_s']:.1f} ms, TTFT p99 {row['ttft_p99_s']:.2f} s, "
                     f"{row['throughput']:.0f} tok/s, SLOs met {row['slo_met']:.0%}, batch {row['mean_batch']:.1f}, "
                     f"gamma {row['mean_gamma']:.1f} ({row['wall_s']:.0f} s, load {load0:.1f})")
            if out is not None:
                with open(out, "a") as f:
                    f.write(json.dumps({k: v for k, v in row.items() if k != "steps_taken"}) + "\n")
    return rows


def simulated(measured: list[dict], cfg: LoadConfig, text: list[int], speculation: dict[str, int | GammaPolicy],
              steps: dict[str, EngineSteps], scheduler: Scheduler, source: str = "simulated") -> list[dict]:
    """The simulator's row beside each measured one: the same requests, the engine's scheduling rules and cache,
    ``steps[setting]``'s step times, and acceptance per draft position as the engine measured it there."""
    rows = []
    for m in measured:
        _, sims = traffic(m["rate"], cfg, text)
        shares = tuple(m["per_position_acceptance_rates"])
        alpha = conditional(shares) if shares and min(shares) > 0 else (m["alpha_estimate"] or 0.0)
        run = simulate([replace(r, alpha=alpha) for r in sims], steps[m["setting"]], speculation[m["setting"]],
                       scheduler)
        rows.append({"setting": m["setting"], "rate": m["rate"], "source": source,
                     "preemptions": run.preemptions} | run.summary(cfg.tpot_slo_s, cfg.ttft_slo_s))
    return rows


def serve_bench(target, settings: dict[str, dict], cfg: LoadConfig, text: list[int], out: str | Path | None = None,
                simulate_too: bool = True, progress=print) -> list[dict]:
    """Measure ``settings`` (name -> Engine keyword arguments: draft, gamma; gamma "table" for vLLM's batch-size
    table from the engine's own step times) under ``cfg``'s load and, unless ``simulate_too`` is False,
    simulate each beside it. ``out``: a path prefix for .jsonl, .png and .txt; without matplotlib the .png is
    skipped, said through ``progress`` before any work and again at the end. Returns every row."""
    out = None if out is None else Path(out)
    no_plot = out is not None and matplotlib_missing()
    if no_plot:
        progress(f"minispec: warning: {no_plot}; serve-bench writes its report and rows, and skips the plot")
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.with_suffix(".jsonl").unlink(missing_ok=True)
    drafts = {id(kw.get("draft")): kw.get("draft") for kw in settings.values()}
    rules = {id(kw.get("draft")): kw.get("rule") for kw in settings.values()}
    G = max(_gamma_max(kw.get("gamma", 4)) for kw in settings.values())  # the widest step any setting may take
    gammas = [g for g in (0, 1, 2, 3, 4, 6, 8) if g <= G] + ([G] if G > 8 else [])  # others: interpolated
    steps = {}
    if simulate_too or any(kw.get("gamma") == "table" for kw in settings.values()):  # measured beside the sweep
        B = sorted({b for b in (1, 4, 16) if b < cfg.max_num_seqs} | {cfg.max_num_seqs // 2, cfg.max_num_seqs})
        contexts = (cfg.prompt.mean, cfg.prompt.mean + cfg.output.mean + cfg.output.mean // 2)  # typical, longest
        tables = {k: engine_step_table(target, d, B, gammas if d is not None else (0,), contexts, text, progress,
                                       rules[k]) for k, d in drafts.items()}
        steps = {name: tables[id(kw.get("draft"))] for name, kw in settings.items()}
    settings = dict(settings)
    for name, kw in settings.items():
        if kw.get("gamma") == "auto":  # one policy object, for the engine and the simulator alike
            settings[name] = kw | {"gamma": gamma_policy("auto", target, as_draft(kw["draft"]))}
        if kw.get("gamma") == "table":
            probe = Engine(target, kw["draft"], gamma=TABLE_K)
            probe.run([replace(r, arrival_s=0.0) for r in traffic(cfg.rates[0], cfg, text)[0][:8]])
            settings[name] = kw | {"gamma": vllm_batch_table(steps[name], probe.stats.alpha_estimate or 0.0, TABLE_K,
                                                             cfg.max_num_seqs)}
            progress(f"{name}: vLLM's table {settings[name]['gamma'].ranges} at alpha "
                     f"{probe.stats.alpha_estimate:.2f}")
    rows = measure(target, settings, cfg, text, None if out is None else out.with_suffix(".jsonl"), progress)
    if simulate_too:
        engine = Engine(target, max_num_seqs=cfg.max_num_seqs, num_blocks=_blocks(cfg))  # the sweep's cache
        sched = Scheduler(max_rows=cfg.max_num_seqs, max_batched_tokens=engine.max_num_batched_tokens,
                          kv_tokens=engine.capacity, block_size=engine.block_size)
        speculation = {n: 0 if kw.get("draft") is None else kw.get("gamma", 4) for n, kw in settings.items()}
        fitted = {n: EngineSteps.fit([s for r in rows if r["setting"] == n for s in r["steps_taken"]])
                  for n in settings}
        sim = simulated(rows, cfg, text, speculation, fitted, sched)
        sim += simulated(rows, cfg, text, speculation, steps, sched, TABLE_SOURCE)
        rows += sim
        if out is not None:
            with open(out.with_suffix(".jsonl"), "a") as f:
                f.writelines(json.dumps(r) + "\n" for r in sim)
            out.with_name(out.name + "_steps.json").write_text(json.dumps(
                {n: {"step_s": [[B, w, s] for (B, w), s in e.step_s[0].items()], "prefill_s": e.prefill_s["plain"]}
                 for n, e in fitted.items()}, indent=1) + "\n")
    for r in rows:
        r.pop("steps_taken", None)
    if out is not None:
        env = environment(target.device, target.dtype)
        loads = [r["loadavg_before"] for r in rows if "loadavg_before" in r]
        out.with_suffix(".txt").write_text(
            f"{report(rows, cfg)}\nLoad: {json.dumps(asdict(cfg), default=str)}\nMachine: {processor()} "
            f"({env['hardware']}), "
            f"{torch.get_num_threads()} threads, {env['dtype']}, git {env['git_revision']}, torch {env['torch']}; "
            f"load average {min(loads):.1f}-{max(loads):.1f} during the sweep\n")
        if no_plot:
            progress(f"plot skipped ({no_plot}); the report is in {out.with_suffix('.txt')}, the rows in "
                     f"{out.with_suffix('.jsonl')}")
        else:
            plot(rows, cfg, f"{env['hardware']}: the engine measured (solid), the simulator (dashed)").savefig(
                out.with_suffix(".png"), dpi=120)
    return rows


def run(target: str = "tiny-code-target", draft: str | None = "tiny-code-draft",
        gammas: tuple[str, ...] | None = None, cfg: LoadConfig = LoadConfig(), out: str | Path | None = "serve_bench",
        device=None, dtype=None, accept_rate: float | None = None, simulate_too: bool = True,
        tree: dict | str | None = None, hot_vocab: int | None = None, progress=print) -> tuple[list[dict], str]:
    """``minispec serve-bench``: load the pair by name, then :func:`serve_bench` plain decoding against one setting
    per entry of ``gammas`` (an integer, ``"auto"`` or ``"table"``; None: 4, or with a ``tree`` the tree's own
    depth), the draft named as ``minispec.tools.pair`` takes it (``tree``, ``hot_vocab`` too). A tree's settings
    are named after the tree ("tree budget=8,depth=3"). ``accept_rate``: a synthetic Bernoulli(alpha) acceptance
    (for random weights; the tokens do not follow p then). Torch's threads are the caller's. Returns the rows and
    the report."""
    from minispec.speculative.rule import accept_reject
    from minispec.tools.bench import SyntheticAcceptance
    from minispec.tools.pair import load_pair, prompt_tokens

    own_depth = gammas is None and tree is not None  # a tree drafts to its own depth unless told otherwise
    gammas = ("4",) if gammas is None else gammas
    for g in gammas:  # everything is checked before any model loads
        if not (g in ("auto", "table") or g.isdigit() and int(g) >= 1):
            raise ValueError(f"each gamma must be an integer >= 1, auto or table, got {g!r}")
    if gammas and draft is None:
        raise ValueError("speculative settings need a draft (--draft)")
    rule = accept_reject if accept_rate is None else SyntheticAcceptance(accept_rate)  # checks the rate
    model, tok, drafter = load_pair(target, draft, device, dtype, tree, hot_vocab)
    text = prompt_tokens(tok) or torch.randint(0, model.config.vocab_size, (1 << 16,),
                                               generator=torch.Generator().manual_seed(cfg.seed)).tolist()
    settings = {"plain": {}}
    if own_depth:
        settings[f"tree {_spec(tree)}"] = dict(draft=drafter, gamma=drafter.depth, rule=rule)
    for g in () if own_depth else gammas:
        name = f"gamma {g}" if g.isdigit() else g
        settings[name if tree is None else f"tree {_spec(tree)}, {name}"] = dict(
            draft=drafter, gamma=int(g) if g.isdigit() else g, rule=rule)
    rows = serve_bench(model, settings, cfg, text, out, simulate_too, progress)
    return rows, report(rows, cfg)


def _spec(tree: dict | str) -> str:
    """A tree's spec as the command line writes it: budget=8,depth=3."""
    return tree if isinstance(tree, str) else ",".join(
        f"{k}={','.join(map(str, v)) if isinstance(v, (list, tuple)) else v}" for k, v in tree.items())


def add_arguments(p) -> None:
    """``minispec serve-bench``'s own flags (the command line adds --threads, --draft, --device and --dtype)."""
    p.add_argument("--rates", default="1,2,4,8,16,32", help="arrival rates, requests/s")
    p.add_argument("--target", default="tiny-code-target", help="embedded name, checkpoint directory or shape:NAME")
    p.add_argument("--tree", default=None, metavar="SPEC", help="a tree grown by the draft, as for generate")
    p.add_argument("--hot-vocab", type=int, default=None, metavar="N", help="an EAGLE head's hot vocabulary")
    p.add_argument("--gamma", default=None, help="settings beside plain decoding: integers, auto (the roofline "
                   "policy), table (vLLM's batch-size table from step times measured here), comma-separated "
                   "(default: 4; with --tree, the tree's own depth)")
    p.add_argument("--requests", default="48,256", help="MIN,MAX requests a rate (about 8 s of arrivals between)")
    p.add_argument("--lengths", default="64,64", help="mean PROMPT,OUTPUT tokens (uniform, 0.5x to 1.5x)")
    p.add_argument("--slo", default="1,50", help="TTFT s,TPOT ms a request must meet (goodput: 90 %% of them)")
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument("--accept-rate", type=float, default=None, help="synthetic acceptance (random weights)")
    p.add_argument("--no-simulate", action="store_true", help="measure only")
    p.add_argument("--out", default="serve_bench", help="path prefix of the .jsonl, .png and .txt written")


def from_args(args, progress=print) -> str:
    """Run ``minispec serve-bench`` from its parsed flags; the report."""
    def numbers(flag: str, n: int | None = None, kind=float) -> tuple:  # comma-separated, n of them if given
        text = getattr(args, flag.replace("-", "_"))
        try:
            values = tuple(kind(x) for x in text.split(","))
        except ValueError:
            values = ()
        if not values or (n is not None and len(values) != n):
            what = "numbers" if kind is float else "integers"
            raise ValueError(f"--{flag} takes {n or 'some'} comma-separated {what}, got {text!r}")
        return values

    (lo, hi), (prompt, output) = numbers("requests", 2, int), numbers("lengths", 2, int)
    (ttft, tpot), rates = numbers("slo", 2), numbers("rates")
    bad = next((r for r in rates if not 0 < r < math.inf), None)
    if bad is not None:  # named with its flag here; LoadConfig says it for a caller of the library
        raise ValueError(f"--rates: need positive rates (requests/s, each finite), got {bad:g}")
    if min(prompt, output) < 1:
        raise ValueError(f"--lengths takes mean PROMPT,OUTPUT tokens, each >= 1, got {args.lengths!r}")
    cfg = LoadConfig(rates=rates, min_requests=lo, max_requests=hi, prompt=Lengths(prompt, "uniform"),
                     output=Lengths(output, "uniform"), ttft_slo_s=ttft, tpot_slo_s=tpot / 1e3,
                     max_num_seqs=args.max_num_seqs)
    gammas = None if args.gamma is None else tuple(g.strip() for g in args.gamma.split(","))
    return run(args.target, args.draft, gammas, cfg, args.out, args.device, args.dtype, args.accept_rate,
               not args.no_simulate, args.tree, args.hot_vocab, progress)[1]
