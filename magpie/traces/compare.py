"""Trace-to-trace comparison (`magpie benchmark --compare-traces BEFORE AFTER`): how an
optimization shows at the trace level.

Each side is one or more traces of one configuration (repeats of one run). Per op signature
(op name and its input dims, types and concrete inputs, as the op tables group calls; outside any
op, TraceLens's `<launch>-><kernel> (Synthetic Op)`) and per kernel (its full name; memcpy and
memset by theirs), the GPU time of each trace is summed; a side's time is the mean over its
repeats. Rows give time before and after, difference and ratio, whether the row is new or
vanished, and a verdict on whether the change is beyond the run-to-run noise (`judge_rows`,
statistics in `noise.py`). Copies within a side (every time equal) count once, with a warning:
zero spread between copies says nothing of the noise.
"""

from __future__ import annotations

import csv
import io
import json
import statistics
from pathlib import Path

from magpie.store import atomic_write
from magpie.traces.ingest import NotATrace, Trace, TraceError, load_trace, trace_files
from magpie.traces.kernels import normalize
from magpie.traces.noise import (
    DEFAULT_PRIOR_DF,
    FDR,
    NoiseModel,
    benjamini_hochberg,
    fit,
    t_test,
)
from magpie.traces.ops_tables import signature_groups

COLUMNS = [
    "level",
    "name",
    "input_dims",
    "input_types",
    "concrete_inputs",
    "status",
    "verdict",
    "before_us",
    "after_us",
    "diff_us",
    "ratio",
    "calls_before",
    "calls_after",
    "before_min_us",
    "before_max_us",
    "after_min_us",
    "after_max_us",
    "noise_us",
    "p_value",
    "q_value",
]
WITHIN, SLOWER, FASTER, NEW, VANISHED, NO_REPEATS = (
    "within noise",
    "slower",
    "faster",
    "new",
    "vanished",
    "no repeats",
)
VERDICTS = (SLOWER, FASTER, NEW, VANISHED, WITHIN, NO_REPEATS)
RULE = (
    f"beyond noise when a row's q-value (Benjamini-Hochberg over the level's rows) is at most {FDR}: a t test "
    "of the difference of the per-trace means, the row's within-side variance moderated toward a noise model "
    "fitted over all rows ((rel * time)^2 + calls * jitter^2); copies within a side count once; with no "
    "repeats on either side only an exact tie is 'within noise', anything else 'no repeats'"
)


def side_paths(spec: str | Path) -> list[Path]:
    """The traces of one side: a trace file, a folder of traces (all of them repeats of one
    configuration), or several of either separated by commas."""
    paths: list[Path] = []
    for part in str(spec).split(","):
        if not part.strip():
            continue
        path = Path(part.strip())
        if path.is_dir():
            paths += trace_files(path)
        elif path.is_file():
            paths.append(path)
        else:
            raise TraceError(f"{path}: no such trace file or folder")
    if not paths:
        raise TraceError(f"{spec!r}: names no trace")
    return paths


def load_side(spec: str | Path, label: str, warnings: list[str]) -> list[Trace]:
    """One side's traces; JSON that is no trace and truncated traces are skipped with a warning
    while another trace of the side loads."""
    traces, bad = [], []
    for path in side_paths(spec):
        try:
            traces.append(load_trace(path))
        except NotATrace as err:
            warnings.append(f"{label}: skipped {err}")
        except TraceError as err:
            bad.append(str(err))
    if not traces:
        raise TraceError(f"{label}: no trace could be read" + (f" ({bad[0]})" if bad else ""))
    warnings += [f"{label}: skipped a bad trace: {message}" for message in bad]
    warnings += [f"{label}: {t.path}: no GPU kernels (a CPU-only profile?)" for t in traces if not t.kernels]
    return traces


def measure(trace: Trace) -> dict[str, dict[str, dict]]:
    """Per level ("op", "kernel"): key -> {"name", signature fields, "calls", "us"} for one trace;
    and its kernels' time ("kernel_us", memcpy and memset left out)."""
    ops: dict[str, dict] = {}
    for group in signature_groups(trace):
        op = group.op
        fields = {
            "name": group.name,
            "input_dims": json.dumps(op.input_dims) if op is not None and op.input_dims is not None else "",
            "input_types": json.dumps(op.input_types) if op is not None and op.input_types is not None else "",
            "concrete_inputs": json.dumps(op.concrete) if op is not None and op.concrete is not None else "",
        }
        key = "\x1f".join(fields.values())
        row = ops.setdefault(key, {**fields, "calls": 0, "us": 0.0})
        row["calls"] += len(group.times)
        row["us"] += group.total
    kernels: dict[str, dict] = {}
    for activity in trace.gpu:
        row = kernels.setdefault(
            activity.name,
            {"name": activity.name, "input_dims": "", "input_types": "", "concrete_inputs": "", "calls": 0, "us": 0.0},
        )
        row["calls"] += 1
        row["us"] += activity.dur
    return {"op": ops, "kernel": kernels, "kernel_us": sum(k.dur for k in trace.kernels)}


def distinct(traces: list[Trace], measured: list[dict], label: str, warnings: list[str]) -> list[dict]:
    """One side's measures less copies (every row's time and calls equal to an earlier trace's:
    the same file, or re-encoded), each copy named in a warning line."""
    kept: list[tuple[Trace, dict]] = []
    for trace, measures in zip(traces, measured):
        original = next((t for t, m in kept if m == measures), None)
        if original is None:
            kept.append((trace, measures))
        else:
            warnings.append(
                f"{label}: {trace.path} is a copy of {original.path} (every time equal): counted once, "
                "as zero spread between copies is no evidence of the run-to-run noise"
            )
    return [m for _, m in kept]


def verdict(before: list[float], after: list[float], model: NoiseModel | None, calls: float) -> dict:
    """A row's test before the false-discovery control: its standard error (`noise_us`) and
    p-value, or with no repeats on either side only whether it is an exact tie."""
    diff = statistics.fmean(after) - statistics.fmean(before)
    prior = model.variance(statistics.fmean(before + after), calls) if model else 0.0
    tested = t_test(before, after, prior, model.prior_df) if model else None
    if tested is None:
        return {"verdict": WITHIN if diff == 0 else NO_REPEATS, "noise_us": None, "p_value": None}
    p, error = tested
    return {"verdict": None, "noise_us": error, "p_value": p, "diff": diff}


def judge_rows(rows: list[dict], tests: list[dict]) -> None:
    """Each common row's verdict: slower or faster where its Benjamini-Hochberg q-value over the
    tested rows is at most FDR, else within noise."""
    tested = [i for i, t in enumerate(tests) if t["p_value"] is not None]
    qvalues = benjamini_hochberg([tests[i]["p_value"] for i in tested])
    for row, test in zip(rows, tests):
        row.update(noise_us=test["noise_us"], p_value=test["p_value"], q_value=None)
        if row["status"] == "common":
            row["verdict"] = test["verdict"]
    for i, q in zip(tested, qvalues):
        rows[i]["q_value"] = q
        if rows[i]["status"] == "common":
            rows[i]["verdict"] = (SLOWER if rows[i]["diff_us"] > 0 else FASTER) if q <= FDR else WITHIN


def compare_rows(before: list[dict], after: list[dict], level: str) -> tuple[list[dict], NoiseModel | None]:
    """The rows of one level from each side's per-trace measures, largest absolute difference
    first, and the noise model fitted on them."""
    keys = dict.fromkeys(k for side in (before, after) for m in side for k in m[level])
    rows, samples = [], []
    for key in keys:
        seen_before = [m[level][key] for m in before if key in m[level]]
        seen_after = [m[level][key] for m in after if key in m[level]]
        times_before = [m[level][key]["us"] if key in m[level] else 0.0 for m in before]
        times_after = [m[level][key]["us"] if key in m[level] else 0.0 for m in after]
        first = (seen_before or seen_after)[0]
        mean_before, mean_after = statistics.fmean(times_before), statistics.fmean(times_after)
        status = NEW if not seen_before else VANISHED if not seen_after else "common"
        calls_before = statistics.fmean([m[level][key]["calls"] if key in m[level] else 0 for m in before])
        calls_after = statistics.fmean([m[level][key]["calls"] if key in m[level] else 0 for m in after])
        samples.append((times_before, times_after, (calls_before + calls_after) / 2))
        rows.append(
            {
                "level": level,
                "name": first["name"],
                "input_dims": first["input_dims"],
                "input_types": first["input_types"],
                "concrete_inputs": first["concrete_inputs"],
                "status": status,
                "verdict": status,
                "before_us": mean_before,
                "after_us": mean_after,
                "diff_us": mean_after - mean_before,
                "ratio": mean_after / mean_before if mean_before > 0 else None,
                "calls_before": calls_before,
                "calls_after": calls_after,
                "before_min_us": min(times_before),
                "before_max_us": max(times_before),
                "after_min_us": min(times_after),
                "after_max_us": max(times_after),
            }
        )
    model = fit([sample for sample, row in zip(samples, rows) if row["status"] == "common"])
    judge_rows(rows, [verdict(b, a, model, calls) for b, a, calls in samples])
    order = sorted(range(len(rows)), key=lambda i: (-abs(rows[i]["diff_us"]), rows[i]["name"], rows[i]["input_dims"]))
    return [rows[i] for i in order], model


def compare_traces(before_spec, after_spec, out_dir: str | Path) -> dict:
    """Compare two sides (see `side_paths`), write `trace_compare.csv` (both levels, a `level`
    column), `trace_compare.json` and the page `trace_compare.html` into out_dir; returns the
    JSON's content."""
    summary = comparison(before_spec, after_spec)
    out = Path(out_dir)
    summary["outputs"] = {"csv": str(out / "trace_compare.csv"), "json": str(out / "trace_compare.json")}
    atomic_write(out / "trace_compare.csv", csv_text(summary))
    summary["outputs"]["report"] = str(out / "trace_compare.html")
    atomic_write(out / "trace_compare.json", json.dumps(summary, indent=1))
    atomic_write(out / "trace_compare.html", render_page(summary))
    return summary


def csv_text(summary: dict) -> str:
    """trace_compare.csv: the op rows, then the kernel rows."""
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(summary["ops"] + summary["kernels"])
    return text.getvalue()


def comparison(before_spec, after_spec) -> dict:
    """The comparison of two sides (see `side_paths`): totals, counts, rows of each level and
    warnings, as trace_compare.json holds them less its `outputs`."""
    warnings: list[str] = []
    before = load_side(before_spec, "before", warnings)
    after = load_side(after_spec, "after", warnings)
    measured_before = distinct(before, [measure(t) for t in before], "before", warnings)
    measured_after = distinct(after, [measure(t) for t in after], "after", warnings)
    ops, op_model = compare_rows(measured_before, measured_after, "op")
    kernels, kernel_model = compare_rows(measured_before, measured_after, "kernel")
    totals_before = [m["kernel_us"] for m in measured_before]
    totals_after = [m["kernel_us"] for m in measured_after]
    calls = statistics.fmean([sum(k["calls"] for k in m["kernel"].values()) for m in measured_before + measured_after])
    total = verdict(totals_before, totals_after, kernel_model, calls)
    total_verdict = total["verdict"] or (WITHIN if total["p_value"] > FDR else SLOWER if total["diff"] > 0 else FASTER)
    total_noise = total["noise_us"]
    mean_before, mean_after = statistics.fmean(totals_before), statistics.fmean(totals_after)
    return {
        "before": [t.path for t in before],
        "after": [t.path for t in after],
        "repeats": {"before": len(measured_before), "after": len(measured_after)},
        "rule": RULE,
        "noise_model": {
            "fdr": FDR,
            "default_prior_df": DEFAULT_PRIOR_DF,
            **{level: vars(model) if model else None for level, model in (("op", op_model), ("kernel", kernel_model))},
        },
        "total_kernel_time_us": {
            "before": mean_before,
            "after": mean_after,
            "diff": mean_after - mean_before,
            "ratio": mean_after / mean_before if mean_before > 0 else None,
            "verdict": total_verdict,
            "noise_us": total_noise,
        },
        "counts": {
            level: {v: sum(r["verdict"] == v for r in rows) for v in VERDICTS}
            for level, rows in (("op", ops), ("kernel", kernels))
        },
        "ops": ops,
        "kernels": kernels,
        "warnings": warnings,
    }


def render_page(summary: dict, limit: int = 50) -> str:
    """trace_compare.html: the totals and the largest changes of each level, verdicts coloured."""
    from magpie.report.render import template_environment

    return template_environment().get_template("trace_compare.html.j2").render(s=summary, limit=limit)


def format_table(summary: dict, limit: int = 20) -> str:
    """The console view: totals, then the largest changes of each level."""
    total = summary["total_kernel_time_us"]
    ratio = f"{total['ratio']:.3f}x" if total["ratio"] is not None else "-"
    lines = [
        f"before: {summary['repeats']['before']} trace(s), after: {summary['repeats']['after']} trace(s); "
        f"kernel time {total['before'] / 1000:.3f} ms -> {total['after'] / 1000:.3f} ms ({ratio}, "
        f"{total['verdict']})"
    ]
    short = [normalize(r["name"]) for r in summary["kernels"]]
    for level, rows in (("op", summary["ops"]), ("kernel", summary["kernels"])):
        counts = summary["counts"][level]
        lines.append(f"\nper {level} ({len(rows)}: " + ", ".join(f"{n} {v}" for v, n in counts.items() if n) + ")")
        lines.append(f"{'before us':>11} {'after us':>11} {'diff us':>10} {'ratio':>7}  {'verdict':12} name")
        for row in rows[:limit]:
            name = row["name"]
            if level == "kernel" and short.count(normalize(name)) == 1:  # the full name where two share one
                name = normalize(name)
            if row["input_dims"]:
                name += f" {row['input_dims']}"
            ratio = f"{row['ratio']:.3f}" if row["ratio"] is not None else "-"
            lines.append(
                f"{row['before_us']:11.1f} {row['after_us']:11.1f} {row['diff_us']:+10.1f} {ratio:>7}  "
                f"{row['verdict']:12} {name[:90]}"
            )
        if len(rows) > limit:
            lines.append(f"... {len(rows) - limit} more in {summary['outputs']['csv']}")
    lines += [f"warning: {w}" for w in summary["warnings"]]
    lines.append(f"written: {summary['outputs']['csv']}, {summary['outputs']['json']}, {summary['outputs']['report']}")
    return "\n".join(lines)
