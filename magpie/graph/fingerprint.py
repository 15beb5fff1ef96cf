"""Toolchain and device facts that key artifacts, computed lazily and cheaply.

None of these imports torch or triton: versions come from package metadata and
compilers are identified by path and file stat, not by running them.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
import sys
from functools import cache
from importlib import metadata
from pathlib import Path


def _package_version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "absent"


def _tool(name: str) -> str:
    path = shutil.which(name)
    if not path:
        return "absent"
    st = os.stat(path)
    return f"{os.path.realpath(path)}:{st.st_size}:{st.st_mtime_ns}"


@cache
def cpu_model() -> str:
    from magpie.linux.procfs import cpu_model_name

    return cpu_model_name() or platform.processor() or platform.machine()


@cache
def nvidia_gpus() -> tuple[dict, ...]:
    """NVIDIA GPUs as nvidia-smi lists them, asked once per process (keys and --gpu-info alike)."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return ()
    fields = "name,memory.total,driver_version,compute_cap,clocks.max.sm"
    try:
        out = subprocess.run(
            [smi, f"--query-gpu={fields}", "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=30
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ()
    return tuple(parse_nvidia_smi(out))


def parse_nvidia_smi(out: str) -> list[dict]:
    gpus = []
    for line in out.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 5:
            continue
        name, mem, driver, cap, clock = parts
        gpus.append(
            {
                "vendor": "NVIDIA",
                "name": name,
                "memory_mib": int(float(mem)),
                "driver": driver,
                "architecture": "sm_" + cap.replace(".", ""),
                "max_sm_clock_mhz": clock,
            }
        )
    return gpus


def gpu_description() -> tuple[str, str] | None:
    """(name, sm_XY) of the first NVIDIA GPU; None without one."""
    gpus = nvidia_gpus()
    return (gpus[0]["name"], gpus[0]["architecture"]) if gpus else None


def _device(device: str) -> str:
    if device == "cpu":
        return f"cpu:{cpu_model()}:{os.cpu_count()}"
    gpu = gpu_description()
    return f"{device}:{gpu[0]}:{gpu[1]}" if gpu else f"{device}:unknown"


def _harness() -> str:
    """Hash of the code that produces verdicts and timings: changing it invalidates them."""
    root = Path(__file__).resolve().parent.parent
    digest = hashlib.sha256()
    for sub in ("harness", "compare"):
        for path in sorted((root / sub).glob("*.py")):
            digest.update(path.name.encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


_FACTS = {
    "python": lambda device: f"{sys.version.split()[0]}:{platform.machine()}",
    "torch": lambda device: _package_version("torch"),
    "triton": lambda device: _package_version("triton"),
    "nvcc": lambda device: _tool("nvcc"),
    "hipcc": lambda device: _tool("hipcc"),
    "ncu": lambda device: _tool("ncu"),
    "rocprofv3": lambda device: _tool("rocprofv3"),
    "device": _device,
    "harness": lambda device: _harness(),
}


@cache
def fingerprint(name: str, device: str) -> str:
    return _FACTS[name](device)
