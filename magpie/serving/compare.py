"""`magpie benchmark --compare A B`: two serving runs side by side, only when their workloads are equivalent.

Each side is a `benchmark_report.json`, a run folder holding one, or several of either joined by commas
(repeats of one run). Equivalent means the same model content (hash, else hub revision, else name), input
and output lengths, dataset (random, range ratio), concurrency, request rate and burstiness, number of
prompts and endpoint; the engine, its version, the GPUs and the environment may differ (that is what is
compared). A difference is one line naming the field and both values (`WorkloadMismatch`, the CLI exits 2).

Per metric (request and output throughput; TTFT, TPOT, ITL and E2EL median and p99) each side's value is
the mean over its runs; with repeats on both sides the verdict is "within noise" when the two ranges
(min..max over the runs) overlap, else better or worse by the metric's direction; with a single run on a
side there is no spread to judge against and the verdict says so.
"""

from __future__ import annotations

import json
from pathlib import Path

REPORT = "benchmark_report.json"

# (label, path into the report, higher is better)
METRICS = [
    ("request_throughput (req/s)", ("throughput", "request_throughput"), True),
    ("output_throughput (tok/s)", ("throughput", "output_throughput"), True),
    ("total_token_throughput (tok/s)", ("throughput", "total_token_throughput"), True),
]
for _name in ("ttft", "tpot", "itl", "e2el"):
    for _stat in ("median", "p99"):
        METRICS.append((f"{_name} {_stat} (ms)", ("latency", _name, f"{_stat}_ms"), False))

# (field, how to read it from a report) for the workload's equivalence
WORKLOAD = [
    (
        "model",
        lambda r: (
            (r.get("provenance") or {}).get("model_hash")
            or (r.get("provenance") or {}).get("model_revision")
            or r["config"]["model"]
        ),
    ),
    ("input_len", lambda r: r["config"]["input_len"]),
    ("output_len", lambda r: r["config"]["output_len"]),
    ("dataset", lambda r: f"random range_ratio={r['config'].get('range_ratio', 0.0)}"),
    ("concurrency", lambda r: r["config"].get("concurrency")),
    ("request_rate", lambda r: r["config"].get("request_rate")),
    ("burstiness", lambda r: r["config"].get("burstiness", 1.0)),
    ("num_prompts", lambda r: r["config"]["num_prompts"]),
    ("endpoint", lambda r: r["config"].get("endpoint", "completions")),
]


class CompareError(Exception):
    """A side that cannot be read or compared, or workloads that differ: one line."""


class WorkloadMismatch(CompareError):
    pass


def read_report(where: str | Path) -> dict:
    path = Path(where)
    if path.is_dir():
        path = path / REPORT
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise CompareError(f"{path}: no such report (give a benchmark_report.json or its run folder)") from None
    except (OSError, ValueError) as exc:
        raise CompareError(f"{path}: not a readable report: {exc}") from None
    if not isinstance(data, dict) or "config" not in data:
        raise CompareError(f"{path}: not a benchmark_report.json (no config)")
    if not data.get("success") or not data.get("throughput") or not data.get("latency"):
        raise CompareError(f"{path}: the run failed or has no metrics; only successful runs compare")
    data["_path"] = str(path)
    return data


def read_side(spec: str) -> list[dict]:
    """A side: one report or run folder, or several joined by commas (repeats)."""
    parts = [p.strip() for p in str(spec).split(",") if p.strip()]
    if not parts:
        raise CompareError("an empty side: give a report, a run folder, or several joined by commas")
    return [read_report(p) for p in parts]


def workload(report: dict) -> dict:
    try:
        return {name: read(report) for name, read in WORKLOAD}
    except KeyError as exc:
        raise CompareError(f"{report['_path']}: the config has no {exc.args[0]}") from None


def check_equivalent(reports: list[tuple[str, dict]]) -> dict:
    """The shared workload; `WorkloadMismatch` naming the first field that differs and both values."""
    (first_label, first), *rest = reports
    base = workload(first)
    for label, report in rest:
        other = workload(report)
        for name, _ in WORKLOAD:
            if other[name] != base[name]:
                what = "model content" if name == "model" else name
                raise WorkloadMismatch(
                    f"workloads differ in {what}: {base[name]!r} ({first_label}) vs "
                    f"{other[name]!r} ({label}); only equivalent workloads compare"
                )
    return base


def _value(report: dict, path: tuple[str, ...]) -> float | None:
    node = report
    for key in path:
        node = node.get(key) if isinstance(node, dict) else None
    return float(node) if isinstance(node, (int, float)) else None


def _verdict(before: list[float], after: list[float], higher_better: bool) -> str:
    if len(before) < 2 or len(after) < 2:
        return "single run: noise unknown"
    if max(before) >= min(after) and max(after) >= min(before):
        return "within noise"
    improved = (min(after) > max(before)) == higher_better
    return "better" if improved else "worse"


def compare(before_spec: str, after_spec: str) -> dict:
    before, after = read_side(before_spec), read_side(after_spec)
    labelled = [(f"A{i + 1}" if len(before) > 1 else "A", r) for i, r in enumerate(before)]
    labelled += [(f"B{i + 1}" if len(after) > 1 else "B", r) for i, r in enumerate(after)]
    shared = check_equivalent(labelled)
    rows = []
    for label, path, higher in METRICS:
        a = [v for r in before if (v := _value(r, path)) is not None]
        b = [v for r in after if (v := _value(r, path)) is not None]
        if not a or not b:
            continue
        ma, mb = sum(a) / len(a), sum(b) / len(b)
        rows.append(
            {
                "metric": label,
                "higher_is_better": higher,
                "before": ma,
                "after": mb,
                "ratio": mb / ma if ma else None,
                "before_range": [min(a), max(a)],
                "after_range": [min(b), max(b)],
                "verdict": _verdict(a, b, higher),
            }
        )

    def side(reports):
        return [
            {
                "report": r["_path"],
                "framework": r.get("framework"),
                "engine_version": (r.get("provenance") or {}).get("engine_version"),
            }
            for r in reports
        ]

    return {"workload": shared, "before": side(before), "after": side(after), "rows": rows}


def format_table(summary: dict) -> str:
    def who(side):
        first = side[0]
        return f"{first['framework']} {first['engine_version'] or ''}".strip() + f" x{len(side)}"

    w = summary["workload"]
    lines = [
        f"before: {who(summary['before'])}   after: {who(summary['after'])}",
        f"workload: ISL {w['input_len']}, OSL {w['output_len']}, {w['num_prompts']} prompts, concurrency "
        f"{w['concurrency'] or 'unlimited'}, rate {w['request_rate']}, {w['endpoint']}",
        f"{'metric':32} {'before':>12} {'after':>12} {'ratio':>7}  verdict",
    ]
    for row in summary["rows"]:
        ratio = f"{row['ratio']:.3f}" if row["ratio"] is not None else "-"
        lines.append(f"{row['metric']:32} {row['before']:12.2f} {row['after']:12.2f} {ratio:>7}  {row['verdict']}")
    return "\n".join(lines)


def main(sides: list[str], as_json: bool = False) -> int:
    """The CLI's `--compare A B`: the table (or JSON) printed; a mistake is one `UserError` line (exit 2)."""
    from magpie.errors import UserError

    try:
        summary = compare(*sides)
    except CompareError as err:
        raise UserError(f"--compare: {err}") from None
    print(json.dumps(summary, indent=1) if as_json else format_table(summary))
    return 0
