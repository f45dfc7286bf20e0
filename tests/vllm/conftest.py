"""The vLLM lane (tests marked ``vllm``): minispec beside vLLM's CPU build, in vLLM's own environment.

    bash scripts/vllm_env.sh && . .venv-vllm/bin/activate && python -m pytest -m vllm tests/vllm -q -rs

Where vLLM is not installed (the main environment) every test here is skipped, saying so. vLLM's engine core runs
in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0): vLLM's default spawns it, and a worker beside it, in processes of
their own, which costs two imports of torch and vLLM per LLM; MINISPEC_VLLM_SPAWN=1 runs the default instead (it
works under pytest too; docs/VLLM.md). One LLM at a time (``llms``), each shared by the tests that need it.
MINISPEC_VLLM_FIX_EXPAND=1 patches the vLLM defect that makes its sampled speculation leave the target's law (in this
process): the expected failures that name it then pass, which strict xfail reports as failures.
"""

import importlib.util
import os
from pathlib import Path

import pytest

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB of KV cache per LLM (its default takes far more)
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
# vLLM's n-gram proposer runs numba, whose default threading layer here is OpenMP, the runtime torch and vLLM's
# kernels use: after each proposal it restores numba's thread count (2 on two cores), which resets the process's
# OpenMP threads after vLLM's worker set them to 1. With the engine in this process, the next LLM built here on the
# embedded target then decoded wrong tokens (61, 61, 61, ... for 49, 41, 32, ...; seen on an AVX2 machine; a plain
# LLM too). One numba thread, as vLLM's proposer asks for on a 2-core machine anyway, leaves OpenMP alone.
os.environ.setdefault("NUMBA_NUM_THREADS", "1")
if os.environ.get("MINISPEC_VLLM_SPAWN") != "1":
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"

HERE = Path(__file__).parent


def _missing() -> str | None:
    """Why the lane cannot run here, or None. (tests/ is on sys.path, so a bare ``import vllm`` would find this
    folder as a namespace package where vLLM is absent: look for a real package first.)"""
    spec = importlib.util.find_spec("vllm")
    if spec is None or spec.origin is None or Path(spec.origin).parent == HERE:
        return ("vLLM is not installed in this environment; the lane runs in its own: bash scripts/vllm_env.sh, "
                "then . .venv-vllm/bin/activate && python -m pytest -m vllm tests/vllm")
    try:
        from vllm import LLM  # noqa: F401
    except Exception as e:  # a broken install says why
        return f"vLLM is installed but does not import: {type(e).__name__}: {e}"
    return None


MISSING = _missing()
if not MISSING and os.environ.get("MINISPEC_VLLM_SPAWN") != "1":
    # Every vLLM worker registers the CPU platform's replacements for Triton kernels at start-up, scanning every
    # module in sys.modules for references to rebind. With the engine in this process, a second scan runs after
    # vLLM's n-gram proposer has imported numba, and trips on a numba object (vllm/triton_utils/dispatcher.py:
    # "AttributeError: '_lib_fn_wrapper' object has no attribute 'get'"). Register once, now, and not again.
    from vllm.platforms import current_platform

    current_platform.register_triton_kernel_overrides()
    type(current_platform).register_triton_kernel_overrides = classmethod(lambda cls: None)
if not MISSING and os.environ.get("MINISPEC_VLLM_FIX_EXPAND") == "1":  # vLLM with the CPU shim fixed (vllm_lane)
    from vllm_lane import fix_expand

    fix_expand()


def pytest_collection_modifyitems(config, items):
    if MISSING:
        for item in items:
            if item.path.is_relative_to(HERE):
                item.add_marker(pytest.mark.skip(reason=MISSING))


@pytest.fixture(scope="session")
def llms():
    """The session's vLLM engines, one at a time (vllm_lane.OneLLM)."""
    import torch
    from vllm_lane import OneLLM

    # vLLM binds this process's OpenMP threads to one core when its worker starts here; two torch threads on one
    # core spin against each other (a 3.3M model's step went from 30 ms to 600 ms). One thread, as in vLLM's worker.
    torch.set_num_threads(1)
    pool = OneLLM()
    yield pool
    pool.close()
