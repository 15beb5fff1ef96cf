"""magpie compare: correctness gate, then speedups of candidates over an explicit baseline."""

from __future__ import annotations

import json

from magpie.cli.oneshot import add_common, options_from, progress


def add_parser(sub) -> None:
    p = sub.add_parser(
        "compare",
        help="compare two or more kernels",
        description="Check every implementation, exclude incorrect ones, then time the rest "
        "interleaved with the baseline and report speedups with 95% intervals.",
    )
    add_common(p, "kernel source files; the first is the baseline unless --baseline says otherwise")
    p.add_argument("--baseline", type=int, default=0, metavar="I", help="index of the baseline (default: 0)")
    p.add_argument("--json", action="store_true", help="print the report JSON on stdout")
    p.set_defaults(run=run)


def run(args) -> int:
    from magpie.execution.oneshot import compare

    compared = compare(options_from(args), args.baseline, progress("compare"))
    if args.json:
        print(json.dumps(compared.report, indent=1, sort_keys=True))
        return 0
    print(table(compared.report))
    print(f"report: {compared.path}")
    return 0


def shape_line(shape: dict, is_baseline: bool) -> str:
    """One timed shape's row under its implementation's: its median and speedup (against the
    baseline median timed beside it), or its timing's state where it has none."""
    from magpie.report.render import against_text

    perf, s = shape.get("performance_result"), shape.get("speedup")
    median = f"{perf['median_us']:.2f}" if perf else "-"
    if is_baseline:
        speed = "baseline"
    elif s:
        speed = f"{s['value']:.2f}x [{s['ci_low']:.2f},{s['ci_high']:.2f}] {s['verdict']}{against_text(s)}"
    else:
        speed = f"timing {shape.get('performance_state')}"
    return f"{shape['shape']:22} {'':12} {median:>12} {speed:>28}"


def table(report: dict) -> str:
    lines = [f"{'implementation':24} {'correctness':12} {'median µs':>12} {'speedup [95% CI]':>28}"]
    for row in report["results"]:
        perf = row.get("performance_result")
        s = row.get("speedup")
        speed = (
            "baseline"
            if row.get("is_baseline")
            else (f"{s['value']:.2f}x [{s['ci_low']:.2f},{s['ci_high']:.2f}] {s['verdict']}" if s else "-")
        )
        if s and s.get("implausible"):
            speed += f" (implausible: re-timed {s['implausible']['retimed']:.2f}x)"
        if s and s.get("bounded_by_calls_alone"):
            from magpie.report.render import bounded_text

            speed += bounded_text(s)
        if s and not row.get("is_baseline"):
            from magpie.report.render import against_text

            speed += against_text(s)  # the baseline timed beside it, not the baseline's own row
        median = f"{perf['median_us']:.2f}" if perf else "-"
        from magpie.report.render import shape_rows, shapes_note

        speed += shapes_note(row)
        lines.append(f"{row['implementation']:24} {row['correctness_state']:12} {median:>12} {speed:>28}")
        for shape in shape_rows(row):  # timed on several shapes: each one's timing and speedup
            lines.append(f"  {shape_line(shape, bool(row.get('is_baseline')))}")
    for item in report["excluded"]:
        lines.append(f"excluded {item['implementation']}: {item['reason']}")
    if report.get("timed_shapes"):
        lines.append(
            f"timed on {'; '.join(report['timed_shapes'])}; each speedup against the baseline timed beside "
            f"that candidate (its median after the speedup), the baseline's row its own timing"
        )
    from magpie.report.render import clock_notes

    for note in clock_notes(report["results"]):
        lines.append(f"GPU clocks{', ' + note['implementation'] if note['implementation'] else ''}: {note['text']}")
    if report.get("time_s"):
        from magpie.report.render import time_spent_text

        lines.append(f"time: {time_spent_text(report['time_s'])}")
    return "\n".join(lines)
