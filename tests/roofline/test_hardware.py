"""Hardware ceilings: datasheet presets, calibration once per process, the GPU preset by its exact name."""

import pytest
import torch

from minispec.roofline import hardware
from minispec.roofline.hardware import DEVICE_PRESETS, H100_SXM, H200, HARDWARE, L40S, Hardware


def test_presets_carry_the_datasheet_figures():
    assert (H100_SXM.memory_bandwidth, H100_SXM.peak_flops, H100_SXM.memory_bytes) == (3.35e12, 989e12, 80e9)
    assert round(H100_SXM.ridge) == 295 and round(H200.ridge) == 206
    assert {"h100", "h200", "a100", "l4"} <= set(HARDWARE)  # the CLI's, plots' and lessons' keys stay
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


# Each name as torch.cuda.get_device_name() reports it, with the HARDWARE key of its preset: written out here rather
# than read from the table, so a wrong, missing or extra entry fails.
REPORTED = {
    "NVIDIA H100 80GB HBM3": "h100", "NVIDIA H100 PCIe": "h100-pcie", "NVIDIA H100 NVL": "h100-nvl",
    "NVIDIA H200": "h200", "NVIDIA H200 NVL": "h200-nvl",
    "NVIDIA A100-SXM4-80GB": "a100", "NVIDIA A100-SXM4-40GB": "a100-40gb",
    "NVIDIA A100-PCIE-40GB": "a100-pcie-40gb", "NVIDIA A100 80GB PCIe": "a100-pcie-80gb",
    "NVIDIA L4": "l4", "NVIDIA L40S": "l40s", "NVIDIA B200": "b200",
}


def reporting(monkeypatch, name):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)


def test_every_reported_name_gets_its_own_preset(monkeypatch):
    assert DEVICE_PRESETS == {name: HARDWARE[key] for name, key in REPORTED.items()}
    assert set(REPORTED.values()) == set(HARDWARE)  # every preset is some GPU's
    for name, key in REPORTED.items():
        reporting(monkeypatch, name)
        assert hardware.preset_for("cuda") is HARDWARE[key], name
    assert hardware.preset_for("cpu") is None  # the device type decides first


@pytest.mark.parametrize("name, not_this", [
    ("NVIDIA L40S", "l4"),  # "l4" is in "l40s": a substring match gave it 300 GB/s instead of 864
    ("NVIDIA H100 PCIe", "h100"), ("NVIDIA H100 NVL", "h100"), ("NVIDIA H200 NVL", "h200"),
    ("NVIDIA A100-SXM4-40GB", "a100"), ("NVIDIA A100-PCIE-40GB", "a100"), ("NVIDIA A100 80GB PCIe", "a100"),
])
def test_a_name_containing_another_gpus_name_does_not_get_its_preset(monkeypatch, name, not_this):
    reporting(monkeypatch, name)
    preset = hardware.preset_for("cuda")
    assert preset is not None and preset != HARDWARE[not_this]


@pytest.mark.parametrize("name", [
    "NVIDIA GeForce RTX 4090", "NVIDIA H100", "NVIDIA A100-SXM4-80GB MIG 1g.10gb", "NVIDIA L40", "NVIDIA L4 ",
])
def test_a_name_not_in_the_table_has_no_preset(monkeypatch, name):
    reporting(monkeypatch, name)
    assert hardware.preset_for("cuda") is None


def test_an_unknown_gpu_is_calibrated_and_a_known_one_is_not(monkeypatch):
    measured, calls = Hardware("NVIDIA GeForce RTX 4090 (measured)", 1e12, 1e14, 24e9), []
    monkeypatch.setattr(hardware, "calibrate", lambda device, dtype: calls.append((device, dtype)) or measured)
    reporting(monkeypatch, "NVIDIA GeForce RTX 4090")
    assert hardware.device_hardware("cuda", torch.bfloat16) is measured and calls == [("cuda", torch.bfloat16)]
    reporting(monkeypatch, "NVIDIA L40S")
    assert hardware.device_hardware("cuda", torch.bfloat16) is L40S and len(calls) == 1
