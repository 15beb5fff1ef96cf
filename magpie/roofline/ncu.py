"""Nsight Compute counters: the metrics we ask for and a parser for `--csv --page raw`.

The raw page is one header row of metric names, one row of units (its ID cell empty),
then a row per profiled kernel. Numbers may carry thousands separators; 'n/a' is missing.
"""

from __future__ import annotations

import csv
import io

from magpie.roofline.model import roofline
from magpie.roofline.specs import Arch

DURATION = "gpu__time_duration.sum"
DRAM_READ = "dram__bytes_read.sum"
DRAM_WRITE = "dram__bytes_write.sum"
SPEED_OF_LIGHT = {
    "sm_pct": "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "memory_pct": "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",
    "dram_pct": "dram__throughput.avg.pct_of_peak_sustained_elapsed",
}
# FLOPs per precision from executed thread instructions: an FMA counts two operations.
NON_TENSOR = {
    "fp64": ("dadd", "dmul", "dfma"),
    "fp32": ("fadd", "fmul", "ffma"),
    "fp16": ("hadd", "hmul", "hfma"),
}
# Tensor-core math operations per source type, as Hopper names them: warpgroup (hgmma,
# igmma) and warp-level (hmma, imma) paths are counted apart and added.
TENSOR = {
    "bf16_tensor": ("sm__ops_path_tensor_op_hgmma_src_bf16_dst_fp32.sum",
                    "sm__ops_path_tensor_op_hmma_src_bf16_dst_fp32.sum"),
    "fp16_tensor": ("sm__ops_path_tensor_op_hgmma_src_fp16.sum", "sm__ops_path_tensor_op_hmma_src_fp16.sum"),
    "tf32_tensor": ("sm__ops_path_tensor_op_hgmma_src_tf32_dst_fp32.sum",
                    "sm__ops_path_tensor_op_hmma_src_tf32_dst_fp32.sum"),
    "fp8_tensor": ("sm__ops_path_tensor_src_fp8.sum",),
    "int8_tensor": ("sm__ops_path_tensor_op_igmma_src_int8.sum", "sm__ops_path_tensor_op_imma_src_int8.sum"),
}
BASIC = (DURATION, DRAM_READ, DRAM_WRITE)


def _inst(op: str) -> str:
    return f"smsp__sass_thread_inst_executed_op_{op}_pred_on.sum"


def metrics(available: set[str] | None = None) -> list[str]:
    names = [*BASIC, *SPEED_OF_LIGHT.values(),
             *(_inst(op) for ops in NON_TENSOR.values() for op in ops), *(n for ns in TENSOR.values() for n in ns)]
    return [n for n in names if available is None or n in available]


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
_SCALE = {"byte": 1, "kbyte": 1e3, "mbyte": 1e6, "gbyte": 1e9, "ns": 1, "nsecond": 1, "us": 1e3, "usecond": 1e3,
          "ms": 1e6, "msecond": 1e6, "s": 1e9, "second": 1e9}


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
        kernels.append({"id": record.get("ID"), "name": record.get("Kernel Name", ""), "metrics": values})
    return kernels


def kernel_roofline(kernel: dict, arch: Arch | None) -> dict:
    m = kernel["metrics"]
    flops = {p: sum(m.get(_inst(op), 0.0) * (2 if op.endswith("fma") else 1) for op in ops)
             for p, ops in NON_TENSOR.items()}
    flops.update({p: sum(m.get(n, 0.0) for n in names) for p, names in TENSOR.items()
                  if any(m.get(n) for n in names)})
    total_flops = sum(flops.values())
    bytes_moved = m.get(DRAM_READ, 0.0) + m.get(DRAM_WRITE, 0.0)
    seconds = m.get(DURATION, 0.0) / 1e9
    precision = max(flops, key=flops.get) if total_flops else "fp32"
    out = {"name": kernel["name"], "duration_us": seconds * 1e6, "dram_bytes": bytes_moved, "flops": flops,
           **{k: m.get(v) for k, v in SPEED_OF_LIGHT.items()}}
    if arch is not None and seconds:
        out["roofline"] = roofline(total_flops, bytes_moved, seconds, arch, precision)
    return out
