"""Published cases where speculation hurt, as serving-simulator settings, each with its source and figures.

Each :class:`Incident` says where a figure was published, what was run, what the report does not say
(and the setting therefore assumes), and the figures themselves as ratios: > 1 the speculative (or
second) setting is faster, < 1 slower. :func:`replay` runs the setting in :mod:`minispec.serving` and
returns the simulated figure under the same name, beside the knobs it had to fit (``fit: ...``).

What a replay fits, it fits to one published figure and then predicts another; a figure fitted is
equal to its published value by construction, and says only what the knob had to be. The knobs are
what the roofline leaves out: a fixed cost per forward pass or per step (kernel launches, scheduling,
an engine's bookkeeping), and an acceptance rate the report did not give. Tensor parallelism is
:class:`~minispec.serving.RooflineSteps`'s: tp x one GPU's bandwidth, FLOP/s and memory, plus two
all-reduces per layer per forward, each 10 us of latency plus a ring's bytes over NVLink.

    for row in compare():
        print(row["incident"], row["figure"], row["published"], row["simulated"])
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from minispec.roofline import LLAMA_70B, ModelShape, MoE
from minispec.roofline.hardware import H100_SXM, Hardware
from minispec.roofline.policy import BatchTablePolicy
from minispec.serving import (
    Lengths,
    Request,
    RooflineSteps,
    Scheduler,
    StepTimes,
    Traffic,
    Workload,
    conditional,
    expected_tokens,
    poisson_requests,
    simulate,
)

# NVIDIA DGX Spark product page: GB10, 128 GB LPDDR5x unified memory at 273 GB/s, "1 PFLOP" of FP4 with
# sparsity. Dense BF16 is not printed; 125 TFLOP/s (1 PFLOP / 2 for dense / 4 from FP4 to BF16) is an assumption,
# and nothing below is compute-bound on it.
GB10 = Hardware("DGX Spark (GB10)", memory_bandwidth=273e9, peak_flops=125e12, memory_bytes=128e9)

NVFP4 = 4.5 / 8  # bytes per weight: a 4-bit value plus one 8-bit scale per 16 weights

# Shapes from the models' config.json files where the report names them; "assumed" marks what no config gave.
# turboderp/Qwama-0.5B-Instruct: Qwen2-0.5B's body (24 layers, 14 heads, 2 KV heads, head dim 64, hidden 896)
# with Llama 3's 128,256-token vocabulary, tied: about 0.36e9 + 0.11e9 params.
QWAMA_05B = ModelShape(0.47e9, 2, layers=24, heads=14, kv_heads=2, head_dim=64, name="Qwama-0.5B")
# HuggingFaceTB/SmolLM2-1.7B: 24 layers, 32 heads, 32 KV heads (no GQA), head dim 64, 1.71e9 params.
SMOLLM2_17B = ModelShape(1.71e9, 2, layers=24, heads=32, kv_heads=32, head_dim=64, name="SmolLM2-1.7B")
# HuggingFaceTB/SmolLM2-135M: 30 layers, 9 heads, 3 KV heads, head dim 64, 1.35e8 params.
SMOLLM2_135M = ModelShape(1.35e8, 2, layers=30, heads=9, kv_heads=3, head_dim=64, name="SmolLM2-135M")
# google/gemma-4-26B-A4B: 25.97e9 params, 128 experts, 8 per token (as reported); 4e9 active is the "A4B" of the
# name, which puts one expert at 22e9 / 120 params. Its KV is left out (8 rows of 500 tokens at most here).
GEMMA4_26B = ModelShape(25.97e9, NVFP4, moe=MoE(128, 8, 22e9 / 120), name="Gemma-4-26B-A4B NVFP4")
GEMMA4_MTP = ModelShape(0.4e9, NVFP4, name="Gemma 4 MTP drafter (assumed 0.4e9)")
# Qwen/Qwen3.5-122B-A10B: the experts are assumed (256, 8 per token, from 122e9 total and 10e9 active); Qwen3.5 is
# a hybrid of linear and full attention, so its KV is small and left out. Its MTP drafter: one layer and the LM
# head, assumed 1e9 params.
QWEN35_122B = ModelShape(122e9, NVFP4, moe=MoE(256, 8, 112e9 / 248), name="Qwen3.5-122B-A10B NVFP4")
QWEN35_MTP = ModelShape(1e9, NVFP4, name="Qwen3.5 MTP drafter (assumed 1e9)")

# Traffic shapes the reports name but do not size (assumed): ShareGPT chat turns of about 220 prompt and 200
# output tokens, CNN/DailyMail articles of about 1,000 tokens summarised in about 100.
SHAREGPT = Traffic("ShareGPT", 0.5, prompt=Lengths(220, "uniform"), output=Lengths(200, "geometric"))
CNN_DAILYMAIL = Traffic("CNN/DailyMail", 0.7, prompt=Lengths(1000, "uniform"), output=Lengths(100, "geometric"))
# vLLM V0 (2024-early 2025): max_num_seqs 256 (EngineArgs.__post_init__ in vllm/engine/arg_utils.py, read at commit
# 001999d2: "256 if not envs.VLLM_USE_V1 else 1024"); chunked prefill off (assumed: V0 turned it on by default only
# for long context windows), so a prefill step takes up to max_model_len tokens (arg_utils.py at 99d7eb5d: "if not
# self.enable_chunked_prefill: self.max_num_batched_tokens = model_config.max_model_len"): 8,192 for Llama 3, and
# the 2,500 that vllm#15025 set.
V0 = Scheduler(max_rows=256, max_batched_tokens=8192)


@dataclass(frozen=True)
class Incident:
    """A published report of speculation slowing a server, and the figures to replay."""

    name: str  # the key of INCIDENTS
    source: str  # where it was published
    setup: str  # what was run, in the report's words
    published: dict[str, float]  # figure -> value, as a speedup of the second setting over the first
    assumed: str  # what the report does not say, and the setting assumes


INCIDENTS = {i.name: i for i in (
    Incident(
        "vllm-blog-2024-10-17",
        "https://blog.vllm.ai/2024/10/17/spec-decode.html (vllm-project/vllm-project.github.io, "
        "_posts/2024-10-17-spec-decode.md)",
        "Llama-3-70B on 4xH100, vLLM V0; a draft model (turboderp/Qwama-0.5B-Instruct) on ShareGPT, n-grams on "
        "CNN/DailyMail; speedup at QPS 1, slowdown 'at high QPS'.",
        {"draft model, QPS 1": 1.5, "n-gram, QPS 1": 2.8, "draft model, high QPS": 1 / 1.4,
         "n-gram, high QPS": 1 / 1.8},
        "K = 5 (the blog's code examples), the draft at the target's tensor parallelism (vLLM's default then), "
        "H100 SXM, the traffic lengths above; acceptance is not published, so alpha is fitted to the QPS-1 figure "
        "at batch 1; 'high QPS' is HIGH_QPS below; the metric is p50 TPOT (the blog's plots are not in its text).",
    ),
    Incident(
        "vllm#49548",
        "https://github.com/vllm-project/vllm/issues/49548",
        "Qwen3.5-122B MTP, static num_speculative_tokens 2 against the table [[1,4,2],[5,512,0]]: single stream "
        "59.6 -> 50.0 tok/s (the table turns cudagraphs to PIECEWISE); 8 concurrent 180-token requests "
        "~232 tok/s -> 24-157 tok/s (the figure is the best run), 40-60 s of wall clock for a 6.3 s workload.",
        {"table over static K=2, single stream": 50.0 / 59.6, "table over static K=2, 8 concurrent": 157 / 232},
        "hardware not stated in what I read: a DGX Spark with NVFP4 weights fits the single-stream rate, so the "
        "setting runs there; the experts and drafter size are assumed (above); 100-token prompts; the MTP acceptance "
        "is not given, so it is fitted to the static single-stream rate with no overhead at all.",
    ),
    Incident(
        "spark-vllm-docker#343",
        "https://github.com/eugr/spark-vllm-docker/issues/343",
        "gemma4-26b-a4b-nvfp4 with MTP on one DGX Spark, 400 max tokens: K=4 55.6 tok/s single stream, 210.0 "
        "at 8 concurrent; K=2 54.9 and 303.6. Per-position acceptance at K=4 0.844 / 0.599 / 0.385 / 0.271, at "
        "K=2 0.766 / 0.545. The reporter calls the concurrent figures noisy.",
        {"K=2 over K=4, single stream": 54.9 / 55.6, "K=2 over K=4, 8 concurrent": 303.6 / 210.0},
        "the drafter's size (0.4e9) and the expert layout (above); 100-token prompts; the same acceptance at "
        "every concurrency.",
    ),
    Incident(
        "vllm#15025",
        "https://github.com/vllm-project/vllm/issues/15025",
        "SmolLM2-1.7B with a distilled SmolLM2-135M draft, 5 speculative tokens, offline LLM.generate, 256 max "
        "tokens, greedy, vLLM 0.6.2 and 0.7.3: about 30 % slower than no speculation.",
        {"K=5 over no speculation": 0.7},
        "an H100 SXM; 256 prompts of 200 tokens at once (V0's 256 rows); acceptance 0.8 ('very high'); the "
        "per-pass cost is fitted to the published figure.",
    ),
)}


def _bisect(f, lo: float, hi: float, steps: int = 30) -> float:
    """The x in [lo, hi] where the monotone f crosses 0 (f(lo), f(hi) of opposite signs)."""
    if (f(lo) < 0) == (f(hi) < 0):
        raise ValueError(f"no crossing in [{lo}, {hi}]: the fit cannot reach the published figure there")
    below = f(lo) < 0
    for _ in range(steps):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if (f(mid) < 0) == below else (lo, mid)
    return (lo + hi) / 2


def _p50_tpot(requests: list[Request], steps: StepTimes, gamma: int) -> tuple[float, float]:
    """p50 TPOT (s) and p99 TTFT (s) of ``requests`` served by V0's scheduler."""
    summary = simulate(requests, steps, gamma, V0).summary(math.inf)
    return summary["tpot_p50_s"], summary["ttft_p99_s"]


def _batch1_speedup(steps: RooflineSteps, traffic: Traffic, gamma: int) -> float:
    """Step-level speedup at batch 1 and the traffic's mean context (prompt + half its output)."""
    context = np.array([traffic.prompt.mean + traffic.output.mean / 2])  # (1,)
    return expected_tokens(traffic.alpha, gamma) * steps.plain(context) / steps.speculative(context, gamma)


# 'High QPS': the highest rate on a grid of 4 requests/s at which both plain decoding and K = 5 still drain their
# queues (p99 TTFT under 1 s) with the fitted alpha; tests/serving/test_incidents.py checks the rule.
HIGH_QPS = {"draft model": 28.0, "n-gram": 16.0}  # requests/s


def _blog() -> dict[str, float]:
    """Fit alpha at batch 1 to the QPS-1 figure, simulate QPS 1 and a high QPS; fit a per-step cost to n-gram's."""
    incident, out = INCIDENTS["vllm-blog-2024-10-17"], {}
    plain = RooflineSteps(H100_SXM, LLAMA_70B, tensor_parallel=4)
    cases = {"draft model": (SHAREGPT, replace(plain, draft=QWAMA_05B)),
             "n-gram": (CNN_DAILYMAIL, replace(plain, draft_cost=0.0))}
    for label, (traffic, steps) in cases.items():
        goal = incident.published[f"{label}, QPS 1"]
        alpha = _bisect(lambda a, s=steps, t=traffic, g=goal: _batch1_speedup(s, replace(t, alpha=a), 5) - g,
                        0.01, 0.99)
        traffic = replace(traffic, alpha=alpha)
        out[f"fit: {label} alpha"] = alpha
        for rate, name in ((1.0, "QPS 1"), (HIGH_QPS[label], "high QPS")):
            requests = poisson_requests(Workload(rate=rate, duration_s=30.0, mix=(traffic,)))
            (off, off_ttft), (on, on_ttft) = _p50_tpot(requests, plain, 0), _p50_tpot(requests, steps, 5)
            out[f"{label}, {name}"] = off / on
            out[f"{label}, {name}: p99 TTFT s, plain / K=5"] = off_ttft, on_ttft
        cases[label] = traffic, steps, requests, off
    # What agreeing on n-gram's high-QPS slowdown takes: a fixed cost on every speculative step (the proposer and
    # the scoring of V0's speculative worker), found by bisection on the simulated ratio.
    _, steps, requests, off = cases["n-gram"]
    goal = incident.published["n-gram, high QPS"]
    out["fit: n-gram s per speculative step, to agree at high QPS"] = _bisect(
        lambda s: off / _p50_tpot(requests, replace(steps, step_overhead_s=s), 5)[0] - goal, 0.0, 0.2, 12)
    return out


@dataclass(frozen=True)
class TableEngine:
    """vLLM with ``num_speculative_tokens_per_batch_size`` set, around a step source: every forward pass pays
    ``piecewise_s`` more (the table turns cudagraphs from FULL_AND_PIECEWISE to PIECEWISE for the whole engine,
    per the vllm#49548 report), and a K = 0 step still runs one draft pass (the proposer keeps the drafter's KV
    in step)."""

    inner: RooflineSteps
    piecewise_s: float = 0.0  # s more per forward pass

    def plain(self, context):
        return self.inner.plain(context) + self.inner.draft_step(context) + 2 * self.piecewise_s

    def speculative(self, context, gamma):
        return self.inner.speculative(context, gamma) + (gamma + 1) * self.piecewise_s

    def prefill(self, batch, prompt_tokens, draft=False):
        return self.inner.prefill(batch, prompt_tokens, draft) + (1 + draft) * self.piecewise_s

    def kv_budget(self, draft=False):
        return self.inner.kv_budget(draft)


def _closed(steps: StepTimes, speculation, n: int, alpha, output: int, prompt: int = 100):
    """``n`` requests arriving together (a closed batch, as the reports ran them)."""
    return simulate([Request(0.0, prompt, output, alpha) for _ in range(n)], steps, speculation)


def _single_stream(steps: StepTimes, speculation, alpha, output: int) -> float:
    """Decode tokens/s of one request alone: 1 / TPOT (its TTFT apart, as the reports give it)."""
    return 1 / _closed(steps, speculation, 1, alpha, output).requests[0].tpot_s


def _aggregate(steps: StepTimes, speculation, n: int, alpha, output: int) -> float:
    """Output tokens/s of ``n`` requests together, from their arrival to the last finish."""
    run = _closed(steps, speculation, n, alpha, output)
    return n * output / run.span_s


def _k_table() -> dict[str, float]:
    """Fit the MTP acceptance to the static single-stream rate (the roofline alone, no overhead) and PIECEWISE's
    extra cost to the table's, then predict 8 concurrent requests: static K = 2 against the table's K = 0."""
    published, out = INCIDENTS["vllm#49548"].published, {}
    table = BatchTablePolicy(ranges=[[1, 4, 2], [5, 512, 0]])
    static = RooflineSteps(GB10, QWEN35_122B, draft=QWEN35_MTP, kv=False)
    alpha = _bisect(lambda a: _single_stream(static, 2, a, 180) - 59.6, 0.3, 0.99)
    goal = published["table over static K=2, single stream"]
    extra = _bisect(lambda x: _single_stream(TableEngine(static, x), table, alpha, 180) / 59.6 - goal, 0.0, 0.05)
    out["fit: MTP alpha"], out["fit: PIECEWISE s more per forward pass"] = alpha, extra
    out["table over static K=2, single stream"] = _single_stream(TableEngine(static, extra), table, alpha, 180) / 59.6
    static8 = _aggregate(static, 2, 8, alpha, 180)
    out["static K=2, 8 concurrent, tok/s (published ~232)"] = static8
    run = _closed(TableEngine(static, extra), table, 8, alpha, 180)
    out["table over static K=2, 8 concurrent"] = 8 * 180 / run.span_s / static8
    out["plain decoding (no table) over static K=2, 8 concurrent"] = _aggregate(static, 0, 8, alpha, 180) / static8
    out["table's wall clock, s (published 40-60)"] = run.span_s
    decode = sum(s.kind == "decode" for s in run.steps)
    out["fit: s of stall per decode step to reach 40 s"] = (40 - run.span_s) / decode
    steps8 = [s.seconds for s in _closed(static, 2, 8, alpha, 180).steps if s.kind == "decode"]
    out["static K=2 decode step at 8 rows, s"] = sum(steps8) / len(steps8)
    return out


def _mtp_k() -> dict[str, float]:
    """Fit a per-pass and a per-step cost to the two single-stream rates, then predict 8 concurrent, with the
    reported per-position acceptance and, for contrast, with one alpha per K (vLLM's average acceptance rate)."""
    k4, k2 = conditional((0.844, 0.599, 0.385, 0.271)), conditional((0.766, 0.545))
    base = RooflineSteps(GB10, GEMMA4_26B, draft=GEMMA4_MTP, kv=False)
    # A closed run's steps do not depend on the overheads, so its TPOT is linear in them: solve two equations.
    rows, goals = [], []
    for K, alpha, published in ((4, k4, 55.6), (2, k2, 54.9)):
        tpot = [1 / _single_stream(replace(base, pass_overhead_s=p, step_overhead_s=s), K, alpha, 400)
                for p, s in ((0.0, 0.0), (1e-3, 0.0), (0.0, 1e-3))]
        rows.append([(tpot[1] - tpot[0]) / 1e-3, (tpot[2] - tpot[0]) / 1e-3])  # s of TPOT per s of overhead
        goals.append(1 / published - tpot[0])
    pass_s, step_s = (float(x) for x in np.linalg.solve(np.array(rows), np.array(goals)))
    fitted = replace(base, pass_overhead_s=pass_s, step_overhead_s=step_s)
    out = {"fit: s per forward pass": pass_s, "fit: s per step": step_s,
           "tokens per step, K=4 / K=2": (expected_tokens(k4, 4), expected_tokens(k2, 2))}
    out["K=2 over K=4, single stream"] = _single_stream(fitted, 2, k2, 400) / _single_stream(fitted, 4, k4, 400)
    out["K=2 over K=4, 8 concurrent"] = _aggregate(fitted, 2, 8, k2, 400) / _aggregate(fitted, 4, 8, k4, 400)
    mean4, mean2 = sum((0.844, 0.599, 0.385, 0.271)) / 4, sum((0.766, 0.545)) / 2  # vLLM's "Avg Draft acceptance"
    out["K=2 over K=4, 8 concurrent, one alpha per K"] = (_aggregate(fitted, 2, 8, mean2, 400)
                                                          / _aggregate(fitted, 4, 8, mean4, 400))
    return out


def _smollm() -> dict[str, float]:
    """The roofline alone, then the per-pass cost that makes K = 5 30 % slower, for 256 prompts and for one."""
    base = RooflineSteps(H100_SXM, SMOLLM2_17B, draft=SMOLLM2_135M)
    scheduler = Scheduler(max_rows=256, max_batched_tokens=2500)

    def ratio(pass_s: float, prompts: int) -> float:
        steps, requests = replace(base, pass_overhead_s=pass_s), [Request(0.0, 200, 256, 0.8)] * prompts
        return simulate(requests, steps, 0, scheduler).span_s / simulate(requests, steps, 5, scheduler).span_s

    goal, out = INCIDENTS["vllm#15025"].published["K=5 over no speculation"], {}
    for prompts in (256, 1):
        pass_s = _bisect(lambda o, n=prompts: ratio(o, n) - goal, 0.0, 0.02, 20)
        out[f"roofline alone, {prompts} prompts"] = ratio(0.0, prompts)
        out[f"fit: s per forward pass, {prompts} prompts"] = pass_s
        out[f"target's roofline step at {prompts} rows, s"] = base.plain(np.full(prompts, 328.0))  # mean context
    out["K=5 over no speculation"] = ratio(out["fit: s per forward pass, 256 prompts"], 256)
    return out


def replay(name: str) -> dict:
    """Simulated figures of one incident, by the names of its published ones, with the fitted knobs (``fit: ...``)
    and a few figures that explain them."""
    runs = {"vllm-blog-2024-10-17": _blog, "vllm#49548": _k_table, "spark-vllm-docker#343": _mtp_k,
            "vllm#15025": _smollm}
    if name not in runs:
        raise ValueError(f"unknown incident {name!r}; known: {sorted(runs)}")
    return runs[name]()


def compare(replays: dict[str, dict] | None = None) -> list[dict]:
    """One row per published figure: incident, figure, published, simulated, source (``replays``: the results of
    :func:`replay` by incident, if already run)."""
    rows = []
    for incident in INCIDENTS.values():
        simulated = replays[incident.name] if replays else replay(incident.name)
        rows += [{"incident": incident.name, "figure": figure, "published": value, "simulated": simulated[figure],
                  "source": incident.source} for figure, value in incident.published.items()]
    return rows
