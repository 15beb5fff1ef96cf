"""magpie analyze: judge one kernel (compile, correctness, timing) and write analyze_report.json."""

from __future__ import annotations

import json

from magpie.cli.oneshot import add_common, options_from, progress


def add_parser(sub) -> None:
    p = sub.add_parser(
        "analyze",
        help="analyze one kernel",
        description="Compile, check and time one kernel in isolated subprocesses. Exits 1 if the "
        "kernel is not correct.",
    )
    add_common(p, "the kernel's source file")
    p.add_argument("--json", action="store_true", help="print the report JSON on stdout")
    p.set_defaults(run=run)


def run(args) -> int:
    from magpie.execution.oneshot import analyze

    analyzed = analyze(options_from(args), progress("analyze"))
    report = analyzed.report
    if args.json:
        print(json.dumps(report, indent=1, sort_keys=True))
    else:
        from magpie.report.render import spread_text

        perf = report["performance_result"]
        timing = (
            f"median {perf['median_us']:.2f} µs (n={perf['n']}, p20-p80 {spread_text(perf)})" if perf else "not timed"
        )
        print(
            f"{report['kernel']}: compile {report['compiling_state']}, correctness {report['correctness_state']} "
            f"({report['verdict']}), {timing}"
        )
        print(f"report: {analyzed.path}")
    return 0 if report["correctness_state"] == "SUCCESS" else 1
