"""magpie --gpu-info: what accelerators, compilers and profilers this machine has."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from importlib import metadata

from magpie.graph.fingerprint import cpu_model, nvidia_gpus


def _version_line(tool: str, flag: str = "--version") -> str | None:
    path = shutil.which(tool)
    if not path:
        return None
    try:
        out = subprocess.run([path, flag], capture_output=True, text=True, timeout=20).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return path
    return (out.splitlines() or [path])[-1]


def _package(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _torch_devices() -> list[dict]:
    """Device properties through torch (CUDA or ROCm builds), when a GPU is visible."""
    try:
        import torch
    except ImportError:
        return []
    if not torch.cuda.is_available():
        return []
    out = []
    for index in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(index)
        arch = props.gcnArchName if torch.version.hip else f"sm_{props.major}{props.minor}"
        out.append(
            {
                "name": props.name,
                "architecture": arch.split(":")[0],
                "sm_count": props.multi_processor_count,
                "memory_mib": props.total_memory // 2**20,
                "l2_bytes": getattr(props, "L2_cache_size", None),
                "runtime": f"hip {torch.version.hip}" if torch.version.hip else f"cuda {torch.version.cuda}",
            }
        )
    return out


def collect() -> dict:
    gpus = [dict(gpu) for gpu in nvidia_gpus()]  # the query is cached: fill copies
    for gpu, detail in zip(gpus, _torch_devices()) if gpus else ():
        gpu.update({k: v for k, v in detail.items() if v is not None and k != "name"})
    if not gpus:
        gpus = [{"vendor": "AMD" if "hip" in d["runtime"] else "NVIDIA", **d} for d in _torch_devices()]
    return {
        "gpus": gpus,
        "cpu": {"model": cpu_model(), "cores": os.cpu_count()},
        "compilers": {"nvcc": _version_line("nvcc"), "hipcc": _version_line("hipcc")},
        "profilers": {"ncu": _version_line("ncu"), "rocprofv3": _version_line("rocprofv3")},
        "packages": {name: _package(name) for name in ("torch", "triton", "hip-python", "nvidia-ml-py")},
    }


def gpu_label(gpu: dict) -> str:
    """Vendor and name, the vendor once: nvidia-smi's and torch's names carry it already
    ("NVIDIA H200", "AMD Instinct MI300X"), a bare name ("H200") gets it in front."""
    name, vendor = gpu.get("name") or "unknown GPU", gpu.get("vendor") or ""
    return name if not vendor or name.lower().startswith(vendor.lower()) else f"{vendor} {name}"


def run(args) -> int:
    info = collect()
    if args.json:
        print(json.dumps(info, indent=1))
        return 0
    if info["gpus"]:
        for i, gpu in enumerate(info["gpus"]):
            extra = ", ".join(
                f"{k} {gpu[k]}" for k in ("sm_count", "l2_bytes", "max_sm_clock_mhz", "runtime") if gpu.get(k)
            )
            print(
                f"GPU {i}: {gpu_label(gpu)} ({gpu['architecture']}), {gpu['memory_mib']} MiB, "
                f"driver {gpu.get('driver', '?')}{', ' + extra if extra else ''}"
            )
    else:
        print("GPU: none found (no nvidia-smi or rocm-smi device); kernels run on the CPU default")
    print(f"CPU: {info['cpu']['model']}, {info['cpu']['cores']} cores")
    for group in ("compilers", "profilers", "packages"):
        items = ", ".join(f"{k} {v}" if v else f"{k} not found" for k, v in info[group].items())
        print(f"{group}: {items}")
    return 0
