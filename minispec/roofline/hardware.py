"""Hardware ceilings, from datasheet presets or by calibrating the device at hand.

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


# Datasheet figures; "GB" is decimal as NVIDIA prints it (the cards report a little more). FLOP/s is the dense BF16
# tensor-core peak: the Hopper and Blackwell datasheets print it with 2:4 sparsity, and dense is half of that.
# NVIDIA H100 Tensor Core GPU datasheet, SXM column: 3.35 TB/s HBM3, BF16 1,979 TFLOPS with sparsity
# (989 dense), 80 GB.
H100_SXM = Hardware("H100 SXM", memory_bandwidth=3.35e12, peak_flops=989e12, memory_bytes=80e9)
# Same datasheet, PCIe column (the 2022 edition; later editions show NVL instead): 2 TB/s HBM2e,
# BF16 1,513 TFLOPS with sparsity (756.5 dense), 80 GB.
H100_PCIE = Hardware("H100 PCIe", memory_bandwidth=2.0e12, peak_flops=756.5e12, memory_bytes=80e9)
# Same datasheet, NVL column: 3.9 TB/s HBM3, BF16 1,671 TFLOPS with sparsity (835.5 dense), 94 GB.
H100_NVL = Hardware("H100 NVL", memory_bandwidth=3.9e12, peak_flops=835.5e12, memory_bytes=94e9)
# NVIDIA H200 Tensor Core GPU datasheet, SXM column: 4.8 TB/s HBM3e, BF16 1,979 TFLOPS with sparsity
# (989 dense, the H100's compute), 141 GB.
H200 = Hardware("H200", memory_bandwidth=4.8e12, peak_flops=989e12, memory_bytes=141e9)
# Same datasheet, NVL column: 4.8 TB/s HBM3e, BF16 1,671 TFLOPS with sparsity (835.5 dense), 141 GB.
H200_NVL = Hardware("H200 NVL", memory_bandwidth=4.8e12, peak_flops=835.5e12, memory_bytes=141e9)
# NVIDIA A100 Tensor Core GPU datasheet, 80GB SXM column: 2,039 GB/s HBM2e, BF16 312 TFLOPS dense, 80 GB.
A100_80GB = Hardware("A100 80GB SXM", memory_bandwidth=2.039e12, peak_flops=312e12, memory_bytes=80e9)
# Same datasheet, 40GB SXM column: 1,555 GB/s HBM2, BF16 312 TFLOPS dense, 40 GB.
A100_40GB = Hardware("A100 40GB SXM", memory_bandwidth=1.555e12, peak_flops=312e12, memory_bytes=40e9)
# Same datasheet, 40GB PCIe column: 1,555 GB/s HBM2, BF16 312 TFLOPS dense, 40 GB.
A100_PCIE_40GB = Hardware("A100 40GB PCIe", memory_bandwidth=1.555e12, peak_flops=312e12, memory_bytes=40e9)
# Same datasheet, 80GB PCIe column: 1,935 GB/s HBM2e, BF16 312 TFLOPS dense, 80 GB.
A100_PCIE_80GB = Hardware("A100 80GB PCIe", memory_bandwidth=1.935e12, peak_flops=312e12, memory_bytes=80e9)
# NVIDIA L4 Tensor Core GPU datasheet: 300 GB/s GDDR6, BF16 242 TFLOPS with sparsity (121 dense), 24 GB.
L4 = Hardware("L4", memory_bandwidth=300e9, peak_flops=121e12, memory_bytes=24e9)
# NVIDIA L40S datasheet: 864 GB/s GDDR6, BF16 362.05 TFLOPS dense (733 with sparsity), 48 GB.
L40S = Hardware("L40S", memory_bandwidth=864e9, peak_flops=362.05e12, memory_bytes=48e9)
# NVIDIA HGX B200 datasheet, "Individual Blackwell GPU Specifications", HGX B200 column: 7.7 TB/s HBM3e,
# FP16/BF16 4.5 PFLOPS with sparsity (2.25 dense), 180 GB. (Early editions printed 8 TB/s and 192 GB.)
B200 = Hardware("B200", memory_bandwidth=7.7e12, peak_flops=2.25e15, memory_bytes=180e9)
HARDWARE = {  # the CLI's --hardware choices
    "h100": H100_SXM, "h100-pcie": H100_PCIE, "h100-nvl": H100_NVL, "h200": H200, "h200-nvl": H200_NVL,
    "a100": A100_80GB, "a100-40gb": A100_40GB, "a100-pcie-40gb": A100_PCIE_40GB, "a100-pcie-80gb": A100_PCIE_80GB,
    "l4": L4, "l40s": L40S, "b200": B200,
}
# torch.cuda.get_device_name() -> preset, matched whole and as reported: the name is the driver's (cudaDeviceProp.name,
# the string nvidia-smi prints), so no normalising is needed, and matching a part of it is what gave "NVIDIA L40S"
# the L4's preset. A name not here (another GPU, a MIG slice "... MIG 1g.10gb", a variant without a datasheet column
# such as "NVIDIA H100") gets calibrated. Where each name was seen: the table of NVIDIA's open kernel modules README
# (NVIDIA/open-gpu-kernel-modules, driver 560.31.02, with its PCI id), and nvidia-smi or torch output in public issues.
DEVICE_PRESETS = {
    "NVIDIA H100 80GB HBM3": H100_SXM,  # README 2330; nvidia-smi in NVIDIA/nccl#1264
    "NVIDIA H100 PCIe": H100_PCIE,  # README 2331; torch's sm_90 warning in roboflow/inference#181
    "NVIDIA H100 NVL": H100_NVL,  # README 2321; nvidia-smi in NVIDIA/gpu-admin-tools#4
    "NVIDIA H200": H200,  # README 2335; nvidia-smi -q "Product Name" in NVIDIA/mig-parted#120
    "NVIDIA H200 NVL": H200_NVL,  # newer than that README; nvidia-smi tables in public repos (600 W, 143771MiB)
    "NVIDIA A100-SXM4-80GB": A100_80GB,  # README 20B2; nvidia-smi -q in NVIDIA/CUDALibrarySamples#104
    "NVIDIA A100-SXM4-40GB": A100_40GB,  # README 20B0; nvidia-smi in bottlerocket-os/bottlerocket-core-kit#834
    "NVIDIA A100-PCIE-40GB": A100_PCIE_40GB,  # README 20F1 (upper-case PCIE, as the driver spells it)
    "NVIDIA A100 80GB PCIe": A100_PCIE_80GB,  # README 20B5
    "NVIDIA L4": L4,  # README 27B8
    "NVIDIA L40S": L40S,  # README 26B9; nvidia-smi in gpustack/gpustack#301
    "NVIDIA B200": B200,  # newer than that README; nvidia-smi in NVIDIA/TensorRT-LLM#10278, pytorch/test-infra#7631
}


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
            threads = torch.get_num_threads()  # what the figures were measured with: not the machine's cores
            name = f"{platform.processor() or platform.machine()} CPU, {threads} torch thread{'s' * (threads > 1)}"
            memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        bandwidth, flops = measure_bandwidth(device), measure_flops(device, dtype)
        _CALIBRATED[key] = Hardware(f"{name} (measured)", bandwidth, flops, memory)
    return _CALIBRATED[key]


def is_calibrated(device="cpu", dtype=torch.float32) -> bool:
    """Whether :func:`calibrate` has already measured this device in this process."""
    return (str(torch.device(device)), dtype) in _CALIBRATED


def preset_for(device) -> Hardware | None:
    """The datasheet preset of a GPU whose reported name is in ``DEVICE_PRESETS`` exactly, else None."""
    device = torch.device(device)
    return DEVICE_PRESETS.get(torch.cuda.get_device_name(device)) if device.type == "cuda" else None


def device_hardware(device="cpu", dtype=torch.float32) -> Hardware:
    """The datasheet preset of a GPU named in ``DEVICE_PRESETS``, otherwise this device's calibration (cached)."""
    return preset_for(device) or calibrate(str(torch.device(device)), dtype)
