"""Nsight Compute counters: the metrics we ask for, the launch cap, and a parser for `--csv --page raw`.

The raw page is one header row of metric names, one row of units (its ID cell empty),
then a row per profiled kernel. Numbers may carry thousands separators; 'n/a' is missing.
A run that profiled nothing prints no such rows, only `No kernels were profiled.`
"""

from __future__ import annotations

import csv
import io

from magpie.roofline.model import roofline
from magpie.roofline.specs import Arch

# What the report uses, and only that: a kernel's duration, the DRAM bytes it moved and the
# FLOPs it executed per precision (its place on the roofline). The speed-of-light throughputs
# asked for before were shown nowhere and cost replay passes of their own.
DURATION = "gpu__time_duration.sum"
DRAM_READ = "dram__bytes_read.sum"
DRAM_WRITE = "dram__bytes_write.sum"
# FLOPs per precision from executed thread instructions: an FMA counts two operations.
NON_TENSOR = {
    "fp64": ("dadd", "dmul", "dfma"),
    "fp32": ("fadd", "fmul", "ffma"),
    "fp16": ("hadd", "hmul", "hfma"),
}
# Tensor-core math operations per source type, as Hopper names them: warpgroup (hgmma,
# igmma) and warp-level (hmma, imma) paths are counted apart and added.
TENSOR = {
    "bf16_tensor": (
        "sm__ops_path_tensor_op_hgmma_src_bf16_dst_fp32.sum",
        "sm__ops_path_tensor_op_hmma_src_bf16_dst_fp32.sum",
    ),
    "fp16_tensor": ("sm__ops_path_tensor_op_hgmma_src_fp16.sum", "sm__ops_path_tensor_op_hmma_src_fp16.sum"),
    "tf32_tensor": (
        "sm__ops_path_tensor_op_hgmma_src_tf32_dst_fp32.sum",
        "sm__ops_path_tensor_op_hmma_src_tf32_dst_fp32.sum",
    ),
    "fp8_tensor": ("sm__ops_path_tensor_src_fp8.sum",),
    "int8_tensor": ("sm__ops_path_tensor_op_igmma_src_int8.sum", "sm__ops_path_tensor_op_imma_src_int8.sum"),
}
BASIC = (DURATION, DRAM_READ, DRAM_WRITE)


def _inst(op: str) -> str:
    return f"smsp__sass_thread_inst_executed_op_{op}_pred_on.sum"


def metrics(available: set[str] | None = None) -> list[str]:
    names = [
        *BASIC,
        *(_inst(op) for ops in NON_TENSOR.values() for op in ops),
        *(n for ns in TENSOR.values() for n in ns),
    ]
    return [n for n in names if available is None or n in available]


# How ncu caps what it profiles. Nsight Compute's `--kernel-id` counts invocations per kernel
# name, grid, block and shared-memory size (context and stream left out when not given), and its
# invocation field takes a regular expression matched against the whole number: `:::^(1|2|3)$`
# profiles the first three launches of each distinct kernel, and `--launch-count` then caps the
# profiled launches in all. Versions whose `--kernel-id` takes no regex, or a run in which that
# filter profiled nothing although the implementation's timing saw kernels (its launches before
# the profiled range counted too), fall back to `--filter-mode per-launch-config --launch-count N`:
# the first N launches of each launch configuration, which counts only launches it profiled,
# but with no cap in all (launch-count is per configuration in that mode).
KERNEL_ID = "kernel-id"
PER_LAUNCH_CONFIG = "per-launch-config"


def invocations(n: int) -> str:
    """A regular expression for invocation numbers 1 to n, whole."""
    return "^(" + "|".join(str(i) for i in range(1, n + 1)) + ")$"


def cap_options(per_kernel: int, total: int, mode: str = KERNEL_ID) -> list[str]:
    if mode == KERNEL_ID:
        return ["--kernel-id", f":::{invocations(per_kernel)}", "--launch-count", str(total)]
    if mode == PER_LAUNCH_CONFIG:
        return ["--filter-mode", PER_LAUNCH_CONFIG, "--launch-count", str(per_kernel)]
    raise ValueError(f"unknown launch cap mode {mode!r}")


def ncu_command(
    metric_set: list[str], per_kernel: int, total: int, mode: str = KERNEL_ID, nvtx_range: str | None = None
) -> list[str]:
    """ncu's arguments before the profiled command. With an NVTX range, only kernels inside it
    (and after cudaProfilerStart, which the profiled process calls at the range): the warm-up
    call before it, and its launches, are not profiled. ncu waits for every process it follows:
    an implementation's process (the one with the range) is followed alone, so that a process
    its code left (a double fork, a new session) cannot hold ncu, and the device, until the
    profile's timeout; a command's kernels run in the processes it starts, all followed."""
    processes = "application-only" if nvtx_range else "all"
    argv = [
        "ncu",
        "--csv",
        "--page",
        "raw",
        "--clock-control",
        "none",
        "--target-processes",
        processes,
        *cap_options(per_kernel, total, mode),
        "--metrics",
        ",".join(metric_set),
    ]
    if nvtx_range:
        argv += ["--profile-from-start", "off", "--nvtx", "--nvtx-include", f"{nvtx_range}/"]
    return argv


NOTHING_PROFILED = "no kernels were profiled"


def profiled_nothing(stdout: str, stderr: str) -> bool:
    """ncu ran and profiled no kernel (`==PROF== No kernels were profiled.` or its warning
    form): the range launched none, e.g. x.clone(), a memory copy. Not a parse failure."""
    return NOTHING_PROFILED in (stdout + "\n" + stderr).lower() and '"ID"' not in stdout


class NcuParseError(ValueError):
    pass


def _number(text: str) -> float | None:
    text = (text or "").strip().replace(",", "")
    if not text or text.lower() in ("n/a", "nan", "-"):
        return None
    try:
        return float(text)
    except ValueError:
        return None


# Base units: bytes and nanoseconds. ncu writes 'ns' and 'byte' by default and scaled units
# ('usecond', 'Mbyte') when asked to; counts ('inst') and percentages pass through.
_SCALE = {
    "byte": 1,
    "kbyte": 1e3,
    "mbyte": 1e6,
    "gbyte": 1e9,
    "ns": 1,
    "nsecond": 1,
    "us": 1e3,
    "usecond": 1e3,
    "ms": 1e6,
    "msecond": 1e6,
    "s": 1e9,
    "second": 1e9,
}


def parse_raw_csv(text: str) -> list[dict]:
    """One dict per kernel: name, metric values in base units (bytes, ns), and ids."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if start is None:
        raise NcuParseError("no '\"ID\",...' header row: not the output of ncu --csv --page raw")
    rows = list(csv.reader(io.StringIO("\n".join(lines[start:]))))
    header = rows[0]
    units = rows[1] if len(rows) > 1 and rows[1] and rows[1][0] == "" else [""] * len(header)
    body = rows[2:] if units is rows[1] else rows[1:]
    kernels = []
    for row in body:
        if len(row) != len(header):
            continue
        record = dict(zip(header, row))
        values = {}
        for column, unit, cell in zip(header, units, row):
            if "__" in column:
                number = _number(cell)
                if number is not None:
                    values[column] = number * _SCALE.get(unit.strip().lower(), 1)
        kernels.append(
            {
                "id": record.get("ID"),
                "name": record.get("Kernel Name", ""),
                "grid": record.get("Grid Size"),
                "block": record.get("Block Size"),
                "metrics": values,
            }
        )
    return kernels


def kernel_roofline(kernel: dict, arch: Arch | None) -> dict:
    m = kernel["metrics"]
    flops = {
        p: sum(m.get(_inst(op), 0.0) * (2 if op.endswith("fma") else 1) for op in ops) for p, ops in NON_TENSOR.items()
    }
    flops.update({p: sum(m.get(n, 0.0) for n in names) for p, names in TENSOR.items() if any(m.get(n) for n in names)})
    total_flops = sum(flops.values())
    bytes_moved = m.get(DRAM_READ, 0.0) + m.get(DRAM_WRITE, 0.0)
    seconds = m.get(DURATION, 0.0) / 1e9
    precision = max(flops, key=lambda p: flops[p]) if total_flops else "fp32"
    out = {
        "name": kernel["name"],
        "duration_us": seconds * 1e6,
        "dram_bytes": bytes_moved,
        "flops": flops,
        **{k: kernel[k] for k in ("grid", "block") if kernel.get(k)},
    }
    if arch is not None and seconds:
        out["roofline"] = roofline(total_flops, bytes_moved, seconds, arch, precision)
    return out
