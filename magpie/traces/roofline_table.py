"""Per-op roofline rows (TraceLens's `<label>_kernel_roofline_simple.csv` columns): each op
signature's kernel time from the trace, its FLOPs and bytes from the perf models, and where
that lands against the device's roofline."""

from __future__ import annotations

import json
from collections import defaultdict

from magpie.roofline.model import roofline
from magpie.roofline.specs import Arch
from magpie.traces.ingest import Trace
from magpie.traces.perf_models import estimate

COLUMNS = ["source_category", "op_name", "param_signature", "params_json", "operation_count", "num_kernels",
           "kernel_time_ms_sum", "time_pct", "kernel_time_us_mean", "gflops", "data_moved_mb",
           "arithmetic_intensity_flops_per_byte", "achieved_tflops_mean", "achieved_tbps_mean", "compute_spec",
           "roofline_bound", "pct_roofline_mean", "roofline_time_us", "has_perf_model", "input_dims", "input_type"]


def _mean(values: list[float]) -> float | None:
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def _round(value, digits: int = 4):
    return None if value is None else round(value, digits)


def roofline_rows(trace: Trace, arch: Arch | None) -> list[dict]:
    per_op: dict[int | None, list] = defaultdict(list)
    for kernel in trace.kernels:
        per_op[kernel.op].append(kernel)
    total_us = sum(k.dur for k in trace.kernels) or 1.0
    groups: dict[tuple, dict] = {}
    for op_index, kernels in per_op.items():
        op = trace.cpu_ops[op_index] if op_index is not None else None
        name = op.name if op else "(launched outside any CPU op)"
        signature = repr([op.input_dims, op.input_types, op.concrete]) if op else kernels[0].name
        group = groups.setdefault((name, signature), {"op": op, "instances": [], "kernels": 0})
        group["instances"].append(sum(k.dur for k in kernels))
        group["kernels"] += len(kernels)
    rows = []
    for (name, signature), g in groups.items():
        op, times = g["op"], g["instances"]
        est = estimate(op) if op else None
        row = {"source_category": est.family if est else "unmodeled", "op_name": name, "param_signature": signature,
               "params_json": json.dumps(est.params) if est else "", "operation_count": len(times),
               "num_kernels": g["kernels"], "kernel_time_ms_sum": _round(sum(times) / 1000, 6),
               "time_pct": _round(100 * sum(times) / total_us), "kernel_time_us_mean": _round(sum(times) / len(times)),
               "has_perf_model": est is not None,
               "input_dims": json.dumps(op.input_dims) if op else "",
               "input_type": json.dumps(op.input_types) if op else ""}
        if est is not None:
            per_instance = [roofline(est.flops, est.bytes, us / 1e6, arch, est.precision) for us in times if us > 0] \
                if arch else []
            row.update(gflops=_round(est.flops / 1e9, 6), data_moved_mb=_round(est.bytes / 1e6, 6),
                       arithmetic_intensity_flops_per_byte=_round(est.flops / est.bytes if est.bytes else None),
                       compute_spec=est.precision)
            if per_instance:
                row.update(achieved_tflops_mean=_round(_mean([r["achieved_tflops"] for r in per_instance])),
                           achieved_tbps_mean=_round(_mean([r["achieved_tbps"] for r in per_instance])),
                           roofline_bound=per_instance[0]["bound"],
                           pct_roofline_mean=_round(_mean([r["pct_of_roofline"] for r in per_instance])),
                           roofline_time_us=_round(per_instance[0]["roofline_time_us"]))
        rows.append({column: row.get(column) for column in COLUMNS})
    rows.sort(key=lambda r: -r["kernel_time_ms_sum"])
    return rows
