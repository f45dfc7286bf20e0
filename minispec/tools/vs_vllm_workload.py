"""The requests of ``minispec vs-vllm`` and the settings each engine serves them with.

Two workloads (:func:`workload`): SmolLM2-135M-Instruct on chat prompts whose answers copy from them
(:func:`copy_prompts`: an editing task on whole lines of the shipped held-out code), and the embedded pair
on windows of the same code as byte token ids (:func:`code_prompts`). :func:`jobs` draws a seed's request
sequence (prompt, output length, unit arrival gap, sampling seed) once; a rate only scales its arrivals.
The settings: plain decoding; prompt lookup (SmolLM2) or the draft model (the pair) with K draft tokens a step;
and, given vLLM's batch-size table, the same draft with K from the table (:func:`minispec_engines`,
:func:`vllm_spec`: minispec's engines and vLLM's ``speculative_config`` for the same setting). A run's record:
:func:`metadata` (commit, machine, versions, the command) and :func:`roofline_inputs` (this CPU's ceilings and the
workloads' shapes, for the report's roofline lines).
"""

from __future__ import annotations

import json
import os
import platform
import random
import sys
import time
from dataclasses import asdict, dataclass, replace

import torch

from minispec.drafts.lookup import PromptLookupDraft
from minispec.engine import Engine
from minispec.model.load import load, resolve, sample_text
from minispec.roofline import ModelShape
from minispec.roofline.hardware import calibrate
from minispec.roofline.policy import BatchTablePolicy
from minispec.tools.bench import environment, processor
from minispec.tools.vllm_side import versions


@dataclass(frozen=True)
class Job:
    """One request, as both engines take it."""

    prompt: tuple[int, ...]
    max_new_tokens: int
    arrival_s: float = 0.0
    temperature: float = 0.0
    seed: int = 0
    eos: int | None = None



LENGTHS = {"smollm2": ((64, 512), (32, 128)), "pair": ((64, 320), (32, 128))}  # (prompt, output) token ranges
MAX_MODEL_LEN = {"smollm2": 2048, "pair": 512}  # tokens a request may reach: prompt and output (both engines)

TASKS = ("Add a short comment above every line of this code. Return the whole code.",
         "Rename the variables in this code to longer, descriptive names. Return the full code.",
         "Reformat this code so that no line is longer than 60 characters. Return the code.",
         "Add type hints to this code. Return the complete code.",
         "Rewrite this code exactly, with double quotes instead of single quotes.",
         "Add a docstring to each function in this code and return the full code.",
         "Re-indent this code with 2 spaces instead of 4 and return it.",
         "Reformat every list, tuple and call in this code with one item per line. Return the code.")


def copy_prompts(tok, n: int = 50, lengths: tuple[int, int] = (64, 512), seed: int = 0) -> list[tuple[int, ...]]:
    """``n`` chat prompts whose answers copy from them: an editing task (:data:`TASKS`) on whole lines of the
    shipped held-out code, in the tokenizer's chat template, each between ``lengths`` tokens. ValueError where
    ``lengths`` leaves no room for a task and a line of code in the template (none found in 100 n tries)."""
    rng, lines = random.Random(seed), sample_text("code").decode().splitlines(keepends=True)
    wrap = lambda code, task: tok.encode(tok.apply_chat_template(  # noqa: E731
        [{"role": "user", "content": f"{task}\n\n```python\n{code}```"}], add_generation_prompt=True,
        tokenize=False), add_special_tokens=False)
    prompts = []
    for _ in range(100 * n):
        if len(prompts) == n:
            break
        budget, start, task = rng.randint(*lengths), rng.randrange(len(lines)), TASKS[len(prompts) % len(TASKS)]
        end = start + 1
        while end < len(lines) and len(wrap("".join(lines[start: end + 1]), task)) <= budget:
            end += 1
        ids = wrap("".join(lines[start:end]), task)
        if lengths[0] <= len(ids) <= lengths[1]:
            prompts.append(tuple(ids))
    if len(prompts) < n:
        raise ValueError(f"no chat prompt of {lengths[0]}-{lengths[1]} tokens: a task and a line of code in the chat "
                         f"template take more (found {len(prompts)} of {n} in {100 * n} tries)")
    return prompts


def code_prompts(n: int = 50, lengths: tuple[int, int] = (64, 320), seed: int = 0) -> list[tuple[int, ...]]:
    """``n`` windows of the held-out code as byte token ids (the embedded pair's tokens), ``lengths`` long."""
    rng, text = random.Random(seed), sample_text("code")
    out = []
    for _ in range(n):
        m = rng.randint(*lengths)
        start = rng.randrange(len(text) - m)
        out.append(tuple(text[start: start + m]))
    return out


def jobs(prompts, outputs: tuple[int, int], seed: int, rate: float, cfg, eos=None) -> list[Job]:
    """Seed ``seed``'s requests at ``rate``: the same prompts, lengths and unit gaps at every rate (arrivals
    scaled by 1 / rate), max(min, rate x window) of them (at most max)."""
    n = min(cfg.max_requests, max(cfg.min_requests, round(rate * cfg.window_s)))
    rng, t, out = random.Random(1_000_003 * seed + 17), 0.0, []
    for _ in range(n):
        t += rng.expovariate(1.0)
        out.append(Job(rng.choice(prompts), rng.randint(*outputs), t / rate, cfg.temperature, rng.getrandbits(63),
                       eos))
    return out


def static_jobs(prompts, outputs, batch: int, cfg, eos=None) -> list[list[Job]]:
    """Rounds of ``batch`` requests at t = 0, at least ``cfg.static_min`` requests in all: seed 0's sequence."""
    n = batch * -(-max(cfg.static_min, batch) // batch)
    seq = [replace(j, arrival_s=0.0) for j in jobs(prompts, outputs, 0, 1.0, replace(
        cfg, min_requests=n, max_requests=n, window_s=1.0), eos)]
    return [seq[i: i + batch] for i in range(0, n, batch)]


def workload(name: str, lengths: tuple | None = None) -> dict:
    """Models, prompts and lengths of a workload (SmolLM2 must have been fetched); ``lengths``: ((prompt min, max),
    (output min, max)) tokens, default :data:`LENGTHS`."""
    (plen, olen) = lengths or LENGTHS[name]
    if name == "smollm2":
        target = resolve("smollm2-135m-instruct")  # raises, naming `minispec fetch smollm2`, when missing
        model, tok = load(target, dtype=torch.float32)
        return dict(name=name, target=target, target_model=model, draft=None, prompts=copy_prompts(tok, 50, plen),
                    outputs=olen, eos=tok.eos_token_id, tokenizer=True, max_model_len=MAX_MODEL_LEN[name])
    target, draft = resolve("tiny-code-target"), resolve("tiny-code-draft")
    return dict(name=name, target=target, target_model=load(target)[0], draft=draft, draft_model=load(draft)[0],
                prompts=code_prompts(50, plen), outputs=olen, eos=None, tokenizer=False,
                max_model_len=MAX_MODEL_LEN[name])


# --- the settings: what each engine runs for a workload ------------------------------------------------------

def minispec_engines(w: dict, cfg, table: dict | None) -> dict[str, Engine]:
    """A minispec engine per setting of workload ``w``."""
    common = dict(max_num_seqs=cfg.max_num_seqs, max_num_batched_tokens=cfg.max_num_batched_tokens,
                  num_blocks=-(-cfg.kv_of(w["name"]) // 16), prepack=cfg.prepack,
                  compile=cfg.compile)
    if w["draft"] is None:
        spec = {"ngram": PromptLookupDraft(*cfg.ngram, rule=cfg.lookup_rule)}
    else:
        spec = {"draft": w["draft_model"]}
    engines = {"plain": Engine(w["target_model"], **common)}
    for name, draft in spec.items():
        engines[name] = Engine(w["target_model"], draft, gamma=cfg.gamma, **common)
        if table is not None:
            engines[name + ", K table"] = Engine(w["target_model"], draft, BatchTablePolicy.from_config(table),
                                                 **common)
    return engines


def vllm_spec(w: dict, setting: str, cfg, table: dict | None) -> dict | None:
    """vLLM's speculative_config for ``setting``."""
    if setting == "plain":
        return None
    spec = ({"method": "ngram", "prompt_lookup_max": cfg.ngram[0], "prompt_lookup_min": cfg.ngram[1]}
            if w["draft"] is None else {"method": "draft_model", "model": str(w["draft"])})
    spec["num_speculative_tokens"] = cfg.gamma
    if setting.endswith("K table"):
        spec |= {"num_speculative_tokens": table["num_speculative_tokens"],
                 "num_speculative_tokens_per_batch_size": table["num_speculative_tokens_per_batch_size"]}
    return spec


# --- the run's record: what reproduces it, and what the report's roofline lines take ----------------------------

def metadata(cfg) -> dict:
    """What the run needs to be reproduced: commit, machine, threads, versions, load, settings, the command."""
    env = environment(torch.device("cpu"), torch.float32)
    meta = {"git_revision": env["git_revision"], "torch": env["torch"], "python": env["python"],
            "hardware": env["hardware"], "cpu": processor(), "cores": os.cpu_count(), "platform": platform.platform(),
            "threads": cfg.threads, "loadavg_start": os.getloadavg(), "argv": sys.argv,
            "vllm_env": cfg.vllm.environment() if "vllm" in cfg.engines else None,
            "config": json.loads(json.dumps(asdict(cfg), default=str)),
            "started": time.strftime("%Y-%m-%d %H:%M:%S %z")} | versions()
    meta["id"] = f"{meta['git_revision']}@{meta['started']}"
    return meta


def roofline_inputs(cfg, when: str) -> dict:
    """What the report's roofline lines take: this CPU's ceilings, calibrated in float32 at ``cfg.threads`` torch
    threads, and per workload the float32 shapes of its target and draft model and its mean context (the middle of
    its prompt lengths plus half the middle of its output lengths)."""
    shape = lambda name: asdict(ModelShape.from_config(json.loads((resolve(name) / "config.json").read_text()), 4))  # noqa: E731
    names = {"smollm2": ("smollm2-135m-instruct", None), "pair": ("tiny-code-target", "tiny-code-draft")}
    workloads = {}
    for w in cfg.workloads:
        (p0, p1), (o0, o1) = cfg.lengths_of(w)
        target, draft = names[w]
        workloads[w] = {"target": shape(target), "draft": None if draft is None else shape(draft),
                        "context": (p0 + p1) / 2 + (o0 + o1) / 4}
    threads = torch.get_num_threads()
    torch.set_num_threads(cfg.threads)
    try:
        hw = calibrate("cpu", torch.float32)
    finally:
        torch.set_num_threads(threads)
    return {"hardware": asdict(hw), "threads": cfg.threads, "when": when, "workloads": workloads}
