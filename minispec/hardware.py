"""Hardware ceilings: datasheet presets of accelerators, and calibration of the device at hand.

A :class:`Hardware` is three numbers the roofline needs (memory bandwidth, peak FLOP/s, memory
size). The presets come from NVIDIA's datasheets; :func:`calibrate` measures the first two on
this device (a large copy and a large matmul) once per process, and :func:`device_hardware`
picks the preset of a known GPU or, failing that, the calibration.
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Hardware:
    """One accelerator's ceilings."""

    name: str
    memory_bandwidth: float  # bytes/s of HBM (or DRAM)
    peak_flops: float  # FLOP/s, dense BF16 tensor-core peak for GPUs; measured matmul FLOP/s when calibrated
    memory_bytes: float  # bytes of device memory

    def __post_init__(self):
        for field in ("memory_bandwidth", "peak_flops", "memory_bytes"):
            if not getattr(self, field) > 0:
                raise ValueError(f"{field} must be positive, got {getattr(self, field)!r}")

    @property
    def ridge(self) -> float:
        """FLOP/byte at which a kernel turns from memory-bound to compute-bound."""
        return self.peak_flops / self.memory_bandwidth


# Datasheet figures; "GB" is decimal as NVIDIA prints it (the cards report a little more).
# NVIDIA H100 Tensor Core GPU datasheet, SXM column: 3.35 TB/s HBM3, BF16 1,979 TFLOPS with sparsity
# (989 dense), 80 GB.
H100_SXM = Hardware("H100 SXM", memory_bandwidth=3.35e12, peak_flops=989e12, memory_bytes=80e9)
# NVIDIA H200 Tensor Core GPU datasheet, SXM column: 4.8 TB/s HBM3e, BF16 1,979 TFLOPS with sparsity
# (989 dense, the H100's compute), 141 GB.
H200 = Hardware("H200", memory_bandwidth=4.8e12, peak_flops=989e12, memory_bytes=141e9)
# NVIDIA A100 Tensor Core GPU datasheet, 80GB SXM column: 2,039 GB/s HBM2e, BF16 312 TFLOPS dense, 80 GB.
A100_80GB = Hardware("A100 80GB SXM", memory_bandwidth=2.039e12, peak_flops=312e12, memory_bytes=80e9)
# NVIDIA L4 Tensor Core GPU datasheet: 300 GB/s GDDR6, BF16 242 TFLOPS with sparsity (121 dense), 24 GB.
L4 = Hardware("L4", memory_bandwidth=300e9, peak_flops=121e12, memory_bytes=24e9)
HARDWARE = {"h100": H100_SXM, "h200": H200, "a100": A100_80GB, "l4": L4}


def median_time(fn, device: torch.device, repeats: int = 5, warmup: int = 2) -> float:
    """Median wall seconds of fn() over ``repeats`` calls, the device synchronised around each."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        sync()
        t = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def measure_bandwidth(device="cpu", nbytes: int | None = None) -> float:
    """Bytes/s of a large device-to-device copy, counting the read and the write."""
    device = torch.device(device)
    nbytes = nbytes or (2 << 30 if device.type == "cuda" else 256 << 20)
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).fill_(1.0)
    dst = torch.empty_like(src)
    return 2 * nbytes / median_time(lambda: dst.copy_(src), device)


def measure_flops(device="cpu", dtype=torch.float32, n: int | None = None) -> float:
    """FLOP/s of an n x n matrix product in ``dtype``."""
    device = torch.device(device)
    n = n or (8192 if device.type == "cuda" else 1024)
    a, b = (torch.randn(n, n, device=device).to(dtype) for _ in range(2))
    return 2 * n**3 / median_time(lambda: a @ b, device)


_CALIBRATED: dict[tuple[str, torch.dtype], Hardware] = {}  # one calibration per (device, dtype) and process


def calibrate(device="cpu", dtype=torch.float32) -> Hardware:
    """This device's roofline from ceilings measured here, once per process (memory: the device's total).

    Takes about a second on a CPU (a 256 MiB copy, 1024 x 1024 matmuls) and a few on a GPU; later
    calls return the first result.
    """
    device = torch.device(device)
    key = (str(device), dtype)
    if key not in _CALIBRATED:
        if device.type == "cuda":
            props = torch.cuda.get_device_properties(device)
            name, memory = props.name, props.total_memory
        else:
            name = f"{platform.processor() or platform.machine()} CPU x{torch.get_num_threads()}"
            memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        bandwidth, flops = measure_bandwidth(device), measure_flops(device, dtype)
        _CALIBRATED[key] = Hardware(f"{name} (measured)", bandwidth, flops, memory)
    return _CALIBRATED[key]


def is_calibrated(device="cpu", dtype=torch.float32) -> bool:
    """Whether :func:`calibrate` has already measured this device in this process."""
    return (str(torch.device(device)), dtype) in _CALIBRATED


def preset_for(device) -> Hardware | None:
    """The datasheet preset of a known NVIDIA GPU (H200, H100, A100, L4), else None."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device).lower()
    for key in ("h200", "h100", "a100", "l4"):  # h200 before h100: names like "NVIDIA H200"
        if key in name:
            return HARDWARE[key]
    return None


def device_hardware(device="cpu", dtype=torch.float32) -> Hardware:
    """The datasheet preset of a known NVIDIA GPU, otherwise this device's calibration (cached per process)."""
    return preset_for(device) or calibrate(str(torch.device(device)), dtype)
