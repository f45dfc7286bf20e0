"""Where a decode step goes in each engine: SmolLM2-135M's decode-heavy static batch under ``torch.profiler``.

    . .venv-vllm/bin/activate   # vLLM and minispec
    python scripts/decode_profile.py [--batch 32] [--prompts 40,100] [--new 96] [--rounds 4] [--threads 2] [--ngram]
                                     [--compile] [--vllm-compile] [--out FILE]

``--batch`` chat prompts of ``--prompts`` tokens (default 40-100, vs-vllm's ``--lengths-smollm2 40,100,...``; 64,512 are
vs-vllm's default workload's), ``--new`` greedy tokens each,
EOS ignored, so nearly every step is a decode step of the whole batch; ``--ngram``: both with prompt lookup, as
vs-vllm's ngram setting runs it. vLLM runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, enforce_eager, its
OpenMP threads bound to the first ``--threads`` CPUs), so one profiler sees its scheduler, model runner and sampler as
it sees minispec's engine; minispec runs in the same process, on the same bound threads. First ``--rounds`` unprofiled
runs of each engine, alternated (vLLM, minispec, vLLM, ...): per engine its best ms a step over the whole run (the
prefill steps included) and its best median step (a decode step of the whole batch), and round by round minispec's speed
over vLLM's (in vs-vllm vLLM's multi-process engine overlaps its scheduling and output processing with the model; here
neither does). Then a decode step profiled in each: a profiled run less a profiled run of 8 tokens a request (the same
prefill steps), over the steps it adds: operator calls, the operators' self CPU time grouped (linear layers, attention,
the rest), and the largest operators. ``--prefill``: one token a request instead, so that every step is a prefill
step (chunks of the 2,048-token budget), and the profile is of a whole run over its steps. A benchmark: read the shares
and ratios within one run; the profiler's own overhead is in its figures. ``--vllm-compile``: vLLM as its CPU build
starts by default, compiled by ``torch.compile``; ``--compile``: minispec's ``Engine(compile=True)``.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import time

LINEAR = {"mkldnn::_linear_pointwise", "_C::onednn_mm", "aten::mm"}  # minispec's prepacked oneDNN, vLLM's, F.linear
ATTENTION = {  # minispec: the KV write and the sparse products (aten::addmm is the SpMM: linears are prepacked here)
    "aten::index_copy_", "aten::sparse_sampled_addmm", "aten::addmm", "aten::scatter_reduce_", "aten::segment_reduce",
    "aten::exp_", "aten::sub_", "aten::index_select", "aten::_scaled_dot_product_flash_attention_for_cpu",
    "minispec::paged_attention",  # Engine(compile=True): the opaque call, its own Python
    # vLLM: its CPU attention and KV write
    "_C::cpu_attention_with_kv_cache", "_C::cpu_attn_reshape_and_cache", "vllm::unified_attention_with_output",
    "vllm::unified_kv_cache_update"}
SHORT = 8  # tokens a request in the run whose profile is subtracted: its prefill steps and a few decode steps


def minispec_runner(prompts, new: int, ngram: bool, cfg, compiled: bool = False):
    import torch

    from minispec.drafts.lookup import PromptLookupDraft
    from minispec.engine import Engine, Request
    from minispec.model.load import load, resolve

    model, _ = load(resolve("smollm2-135m-instruct"), dtype=torch.float32)
    draft = PromptLookupDraft(*cfg.ngram, rule=cfg.lookup_rule) if ngram else None
    engine = Engine(model, draft, gamma=cfg.gamma, max_num_seqs=64, max_num_batched_tokens=2048, num_blocks=2048,
                    compile=compiled)

    def run(n=new):
        outs = engine.run([Request(list(p), n, 0.0) for p in prompts])
        return list(engine.stats.step_s), [list(o.tokens) for o in outs]
    return run


def vllm_runner(prompts, new: int, ngram: bool, cfg, compiled: bool = False):
    from vllm import EngineArgs, SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.v1.engine.llm_engine import LLMEngine

    from minispec.model.load import resolve
    from minispec.tools.vllm_side import kv_bytes_per_token
    from minispec.tools.vs_vllm_workload import vllm_spec

    path = resolve("smollm2-135m-instruct")
    engine = LLMEngine.from_engine_args(EngineArgs(
        model=str(path), dtype="float32", enforce_eager=not compiled, max_num_seqs=64, max_num_batched_tokens=2048,
        kv_cache_memory_bytes=32768 * kv_bytes_per_token(path), enable_prefix_caching=False, max_model_len=2048,
        speculative_config=vllm_spec({"draft": None}, "ngram" if ngram else "plain", cfg, None)))
    ids = iter(range(10**9))

    def run(n=new):
        order = {}
        for i, p in enumerate(prompts):
            rid = f"r{next(ids)}"
            order[rid] = i
            engine.add_request(rid, TokensPrompt(prompt_token_ids=list(p)),
                               SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True, detokenize=False))
        step_s, tokens = [], [[] for _ in prompts]
        while engine.has_unfinished_requests():
            t = time.perf_counter()
            outs = engine.step()
            step_s.append(time.perf_counter() - t)
            for o in outs:
                if o.finished:
                    tokens[order[o.request_id]] = list(o.outputs[0].token_ids)
        return step_s, tokens
    return run


def timed(runs: dict, rounds: int) -> tuple[dict, dict]:
    """Each engine's whole-run ms a step, median step ms and seconds, ``rounds`` runs each, alternated (engine A, B,
    A, B...), so that a slow minute of this shared machine lands on both; and each engine's tokens."""
    times, tokens = {name: [] for name in runs}, {}
    for run in runs.values():
        run(SHORT)  # first calls: allocators, caches
    for _ in range(rounds):
        for name, run in runs.items():
            t = time.perf_counter()
            step_s, tokens[name] = run()
            wall = time.perf_counter() - t
            times[name].append((1e3 * wall / len(step_s), 1e3 * statistics.median(step_s), wall))
    return times, tokens


def profiled(run, name: str, times: list, top: int, prefill: bool = False) -> list[str]:
    """Operator calls and self CPU time a decode step, grouped, and the largest operators: a profiled run of
    ``--new`` tokens less a profiled run of :data:`SHORT` (the same prompts, so the same prefill steps), over the
    steps the longer run adds; ``prefill``: a profiled run (of one token a request) over all its steps."""
    from torch.profiler import profile

    totals = [(0, 0.0, {})] if prefill else []  # a prefill run: nothing to subtract
    for n in (None,) if prefill else (SHORT, None):
        t = time.perf_counter()
        with profile() as prof:
            steps = len((run() if n is None else run(n))[0])
        wall = time.perf_counter() - t  # the profiled run alone, not the summary below
        totals.append((steps, wall, {k.key: (k.self_cpu_time_total, k.count) for k in prof.key_averages()
                                     if "::" in k.key}))
    (s0, w0, ops0), (s1, w1, ops1) = totals
    steps = s1 - s0
    ops = {k: ((v - ops0.get(k, (0, 0))[0]) / steps / 1e3, (c - ops0.get(k, (0, 0))[1]) / steps)
           for k, (v, c) in ops1.items()}  # ms and calls a decode step
    groups = {g: sum(v for k, (v, _) in ops.items() if k in keys) for g, keys in (("linear", LINEAR),
                                                                                   ("attention", ATTENTION))}
    every = sum(v for v, _ in ops.values())
    whole, median = min(w for w, _, _ in times), min(m for _, m, _ in times)
    what = f"A prefill step profiled (the run's {steps} steps)" if prefill else \
        f"A decode step profiled ({steps} steps: the run of {s1} less one of {s0})"
    lines = [f"{name}: {whole:.1f} ms a step over the run, {median:.1f} the median step (best of {len(times)} "
             f"unprofiled runs, {s1} steps). {what}: "
             f"{1e3 * (w1 - w0) / steps:.0f} ms (the profiler's cost grows with the calls), "
             f"{sum(c for _, c in ops.values()):,.0f} operator calls; operators' self CPU ms: linear layers "
             f"{groups['linear']:.1f}, attention {groups['attention']:.1f}, the rest "
             f"{every - sum(groups.values()):.1f}, in all {every:.1f}"]
    for k, (v, c) in sorted(ops.items(), key=lambda kv: -kv[1][0])[:top]:
        lines.append(f"  {k[:48]:48} {v:7.2f} ms  {c:6.1f} calls")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--prompts", default="40,100", help="the prompts' fewest and most tokens, LO,HI")
    ap.add_argument("--new", type=int, default=96)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--top", type=int, default=16)
    ap.add_argument("--ngram", action="store_true", help="both engines with prompt lookup as vs-vllm's ngram setting "
                                                          "runs it (VsConfig's K, n-grams, rule), not plain decoding")
    ap.add_argument("--prefill", action="store_true", help="one token a request (--new 1), so every step is a prefill "
                                                            "step: where a prefill step's time goes")
    ap.add_argument("--vllm-compile", action="store_true", help="vLLM as its CPU build starts by default: "
                                                                "torch.compile (Inductor), not enforce_eager")
    ap.add_argument("--compile", action="store_true", help="minispec's Engine(compile=True)")
    ap.add_argument("--out", default=None, help="default results/cpu/decode_profile.txt (--ngram: "
                                                "decode_profile_ngram.txt; --prefill: prefill_profile.txt)")
    args = ap.parse_args()
    out = args.out or ("results/cpu/prefill_profile.txt" if args.prefill else
                       f"results/cpu/decode_profile{'_ngram' if args.ngram else ''}.txt")
    if args.prefill:
        args.new = 1
    try:
        lo, hi = map(int, args.prompts.split(","))
    except ValueError:
        lo = hi = 0
    if min(args.batch, args.rounds, args.threads, args.top) < 1 or (args.new <= 2 * SHORT and not args.prefill) \
            or not 1 <= lo <= hi:
        raise SystemExit(f"--batch, --rounds, --threads and --top must be >= 1, --new > {2 * SHORT} and --prompts "
                         f"LO,HI with 1 <= LO <= HI, got {args.prompts!r}")
    from minispec.tools.vllm_side import VllmSettings

    cpus = sorted(os.sched_getaffinity(0))[: args.threads]
    # vs-vllm's settings for vLLM: its threads bound to these CPUs, and its n-gram proposer's numba threads in numba's
    # workqueue layer (numba's default OpenMP pool, beside torch's threads in this one process, made minispec's
    # speculative steps here up to 6x as slow, and vLLM's slower too)
    os.environ.update(VllmSettings(threads=args.threads, bind=",".join(map(str, cpus))).environment(),
                      VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_LOGGING_LEVEL="WARNING")
    import torch
    from transformers import AutoTokenizer

    from minispec.model.load import resolve
    from minispec.tools.vs_vllm import VsConfig
    from minispec.tools.vs_vllm_workload import copy_prompts

    torch.set_num_threads(args.threads)
    prompts = copy_prompts(AutoTokenizer.from_pretrained(str(resolve("smollm2-135m-instruct"))), args.batch, (lo, hi),
                           seed=6)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    cfg = VsConfig()  # vs-vllm's ngram setting, for both engines: its K, n-grams and lookup rule
    how = f", prompt lookup (K = {cfg.gamma})" if args.ngram else ""
    lines = [f"# SmolLM2-135M float32, a static batch of {args.batch} prompts of {lo}-{hi} tokens, {args.new} greedy "
             f"token{'s' if args.new > 1 else ''} each{how}: both engines in one process under torch.profiler (commit "
             f"{commit}, {platform.machine()}, {args.threads} threads bound to CPUs {cpus}, torch {torch.__version__}, "
             f"load average before {os.getloadavg()[0]:.1f})", ""]
    runs = {f"vLLM (in-process, {'compiled' if args.vllm_compile else 'eager'})":
            vllm_runner(prompts, args.new, args.ngram, cfg, args.vllm_compile),
            f"minispec{' (compiled)' if args.compile else ''}": minispec_runner(prompts, args.new, args.ngram, cfg,
                                                                                  args.compile)}
    torch.set_num_threads(args.threads)  # vLLM's worker set its own binding when it started
    times, tokens = timed(runs, args.rounds)
    vt, mt = times.values()
    ratio = [(v[2] / m[2], v[1] / m[1]) for v, m in zip(vt, mt)]  # each round's vLLM / minispec time: the same tokens
    for name, run in runs.items():
        lines += profiled(run, name, times[name], args.top, args.prefill) + [""]
    same = sum(a == b for a, b in zip(*tokens.values()))
    lines += [f"minispec's speed / vLLM's, round by round (runs alternated): over the whole run "
              f"{', '.join(f'{r:.2f}' for r, _ in ratio)}; the median step {', '.join(f'{r:.2f}' for _, r in ratio)} "
              + ("(every step a prefill step)" if args.prefill else
                 "(the run includes the prefill steps, the median step is a decode step of the whole batch)"),
              f"the same greedy tokens in {same} of {args.batch} requests; load average after {os.getloadavg()[0]:.1f}"]
    print("\n".join(lines))
    with open(out, "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
