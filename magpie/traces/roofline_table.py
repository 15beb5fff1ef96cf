"""Per-op roofline rows (TraceLens's `<label>_kernel_roofline_simple.csv` columns): each op
signature's kernel time from the trace, its FLOPs and bytes from the perf models, and where
that lands against the device's roofline. Rows come from `ops_tables.signature_groups`."""

from __future__ import annotations

import json

from magpie.roofline.model import roofline
from magpie.roofline.specs import Arch
from magpie.traces.ops_tables import MIB, SignatureGroup

COLUMNS = [
    "source_category",
    "op_name",
    "param_signature",
    "params_json",
    "operation_count",
    "num_kernels",
    "kernel_time_ms_sum",
    "time_pct",
    "kernel_time_us_mean",
    "gflops",
    "data_moved_mb",
    "arithmetic_intensity_flops_per_byte",
    "achieved_tflops_mean",
    "achieved_tbps_mean",
    "compute_spec",
    "roofline_bound",
    "pct_roofline_mean",
    "roofline_time_us",
    "has_perf_model",
    "input_dims",
    "input_type",
]


def roofline_rows(groups: list[SignatureGroup], arch: Arch | None) -> list[dict]:
    total_us = sum(g.total for g in groups) or 1.0
    rows = []
    for group in groups:
        op, est, times = group.op, group.est, group.times
        signature = repr([op.input_dims, op.input_types, op.concrete]) if op else group.kernel_names[0]
        row = {
            "source_category": est.family if est else "unmodeled",
            "op_name": group.name,
            "param_signature": signature,
            "params_json": json.dumps(est.params) if est else "",
            "operation_count": len(times),
            "num_kernels": sum(map(len, group.calls)),
            "kernel_time_ms_sum": group.total / 1000,
            "time_pct": 100 * group.total / total_us,
            "kernel_time_us_mean": group.total / len(times),
            "has_perf_model": est is not None,
            "input_dims": json.dumps(op.input_dims) if op else "",
            "input_type": json.dumps(op.input_types) if op else "",
        }
        if est is not None:
            row.update(
                gflops=est.flops / 1e9,
                data_moved_mb=est.bytes / MIB,
                arithmetic_intensity_flops_per_byte=est.flops / est.bytes if est.bytes else None,
                compute_spec=est.precision,
            )
            rates = [1e6 / us for us in times if us > 0]
            if arch and rates:
                # Achieved rates and percent of roofline are linear in 1/time, so their means over
                # the calls are the values at the time whose inverse is the mean inverse time.
                r = roofline(est.flops, est.bytes, len(rates) / sum(rates), arch, est.precision)
                row.update(
                    achieved_tflops_mean=r["achieved_tflops"],
                    achieved_tbps_mean=r["achieved_tbps"],
                    roofline_bound=r["bound"],
                    pct_roofline_mean=r["pct_of_roofline"],
                    roofline_time_us=r["roofline_time_us"],
                )
        rows.append({column: row.get(column) for column in COLUMNS})
    return rows
