"""Phase timers: CUDA events on a GPU, perf_counter on the CPU, next to free when disabled.

    timer = PhaseTimer(device)
    with timer("draft"):
        ...
    timer.totals()  # {"draft": seconds, ...}

On a GPU, kernels run asynchronously, so a host clock around a phase measures only the
launches; CUDA events are recorded into the stream instead and read once, at the end, so
timing adds no host synchronisation inside the loop.
"""

from __future__ import annotations

import time
from collections import defaultdict
from contextlib import contextmanager, nullcontext

import torch

_OFF = nullcontext()


class PhaseTimer:
    def __init__(self, device: torch.device | str = "cpu", enabled: bool = True):
        """The clock is chosen once here: CUDA events for a CUDA device, perf_counter otherwise."""
        self.enabled = enabled
        self.cuda = enabled and torch.device(device).type == "cuda"
        self._seconds: dict[str, float] = defaultdict(float)
        self._events: list[tuple[str, object, object]] = []

    def __call__(self, phase: str):
        if not self.enabled:
            return _OFF
        return self._cuda(phase) if self.cuda else self._cpu(phase)

    @contextmanager
    def _cpu(self, phase: str):
        start = time.perf_counter()
        yield
        self._seconds[phase] += time.perf_counter() - start

    @contextmanager
    def _cuda(self, phase: str):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        yield
        end.record()
        self._events.append((phase, start, end))

    def totals(self) -> dict[str, float]:
        """Seconds per phase (synchronises the GPU once, to read its events)."""
        if self._events:
            torch.cuda.synchronize()
            for phase, start, end in self._events:
                self._seconds[phase] += start.elapsed_time(end) / 1e3
            self._events.clear()
        return dict(self._seconds)


def synchronize(device: torch.device) -> None:
    """Wait for the device to finish queued work (a no-op on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
