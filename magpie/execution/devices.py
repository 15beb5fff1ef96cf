"""Which device each job of a build runs on: every visible GPU by default, devices as data.

A measurement (timing, profile, a serving benchmark) holds one device alone: no other
measurement is placed on it until it ends, and inside the job `device_lock.exclusive` keeps
the checks sharing that device out of its measured phases. Checks (correctness) share a
device: each goes where the fewest jobs are. Every measurement of one kernel runs on one
device model (a candidate's timing times its baseline beside it, in the same job, so a
comparison never mixes models); a build spanning models says so in one line.

Nothing here imports torch or asks NVML: devices are found through `nvidia-smi` (or given),
so the placement is the same code on a laptop, the CPU machine and a host of 8 GPUs. The
CPU is one device, index None.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
from dataclasses import dataclass, replace

from magpie.errors import UserError

# Rules whose job measures: it holds its device alone.
MEASURING_RULES = frozenset({"timing", "profile"})
# Rules whose job uses the device beside others (checking). Serving benchmarks pick their
# GPUs themselves (serving/gpus.py) and are not placed here.
SHARING_RULES = frozenset({"correctness"})
PLACED_RULES = MEASURING_RULES | SHARING_RULES


@dataclass(frozen=True)
class Device:
    """One device a job may be placed on. `index`: CUDA's (in the visible numbering); None for the CPU."""

    index: int | None
    name: str
    uuid: str | None = None

    @property
    def torch_name(self) -> str:
        return "cpu" if self.index is None else f"cuda:{self.index}"

    def record(self) -> dict:
        """What a result records of the device it came from."""
        return {"index": self.index, "name": self.name, "uuid": self.uuid}


CPU = Device(None, "cpu")


def parse_devices(text: str, source: str = "--devices") -> list[int]:
    """`0,1` -> [0, 1]; anything else is one line naming the source."""
    try:
        indices = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        indices = []
    if not indices or any(i < 0 for i in indices) or len(set(indices)) != len(indices):
        raise UserError(f"{source}: {text!r} is not a list of distinct GPU indices such as 0,1")
    return indices


def visible_gpus() -> list[Device]:
    """The GPUs this process may use, as nvidia-smi lists them, in CUDA's visible numbering
    (CUDA_VISIBLE_DEVICES given as indices or UUIDs picks and orders them); [] without any."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return []
    try:
        out = subprocess.run(
            [smi, "--query-gpu=index,name,uuid", "--format=csv,noheader"], capture_output=True, text=True, timeout=30
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    return gpus_from_listing(out, os.environ.get("CUDA_VISIBLE_DEVICES"))


def gpus_from_listing(listing: str, visible: str | None) -> list[Device]:
    """nvidia-smi's `index, name, uuid` lines as the devices CUDA numbers 0.. under `visible`."""
    rows = []
    for line in listing.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 3 and parts[0].isdigit():
            rows.append((parts[0], parts[1], parts[2]))
    if visible is not None:
        wanted = [v.strip() for v in visible.split(",") if v.strip()]
        by_key = {key: row for row in rows for key in (row[0], row[2])}
        picked = []
        for want in wanted:
            row = by_key.get(want)
            if row is None:  # CUDA stops at the first entry it cannot use
                break
            picked.append(row)
        rows = picked
    return [Device(position, name, uuid) for position, (_, name, uuid) in enumerate(rows)]


def build_devices(project_device: str, asked: list[int] | None, found: list[Device] | None = None) -> list[Device]:
    """The devices a build places its jobs on: the CPU for a CPU project; for `cuda:N` that
    GPU; for `cuda` the ones asked for (--devices, else [project] devices), else every visible GPU."""
    if project_device == "cpu":
        return [CPU]
    gpus = visible_gpus() if found is None else found
    by_index = {gpu.index: gpu for gpu in gpus}
    if project_device.startswith("cuda:"):
        asked = [int(project_device.split(":", 1)[1])]
    if asked is None:
        return gpus or [Device(0, "unknown GPU")]  # none listed (no nvidia-smi): CUDA's default device
    missing = [i for i in asked if i not in by_index]
    if missing and gpus:
        raise UserError(
            f"--devices: GPU {', '.join(map(str, missing))} not visible (visible: "
            f"{', '.join(str(g.index) for g in gpus)}); pick among them"
        )
    return [by_index.get(i, Device(i, "unknown GPU")) for i in asked]


def models_line(devices: list[Device]) -> str | None:
    """One line where the devices span models (each comparison stays on one); None otherwise."""
    models: dict[str, list[str]] = {}
    for device in devices:
        models.setdefault(device.name, []).append(str(device.index))
    if len(models) < 2:
        return None
    spans = "; ".join(f"{name} ({', '.join(indices)})" for name, indices in models.items())
    return f"magpie: the devices span {len(models)} models: {spans}; each kernel's timings stay on one model"


def device_of(spec) -> str | None:
    """The device a task's settings name; None for a task that names none (compile, report)."""
    return spec.params.get("settings", {}).get("project", {}).get("device")


def placed_on(spec, device: Device):
    """The task's spec with its settings naming `device` (a copy: the shared settings untouched)."""
    settings = spec.params["settings"]
    project = {**settings["project"], "device": device.torch_name}
    return replace(spec, params={**spec.params, "settings": {**settings, "project": project}})


class Placement:
    """Hands out devices to jobs, thread-safe: `take(rule, kernel)` waits for a device and
    returns it, `give_back(device, rule)` ends the job's hold. A measuring rule's job gets a
    device no other measurement holds, of the model its kernel's first measurement got; any
    other job the device holding the fewest jobs (ties: the lowest index). Without
    `measurements_alone`, measurements only keep to their kernel's model (the CPU: see make_executor)."""

    def __init__(self, devices: list[Device], measurements_alone: bool = True):
        if not devices:
            raise ValueError("no devices to place jobs on")
        self.devices = list(devices)
        self.measurements_alone = measurements_alone
        self._jobs = {device: 0 for device in self.devices}
        self._measuring: set[Device] = set()
        self._kernel_model: dict[str, str] = {}
        self._changed = threading.Condition()

    def take(self, rule: str, kernel: str | None) -> Device:
        with self._changed:
            while True:
                device = self._pick(rule, kernel)
                if device is not None:
                    break
                self._changed.wait()
            self._jobs[device] += 1
            if rule in MEASURING_RULES:
                self._measuring.add(device)
                if kernel is not None:
                    self._kernel_model.setdefault(kernel, device.name)
            return device

    def give_back(self, device: Device, rule: str) -> None:
        with self._changed:
            self._jobs[device] -= 1
            if rule in MEASURING_RULES:
                self._measuring.discard(device)
            self._changed.notify_all()

    def _pick(self, rule: str, kernel: str | None) -> Device | None:
        candidates = self.devices
        if rule in MEASURING_RULES:
            model = self._kernel_model.get(kernel) if kernel is not None else None
            candidates = [
                d
                for d in candidates
                if (d not in self._measuring or not self.measurements_alone) and (model is None or d.name == model)
            ]
        if not candidates:
            return None
        return min(candidates, key=lambda d: (self._jobs[d], self.devices.index(d)))
