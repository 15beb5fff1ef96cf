"""TraceLens-style operation tables from one parsed trace: `ops_summary.csv` (per op name),
`ops_summary_by_category.csv` (per category) and `unified_perf_summary.csv` (per op name and
argument signature, with the perf models' metrics), all from `signature_groups`. Kernel time
is the time of the kernels each CPU op launched directly (its innermost-op kernels)."""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field

from magpie.traces.ingest import CpuOp, Trace
from magpie.traces.perf_models import Estimate, estimate

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


@dataclass
class SignatureGroup:
    """Every call of one op with one argument signature (or, outside any op, one kernel)."""

    name: str
    op: CpuOp | None
    est: Estimate | None
    category: str
    times: list[float] = field(default_factory=list)  # direct kernel time of each call, µs
    kernels: dict[str, int] = field(default_factory=dict)

    @property
    def total(self) -> float:
        return sum(self.times)


def signature_groups(trace: Trace) -> list[SignatureGroup]:
    """Calls grouped by op and argument signature, longest total kernel time first; the perf
    model is evaluated once per group. Both the op tables and the roofline rows read these."""
    launches: dict = defaultdict(lambda: ([], [0.0]))
    for kernel in trace.kernels:
        # a kernel launched outside any op is its own launcher (Triton's launcher calls the driver directly)
        names, time = launches[kernel.op if kernel.op is not None else ("launch", kernel.launch, kernel.ts)]
        names.append(kernel.name)
        time[0] += kernel.dur
    groups: dict[tuple, SignatureGroup] = {}
    for launcher, (names, (time,)) in launches.items():
        op = trace.cpu_ops[launcher] if isinstance(launcher, int) else None
        key = (op.name, repr(op.input_dims), repr(op.input_types), repr(op.concrete)) if op else (_OUTSIDE, names[0])
        group = groups.get(key)
        if group is None:
            est = estimate(op) if op else None
            name = op.name if op else _OUTSIDE
            group = groups[key] = SignatureGroup(name, op, est, op_category(name, est.family if est else None, names))
        group.times.append(time)
        for kernel in names:
            group.kernels[kernel] = group.kernels.get(kernel, 0) + 1
    return sorted(groups.values(), key=lambda g: -g.total)


def _percentages(rows: list[dict], key: str) -> None:
    total = sum(r[key] for r in rows) or 1.0
    running = 0.0
    for row in rows:
        row["Percentage (%)"] = round(100 * row[key] / total, 4)
        running += 100 * row[key] / total
        row["Cumulative Percentage (%)"] = round(running, 4)


def ops_tables(groups: list[SignatureGroup]) -> dict[str, list[dict]]:
    by_name: dict[str, dict] = {}
    for group in groups:
        named = by_name.setdefault(group.name, {"name": group.name, "op category": group.category,
                                                "total_direct_kernel_time_sum": 0.0, "Count": 0})
        named["total_direct_kernel_time_sum"] += group.total
        named["Count"] += len(group.times)
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
            "unified_perf_summary": [_unified_row(g) for g in groups]}


def _unified_row(group: SignatureGroup) -> dict:
    times, est, op = group.times, group.est, group.op
    total = group.total
    out = {"name": group.name, "op category": group.category,
           "Input Dims": json.dumps(op.input_dims) if op else "",
           "Input type": json.dumps(op.input_types) if op else "",
           "Count": len(times), "Kernel Time (µs)_sum": round(total, 3),
           "Kernel Time (µs)_mean": round(total / len(times), 3),
           "kernel_details_summary": json.dumps([{"name": k, "count": c} for k, c in group.kernels.items()])}
    if est is not None:
        mean_s = total / len(times) / 1e6
        out.update({"GFLOPS": round(est.flops / 1e9, 6), "Data Moved (MB)": round(est.bytes / 1e6, 6),
                    "FLOPS/Byte": round(est.flops / est.bytes, 4) if est.bytes else None,
                    "TFLOPS/s_mean": round(est.flops / mean_s / 1e12, 4) if mean_s else None,
                    "TB/s_mean": round(est.bytes / mean_s / 1e12, 4) if mean_s else None,
                    "perf_params": json.dumps(est.params), "compute_spec": est.precision})
    return out
