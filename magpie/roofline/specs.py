"""Published peak rates and memory bandwidth per accelerator, and measured overrides.

Peaks are dense (no structured sparsity), in TFLOP/s (TOP/s for int8), bandwidth in TB/s.
They are leads from vendors' datasheets, cited per entry; `magpie calibrate` measures the
current device's real ceilings, and measured values win wherever they exist.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, replace
from pathlib import Path


@dataclass(frozen=True)
class Arch:
    name: str
    vendor: str
    arch: str
    memory_tbps: float
    peak_tflops: dict[str, float]
    source: str
    aliases: tuple[str, ...] = ()
    measured: dict = field(default_factory=dict)

    def peak(self, precision: str) -> float | None:
        return self.peak_tflops.get(precision)


ARCHES = [
    Arch(
        "H100",
        "NVIDIA",
        "sm_90",
        3.35,
        {
            "fp64": 34,
            "fp64_tensor": 67,
            "fp32": 67,
            "tf32_tensor": 494.7,
            "bf16_tensor": 989.4,
            "fp16_tensor": 989.4,
            "fp8_tensor": 1978.9,
            "int8_tensor": 1978.9,
        },
        "NVIDIA H100 Tensor Core GPU datasheet, SXM5 column (sparse figures halved)",
        ("H100 80GB HBM3", "H100 SXM"),
    ),
    Arch(
        "H200",
        "NVIDIA",
        "sm_90",
        4.8,
        {
            "fp64": 34,
            "fp64_tensor": 67,
            "fp32": 67,
            "tf32_tensor": 494.7,
            "bf16_tensor": 989.4,
            "fp16_tensor": 989.4,
            "fp8_tensor": 1978.9,
            "int8_tensor": 1978.9,
        },
        "NVIDIA H200 Tensor Core GPU datasheet, SXM column (sparse figures halved)",
        ("NVIDIA H200",),
    ),
    Arch(
        "B200",
        "NVIDIA",
        "sm_100",
        8.0,
        {
            "fp64": 37,
            "fp64_tensor": 37,
            "tf32_tensor": 1100,
            "bf16_tensor": 2250,
            "fp16_tensor": 2250,
            "fp8_tensor": 4500,
            "int8_tensor": 4500,
        },
        "NVIDIA HGX B200 datasheet, per-GPU figures (sparse figures halved); fp32 non-tensor not listed there",
        ("NVIDIA B200",),
    ),
    Arch(
        "A100",
        "NVIDIA",
        "sm_80",
        2.039,
        {
            "fp64": 9.7,
            "fp64_tensor": 19.5,
            "fp32": 19.5,
            "tf32_tensor": 156,
            "bf16_tensor": 312,
            "fp16_tensor": 312,
            "int8_tensor": 624,
        },
        "NVIDIA A100 Tensor Core GPU datasheet, 80GB SXM column (sparse figures halved)",
        ("A100-SXM4-80GB", "A100 80GB"),
    ),
    Arch(
        "MI300X",
        "AMD",
        "gfx942",
        5.3,
        {
            "fp64": 81.7,
            "fp64_tensor": 163.4,
            "fp32": 163.4,
            "tf32_tensor": 653.7,
            "bf16_tensor": 1307.4,
            "fp16_tensor": 1307.4,
            "fp8_tensor": 2614.9,
            "int8_tensor": 2614.9,
        },
        "AMD Instinct MI300X data sheet (dense matrix figures)",
        ("AMD Instinct MI300X",),
    ),
    Arch(
        "MI325X",
        "AMD",
        "gfx942",
        6.0,
        {
            "fp64": 81.7,
            "fp64_tensor": 163.4,
            "fp32": 163.4,
            "tf32_tensor": 653.7,
            "bf16_tensor": 1307.4,
            "fp16_tensor": 1307.4,
            "fp8_tensor": 2614.9,
            "int8_tensor": 2614.9,
        },
        "AMD Instinct MI325X data sheet (dense matrix figures)",
        ("AMD Instinct MI325X",),
    ),
    Arch(
        "MI355X",
        "AMD",
        "gfx950",
        8.0,
        {
            "fp64": 78.6,
            "fp64_tensor": 78.6,
            "fp32": 157.3,
            "bf16_tensor": 2516.6,
            "fp16_tensor": 2516.6,
            "fp8_tensor": 5033.2,
            "int8_tensor": 5033.2,
        },
        "AMD Instinct MI355X data sheet (dense matrix figures)",
        ("AMD Instinct MI355X",),
    ),
]


def lookup(device_name: str) -> Arch | None:
    """The table entry for a device name as drivers report it ('NVIDIA H200', 'AMD Instinct MI300X')."""
    lowered = device_name.lower()
    for arch in sorted(ARCHES, key=lambda a: -len(a.name)):
        if arch.name.lower() in lowered or any(alias.lower() == lowered for alias in arch.aliases):
            return with_calibration(arch)
    return None


def calibration_path(device_name: str) -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "magpie" / "calibration"
    return base / (device_name.replace(" ", "_").replace("/", "_") + ".json")


def with_calibration(arch: Arch) -> Arch:
    """Measured ceilings (from `magpie calibrate`) replace the published ones they cover."""
    for name in (arch.name, *arch.aliases):
        path = calibration_path(name)
        if path.is_file():
            data = json.loads(path.read_text())
            peaks = {**arch.peak_tflops, **data.get("peak_tflops", {})}
            return replace(
                arch, memory_tbps=data.get("memory_tbps", arch.memory_tbps), peak_tflops=peaks, measured=data
            )
    return arch


def detect_current() -> Arch | None:
    """The entry for the GPU torch sees, if any (call only where torch is already imported)."""
    import torch

    if not torch.cuda.is_available():
        return None
    return lookup(torch.cuda.get_device_name())
