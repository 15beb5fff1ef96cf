"""Timers behind one interface. A timer runs inside the process that calls the kernel;
its clock is bound at import, before any candidate code is loaded, and the evaluator
cross-checks what it reports against wall time measured from the outside.

Every timer leaves `info` (mode, clocks, cross-checks) after `measure`, so each number
travels with how it was taken.
"""

from __future__ import annotations

import contextlib
import gc
import time
from abc import ABC, abstractmethod
from statistics import median
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from magpie.harness.wire import TimingSettings

_clock_ns = time.perf_counter_ns

# Kernels shorter than this are timed as CUDA-graph replays: per-launch events would
# measure the launch path instead of the kernel.
GRAPH_THRESHOLD_US = 10.0


class Timer(ABC):
    name: str
    modes: tuple = (None,)

    def __init__(self):
        self.info: dict = {}
        # (input set index, output) of the last timed call: the evaluator checks it against the
        # reference, so a call that was timed was also right. Calls made after it (host checks)
        # leave it as it is: an implementation that returned one buffer for every call would
        # have failed the correctness checks already, whose calls' outputs are all compared.
        self.last_call: tuple[int, object] | None = None

    def warmup(self, fn, input_sets: list, warmup_ms: float) -> int:
        """Call until warmup_ms has passed (at least once); return the number of calls."""
        deadline = _clock_ns() + int(warmup_ms * 1e6)
        calls = 0
        while calls == 0 or _clock_ns() < deadline:
            fn(*input_sets[calls % len(input_sets)])
            calls += 1
            if calls % 16 == 0:
                self._settle()
        self._settle()
        return calls

    def _settle(self) -> None:  # noqa: B027 (a no-op by design: only device timers override it)
        """Wait for work the calls queued (nothing to wait for on the CPU)."""

    def probe(self, fn, input_sets: list, budget_ms: float = 20.0) -> float:
        """A per-call duration in microseconds (median over a short budget), to choose a mode."""
        samples = self.measure(fn, input_sets, budget_ms=budget_ms, max_reps=1000, offset=0)
        return median(samples) / 1000 if samples else 0.0

    @abstractmethod
    def measure(
        self, fn, input_sets: list, budget_ms: float, max_reps: int, offset: int, mode: str | None = None
    ) -> list[int]:
        """Per-call durations in nanoseconds, rotating through input_sets from offset."""

    def host_check(self, fn, input_sets: list, offset: int, calls: int) -> float | None:
        """Host wall time of `calls` calls each synchronised before and after, median in µs;
        None where the clock around a call already is host time."""
        return None

    def launch_probe(self, fn, input_sets: list) -> float | None:
        """Host time per call to queue the calls' work, in µs; None where calls are synchronous."""
        return None

    def describe(self, settings: TimingSettings, mode: str | None = None) -> str:
        return self.name

    def prepare(self, fn, input_sets: list, mode: str | None):
        """Whatever a mode sets up before its first timed call (nothing here)."""
        return None

    def forget(self) -> None:
        """Drop what `prepare` and the last call kept (between jobs: they hold the job's data)."""
        self.last_call = None

    def trivial_call(self) -> tuple:
        """A call that does next to nothing, and its input sets: what calibration times."""
        return (lambda: None), [()]


class CpuWallTimer(Timer):
    """Host clock around each call; on the CPU the call is synchronous."""

    name = "cpu-perf-counter"

    def measure(self, fn, input_sets, budget_ms, max_reps, offset, mode=None):
        samples = []
        clock = _clock_ns
        count = len(input_sets)
        i = offset
        with collector_paused():
            began = clock()
            deadline = began + int(budget_ms * 1e6)
            out = None
            while len(samples) < max_reps and (not samples or clock() < deadline):
                args = input_sets[i % count]
                start = clock()
                out = fn(*args)
                samples.append(clock() - start)
                i += 1
            loop_ns = clock() - began
        self.last_call = ((i - 1) % count, out)
        self.info = {"mode": "host-clock", "calls_per_sample": 1, "loop_wall_ms": loop_ns / 1e6}
        return samples

    def describe(self, settings, mode=None):
        return (
            f"{self.name}: per-call time.perf_counter_ns on the host, warm-up {settings.warmup_ms:g} ms, "
            f"{settings.input_sets} fresh input sets rotated, torch threads={settings.threads}, "
            f"{settings.rounds} rounds interleaved with the baseline"
        )


class CudaTimer(Timer):
    """Device time of each call.

    events: CUDA events around each call, the L2 flushed before it by reading a buffer of
    four times the L2 size, calls queued back to back and synchronised device-wide in batches
    (work a call leaves on a side stream without joining it shows in the host-synchronised
    cross-check, `host_check`, not in its events). graph: for kernels under
    GRAPH_THRESHOLD_US or launch-bound ones, a CUDA graph of GRAPH_CALLS calls, captured once
    (`prepare`), is replayed and each replay's event time divided by the calls it holds (warm
    L2: such kernels live in cache anyway).
    """

    name = "cuda"
    modes = ("events", "graph")
    GRAPH_CALLS = 20
    BATCH_US = 5000.0  # device time queued between synchronisations in events mode
    MAX_BATCH = 50

    def __init__(self, device: str = "cuda"):
        super().__init__()
        import torch

        self.torch = torch
        self.device = torch.device(device)
        props = torch.cuda.get_device_properties(self.device)
        self.l2_bytes = int(getattr(props, "L2_cache_size", 0) or 50 * 2**20)
        self._flush_words = torch.ones(self.l2_bytes, dtype=torch.int32, device=self.device)  # 4x L2 in bytes
        self._flush_sink = torch.empty((), dtype=torch.int32, device=self.device)
        self.persisting_l2_reset = _reset_persisting_l2()
        self._graphs: dict = {}

    def _sync(self):
        self.torch.cuda.synchronize(self.device)

    _settle = _sync

    def trivial_call(self):
        one = self.torch.zeros(1, device=self.device)
        return one.add_, [(1,)]

    def probe(self, fn, input_sets: list, budget_ms: float = 20.0) -> float:
        """Device time per call from a short graph replay, free of launch overhead; where the call
        cannot be captured, the events median."""
        try:
            samples = self._replays(self.prepare(fn, input_sets, "graph"), budget_ms, 50 * self.GRAPH_CALLS)
        except Exception:  # host syncs inside fn make it uncapturable
            samples = self._events(fn, input_sets, budget_ms, 1000, 0)
        return median(samples) / 1000 if samples else 0.0

    LAUNCH_PROBE_CALLS = 20  # few enough that the device's launch queue never fills and holds the host up

    def launch_probe(self, fn, input_sets, repeats: int = 3):
        """Host time per call to queue LAUNCH_PROBE_CALLS calls back to back, no synchronisation
        between them (the least of `repeats` batches: an interrupt only ever adds). Where it
        exceeds the device time per call, the device waits on the host: per-call events would
        time the host's launch path, at whatever speed the host has that moment."""
        count = len(input_sets)
        best = None
        for _ in range(repeats):
            self._sync()
            start = _clock_ns()
            for k in range(self.LAUNCH_PROBE_CALLS):
                fn(*input_sets[k % count])
            elapsed = (_clock_ns() - start) / 1000 / self.LAUNCH_PROBE_CALLS
            self._sync()
            best = elapsed if best is None else min(best, elapsed)
        return best

    def _flush_l2(self):
        # Reading (not writing) 4x the L2 leaves it full of clean lines: a written buffer would
        # leave dirty lines whose write-back the timed kernel would then pay for.
        self._flush_sink.copy_(self._flush_words.amax())

    def measure(self, fn, input_sets, budget_ms, max_reps, offset, mode=None):
        mode = mode or "events"
        fallback = None
        began = _clock_ns()
        if mode == "graph":
            try:
                graph = self.prepare(fn, input_sets, mode)
                began = _clock_ns()
                samples = self._replays(graph, budget_ms, max_reps)
            except Exception as err:  # host syncs inside fn make it uncapturable
                fallback = f"graph capture failed ({type(err).__name__}); timed with events"
                mode = "events"
        if mode == "events":
            samples = self._events(fn, input_sets, budget_ms, max_reps, offset)
        self.info = {
            "mode": mode,
            "calls_per_sample": self.GRAPH_CALLS if mode == "graph" else 1,
            "fallback": fallback,
            "l2_flush_bytes_read": 4 * self.l2_bytes if mode == "events" else 0,
            "persisting_l2_reset": self.persisting_l2_reset,
            "loop_wall_ms": (_clock_ns() - began) / 1e6,
        }
        return samples

    def _events(self, fn, input_sets, budget_ms, max_reps, offset):
        """Flush, then the call between two events, queued back to back and synchronised in
        batches of about BATCH_US of device time: on the H200 a 4096³ bf16 GEMM that follows
        idle time (a sync per call leaves some) read 10-30% slower (docs/performance.md)."""
        torch = self.torch
        samples = []
        deadline = _clock_ns() + int(budget_ms * 1e6)
        count = len(input_sets)
        i = offset
        batch = 1  # until the first sample says how long a call takes
        out = None
        with collector_paused():
            while len(samples) < max_reps and (not samples or _clock_ns() < deadline):
                pending = []
                for _ in range(min(batch, max_reps - len(samples))):
                    args = input_sets[i % count]
                    self._flush_l2()
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    start.record()
                    out = fn(*args)
                    end.record()
                    pending.append((start, end))
                    i += 1
                self._sync()
                samples.extend(int(start.elapsed_time(end) * 1e6) for start, end in pending)
                batch = max(1, min(self.MAX_BATCH, int(self.BATCH_US * 1000 / max(samples[0], 1))))
        self.last_call = ((i - 1) % count, out)
        return samples

    def prepare(self, fn, input_sets, mode: str | None):
        """What a mode needs before its first timed call: for graph mode, the graph of
        GRAPH_CALLS calls over the input sets, captured once per function and input sets and
        replayed by every later measurement (a capture costs the calls' host time and one
        replay: far more than a measurement's budget for a slow kernel). None for events."""
        if mode != "graph":
            return None
        key = (id(fn), id(input_sets))
        if key not in self._graphs:
            self._graphs[key] = self._capture(fn, input_sets)
        return self._graphs[key]

    def forget(self):
        super().forget()
        self._graphs.clear()

    def _capture(self, fn, input_sets):
        torch = self.torch
        count = len(input_sets)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for k in range(3):
                fn(*input_sets[k % count])
        torch.cuda.current_stream(self.device).wait_stream(side)
        self._sync()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for k in range(self.GRAPH_CALLS):
                out = fn(*input_sets[k % count])
        graph.replay()
        self._sync()
        # the function and inputs stay alive while their graph may be replayed; the last
        # captured call's output holds, after each replay, what that call computed
        return graph, fn, input_sets, ((self.GRAPH_CALLS - 1) % count, out)

    def _replays(self, captured, budget_ms, max_reps):
        torch = self.torch
        graph = captured[0]
        samples = []
        deadline = _clock_ns() + int(budget_ms * 1e6)
        with collector_paused():
            while len(samples) < sample_cap("graph", max_reps) and (not samples or _clock_ns() < deadline):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                graph.replay()
                end.record()
                self._sync()
                samples.append(int(start.elapsed_time(end) * 1e6 / self.GRAPH_CALLS))
        self.last_call = captured[3]
        return samples

    def host_check(self, fn, input_sets, offset, calls):
        walls = []
        for k in range(calls):
            self._sync()
            start = _clock_ns()
            fn(*input_sets[(offset + k) % len(input_sets)])
            self._sync()
            walls.append((_clock_ns() - start) / 1000)
        return median(walls)

    def describe(self, settings, mode=None):
        if mode == "graph":
            how = (
                f"CUDA graph of {self.GRAPH_CALLS} calls replayed, event time per replay divided by "
                f"{self.GRAPH_CALLS} (kernels under {GRAPH_THRESHOLD_US:g} µs; warm L2)"
            )
        else:
            how = (
                f"CUDA events around each call, L2 flushed before each ({4 * self.l2_bytes >> 20} MiB read), "
                f"calls queued back to back, device-wide synchronisation every ~{self.BATCH_US / 1000:g} ms of "
                "device time"
            )
        return (
            f"{how}; warm-up {settings.warmup_ms:g} ms, {settings.input_sets} fresh input sets rotated, "
            f"{settings.rounds} rounds interleaved with the baseline; host-synchronised wall time cross-checked"
        )


def calibrate(
    timer: Timer, short_ms: float = 5.0, long_ms: float = 25.0, repeats: int = 3, host_checks: int = 10
) -> dict:
    """What the timer costs beside the time its samples report, measured by running it on a
    call that does next to nothing: per sample (in events mode the L2 flush, events, batched
    synchronisations and the loop; in graph mode a replay's launch, events and
    synchronisation), per request (set-up, the loop's first turn) and per host-synchronised check
    call. Two budgets separate the per-sample from the per-request cost (a line through the
    two points); each is the median of `repeats` such pairs. Run in the evaluator, which runs
    no code under test: these figures are the integrity check's allowances."""
    fn, input_sets = timer.trivial_call()
    timer.warmup(fn, input_sets, 5.0)
    costs: dict = {}
    for mode in timer.modes:
        per_sample, per_request = [], []
        for _ in range(repeats):
            points = []
            for budget_ms in (short_ms, long_ms):
                start = _clock_ns()
                samples = timer.measure(fn, input_sets, budget_ms, 10**7, 0, mode=mode)
                wall = _clock_ns() - start
                points.append((len(samples), wall - sum(samples) * timer.info.get("calls_per_sample", 1)))
            (n_short, rest_short), (n_long, rest_long) = points
            slope = (rest_long - rest_short) / (n_long - n_short) if n_long > n_short else rest_long / max(n_long, 1)
            per_sample.append(max(0.0, slope))
            per_request.append(max(0.0, rest_short - n_short * per_sample[-1]))
        costs[mode or timer.name] = {"per_sample_ns": median(per_sample), "per_request_ns": median(per_request)}
    start = _clock_ns()
    checked = timer.host_check(fn, input_sets, 0, host_checks)
    costs["host_check_ns"] = (_clock_ns() - start) / host_checks if checked is not None else 0.0
    return costs


@contextlib.contextmanager
def collector_paused():
    """The garbage collector off while calls are timed, as timeit does: a collection's pause
    would land in a sample or between samples, where the wall-clock check sees it."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def sample_cap(mode: str | None, max_reps: int) -> int:
    """The most samples a timer takes in one request; short of it, it measures until its budget
    has passed, which is how the evaluator tells an honest early stop from a replaced timer."""
    return max(1, max_reps // CudaTimer.GRAPH_CALLS) if mode == "graph" else max_reps


def nvml_snapshot(index: int) -> dict | None:
    """SM clock, memory clock, power and temperature, where NVML is available."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        return {
            "sm_clock_mhz": pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM),
            "mem_clock_mhz": pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_MEM),
            "power_w": pynvml.nvmlDeviceGetPowerUsage(handle) / 1000,
            "temperature_c": pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU),
        }
    except Exception:  # NVML absent or refused in this container: timings stand without it
        return None


def _reset_persisting_l2() -> bool:
    """Undo any persisting-L2 window a previous process or candidate left behind."""
    try:
        from cuda.bindings import runtime
    except ImportError:
        try:
            from cuda import cudart as runtime
        except ImportError:
            return False
    try:
        (err,) = runtime.cudaCtxResetPersistingL2Cache()
        return int(err) == 0
    except Exception:
        return False


def timer_for(device: str) -> Timer:
    kind = device.split(":", 1)[0]
    if kind == "cpu":
        return CpuWallTimer()
    if kind == "cuda":
        return CudaTimer(device)
    raise KeyError(f"no timer for device {device!r} (known: cpu, cuda)")
