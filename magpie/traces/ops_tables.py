"""TraceLens-style operation tables from one parsed trace: `ops_summary.csv` (per op name),
`ops_summary_by_category.csv` (per category) and `unified_perf_summary.csv` (per op name and
argument signature, with the perf models' metrics). Kernel time is the time of the kernels
each CPU op launched directly (its innermost-op kernels)."""

from __future__ import annotations

import json
from collections import defaultdict

from magpie.traces.ingest import Trace
from magpie.traces.perf_models import estimate

OPS_SUMMARY = ["name", "op category", "total_direct_kernel_time_sum", "Count", "total_direct_kernel_time_ms",
               "Percentage (%)", "Cumulative Percentage (%)"]
BY_CATEGORY = ["op category", "Count", "total_direct_kernel_time_ms", "Percentage (%)", "Cumulative Percentage (%)"]
UNIFIED = ["name", "op category", "Input Dims", "Input type", "Count", "Kernel Time (µs)_sum", "Kernel Time (µs)_mean",
           "GFLOPS", "Data Moved (MB)", "FLOPS/Byte", "TFLOPS/s_mean", "TB/s_mean", "perf_params",
           "kernel_details_summary"]

_FAMILY_CATEGORY = {"GEMM": "GEMM", "elementwise": "elementwise", "reduction": "reduce", "copy": "elementwise",
                    "indexing": "other", "normalization": "other", "softmax": "other"}
_OUTSIDE = "(launched outside any CPU op)"


def op_category(name: str, family: str | None, kernel_names: list[str]) -> str:
    if name == _OUTSIDE:
        return "triton" if kernel_names and all(not k.startswith(("void ", "at::")) for k in kernel_names) else "other"
    backward = "backward" in name
    if family == "SDPA":
        return "SDPA_bwd" if backward else "SDPA_fwd"
    if family == "CONV" or ("convolution" in name):
        return "CONV_bwd" if backward else "CONV_fwd"
    if "batch_norm" in name:
        return "BN_bwd" if backward else "BN_fwd"
    if name.startswith("aten::_foreach_"):
        return "multi_tensor_apply"
    return _FAMILY_CATEGORY.get(family or "", "other")


def _launchers(trace: Trace) -> dict:
    """Per CPU op instance that launched kernels: its name, kernels and direct kernel time."""
    out: dict = defaultdict(lambda: {"kernels": [], "time": 0.0})
    for kernel in trace.kernels:
        # a kernel launched outside any op is its own launcher (Triton's launcher calls the driver directly)
        entry = out[kernel.op if kernel.op is not None else ("launch", kernel.launch, kernel.ts)]
        entry["kernels"].append(kernel.name)
        entry["time"] += kernel.dur
    return out


def _percentages(rows: list[dict], key: str) -> None:
    total = sum(r[key] for r in rows) or 1.0
    running = 0.0
    for row in rows:
        row["Percentage (%)"] = round(100 * row[key] / total, 4)
        running += 100 * row[key] / total
        row["Cumulative Percentage (%)"] = round(running, 4)


def ops_tables(trace: Trace) -> dict[str, list[dict]]:
    launchers = _launchers(trace)
    by_name: dict[str, dict] = {}
    unified: dict[tuple, dict] = {}
    for op_index, entry in launchers.items():
        op = trace.cpu_ops[op_index] if isinstance(op_index, int) else None
        name = op.name if op else _OUTSIDE
        key = (name, repr(op.input_dims), repr(op.input_types), repr(op.concrete)) if op else (name,)
        row = unified.get(key)
        if row is None:  # one estimate per signature, not per call
            est = estimate(op) if op else None
            row = unified[key] = {
                "name": name, "op category": op_category(name, est.family if est else None, entry["kernels"]),
                "Input Dims": json.dumps(op.input_dims) if op else "",
                "Input type": json.dumps(op.input_types) if op else "", "Count": 0, "times": [], "est": est,
                "kernels": {}}
        row["Count"] += 1
        row["times"].append(entry["time"])
        for kernel in entry["kernels"]:
            row["kernels"][kernel] = row["kernels"].get(kernel, 0) + 1
        named = by_name.setdefault(name, {"name": name, "op category": row["op category"],
                                          "total_direct_kernel_time_sum": 0.0, "Count": 0})
        named["total_direct_kernel_time_sum"] += entry["time"]
        named["Count"] += 1
    ops = sorted(by_name.values(), key=lambda r: -r["total_direct_kernel_time_sum"])
    for row in ops:
        row["total_direct_kernel_time_sum"] = round(row["total_direct_kernel_time_sum"], 3)
        row["total_direct_kernel_time_ms"] = round(row["total_direct_kernel_time_sum"] / 1000, 6)
    _percentages(ops, "total_direct_kernel_time_sum")
    categories: dict[str, dict] = {}
    for row in ops:
        cat = categories.setdefault(row["op category"], {"op category": row["op category"], "Count": 0,
                                                         "total_direct_kernel_time_ms": 0.0})
        cat["Count"] += row["Count"]
        cat["total_direct_kernel_time_ms"] += row["total_direct_kernel_time_ms"]
    for cat in categories.values():
        cat["total_direct_kernel_time_ms"] = round(cat["total_direct_kernel_time_ms"], 6)
    by_category = sorted(categories.values(), key=lambda r: -r["total_direct_kernel_time_ms"])
    _percentages(by_category, "total_direct_kernel_time_ms")
    return {"ops_summary": ops, "ops_summary_by_category": by_category,
            "unified_perf_summary": [_unified_row(r) for r in sorted(unified.values(), key=lambda r: -sum(r["times"]))]}


def _unified_row(row: dict) -> dict:
    times, est = row["times"], row["est"]
    total = sum(times)
    out = {"name": row["name"], "op category": row["op category"], "Input Dims": row["Input Dims"],
           "Input type": row["Input type"], "Count": row["Count"], "Kernel Time (µs)_sum": round(total, 3),
           "Kernel Time (µs)_mean": round(total / len(times), 3),
           "kernel_details_summary": json.dumps([{"name": k, "count": c} for k, c in row["kernels"].items()])}
    if est is not None:
        mean_s = total / len(times) / 1e6
        out.update({"GFLOPS": round(est.flops / 1e9, 6), "Data Moved (MB)": round(est.bytes / 1e6, 6),
                    "FLOPS/Byte": round(est.flops / est.bytes, 4) if est.bytes else None,
                    "TFLOPS/s_mean": round(est.flops / mean_s / 1e12, 4) if mean_s else None,
                    "TB/s_mean": round(est.bytes / mean_s / 1e12, 4) if mean_s else None,
                    "perf_params": json.dumps(est.params), "compute_spec": est.precision})
    return out
