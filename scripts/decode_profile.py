"""Where a decode step goes in each engine: SmolLM2-135M's decode-heavy static batch under ``torch.profiler``.

    . .venv-vllm/bin/activate   # vLLM and minispec
    python scripts/decode_profile.py [--batch 32] [--new 96] [--rounds 3] [--threads 2] [--out FILE]

``--batch`` chat prompts of 40-100 tokens (vs-vllm's ``--lengths-smollm2 40,100,...``), ``--new`` greedy tokens each,
EOS ignored, so nearly every step is a decode step of the whole batch. vLLM runs in this process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``, enforce_eager, its OpenMP threads bound to the first ``--threads`` CPUs), so one
profiler sees its scheduler, model runner and sampler as it sees minispec's engine; minispec runs after it in the same
process, on the same bound threads. Per engine: the best wall time a step of ``--rounds`` unprofiled runs (in
vs-vllm vLLM's multi-process engine overlaps its scheduling and output processing with the model; here neither does),
then one profiled run: operator calls a step, the operators' self CPU time a step, grouped (linear layers,
attention, the rest), and the largest operators. A benchmark: read the shares and ratios within one run; the
profiler's own overhead is in every figure.
"""

from __future__ import annotations

import argparse
import os
import platform
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
        return engine.stats.steps, [list(o.tokens) for o in outs]
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
        steps, tokens = 0, [[] for _ in prompts]
        while engine.has_unfinished_requests():
            for o in engine.step():
                if o.finished:
                    tokens[order[o.request_id]] = list(o.outputs[0].token_ids)
            steps += 1
        return steps, tokens
    return run


def profiled(run, name: str, rounds: int, top: int) -> tuple[list[str], list]:
    from torch.profiler import profile

    run(8)  # first calls: allocators, caches
    best, tokens = float("inf"), None
    for _ in range(rounds):
        t = time.perf_counter()
        steps, tokens = run()
        best = min(best, (time.perf_counter() - t) / steps)
    t = time.perf_counter()
    with profile() as prof:
        steps, _ = run()
    wall = 1e3 * (time.perf_counter() - t) / steps  # the profiled run alone, not the summary below
    ops = prof.key_averages()
    calls = sum(k.count for k in ops if "::" in k.key) / steps
    self_ms = {k.key: k.self_cpu_time_total / steps / 1e3 for k in ops if "::" in k.key}
    groups = {g: sum(v for k, v in self_ms.items() if k in keys) for g, keys in (("linear", LINEAR),
                                                                                  ("attention", ATTENTION))}
    rest = sum(self_ms.values()) - sum(groups.values())
    lines = [f"{name}: {1e3 * best:.1f} ms a step (best of {rounds} unprofiled runs, {steps} steps); profiled "
             f"{wall:.0f} ms a step (the profiler's cost grows with the calls), {calls:,.0f} operator calls a step; "
             f"operators' self CPU ms a step: linear layers {groups['linear']:.1f}, attention "
             f"{groups['attention']:.1f}, the rest {rest:.1f}, in all {sum(self_ms.values()):.1f}"]
    for k in sorted(ops, key=lambda k: -k.self_cpu_time_total)[:top]:
        lines.append(f"  {k.key[:48]:48} {k.self_cpu_time_total / steps / 1e3:7.2f} ms  {k.count / steps:6.1f} calls")
    return lines, tokens


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--new", type=int, default=96)
    ap.add_argument("--rounds", type=int, default=3)
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
    vllm, vllm_tokens = profiled(vllm_runner(prompts, args.new), "vLLM (in-process, eager)", args.rounds,
                                 args.top)
    torch.set_num_threads(args.threads)
    mine, mine_tokens = profiled(minispec_runner(prompts, args.new), "minispec", args.rounds, args.top)
    same = sum(a == b for a, b in zip(mine_tokens, vllm_tokens))
    lines += vllm + [""] + mine + ["", f"the same greedy tokens in {same} of {args.batch} requests; load average "
                                       f"after {os.getloadavg()[0]:.1f}"]
    print("\n".join(lines))
    with open(args.out, "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
