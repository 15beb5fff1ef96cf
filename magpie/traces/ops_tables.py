"""TraceLens-style operation tables from one parsed trace: `ops_summary.csv` (per op name),
`ops_summary_by_category.csv` (per category) and `unified_perf_summary.csv` (per op name and
argument signature, with the perf models' metrics), all from `signature_groups`. Kernel time
is the time of the kernels each CPU op launched directly (its innermost-op kernels)."""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, field

import msgspec

from magpie.traces.ingest import CpuOp, Trace
from magpie.traces.kernels import category as kernel_category
from magpie.traces.perf_models import Estimate, estimate

STATS = ("mean", "median", "std", "min", "max")
OPS_SUMMARY = ["name", "op category", "total_direct_kernel_time_sum", "Count", "total_direct_kernel_time_ms",
               "Percentage (%)", "Cumulative Percentage (%)"]
BY_CATEGORY = ["op category", "Count", "total_direct_kernel_time_ms", "Percentage (%)", "Cumulative Percentage (%)"]
UNIQUE_ARGS = ["name", "op category", "Input Dims", "Input type", "Concrete Inputs", "operation_count",
               "total_direct_kernel_time_sum", *(f"total_direct_kernel_time_{s}" for s in STATS),
               "kernel_details_summary", "Percentage (%)", "Cumulative Percentage (%)"]
UNIFIED = ["name", "op category", "Input Dims", "Input type", "Concrete Inputs", "Count", "Kernel Time (µs)_sum",
           *(f"Kernel Time (µs)_{s}" for s in STATS), "GFLOPS", "Data Moved (MB)", "FLOPS/Byte",
           *(f"TFLOPS/s_{s}" for s in STATS), *(f"TB/s_{s}" for s in STATS), "compute_spec", "has_perf_model",
           "perf_params", "kernel_details_summary", "Percentage (%)", "Cumulative Percentage (%)"]
# TraceLens's performance-metric sheets, one CSV each: the unified rows of one op family
# with a "param: <name>" column per perf-model parameter. Input strides are not ingested.
PERF_FAMILIES = ("GEMM", "CONV_fwd", "CONV_bwd", "SDPA_fwd", "SDPA_bwd", "UnaryElementwise", "BinaryElementwise")

_FAMILY_CATEGORY = {"GEMM": "GEMM", "elementwise": "elementwise", "reduction": "reduce", "copy": "elementwise",
                    "indexing": "other", "normalization": "other", "softmax": "other"}
_OUTSIDE = "(launched outside any CPU op)"
_GRAPH = "(graph replay: {})"
GRAPH_LAUNCHES = ("cudaGraphLaunch", "hipGraphLaunch")
# Kernels replayed from a CUDA/HIP graph have no op around them: one pseudo-op per kind of
# kernel (by name), so each lands in its own category.
_KERNEL_CATEGORY = {"gemm": "GEMM", "elementwise": "elementwise", "copy": "elementwise", "reduction": "reduce"}


def op_category(name: str, family: str | None, kernel_names: list[str]) -> str:
    if name.startswith("(graph replay: "):
        return _KERNEL_CATEGORY.get(kernel_category(kernel_names[0]), "other") if kernel_names else "other"
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
    kernels: dict[str, list[float]] = field(default_factory=dict)  # kernel name -> its durations, µs

    @property
    def total(self) -> float:
        return sum(self.times)


def signature_groups(trace: Trace) -> list[SignatureGroup]:
    """Calls grouped by op and argument signature, longest total kernel time first; the perf
    model is evaluated once per group. Both the op tables and the roofline rows read these."""
    launches: dict = {}
    for kernel in trace.kernels:
        # a kernel launched outside any op is its own launcher (Triton's launcher calls the driver directly)
        launcher = kernel.op if kernel.op is not None else ("launch", kernel.launch, kernel.ts)
        launched = launches.get(launcher)
        if launched is None:
            launches[launcher] = [kernel]
        else:
            launched.append(kernel)
    groups: dict[tuple, SignatureGroup] = {}
    encode = msgspec.json.encode  # a signature key several times faster than repr() of the argument lists
    for launcher, launched in launches.items():
        op = trace.cpu_ops[launcher] if isinstance(launcher, int) else None
        time = sum(k.dur for k in launched)
        names = [k.name for k in launched]
        if op is None:
            launch = trace.launches[launched[0].launch] if launched[0].launch is not None else None
            graph = launch is not None and launch.name.startswith(GRAPH_LAUNCHES)
            outside = _GRAPH.format(kernel_category(names[0])) if graph else _OUTSIDE
        key = (op.name, encode((op.input_dims, op.input_types, op.concrete))) if op else (outside, names[0])
        group = groups.get(key)
        if group is None:
            est = estimate(op) if op else None
            name = op.name if op else outside
            group = groups[key] = SignatureGroup(name, op, est, op_category(name, est.family if est else None, names))
        group.times.append(time)
        for kernel in launched:
            group.kernels.setdefault(kernel.name, []).append(kernel.dur)
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
    unique = [_unique_args_row(g) for g in groups]
    _percentages(unique, "total_direct_kernel_time_sum")
    unified = [_unified_row(g) for g in groups]
    _percentages(unified, "Kernel Time (µs)_sum")
    tables = {"ops_summary": ops, "ops_summary_by_category": by_category, "ops_unique_args": unique,
              "unified_perf_summary": unified}
    for family in PERF_FAMILIES:
        tables[family] = [{**row, **{f"param: {k}": v for k, v in g.est.params.items()}}
                          for g, row in zip(groups, unified) if g.est is not None and perf_family(g) == family]
    return tables


def table_columns(name: str, rows: list[dict]) -> list[str]:
    """The CSV columns of a table: fixed ones, and for a family sheet its parameters too."""
    fixed = {"ops_summary": OPS_SUMMARY, "ops_summary_by_category": BY_CATEGORY, "ops_unique_args": UNIQUE_ARGS,
             "unified_perf_summary": UNIFIED}.get(name)
    if fixed is not None:
        return fixed
    params = dict.fromkeys(k for row in rows for k in row if k.startswith("param: "))
    return [*UNIFIED, *params]


def perf_family(group: SignatureGroup) -> str | None:
    """The TraceLens performance sheet a modelled op belongs on, if any."""
    if group.category in PERF_FAMILIES:
        return group.category
    if group.est is not None and group.est.family == "elementwise":
        return "UnaryElementwise" if group.est.params.get("tensor_inputs", 1) <= 1 else "BinaryElementwise"
    return None


def _stats(values: list[float], prefix: str, digits: int = 4) -> dict:
    if not values:
        return {}
    mean = sum(values) / len(values)
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))
    return {f"{prefix}_mean": round(mean, digits), f"{prefix}_median": round(statistics.median(values), digits),
            f"{prefix}_std": round(std, digits), f"{prefix}_min": round(min(values), digits),
            f"{prefix}_max": round(max(values), digits)}


def _kernel_details(group: SignatureGroup) -> str:
    details = []
    for name, durations in group.kernels.items():
        stats = _stats(durations, "d")
        details.append({"kernel_name": name, "count": len(durations), "mean_duration_us": stats["d_mean"],
                        "std_dev_duration_us": stats["d_std"]})
    return json.dumps(details)


def _signature(group: SignatureGroup) -> dict:
    op = group.op
    return {"name": group.name, "op category": group.category,
            "Input Dims": json.dumps(op.input_dims) if op else "",
            "Input type": json.dumps(op.input_types) if op else "",
            "Concrete Inputs": json.dumps(op.concrete) if op and op.concrete is not None else ""}


def _unique_args_row(group: SignatureGroup) -> dict:
    return {**_signature(group), "operation_count": len(group.times),
            "total_direct_kernel_time_sum": round(group.total, 3),
            **_stats(group.times, "total_direct_kernel_time"), "kernel_details_summary": _kernel_details(group)}


def _unified_row(group: SignatureGroup) -> dict:
    times, est = group.times, group.est
    out = {**_signature(group), "Count": len(times), "Kernel Time (µs)_sum": round(group.total, 3),
           **_stats(times, "Kernel Time (µs)"), "has_perf_model": est is not None,
           "kernel_details_summary": _kernel_details(group)}
    if est is not None:
        seconds = [t / 1e6 for t in times if t > 0]
        out.update({"GFLOPS": round(est.flops / 1e9, 6), "Data Moved (MB)": round(est.bytes / 1e6, 6),
                    "FLOPS/Byte": round(est.flops / est.bytes, 4) if est.bytes else None,
                    **_stats([est.flops / s / 1e12 for s in seconds], "TFLOPS/s"),
                    **_stats([est.bytes / s / 1e12 for s in seconds], "TB/s"),
                    "perf_params": json.dumps(est.params), "compute_spec": est.precision})
    return out
