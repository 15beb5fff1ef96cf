"""Timers behind one interface. A timer runs inside the process that calls the kernel;
its clock is bound at import, before any candidate code is loaded, and the evaluator
cross-checks what it reports against wall time measured from the outside.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod

_clock_ns = time.perf_counter_ns


class Timer(ABC):
    name: str

    @abstractmethod
    def warmup(self, fn, input_sets: list, warmup_ms: float) -> int:
        """Call until warmup_ms has passed; return the number of calls."""

    @abstractmethod
    def measure(self, fn, input_sets: list, budget_ms: float, max_reps: int, offset: int) -> list[int]:
        """Per-call durations in nanoseconds, rotating through input_sets from offset."""

    def describe(self, settings: dict) -> str:
        return self.name


class CpuWallTimer(Timer):
    """Host clock around each call; on the CPU the call is synchronous."""

    name = "cpu-perf-counter"

    def warmup(self, fn, input_sets, warmup_ms):
        deadline = _clock_ns() + int(warmup_ms * 1e6)
        calls = 0
        while calls == 0 or _clock_ns() < deadline:
            fn(*input_sets[calls % len(input_sets)])
            calls += 1
        return calls

    def measure(self, fn, input_sets, budget_ms, max_reps, offset):
        samples = []
        clock = _clock_ns
        deadline = clock() + int(budget_ms * 1e6)
        count = len(input_sets)
        i = offset
        while len(samples) < max_reps and (not samples or clock() < deadline):
            args = input_sets[i % count]
            start = clock()
            fn(*args)
            samples.append(clock() - start)
            i += 1
        return samples

    def describe(self, settings):
        return (
            f"{self.name}: per-call time.perf_counter_ns on the host, warm-up {settings['warmup_ms']:g} ms, "
            f"{settings['input_sets']} fresh input sets rotated, torch threads={settings['threads']}, "
            f"{settings['rounds']} rounds interleaved with the baseline"
        )


TIMERS: dict[str, type[Timer]] = {"cpu": CpuWallTimer}


def timer_for(device: str) -> Timer:
    kind = device.split(":", 1)[0]
    if kind not in TIMERS:
        raise KeyError(f"no timer for device {device!r} (known: {', '.join(TIMERS)})")
    return TIMERS[kind]()
