"""The GPU's clock regime over a measurement (issue 37.8): SM and memory clocks, board power,
temperature and NVML's throttle reasons, read by a thread of the evaluator every
SAMPLE_INTERVAL_S while the timing job measures, and summarised beside the timing
(`ClockRegime`: each figure's least, median and largest reading, the share of readings each
throttle reason was active in, the device's clock ceilings and power limit).

NVML is reached through ctypes on `libnvidia-ml.so.1`, the driver's own library, so no Python
package is needed (the H200 machine has no package index). Where there is no GPU, no driver or
NVML refuses, every figure is None and `reason` says why: a timing stands without its clocks.

A sampling thread rather than readings between rounds: a GPU's clock can move within a round
(a tensor-core GEMM that draws the board to its power limit), which readings only between rounds
miss; every 20 ms a reading is a few NVML queries (calls into the driver), made while the thread
holds no GIL (ctypes lets it go for each call), so the evaluator's
thread, which queues the batches, is not held up, and the batches' time is the GPU's, by CUDA
events the thread never touches. What a measurement of bursts reads (`regime` "burst": short
batches with the device idle between them, at or near boost clock) is not what a long loop at
the power limit reads: docs/architecture/harness.md, "Clock regime"."""

from __future__ import annotations

import os
import threading
import time
from statistics import median
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel

if TYPE_CHECKING:  # imported where NVML is called: the reports import this module for its model
    import ctypes

SAMPLE_INTERVAL_S = 0.02
LIBRARY = "libnvidia-ml.so.1"
# nvmlClockType_t, nvmlTemperatureSensors_t, nvmlPstates_t
CLOCK_SM, CLOCK_MEM = 1, 2
TEMPERATURE_GPU = 0
PSTATE_0 = 0
# nvmlClocksThrottleReasons (nvml.h): the bits of nvmlDeviceGetCurrentClocksThrottleReasons
THROTTLE_REASONS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
# how the timing ran: short batches with the device idle between them (no sustained mode is offered)
Regime = Literal["burst"]


class Spread(BaseModel):
    """The least, median and largest of a figure's readings."""

    min: float
    median: float
    max: float


class ClockRegime(BaseModel):
    """The clocks a timing ran at, or why none were read (`reason`; every figure None then)."""

    regime: Regime
    source: Literal["nvml"] | None
    reason: str | None = None
    readings: int = 0
    interval_ms: float | None = None
    window_s: float | None = None
    sm_clock_mhz: Spread | None = None
    mem_clock_mhz: Spread | None = None
    power_w: Spread | None = None
    temperature_c: Spread | None = None
    max_sm_clock_mhz: float | None = None
    min_sm_clock_mhz: float | None = None  # the P0 state's floor, where the driver says
    max_mem_clock_mhz: float | None = None
    power_limit_w: float | None = None
    # reason -> the share of readings it was active in (gpu_idle between batches included)
    throttle_reasons: dict[str, float] = {}


class NvmlError(RuntimeError):
    pass


class Nvml:
    """One device's NVML handle, on the library loaded once per process."""

    _library: ctypes.CDLL | None = None
    _lock = threading.Lock()

    def __init__(self, index: int, uuid: str | None = None):
        import ctypes

        lib = self._load()
        handle = ctypes.c_void_p()
        found = lib.nvmlDeviceGetHandleByUUID(uuid.encode(), ctypes.byref(handle)) if uuid else 1
        if found and (not uuid or "CUDA_VISIBLE_DEVICES" not in os.environ):
            # NVML numbers devices as CUDA does only where CUDA_VISIBLE_DEVICES renumbers none
            found = lib.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(index), ctypes.byref(handle))
        self._check(found, f"no device of UUID {uuid}" if uuid else f"no device {index}")
        self.lib, self.handle = lib, handle

    @classmethod
    def _load(cls) -> ctypes.CDLL:
        import ctypes

        with cls._lock:
            if cls._library is None:
                try:
                    lib = ctypes.CDLL(LIBRARY)
                except OSError as err:
                    raise NvmlError(f"{LIBRARY} could not be loaded ({err})") from None
                lib.nvmlErrorString.restype = ctypes.c_char_p
                code = lib.nvmlInit_v2()
                if code:
                    raise NvmlError(f"nvmlInit_v2: {lib.nvmlErrorString(code).decode()}")
                cls._library = lib
            return cls._library

    def _check(self, code: int, what: str) -> None:
        if code:
            lib = self._library
            text = lib.nvmlErrorString(code).decode() if lib is not None else str(code)
            raise NvmlError(f"NVML {what}: {text}")

    def _uint(self, function: str, *args) -> int | None:
        """A query that fills one unsigned int, or None where the driver does not support it."""
        import ctypes

        value = ctypes.c_uint()
        call = getattr(self.lib, function, None)
        if call is None or call(self.handle, *args, ctypes.byref(value)):
            return None
        return value.value

    def read(self) -> dict:
        """One reading: clocks (MHz), power (W), temperature (°C), throttle reasons (bit mask)."""
        import ctypes

        mask = ctypes.c_ulonglong()
        reasons = getattr(self.lib, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
            self.lib, "nvmlDeviceGetCurrentClocksThrottleReasons", None
        )
        throttled = reasons(self.handle, ctypes.byref(mask)) if reasons is not None else 1
        power_mw = self._uint("nvmlDeviceGetPowerUsage")
        return {
            "sm_clock_mhz": self._uint("nvmlDeviceGetClockInfo", CLOCK_SM),
            "mem_clock_mhz": self._uint("nvmlDeviceGetClockInfo", CLOCK_MEM),
            "power_w": power_mw / 1000 if power_mw is not None else None,
            "temperature_c": self._uint("nvmlDeviceGetTemperature", TEMPERATURE_GPU),
            "throttle_mask": None if throttled else mask.value,
        }

    def limits(self) -> dict:
        """The device's SM and memory clock ceilings, P0's SM clock floor, its enforced power limit."""
        import ctypes

        low, high = ctypes.c_uint(), ctypes.c_uint()
        pstate = getattr(self.lib, "nvmlDeviceGetMinMaxClockOfPState", None)
        floor = None
        if pstate is not None and not pstate(self.handle, CLOCK_SM, PSTATE_0, ctypes.byref(low), ctypes.byref(high)):
            floor = float(low.value)
        limit_mw = self._uint("nvmlDeviceGetEnforcedPowerLimit")
        sm_max, mem_max = (self._uint("nvmlDeviceGetMaxClockInfo", kind) for kind in (CLOCK_SM, CLOCK_MEM))
        return {
            "max_sm_clock_mhz": float(sm_max) if sm_max is not None else None,
            "min_sm_clock_mhz": floor,
            "max_mem_clock_mhz": float(mem_max) if mem_max is not None else None,
            "power_limit_w": limit_mw / 1000 if limit_mw is not None else None,
        }


def open_device(device: str, index: int, uuid: str | None = None) -> tuple[Nvml | None, str | None]:
    """(the device's NVML handle, None), or (None, why there is none)."""
    if not device.startswith("cuda"):
        return None, f"the device is {device}: no GPU clocks to read"
    try:
        return Nvml(index, uuid), None
    except NvmlError as err:
        return None, str(err)


def summarise(readings: list[dict], limits: dict, regime: Regime, interval_s: float, window_s: float) -> ClockRegime:
    """The record of a measurement's readings (each `Nvml.read`'s)."""

    def spread(key: str) -> Spread | None:
        values = [r[key] for r in readings if r.get(key) is not None]
        return Spread(min=min(values), median=median(values), max=max(values)) if values else None

    masks = [r["throttle_mask"] for r in readings if r.get("throttle_mask") is not None]
    shares = {
        name: sum(1 for mask in masks if mask & bit) / len(masks)
        for bit, name in THROTTLE_REASONS.items()
        if any(mask & bit for mask in masks)
    }
    return ClockRegime(
        regime=regime,
        source="nvml",
        readings=len(readings),
        interval_ms=interval_s * 1000,
        window_s=round(window_s, 4),
        sm_clock_mhz=spread("sm_clock_mhz"),
        mem_clock_mhz=spread("mem_clock_mhz"),
        power_w=spread("power_w"),
        temperature_c=spread("temperature_c"),
        throttle_reasons=shares,
        **limits,
    )


class ClockSampler:
    """Readings of one device every `interval_s` on a thread of its own while in use (`with`),
    one as it starts and one as it stops; `regime()` their record. Without a device (`nvml`
    None), it reads nothing and its record says `reason`."""

    def __init__(self, nvml: Nvml | None, reason: str | None, regime: Regime = "burst", interval_s=SAMPLE_INTERVAL_S):
        self.nvml, self.reason, self.regime_name, self.interval_s = nvml, reason, regime, interval_s
        self.readings: list[dict] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._started = self._stopped = 0.0

    @classmethod
    def for_device(cls, device: str, index: int, uuid: str | None = None, regime: Regime = "burst") -> ClockSampler:
        nvml, reason = open_device(device, index, uuid)
        return cls(nvml, reason, regime)

    def _take(self) -> None:
        try:
            self.readings.append(self.nvml.read())  # type: ignore[union-attr]
        except (NvmlError, OSError):  # a reading refused mid-run: the others stand
            pass

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._take()

    def __enter__(self) -> ClockSampler:
        self._started = time.monotonic()
        if self.nvml is not None:
            self._take()
            self._thread = threading.Thread(target=self._run, name="magpie-clocks", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
            self._take()
        self._stopped = time.monotonic()

    def regime(self) -> dict:
        """The record (`ClockRegime`, as JSON-ready data)."""
        if self.nvml is None or not self.readings:
            reason = self.reason or "NVML gave no reading"
            return ClockRegime(regime=self.regime_name, source=None, reason=reason).model_dump()
        limits = self.nvml.limits()
        window = max(0.0, self._stopped - self._started)
        return summarise(self.readings, limits, self.regime_name, self.interval_s, window).model_dump()


def clock_text(record: dict | None) -> str:
    """One line for a timing's clocks (the compare table, the reports)."""
    if not record:
        return "clocks not recorded"
    if not record.get("readings"):
        return f"clocks not read: {record.get('reason') or 'no reading'}"

    def mhz(key: str) -> str:
        spread = record.get(key)
        if not spread:
            return "?"
        if spread["min"] == spread["max"]:
            return f"{spread['median']:,.0f} MHz"
        return f"{spread['median']:,.0f} MHz ({spread['min']:,.0f}–{spread['max']:,.0f})"

    parts = [f"SM {mhz('sm_clock_mhz')}"]
    if record.get("max_sm_clock_mhz"):
        parts[0] += f" of {record['max_sm_clock_mhz']:,.0f} max"
    parts.append(f"memory {mhz('mem_clock_mhz')}")
    power = record.get("power_w")
    if power:
        limit = f" of {record['power_limit_w']:,.0f} W limit" if record.get("power_limit_w") else ""
        parts.append(f"power {power['median']:,.0f} W (max {power['max']:,.0f}){limit}")
    reasons = {k: v for k, v in (record.get("throttle_reasons") or {}).items() if k != "gpu_idle"}
    if reasons:
        parts.append("throttled: " + ", ".join(f"{k} {v:.0%}" for k, v in sorted(reasons.items())))
    parts.append(f"{record['readings']} readings over {record.get('window_s') or 0:.2f} s, {record['regime']}")
    return "; ".join(parts)
