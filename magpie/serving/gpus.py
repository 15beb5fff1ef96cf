"""The GPUs of a serving benchmark: which are idle (selection) and what they did during the run (monitor).

Selection: a GPU is idle when no compute process runs on it and at least `min_free_fraction` of its memory
is free. NVML (pynvml) is asked first, then `nvidia-smi --query-gpu` / `--query-compute-apps` (CSV), then
amdsmi (AMD, unverified). The chosen indices go to the server as `CUDA_VISIBLE_DEVICES` (with
`CUDA_DEVICE_ORDER=PCI_BUS_ID`, so CUDA numbers them as NVML does) or `HIP_VISIBLE_DEVICES`, unless the user
pinned them (`gpu_selection`, `--gpus`, or the variable already set).

Monitor: `GpuMonitor` samples a `Sampler` (SM clock, memory clock, power, temperature, memory used per
device) in a background thread every `interval_s` while the measured run lasts; `summary()` is the
report's `gpu_monitor{metric: {min, max, avg}, samples, interval_s, source, devices}`.

Nothing here imports pynvml or amdsmi before it is asked to; tests pass a fake module object in.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass

METRICS = ("sm_clock_mhz", "mem_clock_mhz", "power_w", "temperature_c", "memory_used_mib")
PIN_VARIABLES = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES")


class GpuError(Exception):
    """Not enough idle GPUs, or a pinned set too small: one line."""


@dataclass
class GpuState:
    index: int
    total_mib: float
    free_mib: float
    processes: int
    uuid: str | None = None

    def idle(self, min_free_fraction: float) -> bool:
        return self.processes == 0 and self.free_mib >= min_free_fraction * self.total_mib

    def why_busy(self, min_free_fraction: float) -> str:
        if self.processes:
            return f"{self.index} ({self.processes} compute process{'es' if self.processes > 1 else ''})"
        return f"{self.index} ({self.free_mib:.0f} of {self.total_mib:.0f} MiB free)"


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def load_nvml():
    """(pynvml initialised, "") or (None, why not)."""
    try:
        import pynvml
    except ImportError:
        return None, "pynvml is not installed"
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # no driver, or refused in this container
        return None, f"NVML: {exc}"
    return pynvml, ""


def load_amdsmi():
    """(amdsmi initialised, "") or (None, why not). Unverified: no AMD GPU was at hand."""
    try:
        import amdsmi
    except ImportError:
        return None, "amdsmi is not installed"
    try:
        amdsmi.amdsmi_init()
        if not amdsmi.amdsmi_get_processor_handles():
            return None, "amdsmi: no AMD GPU"
    except Exception as exc:
        return None, f"amdsmi: {exc}"
    return amdsmi, ""


def nvml_states(nvml) -> list[GpuState]:
    states = []
    for i in range(nvml.nvmlDeviceGetCount()):
        h = nvml.nvmlDeviceGetHandleByIndex(i)
        mem = nvml.nvmlDeviceGetMemoryInfo(h)
        procs = nvml.nvmlDeviceGetComputeRunningProcesses(h)
        states.append(GpuState(i, mem.total / 2**20, mem.free / 2**20, len(procs), _text(nvml.nvmlDeviceGetUUID(h))))
    return states


def amdsmi_states(amdsmi) -> list[GpuState]:
    states = []
    for i, h in enumerate(amdsmi.amdsmi_get_processor_handles()):
        vram = amdsmi.amdsmi_get_gpu_vram_usage(h)  # MB
        procs = amdsmi.amdsmi_get_gpu_process_list(h)
        states.append(GpuState(i, float(vram["vram_total"]), float(vram["vram_total"] - vram["vram_used"]), len(procs)))
    return states


SMI_GPU_QUERY = ["--query-gpu=index,uuid,memory.total,memory.free", "--format=csv,noheader,nounits"]
SMI_APPS_QUERY = ["--query-compute-apps=gpu_uuid,pid,used_memory", "--format=csv,noheader,nounits"]


def parse_smi(gpu_csv: str, apps_csv: str) -> list[GpuState]:
    """nvidia-smi's CSV answers (noheader, nounits) to the two queries above, as states."""
    states = []
    for line in gpu_csv.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 4 or not parts[0].isdigit():
            continue
        try:
            states.append(GpuState(int(parts[0]), float(parts[2]), float(parts[3]), 0, parts[1]))
        except ValueError:  # "[N/A]"
            continue
    by_uuid = {s.uuid: s for s in states}
    for line in apps_csv.strip().splitlines():
        uuid = line.split(",")[0].strip()
        if uuid in by_uuid:
            by_uuid[uuid].processes += 1
    return states


def smi_states(run=subprocess.run) -> list[GpuState] | None:
    smi = shutil.which("nvidia-smi")
    if not smi:
        return None
    try:
        gpus = run([smi, *SMI_GPU_QUERY], capture_output=True, text=True, timeout=30)
        apps = run([smi, *SMI_APPS_QUERY], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if gpus.returncode != 0 or apps.returncode != 0:
        return None
    return parse_smi(gpus.stdout, apps.stdout)


def _ask(load, read, shutdown: str, label: str, reasons: list[str]):
    """`read(module)` of the module `load()` initialises, shut down after; None (the reason kept) on failure."""
    module, why = load()
    if module is None:
        reasons.append(why)
        return None
    try:
        return read(module)
    except Exception as exc:
        reasons.append(f"{label}: {exc}")
        return None
    finally:
        getattr(module, shutdown)()


def gpu_states() -> tuple[list[GpuState], str, str]:
    """(states, source, reason): NVML, else nvidia-smi, else amdsmi; ([], "", why) without a GPU."""
    reasons: list[str] = []
    states = _ask(load_nvml, nvml_states, "nvmlShutdown", "NVML", reasons)
    if states:
        return states, "nvml", ""
    states = smi_states()
    if states:
        return states, "nvidia-smi", ""
    reasons.append("no nvidia-smi" if not shutil.which("nvidia-smi") else "nvidia-smi lists no GPU")
    states = _ask(load_amdsmi, amdsmi_states, "amdsmi_shut_down", "amdsmi", reasons)
    if states:
        return states, "amdsmi", ""
    return [], "", "no GPU found (" + "; ".join(reasons) + ")"


def select_idle(states: list[GpuState], count: int, min_free_fraction: float = 0.9) -> list[int]:
    """The first `count` idle GPUs' indices; `GpuError` (one line) when fewer are idle."""
    idle = [s.index for s in states if s.idle(min_free_fraction)]
    if len(idle) < count:
        busy = ", ".join(s.why_busy(min_free_fraction) for s in states if not s.idle(min_free_fraction))
        raise GpuError(
            f"{count} idle GPU{'s' if count > 1 else ''} needed (TP {count}), {len(idle)} of "
            f"{len(states)} idle; busy: {busy or 'none'}; pin GPUs with --gpus or gpu_selection"
        )
    return idle[:count]


def parse_devices(value: str) -> list[int | str]:
    """A *_VISIBLE_DEVICES value as a list (indices as ints, UUIDs as they are)."""
    return [int(v) if v.strip().isdigit() else v.strip() for v in value.split(",") if v.strip()]


def allocate(
    env: dict[str, str], tp: int, environ=os.environ, states=None, min_free_fraction: float = 0.9
) -> tuple[dict[str, str], dict]:
    """The server's GPUs: (variables to set for it, the allocation for the report). Pinned (a *_VISIBLE_DEVICES
    variable in the run's env or this process's) is kept; else idle GPUs are picked; none without a GPU."""
    for name in PIN_VARIABLES:
        value = env.get(name, environ.get(name))
        if value is not None:
            devices = parse_devices(value)
            if len(devices) < tp:
                raise GpuError(f"TP {tp} needs {tp} GPUs, but {name}={value} pins {len(devices)}")
            return {}, {"mode": "pinned", "variable": name, "devices": devices}
    found, source, reason = (states or gpu_states)()
    if not found:
        return {}, {"mode": "none", "devices": [], "reason": reason}
    chosen = select_idle(found, tp, min_free_fraction)
    value = ",".join(map(str, chosen))
    if source == "amdsmi":
        updates = {"HIP_VISIBLE_DEVICES": value}
    else:
        updates = {"CUDA_VISIBLE_DEVICES": value, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    by_index = {s.index: s for s in found}
    return updates, {
        "mode": "auto",
        "source": source,
        "devices": chosen,
        "min_free_fraction": min_free_fraction,
        "uuids": [by_index[i].uuid for i in chosen if by_index[i].uuid],
        "idle": sum(s.idle(min_free_fraction) for s in found),
        "total": len(found),
    }


class NvmlSampler:
    """One reading of each device through an initialised NVML module (pynvml or a stand-in)."""

    source = "nvml"

    def __init__(self, nvml, indices: list[int] | None = None) -> None:
        self.nvml = nvml
        self.indices = list(range(nvml.nvmlDeviceGetCount())) if indices is None else list(indices)
        self.handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in self.indices]

    def sample(self) -> list[dict[str, float]]:
        n = self.nvml
        out = []
        for h in self.handles:
            out.append(
                {
                    "sm_clock_mhz": n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM),
                    "mem_clock_mhz": n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_MEM),
                    "power_w": n.nvmlDeviceGetPowerUsage(h) / 1000,
                    "temperature_c": n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU),
                    "memory_used_mib": n.nvmlDeviceGetMemoryInfo(h).used / 2**20,
                }
            )
        return out

    def close(self) -> None:
        self.nvml.nvmlShutdown()


class AmdSmiSampler:
    """The same readings through amdsmi (unverified: written to its documented API, no AMD GPU was at hand);
    a reading it refuses is left out."""

    source = "amdsmi"

    def __init__(self, amdsmi, indices: list[int] | None = None) -> None:
        self.amdsmi = amdsmi
        handles = amdsmi.amdsmi_get_processor_handles()
        self.indices = list(range(len(handles))) if indices is None else list(indices)
        self.handles = [handles[i] for i in self.indices]

    def sample(self) -> list[dict[str, float]]:
        a = self.amdsmi
        readers = {
            "sm_clock_mhz": lambda h: a.amdsmi_get_clock_info(h, a.AmdSmiClkType.GFX)["clk"],
            "mem_clock_mhz": lambda h: a.amdsmi_get_clock_info(h, a.AmdSmiClkType.MEM)["clk"],
            "power_w": lambda h: a.amdsmi_get_power_info(h)["average_socket_power"],
            "temperature_c": lambda h: a.amdsmi_get_temp_metric(
                h, a.AmdSmiTemperatureType.EDGE, a.AmdSmiTemperatureMetric.CURRENT
            ),
            "memory_used_mib": lambda h: a.amdsmi_get_gpu_vram_usage(h)["vram_used"],
        }
        out = []
        for h in self.handles:
            reading = {}
            for name, read in readers.items():
                try:
                    reading[name] = float(read(h))
                except Exception:
                    pass
            out.append(reading)
        return out

    def close(self) -> None:
        self.amdsmi.amdsmi_shut_down()


def open_sampler(indices: list[int] | None = None):
    """(sampler, "") for the devices `indices` (None: all), or (None, why there is none). The sampler keeps
    its module initialised until `close()`."""
    reasons = []
    for load, sampler, shutdown, label in (
        (load_nvml, NvmlSampler, "nvmlShutdown", "NVML"),
        (load_amdsmi, AmdSmiSampler, "amdsmi_shut_down", "amdsmi"),
    ):
        module, why = load()
        if module is None:
            reasons.append(why)
            continue
        try:
            return sampler(module, indices), ""
        except Exception as exc:
            getattr(module, shutdown)()
            reasons.append(f"{label}: {exc}")
    return None, f"no GPU to monitor ({'; '.join(reasons)})"


def _stats(values: list[float]) -> dict[str, float]:
    return {"min": min(values), "max": max(values), "avg": sum(values) / len(values)}


class GpuMonitor:
    """Samples `sampler` every `interval_s` in a daemon thread between `start()` and `stop()` (or as a context
    manager): the first reading at the start, one at the stop."""

    def __init__(self, sampler, interval_s: float = 1.0, clock=time.monotonic) -> None:
        if interval_s <= 0:
            raise ValueError("the monitor's interval must be positive")
        self.sampler = sampler
        self.interval_s = interval_s
        self.clock = clock
        self.readings: list[list[dict[str, float]]] = []
        self.failures = 0
        self.first_error = ""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def _take(self) -> None:
        try:
            reading = self.sampler.sample()
        except Exception as exc:
            self.failures += 1
            self.first_error = self.first_error or f"{type(exc).__name__}: {exc}"
            return
        with self._lock:
            self.readings.append(reading)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._take()

    def start(self) -> GpuMonitor:
        self._take()
        self._started = self.clock()
        self._thread = threading.Thread(target=self._loop, name="magpie-gpu-monitor", daemon=True)
        self._thread.start()
        return self

    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def stop(self) -> dict:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
            self._take()
            self.duration_s = self.clock() - self._started
        try:
            self.sampler.close()
        except Exception:
            pass
        return self.summary()

    def __enter__(self) -> GpuMonitor:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def summary(self) -> dict:
        """`{metric: {min, max, avg}}` over every device and sample, per device too, with the counts."""
        with self._lock:
            readings = list(self.readings)
        indices = list(getattr(self.sampler, "indices", range(len(readings[0]) if readings else 0)))
        out: dict = {
            "source": self.sampler.source,
            "interval_s": self.interval_s,
            "samples": len(readings),
            "failed_samples": self.failures,
            "devices": indices,
            "duration_s": getattr(self, "duration_s", None),
        }
        if self.first_error:
            out["first_error"] = self.first_error
        per_device: dict[str, dict] = {}
        for metric in METRICS:
            pooled = []
            for pos, index in enumerate(indices):
                values = [r[pos][metric] for r in readings if pos < len(r) and metric in r[pos]]
                if values:
                    per_device.setdefault(str(index), {})[metric] = _stats(values)
                    pooled += values
            if pooled:
                out[metric] = _stats(pooled)
        out["per_device"] = per_device
        return out


def pin_env(ids: str) -> dict[str, str]:
    """`--gpus 0,1` as the variables that pin them; `UserError` unless indices joined by commas."""
    parts = [p.strip() for p in ids.split(",")]
    if not parts or not all(p.isdigit() for p in parts):
        from magpie.errors import UserError

        raise UserError(f"--gpus: expected device indices joined by commas (e.g. 0,1), got {ids!r}")
    value = ",".join(parts)
    return {"CUDA_VISIBLE_DEVICES": value, "HIP_VISIBLE_DEVICES": value}
