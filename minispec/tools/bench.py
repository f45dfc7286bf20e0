"""Measured, not only modelled: speculative against plain decoding across batch sizes.

For each (batch size, gamma, temperature) the sweep runs plain and speculative decoding on the
same prompts, with warm-up and repeats, and reports medians beside what the roofline predicts
for this device (its ceilings from :func:`minispec.roofline.hardware.calibrate`, or a GPU's datasheet).
One JSONL row per point. Step times measured here also feed a gamma policy and vLLM's table.
"""

from __future__ import annotations

import json
import platform
import statistics
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import torch

from minispec.decoding.plain import generate
from minispec.decoding.sampling import take
from minispec.model.llama import Model
from minispec.model.load import resolve
from minispec.roofline import ModelShape, leviathan_speedup, speculative_speedup, vllm_config_from_speedup
from minispec.roofline.hardware import Hardware, device_hardware
from minispec.roofline.policy import MeasuredPolicy
from minispec.speculative.loop import speculative_generate
from minispec.speculative.rule import accept_reject
from minispec.tools.pair import load_pair, prompt_tokens
from minispec.tools.steps import measure_step_time, measured_draft_cost, step_time_table


@dataclass(frozen=True)
class SyntheticAcceptance:
    """An accept rule for timing a given alpha, not for sampling: each draft token is accepted with
    probability ``alpha`` until a row's first rejection, then t is drawn from the target's p there.
    The output does not follow p (use :func:`~minispec.speculative.rule.accept_reject` for that), so
    the stats of a run with it say ``synthetic``."""

    alpha: float
    synthetic: ClassVar[bool] = True

    def __post_init__(self):
        if not 0 <= self.alpha <= 1:
            raise ValueError(f"the synthetic acceptance rate must be in [0, 1], got {self.alpha!r}")

    def __call__(self, p, q, x, u, draw):
        accepted = (u < self.alpha).cumprod(1).bool()  # (B, gamma)
        n = accepted.sum(1)  # (B,)
        return accepted, draw(take(p, n))  # (B,) t ~ p at the first rejection, or the bonus


@dataclass(frozen=True)
class BenchConfig:
    batches: tuple[int, ...] = (1, 2, 4, 8, 16, 32)  # batch sizes to sweep
    gammas: tuple[int, ...] = (4,)  # draft lengths
    temperatures: tuple[float, ...] = (0.0,)
    max_new_tokens: int = 64  # per row
    prompt_len: int = 64  # tokens per prompt
    repeats: int = 3  # timed runs per point (medians reported)
    warmup: int = 1  # untimed runs per point
    accept_rate: float | None = None  # synthetic acceptance (SyntheticAcceptance), None = the exact rule
    seed: int = 0

    def __post_init__(self):
        counts = dict(batches=self.batches, gammas=self.gammas, max_new_tokens=(self.max_new_tokens,),
                      prompt_len=(self.prompt_len,), repeats=(self.repeats,))
        for name, values in counts.items():
            if not values or not all(isinstance(v, int) and v >= 1 for v in values):
                raise ValueError(f"{name} must be integers >= 1, got {getattr(self, name)!r}")
        if not isinstance(self.warmup, int) or self.warmup < 0:
            raise ValueError(f"warmup must be an integer >= 0, got {self.warmup!r}")
        if not self.temperatures or any(t < 0 for t in self.temperatures):
            raise ValueError(f"temperatures must be numbers >= 0, got {self.temperatures!r}")
        if self.accept_rate is not None:
            SyntheticAcceptance(self.accept_rate)  # raises on a rate outside [0, 1]


def processor() -> str:
    """The CPU's model name (Linux), else the platform's, and the vector instructions torch's kernels use (AVX2,
    AVX512: the same model name has come with either here, at about 2x the speed)."""
    try:
        name = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        name = platform.processor() or platform.machine()
    return f"{name} ({torch.backends.cpu.get_cpu_capability()})"


def environment(device: torch.device, dtype: torch.dtype) -> dict:
    """What a result row needs to be reproduced: hardware, dtype, versions, git revision."""
    try:
        rev = subprocess.run(["git", "describe", "--always", "--dirty"], capture_output=True, text=True,
                             cwd=Path(__file__).parent, timeout=5).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        rev = None
    return {"hardware": device_hardware(device, dtype).name, "device": str(device),
            "dtype": str(dtype).removeprefix("torch."), "torch": torch.__version__,
            "cuda": torch.version.cuda, "python": platform.python_version(), "git_revision": rev}


def bench_point(target: Model, draft, prompts: list[list[int]], gamma: int, temperature: float,
                cfg: BenchConfig, hardware: Hardware) -> dict:
    """Plain and speculative decoding of the same prompts: medians of cfg.repeats runs, one JSONL row.

    ``draft``: a draft Model or a Draft (e.g. ``PromptLookupDraft()``).
    """
    kw = dict(max_new_tokens=cfg.max_new_tokens, temperature=temperature, seed=cfg.seed)
    rule = accept_reject if cfg.accept_rate is None else SyntheticAcceptance(cfg.accept_rate)
    runs = {"plain": [], "spec": []}
    for i in range(cfg.warmup + cfg.repeats):
        plain = generate(target, prompts, **kw)
        spec = speculative_generate(target, draft, prompts, gamma=gamma, rule=rule, **kw)
        if i >= cfg.warmup:
            runs["plain"].append(plain)
            runs["spec"].append(spec)
    mismatch = None
    if temperature == 0 and cfg.accept_rate is None and spec.tokens != plain.tokens:
        mismatch = greedy_mismatch(target, prompts, plain.tokens, spec.tokens)
        if target.device.type == "cpu" and target.dtype == torch.float32:  # the same arithmetic: must be equal
            raise RuntimeError(f"greedy speculative tokens differ from plain decoding (float32, CPU): {mismatch}")
    med = lambda k, f: statistics.median(f(r.stats) for r in runs[k])  # noqa: E731
    B = len(prompts)
    s = runs["spec"][-1].stats
    alpha = s.alpha_estimate or 0.0
    c = statistics.median(measured_draft_cost(p.stats, q.stats) for p, q in zip(runs["plain"], runs["spec"]))
    verify_ratio = (measure_step_time(target, B, gamma + 1, cfg.prompt_len)
                    / measure_step_time(target, B, 1, cfg.prompt_len))
    shape = ModelShape.from_model(target)
    return {
        "batch_size": B, "gamma": gamma, "temperature": temperature, "synthetic": s.synthetic, "draft": s.draft,
        "speedup": med("spec", lambda st: st.output_throughput) / med("plain", lambda st: st.output_throughput),
        "modelled_speedup": speculative_speedup(B, alpha, gamma, c, hardware, shape, cfg.prompt_len),
        "leviathan_speedup": leviathan_speedup(alpha, gamma, c),
        "output_throughput": med("spec", lambda st: st.output_throughput),
        "plain_output_throughput": med("plain", lambda st: st.output_throughput),
        "median_tpot_ms": 1e3 * med("spec", lambda st: st.tpot_p50_s),
        "p99_tpot_ms": 1e3 * med("spec", lambda st: st.tpot_p99_s),
        "plain_median_tpot_ms": 1e3 * med("plain", lambda st: st.tpot_p50_s),
        "plain_p99_tpot_ms": 1e3 * med("plain", lambda st: st.tpot_p99_s),
        "mean_ttft_ms": 1e3 * med("spec", lambda st: st.ttft_s),
        "plain_mean_ttft_ms": 1e3 * med("plain", lambda st: st.ttft_s),
        "acceptance_rate": s.acceptance_rate, "alpha_estimate": s.alpha_estimate,
        "mean_acceptance_length": s.mean_acceptance_length,
        "per_position_acceptance_rates": s.per_position_acceptance_rates,
        "num_drafts": s.num_drafts, "draft_tokens": s.draft_tokens, "accepted_tokens": s.accepted_tokens,
        "draft_cost_c": c, "verify_to_decode_step_ratio": verify_ratio,
        "phase_s": {k: statistics.median(r.stats.phase_s.get(k, 0.0) for r in runs["spec"]) for k in s.phase_s},
        "plain_phase_s": {k: statistics.median(r.stats.phase_s[k] for r in runs["plain"]) for k in plain.stats.phase_s},
        "max_new_tokens": cfg.max_new_tokens, "prompt_len": cfg.prompt_len, "repeats": cfg.repeats,
        "seed": cfg.seed, "greedy_mismatch": mismatch,
    }


def greedy_mismatch(target: Model, prompts: list[list[int]], plain: list[list[int]], spec: list[list[int]]):
    """Where greedy speculative tokens ``spec`` first differ from plain decoding's ``plain``, and how far
    apart the target's logits put the two tokens there; None where every row is equal.

    In bfloat16 or float16 on a GPU a 1-token decode step and a (gamma+1)-token verify step reduce in
    different orders, so a near-tie can round either way. The logits come from one more forward pass of
    the row's prompt and the tokens both runs agree on, in the model's dtype. ``logit_gap`` is the plain
    token's logit minus the speculative token's: a few ``logit_spacing`` (the dtype's resolution at those
    logits) is rounding; a large gap is a bug.
    """
    rows = [b for b, (a, s) in enumerate(zip(plain, spec)) if a != s]
    if not rows:
        return None
    b = rows[0]
    a, s = plain[b], spec[b]
    i = next((j for j, (x, y) in enumerate(zip(a, s)) if x != y), min(len(a), len(s)))  # or where one stopped
    with torch.inference_mode():
        logits = target(torch.tensor([prompts[b] + a[:i]], device=target.device))[0, -1]  # (V,)
    tokens = [row[i] if i < len(row) else None for row in (a, s)]  # None: that run had stopped (EOS)
    pair = logits[[t for t in tokens if t is not None]].float()  # (2,) or (1,)
    return {"rows": len(rows), "row": b, "index": i, "plain_token": tokens[0], "speculative_token": tokens[1],
            "logit_gap": float(pair[0] - pair[1]) if len(pair) == 2 else None,
            "logit_spacing": float(torch.finfo(logits.dtype).eps * pair.abs().max())}


def prompts_for(batch: int, length: int, vocab_size: int, tokens: list[int] | None = None,
                seed: int = 0) -> list[list[int]]:
    """``batch`` prompts of ``length`` tokens: evenly spaced slices of ``tokens`` (real text, encoded),
    or random ids when no text is given (acceptance is then measured on noise)."""
    if tokens is not None:
        if len(tokens) <= length:
            raise ValueError(f"the prompt text has {len(tokens)} tokens; need more than --prompt-len {length}")
        stride = max(1, (len(tokens) - length) // max(1, batch))
        return [list(tokens[(i * stride) % (len(tokens) - length):][:length]) for i in range(batch)]
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab_size, (batch, length), generator=g).tolist()


def sweep(target: Model, draft, cfg: BenchConfig, tokens: list[int] | None = None, out=None,
          progress: bool = True) -> list[dict]:
    """Every (batch, gamma, temperature) point of cfg on prompts cut from ``tokens`` (see
    :func:`prompts_for`); rows are appended to ``out`` (a path) as they come."""
    from tqdm.auto import tqdm

    hardware = device_hardware(target.device, target.dtype)
    env = environment(target.device, target.dtype)
    points = [(b, g, t) for t in cfg.temperatures for g in cfg.gammas for b in cfg.batches]
    rows = []
    for b, g, t in tqdm(points, desc="bench", disable=not progress):
        prompts = prompts_for(b, cfg.prompt_len, target.config.vocab_size, tokens, cfg.seed)
        row = bench_point(target, draft, prompts, g, t, cfg, hardware) | env
        rows.append(row)
        if out is not None:
            with open(out, "a") as f:
                f.write(json.dumps(row) + "\n")
    return rows


def break_even(rows: list[dict], key: str = "speedup") -> float | None:
    """The batch where ``key`` crosses 1.0 (log-linear interpolation between measured points), or None."""
    import math

    pts = sorted((r["batch_size"], r[key]) for r in rows)
    for (b0, s0), (b1, s1) in zip(pts, pts[1:]):
        if s0 >= 1 > s1:
            x0, x1 = math.log2(b0), math.log2(b1)
            return 2 ** (x0 + (s0 - 1) * (x1 - x0) / (s0 - s1))
    return None


def format_table(rows: list[dict]) -> str:
    """An aligned text table of the sweep."""
    cols = [("batch", "batch_size", "{:d}"), ("gamma", "gamma", "{:d}"), ("temp", "temperature", "{:.1f}"),
            ("plain tok/s", "plain_output_throughput", "{:.0f}"), ("spec tok/s", "output_throughput", "{:.0f}"),
            ("speedup", "speedup", "{:.2f}x"), ("modelled", "modelled_speedup", "{:.2f}x"),
            ("alpha", "alpha_estimate", "{:.2f}"), ("c", "draft_cost_c", "{:.3f}"),
            ("verify/decode", "verify_to_decode_step_ratio", "{:.2f}"),
            ("TPOT p50 ms", "median_tpot_ms", "{:.1f}"), ("TPOT p99 ms", "p99_tpot_ms", "{:.1f}")]
    cells = [[h for h, _, _ in cols]] + [[f.format(r[k]) if r.get(k) is not None else "-" for _, k, f in cols]
                                         for r in rows]
    return text_table(cells)


def text_table(cells: list[list[str]], left: int = 0) -> str:
    """Rows of strings as aligned columns, two spaces apart: the first ``left`` left-justified, the rest right."""
    widths = [max(len(row[i]) for row in cells) for i in range(len(cells[0]))]
    return "\n".join("  ".join(c.ljust(w) if j < left else c.rjust(w) for j, (c, w) in enumerate(zip(row, widths)))
                     for row in cells)


def _prepare(target: str, draft: str | None, device, dtype, prompts: str | None, out, compile: bool,
             cfg: BenchConfig):
    """Check ``out`` (its folder is created) and the prompts file before any work, then load and compile with
    a budget of 16 shapes per (batch, gamma) point of ``cfg`` (a shape past it raises, never runs eagerly)."""
    if out is not None:
        out = Path(out)
        if out.is_dir():
            raise ValueError(f"{out} is a directory; give a file name such as {out / 'sweep.jsonl'}")
        out.parent.mkdir(parents=True, exist_ok=True)
    if prompts is not None and not Path(prompts).is_file():
        raise ValueError(f"prompts file {prompts}: no such file")
    model, tok, drafter = load_pair(target, draft, device, dtype)
    if compile:
        budget = 16 * len(cfg.batches) * len(cfg.gammas)  # prefill, decode, verify and draft shapes per point
        model.compile(recompile_limit=budget)
        if isinstance(drafter, Model):  # prompt lookup has no model; layer skip shares the target's
            drafter.compile(recompile_limit=budget)
    return model, tok, drafter, out


@dataclass(frozen=True)
class BenchRun:
    """What :func:`run` measured; ``str()`` is the table and the break-even batches."""

    header: str  # the device's ceilings and where the prompts came from
    rows: list[dict]  # one per (batch, gamma, temperature) point, as :func:`bench_point` makes them
    summary: dict  # hardware, target, draft, and break_even: measured and modelled batch per (gamma, temperature)
    hf_baseline: dict | None = None  # transformers' generate beside minispec at batch 1, when asked for

    def __str__(self) -> str:
        fmt = lambda x: "none in range" if x is None else f"{x:.1f}"  # noqa: E731
        lines = [format_table(self.rows)] + [
            f"gamma {b['gamma']}, temperature {b['temperature']}: break-even batch measured "
            f"{fmt(b['measured_batch'])}, modelled {fmt(b['modelled_batch'])}" for b in self.summary["break_even"]]
        return "\n".join(lines + ([json.dumps(self.hf_baseline)] if self.hf_baseline else []))


def run(target: str = "tiny-code-target", draft: str | None = "tiny-code-draft", cfg: BenchConfig | None = None,
        device=None, dtype=None, prompts: str | None = None, out=None, plot=None, compile: bool = False,
        hf_baseline: bool = False, progress: bool = True) -> BenchRun:
    """The measured sweep of ``cfg`` for a named pair (see :func:`load_pair`), with break-even batches.

    ``prompts``: a text file to cut prompts from (default the shipped samples). ``out``: a JSONL file the
    rows are appended to, with ``summary.json`` (and ``hf_baseline.json``) beside it. ``plot``: a file for
    measured and modelled speedup against batch. ``compile``: ``Model.compile`` the models first.
    ``hf_baseline``: also time transformers' ``generate`` at batch 1 on the same (local) checkpoints.
    """
    cfg = cfg or BenchConfig()
    if hf_baseline and (target.startswith("shape:") or (draft or "").startswith(("shape:", "layerskip:"))):
        raise ValueError("the transformers baseline runs checkpoints (and prompt lookup), not random shapes "
                         f"or layer skip: got target {target!r}, draft {draft!r}")
    model, tok, drafter, out = _prepare(target, draft, device, dtype, prompts, out, compile, cfg)
    tokens = prompt_tokens(tok, prompts)
    hw = device_hardware(model.device, model.dtype)
    header = (f"device: {hw.name}: {hw.memory_bandwidth / 1e9:.1f} GB/s, {hw.peak_flops / 1e12:.2f} TFLOP/s "
              f"({model.dtype}), ridge {hw.ridge:.1f} FLOP/byte; prompts from "
              f"{prompts or ('the shipped code and prose samples' if tokens else 'random token ids')}")
    rows = sweep(model, drafter, cfg, tokens, out, progress)
    points = sorted({(r["gamma"], r["temperature"]) for r in rows})
    selected = {gt: [r for r in rows if (r["gamma"], r["temperature"]) == gt] for gt in points}
    summary = {"hardware": hw.name, "memory_bandwidth_Bps": hw.memory_bandwidth, "peak_flops": hw.peak_flops,
               "target": target, "draft": draft,
               "break_even": [{"gamma": g, "temperature": t, "measured_batch": break_even(selected[g, t]),
                               "modelled_batch": break_even(selected[g, t], "modelled_speedup")} for g, t in points]}
    if out:
        out.with_name("summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    if plot:
        from minispec.course.plots import plot_speedup_vs_batch

        curves, measured = {}, {}
        for r in rows:
            key = f"gamma {r['gamma']}, temperature {r['temperature']:g}"
            curves.setdefault(key, []).append((r["batch_size"], r["modelled_speedup"]))
            measured.setdefault(key, []).append((r["batch_size"], r["speedup"]))
        plot_speedup_vs_batch(curves, title=f"{target} / {draft} on {hw.name}",
                              measured=measured).savefig(plot, dpi=120)
    baseline = None
    if hf_baseline:
        from minispec.tools.baselines import transformers_baseline

        baseline = transformers_baseline(resolve(target), prompts_for(1, cfg.prompt_len, 0, tokens)[0],
                                         cfg.max_new_tokens, draft if draft in (None, "ngram") else resolve(draft),
                                         max(cfg.gammas), eos_token_id=getattr(tok, "eos_token_id", None))
        if out:
            out.with_name("hf_baseline.json").write_text(
                json.dumps(baseline | environment(model.device, model.dtype), indent=2) + "\n")
    return BenchRun(header, rows, summary, baseline)


@dataclass(frozen=True)
class VllmTable:
    """What :func:`vllm_table` found; ``str()`` is vLLM's config as JSON."""

    config: dict  # vLLM's num_speculative_tokens_per_batch_size keys
    alpha: float  # the acceptance rate it assumed
    note: str  # where alpha and the step times came from

    def __str__(self) -> str:
        return json.dumps(self.config)


def vllm_table(target: str = "tiny-code-target", draft: str = "tiny-code-draft", cfg: BenchConfig | None = None,
               device=None, dtype=None, prompts: str | None = None, out=None, compile: bool = False) -> VllmTable:
    """vLLM's dynamic speculation table from step times measured here: the target over 1..gamma_max+1
    tokens per row and the draft at each of ``cfg.batches`` (gamma_max the largest of ``cfg.gammas``),
    and alpha from ``cfg.accept_rate`` or measured with the exact rule on prompts cut from real text.
    ``out``: also write ``vllm_speculative_config.json`` beside it."""
    cfg = cfg or BenchConfig()
    if draft in (None, "ngram") or draft.startswith("layerskip:"):
        raise ValueError("the vLLM table measures a draft model's step time: name a draft checkpoint, "
                         f"not {draft!r}")
    model, tok, drafter, out = _prepare(target, draft, device, dtype, prompts, out, compile, cfg)
    gamma_max, alpha = max(cfg.gammas), cfg.accept_rate
    if alpha is None:
        batch = prompts_for(4, cfg.prompt_len, model.config.vocab_size, prompt_tokens(tok, prompts), cfg.seed)
        alpha = speculative_generate(model, drafter, batch, gamma=gamma_max, max_new_tokens=cfg.max_new_tokens,
                                     temperature=cfg.temperatures[0], seed=cfg.seed).stats.alpha_estimate
    policy = MeasuredPolicy(*step_time_table(model, drafter, cfg.batches, gamma_max, cfg.prompt_len, cfg.repeats,
                                             rounds=3), gamma_max=gamma_max)
    config = vllm_config_from_speedup(lambda B, g: policy.speedup(B, g, alpha), max(cfg.batches), gamma_max)
    if out:
        out.with_name("vllm_speculative_config.json").write_text(json.dumps(config, indent=2) + "\n")
    note = (f"alpha {alpha:.3f} ({'given' if cfg.accept_rate is not None else 'measured'}), step times measured at "
            f"batches {','.join(map(str, cfg.batches))} (interpolated between), gamma 1..{gamma_max}")
    return VllmTable(config, alpha, note)
