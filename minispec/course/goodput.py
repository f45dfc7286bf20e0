"""Goodput in steady state, from the serving simulator: DistServe's SLO goodput bisected per seed, beside the other two.

Three quantities go by the name *goodput*, and a lesson must say which it quotes:

- **DistServe's** (Zhong et al. 2024, arXiv 2401.09670): the highest request rate at which at least a target share
  (90 %) of requests meets both a TTFT and a TPOT SLO, *per GPU* (a server of n GPUs divides its rate by n).
  A rate: requests/s/GPU. :func:`slo_goodput` finds it by bisection on the arrival rate.
- **SmartSpec's** (Liu et al. 2024, arXiv 2406.14066): generated tokens per second of a step, the accepted draft
  tokens plus each row's bonus token over the step's time; it chooses K per step (and per request) to maximise it.
  A throughput that ignores latency: tokens/s. :func:`generated_rate` reads it off a run's decode steps.
- **Useful throughput**: output tokens/s of the requests that met their SLOs (``Run.goodput`` in
  :mod:`minispec.serving`; vLLM's serving benchmark counts such requests with ``--goodput``). Tokens/s again, but
  a request that missed an SLO counts for nothing.

**Steady state.** A run that starts empty and ends when its last request finishes has a ramp (few rows, fast steps)
and a drain (rows leaving, steps getting faster). Short runs are mostly ramp and drain, so they flatter a busy rate.
:func:`steady` scores only the requests that arrived inside a window: after a warm-up, and early enough that the
server was still receiving traffic while they ran (:class:`Window`).

Every second here comes from the simulator's step times; nothing is timed on the host.
"""

from __future__ import annotations

import math
import multiprocessing
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace

import numpy as np

from minispec.serving import Request, Run, Scheduler, StepTimes, Workload, poisson_requests, simulate


@dataclass(frozen=True)
class Window:
    """Arrivals over ``warmup_s + measure_s + tail_s`` seconds; the requests arriving in the middle ``measure_s``
    are scored. The tail keeps traffic arriving while the scored requests finish, so none of them runs in the drain."""

    warmup_s: float = 10.0  # s of arrivals before the first scored one
    measure_s: float = 30.0  # s of scored arrivals
    tail_s: float = 10.0  # s of arrivals after the last scored one

    def __post_init__(self):
        if min(self.warmup_s, self.tail_s) < 0 or not self.measure_s > 0:
            raise ValueError(f"need warmup_s, tail_s >= 0 and measure_s > 0: {self}")

    @property
    def duration_s(self) -> float:
        return self.warmup_s + self.measure_s + self.tail_s

    def scored(self, requests: list[Request]) -> list[Request]:
        return [r for r in requests if self.warmup_s <= r.arrival_s < self.warmup_s + self.measure_s]


def steady(run: Run, window: Window) -> list[Request]:
    """The requests of ``run`` that arrived inside the window's scored span."""
    return window.scored(run.requests)


def attainment(requests: list[Request], tpot_slo_s: float, ttft_slo_s: float = math.inf) -> float:
    """Share of ``requests`` meeting both SLOs (a one-token request has no TPOT, and meets that one)."""
    if not requests:
        raise ValueError("no requests to score: widen the window or raise the rate")
    return sum(not r.tpot_s > tpot_slo_s and not r.ttft_s > ttft_slo_s for r in requests) / len(requests)


def serve(rate: float, steps: StepTimes, speculation, workload: Workload, window: Window, seed: int = 0,
          scheduler: Scheduler | None = None) -> Run:
    """One simulated run at ``rate`` requests/s: the workload's Poisson arrivals over the window's duration, served
    with ``scheduler`` (None: vLLM's defaults on an H100, :class:`minispec.serving.Scheduler`)."""
    requests = poisson_requests(replace(workload, rate=rate, duration_s=window.duration_s, seed=seed))
    return simulate(requests, steps, speculation, scheduler or Scheduler(), seed)


def slo_goodput(met: Callable[[float], float], lo: float, hi: float, resolution: float, target: float = 0.9,
                ) -> tuple[float, list[tuple[float, float]]]:
    """DistServe's goodput: the highest rate at which ``met(rate)`` (the share of requests meeting both SLOs) is at
    least ``target``, by bisection between ``lo`` and ``hi`` to within ``resolution`` requests/s. The ends are
    not run: ``lo`` is taken to meet the target and ``hi`` to miss it, and the evaluations returned (every
    (rate, share)) show whether the bracket held: at least one must meet the target and one miss it (else the
    answer is an end of the bracket, and the bracket was wrong). Attainment is not monotone in the rate for one
    seed's traffic, so bisection finds *a* crossing; the spread over seeds shows how much that matters."""
    if not 0 < lo < hi or not resolution > 0:
        raise ValueError(f"need 0 < lo < hi and resolution > 0, got {lo}, {hi}, {resolution}")
    seen = []
    while hi - lo > resolution:
        mid = (lo + hi) / 2
        share = met(mid)
        seen.append((mid, share))
        lo, hi = (mid, hi) if share >= target else (lo, mid)
    return lo, seen


def bracketed(seen: list[tuple[float, float]], target: float = 0.9) -> bool:
    """Whether a bisection's evaluations met the target somewhere and missed it somewhere (its answer is inside)."""
    return any(s >= target for _, s in seen) and any(s < target for _, s in seen)


def _one_seed(args) -> tuple[float, list[tuple[float, float]]]:
    steps, speculation, workload, window, seed, lo, hi, resolution, tpot_slo_s, ttft_slo_s, scheduler, target = args

    def met(rate):
        run = serve(rate, steps, speculation, workload, window, seed, scheduler)
        return attainment(steady(run, window), tpot_slo_s, ttft_slo_s)
    return slo_goodput(met, lo, hi, resolution, target)


def seeds_goodput(steps: StepTimes, speculation, workload: Workload, window: Window, seeds, lo: float, hi: float,
                  resolution: float, tpot_slo_s: float, ttft_slo_s: float, gpus: int = 1,
                  scheduler: Scheduler | None = None, target: float = 0.9, workers: int = 1,
                  ) -> tuple[list[float], list[list[tuple[float, float]]]]:
    """DistServe's goodput per GPU for each seed (the bisected rate of the whole server divided by ``gpus``), and
    each seed's (rate, share meeting both SLOs) evaluations. ``workers`` > 1 runs seeds in forked processes (each
    run is pure Python and deterministic, so the answer does not depend on it)."""
    jobs = [(steps, speculation, workload, window, s, lo, hi, resolution, tpot_slo_s, ttft_slo_s, scheduler, target)
            for s in seeds]
    if workers > 1 and "fork" in multiprocessing.get_all_start_methods():
        with ProcessPoolExecutor(min(workers, len(jobs)), mp_context=multiprocessing.get_context("fork")) as pool:
            found = list(pool.map(_one_seed, jobs))
    else:
        found = [_one_seed(job) for job in jobs]
    return [rate / gpus for rate, _ in found], [seen for _, seen in found]


def generated_rate(run: Run) -> float:
    """SmartSpec's goodput over a run: tokens generated (accepted drafts and bonus tokens, every output token after
    the first) per second of decode steps. The prefill's first tokens and its time are left out."""
    decode_s = sum(s.seconds for s in run.steps if s.kind == "decode")
    tokens = sum(r.output_tokens - 1 for r in run.requests)
    return tokens / decode_s if decode_s else 0.0


def useful_throughput(requests: list[Request], tpot_slo_s: float, ttft_slo_s: float = math.inf) -> float:
    """Output tokens/s of the requests that met both SLOs, over the span from the first arrival to the last finish
    among ``requests``."""
    ok = [r for r in requests if not r.tpot_s > tpot_slo_s and not r.ttft_s > ttft_slo_s]
    span = max(r.finish_s for r in requests) - min(r.arrival_s for r in requests)
    return sum(r.output_tokens for r in ok) / span


def spread(values) -> tuple[float, float, float]:
    """(mean, min, max) of ``values``."""
    v = np.asarray(list(values), dtype=float)
    return float(v.mean()), float(v.min()), float(v.max())


def full_run(out: str = "results/cpu/goodput_steady.json", seeds: int = 5, workers: int = 2) -> dict:
    """Lesson 10's goodput study at full size: minutes of arrivals a run (15 s of warm-up, 60 s scored, 15 s of tail),
    ``seeds`` seeds, bisected to 2.5 requests/s; the H100 (off, gamma 4, gated) and the H200 (off, gated). The
    lesson runs the same code CI-sized and shows this file as a record. Written as JSON with its settings, the
    revision and the per-seed evaluations."""
    import json
    import platform
    import subprocess
    import time as _time

    from minispec.roofline import LLAMA_1B, hardware
    from minispec.serving import Lengths, RooflineSteps, Traffic

    work = Workload(mix=(Traffic(prompt=Lengths(128, "uniform"), output=Lengths(128, "uniform")),))
    window = Window(warmup_s=15, measure_s=60, tail_s=15)
    h100 = RooflineSteps(draft=LLAMA_1B)
    h200 = replace(h100, hardware=hardware.H200)
    runs = {"H100, off": (h100, 0, 50, 100), "H100, gamma 4": (h100, 4, 110, 160),
            "H100, gated": (h100, h100.policy(alpha0=0.8, gamma_max=4), 130, 180),
            "H200, off": (h200, 0, 150, 200), "H200, gated": (h200, h200.policy(alpha0=0.8, gamma_max=4), 150, 200)}
    rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    record = {"command": "python -m minispec.course.goodput", "revision": rev, "machine": platform.machine(),
              "started": _time.strftime("%Y-%m-%d %H:%M:%S"), "window_s": [window.warmup_s, window.measure_s,
                                                                          window.tail_s],
              "seeds": seeds, "resolution": 2.5, "slo_s": {"ttft": 1.0, "tpot": 0.008}, "settings": {}}
    for name, (steps, spec, lo, hi) in runs.items():
        t0 = _time.perf_counter()
        rates, seen = seeds_goodput(steps, spec, work, window, range(seeds), lo, hi, 2.5, 0.008, 1.0, workers=workers)
        record["settings"][name] = {"goodput": rates, "bracket": [lo, hi], "evaluations": seen,
                                    "bracketed": [bracketed(s) for s in seen], "seconds": _time.perf_counter() - t0}
        print(f"{name}: {rates} ({_time.perf_counter() - t0:.0f} s)", flush=True)
        with open(out, "w") as f:
            json.dump(record, f, indent=1)
    return record


if __name__ == "__main__":
    full_run()
