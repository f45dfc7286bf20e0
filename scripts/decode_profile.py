"""Where a decode step goes in each engine: SmolLM2-135M's decode-heavy static batch under ``torch.profiler``.

    . .venv-vllm/bin/activate   # vLLM and minispec
    python scripts/decode_profile.py [--batch 32] [--new 96] [--rounds 4] [--threads 2] [--out FILE]

``--batch`` chat prompts of 40-100 tokens (vs-vllm's ``--lengths-smollm2 40,100,...``), ``--new`` greedy tokens each,
EOS ignored, so nearly every step is a decode step of the whole batch. vLLM runs in this process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``, enforce_eager, its OpenMP threads bound to the first ``--threads`` CPUs), so one
profiler sees its scheduler, model runner and sampler as it sees minispec's engine; minispec runs in the same process,
on the same bound threads. First ``--rounds`` unprofiled runs of each engine, alternated (vLLM, minispec, vLLM, ...):
per engine its best ms a step over the whole run (the prefill steps included) and its best median step (a decode step
of the whole batch), and round by round minispec's speed over vLLM's (in vs-vllm vLLM's multi-process engine overlaps
its scheduling and output processing with the model; here neither does). Then one profiled run each: operator calls a
step, the operators' self CPU time a step, grouped (linear layers, attention, the rest), and the largest operators. A
benchmark: read the shares and ratios within one run; the profiler's own overhead is in its figures.
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
    # vLLM: its CPU attention and KV write
    "_C::cpu_attention_with_kv_cache", "_C::cpu_attn_reshape_and_cache", "vllm::unified_attention_with_output",
    "vllm::unified_kv_cache_update"}


def minispec_runner(prompts, new: int):
    import torch

    from minispec.engine import Engine, Request
    from minispec.model.load import load, resolve

    model, _ = load(resolve("smollm2-135m-instruct"), dtype=torch.float32)
    engine = Engine(model, max_num_seqs=64, max_num_batched_tokens=2048, num_blocks=2048)

    def run(n=new):
        outs = engine.run([Request(list(p), n, 0.0) for p in prompts])
        return list(engine.stats.step_s), [list(o.tokens) for o in outs]
    return run


def vllm_runner(prompts, new: int):
    from vllm import EngineArgs, SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.v1.engine.llm_engine import LLMEngine

    from minispec.model.load import resolve
    from minispec.tools.vllm_side import kv_bytes_per_token

    path = resolve("smollm2-135m-instruct")
    engine = LLMEngine.from_engine_args(EngineArgs(
        model=str(path), dtype="float32", enforce_eager=True, max_num_seqs=64, max_num_batched_tokens=2048,
        kv_cache_memory_bytes=32768 * kv_bytes_per_token(path), enable_prefix_caching=False, max_model_len=2048))
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
    """Each engine's whole-run ms a step and median step ms, ``rounds`` runs each, alternated (engine A, B, A, B...),
    so that a slow minute of this shared machine lands on both; and each engine's tokens."""
    times, tokens = {name: [] for name in runs}, {}
    for run in runs.values():
        run(8)  # first calls: allocators, caches
    for _ in range(rounds):
        for name, run in runs.items():
            t = time.perf_counter()
            step_s, tokens[name] = run()
            times[name].append((1e3 * (time.perf_counter() - t) / len(step_s), 1e3 * statistics.median(step_s)))
    return times, tokens


def profiled(run, name: str, times: list, top: int) -> list[str]:
    """One profiled run of ``run``: operator calls and self CPU time a step, grouped, and the largest operators."""
    from torch.profiler import profile

    t = time.perf_counter()
    with profile() as prof:
        steps = len(run()[0])
    wall = 1e3 * (time.perf_counter() - t) / steps  # the profiled run alone, not the summary below
    ops = prof.key_averages()
    calls = sum(k.count for k in ops if "::" in k.key) / steps
    self_ms = {k.key: k.self_cpu_time_total / steps / 1e3 for k in ops if "::" in k.key}
    groups = {g: sum(v for k, v in self_ms.items() if k in keys) for g, keys in (("linear", LINEAR),
                                                                                  ("attention", ATTENTION))}
    rest = sum(self_ms.values()) - sum(groups.values())
    whole, median = min(w for w, _ in times), min(m for _, m in times)
    lines = [f"{name}: {whole:.1f} ms a step over the run, {median:.1f} the median step (best of {len(times)} "
             f"unprofiled runs, {steps} steps); profiled {wall:.0f} ms a step (the profiler's cost grows with the "
             f"calls), {calls:,.0f} operator calls a step; operators' self CPU ms a step: linear layers "
             f"{groups['linear']:.1f}, attention {groups['attention']:.1f}, the rest {rest:.1f}, in all "
             f"{sum(self_ms.values()):.1f}"]
    for k in sorted(ops, key=lambda k: -k.self_cpu_time_total)[:top]:
        lines.append(f"  {k.key[:48]:48} {k.self_cpu_time_total / steps / 1e3:7.2f} ms  {k.count / steps:6.1f} calls")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--new", type=int, default=96)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--out", default="results/cpu/decode_profile.txt")
    args = ap.parse_args()
    if min(args.batch, args.new, args.rounds, args.threads, args.top) < 1:
        raise SystemExit("--batch, --new, --rounds, --threads and --top must be >= 1")
    cpus = sorted(os.sched_getaffinity(0))[: args.threads]
    os.environ.update(VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_CPU_OMP_THREADS_BIND=",".join(map(str, cpus)),
                      VLLM_LOGGING_LEVEL="WARNING")
    import torch
    from transformers import AutoTokenizer

    from minispec.model.load import resolve
    from minispec.tools.vs_vllm_workload import copy_prompts

    torch.set_num_threads(args.threads)
    prompts = copy_prompts(AutoTokenizer.from_pretrained(str(resolve("smollm2-135m-instruct"))), args.batch, (40, 100),
                           seed=6)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    lines = [f"# SmolLM2-135M float32, a static batch of {args.batch} prompts of 40-100 tokens, {args.new} greedy "
             f"tokens each: both engines in one process under torch.profiler (commit {commit}, {platform.machine()}, "
             f"{args.threads} threads bound to CPUs {cpus}, torch {torch.__version__}, load average before "
             f"{os.getloadavg()[0]:.1f})", ""]
    runs = {"vLLM (in-process, eager)": vllm_runner(prompts, args.new), "minispec": minispec_runner(prompts, args.new)}
    torch.set_num_threads(args.threads)  # vLLM's worker set its own binding when it started
    times, tokens = timed(runs, args.rounds)
    (vname, vt), (mname, mt) = times.items()
    ratio = [(v[0] / m[0], v[1] / m[1]) for v, m in zip(vt, mt)]  # each round's vLLM / minispec: speed, as tok/s
    for name, run in runs.items():
        lines += profiled(run, name, times[name], args.top) + [""]
    same = sum(a == b for a, b in zip(*tokens.values()))
    lines += [f"minispec's speed / vLLM's, round by round (runs alternated): over the whole run "
              f"{', '.join(f'{r:.2f}' for r, _ in ratio)}; the median step {', '.join(f'{r:.2f}' for _, r in ratio)} "
              f"(the run includes the prefill steps, the median step is a decode step of the whole batch)",
              f"the same greedy tokens in {same} of {args.batch} requests; load average after {os.getloadavg()[0]:.1f}"]
    print("\n".join(lines))
    with open(args.out, "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
