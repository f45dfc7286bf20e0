"""Lesson 01, worked solutions to the exercises. Run from the repository root:

    python lessons/solutions/01_decode_is_memory_bound.py

Exercise 1 measures (its asserts keep margins that survive a 3x slowdown of either side); exercises 2
and 3 use the roofline model, whose numbers are exact.
"""

import math

import torch

from minispec import roofline
from minispec.course.models import course_models
from minispec.roofline import LLAMA_8B, ModelShape, hardware
from minispec.tools.steps import measure_step_time


def intensity(T, shape=LLAMA_8B):
    """FLOP per byte of one forward pass over T tokens (as in the lesson)."""
    return 2 * shape.params * T / shape.weight_bytes


def exercise_1():
    """Up to 512 tokens per step. This machine's roofline says the tiny float32 model turns compute-bound
    after about ridge / I(1) tokens, a handful; the measured curve keeps growing far more slowly than T
    long past that point, because a step's time is mostly per-operation overhead that does not grow with T.
    Only when the arithmetic outgrows the overhead (hundreds of tokens here) does the step time grow
    roughly in proportion to T."""
    print("exercise 1: longer steps on this machine")
    m = course_models()
    model = m["target"]
    if model.device.type == "cpu":
        torch.set_num_threads(1)
    tokens = [1, 8, 64, 256, 512]
    sweeps = [{T: measure_step_time(model, 1, T, 64, 5) for T in tokens} for _ in range(3)]
    measured = {T: min(s[T] for s in sweeps) for T in tokens}  # other work only adds time: keep the fastest
    hw, shape = hardware.calibrate(str(model.device), model.dtype), ModelShape.from_model(model)
    print(f"  modelled: compute-bound from T = {hw.ridge / intensity(1, shape):.0f} on {hw.name}")
    for T in tokens:
        print(f"  T = {T:3d}: measured {1e3 * measured[T]:7.2f} ms per step ({1e3 * measured[T] / T:6.3f} ms per "
              f"token), modelled {1e3 * roofline.step_time(1, T, hw, shape, 64):7.2f} ms")
    growth = measured[512] / measured[256]
    print(f"  from 256 to 512 tokens the step grows {growth:.2f}x (linear: 2x)")
    assert measured[512] > 2 * measured[1], "at hundreds of tokens the arithmetic shows"
    assert measured[512] / 512 < measured[1] / 5, "yet a token in a 512-token step costs far less than alone"
    return measured


def exercise_2():
    """The verify step of 5 tokens per row is free until B * 5 tokens reach the ridge (295 FLOP/byte, so
    295 tokens): batch 59.04, so the first integer batch that costs more is 60. 295 / 5: each row sends
    gamma + 1 = 5 tokens, so the target sees five times the batch."""
    print("exercise 2: the batch where verifying 5 tokens per row stops being free (8B, H100)")
    first = next(B for B in range(1, 1000) if roofline.step_time(B, 5) > roofline.step_time(1, 5))
    bound = roofline.compute_bound_batch()
    print(f"  step_time(B, 5) first grows at B = {first}; compute_bound_batch() = {bound:.2f} "
          f"= ridge {hardware.H100_SXM.ridge:.1f} / 5")
    assert first == math.floor(bound) + 1 == 60
    assert math.isclose(bound, hardware.H100_SXM.ridge / intensity(5))
    return first


def exercise_3():
    """The H200 has 43 % more bandwidth and the same compute: its ridge moves DOWN, from 295 to 206
    FLOP/byte. Every memory-bound step is faster, and the batch-1 speedup is the same 2.80x (both
    steps are still weight reads). But verification turns compute-bound sooner (batch 41 instead of 59)
    and speculation stops paying sooner (break-even near 130 instead of 187)."""
    print("exercise 3: H100 against H200")
    rows = {}
    for hw in (hardware.H100_SXM, hardware.H200):
        rows[hw.name] = r = {"ridge": hw.ridge, "step_ms": 1e3 * roofline.step_time(1, 1, hw),
                             "speedup_b1": roofline.speculative_speedup(1, hardware=hw),
                             "compute_bound": roofline.compute_bound_batch(hardware=hw),
                             "break_even": roofline.break_even_batch(hardware=hw)}
        print(f"  {hw.name:8s}: ridge {r['ridge']:5.1f} FLOP/byte, decode step {r['step_ms']:.2f} ms, batch-1 "
              f"speedup {r['speedup_b1']:.2f}x, compute-bound from batch {r['compute_bound']:.1f}, "
              f"break-even {r['break_even']:.0f}")
    h100, h200 = rows["H100 SXM"], rows["H200"]
    assert h200["ridge"] < h100["ridge"] and round(h200["ridge"]) == 206
    assert h200["step_ms"] < h100["step_ms"] and math.isclose(h200["speedup_b1"], h100["speedup_b1"])
    assert h200["compute_bound"] < h100["compute_bound"] and h200["break_even"] < h100["break_even"]
    return rows


if __name__ == "__main__":
    exercise_1()
    exercise_2()
    exercise_3()
