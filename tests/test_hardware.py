"""Hardware ceilings: datasheet presets, calibration once per process, the GPU preset by name."""

import pytest
import torch

from minispec import hardware
from minispec.hardware import H100_SXM, H200, HARDWARE, Hardware


def test_presets_carry_the_datasheet_figures():
    assert (H100_SXM.memory_bandwidth, H100_SXM.peak_flops, H100_SXM.memory_bytes) == (3.35e12, 989e12, 80e9)
    assert round(H100_SXM.ridge) == 295 and round(H200.ridge) == 206
    assert set(HARDWARE) == {"h100", "h200", "a100", "l4"}
    with pytest.raises(ValueError, match="memory_bandwidth"):
        Hardware("broken", 0, 1e12, 1e9)


def test_median_time_takes_the_median_of_the_timed_calls(monkeypatch):
    clock = iter([0.0, 1.0, 10.0, 13.0, 20.0, 22.0])  # three timed calls: 1 s, 3 s, 2 s
    monkeypatch.setattr(hardware.time, "perf_counter", lambda: next(clock))
    calls = []
    assert hardware.median_time(lambda: calls.append(1), torch.device("cpu"), repeats=3, warmup=2) == 2.0
    assert len(calls) == 5  # two untimed warm-up calls first


def test_measurements_divide_the_work_by_the_median_time(monkeypatch):
    monkeypatch.setattr(hardware, "median_time", lambda fn, device, *a, **k: (fn(), 0.5)[1])
    assert hardware.measure_bandwidth("cpu", nbytes=1 << 20) == 2 * (1 << 20) / 0.5  # a read and a write
    assert hardware.measure_flops("cpu", n=64) == 2 * 64**3 / 0.5


def test_calibration_runs_once_per_device_and_dtype(monkeypatch):
    monkeypatch.setattr(hardware, "_CALIBRATED", {})
    runs = []
    monkeypatch.setattr(hardware, "measure_bandwidth", lambda device: runs.append("bw") or 2e10)
    monkeypatch.setattr(hardware, "measure_flops", lambda device, dtype: runs.append("flops") or 1e11)
    assert not hardware.is_calibrated("cpu")
    hw = hardware.calibrate("cpu")
    assert hw.name.endswith("(measured)") and (hw.memory_bandwidth, hw.peak_flops) == (2e10, 1e11)
    assert hw.memory_bytes > 1e9 and hardware.calibrate("cpu") is hw and runs == ["bw", "flops"]
    assert hardware.is_calibrated("cpu") and hardware.device_hardware("cpu") is hw


def test_a_known_gpu_gets_its_datasheet_preset(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    assert hardware.preset_for("cuda") is H200 and hardware.preset_for("cpu") is None
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    assert hardware.preset_for("cuda") is H100_SXM
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA GeForce RTX 4090")
    assert hardware.preset_for("cuda") is None
