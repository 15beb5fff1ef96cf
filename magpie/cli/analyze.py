"""magpie analyze: judge one kernel (compile, correctness, timing) and write analyze_report.json."""

from __future__ import annotations

import json

from magpie.cli.oneshot import add_common, build_project, run_and_collect, start_pool, write_json

STATE_KEYS = ("compiling_state", "correctness_state", "performance_state", "performance_result", "numerics",
              "verdict", "errors", "warnings", "failures", "flags", "numerics_margin", "time_s")


def add_parser(sub) -> None:
    p = sub.add_parser("analyze", help="analyze one kernel",
                       description="Compile, check and time one kernel in isolated subprocesses. Exits 1 if the "
                                   "kernel is not correct.")
    add_common(p, "the kernel's source file")
    p.add_argument("--json", action="store_true", help="print the report JSON on stdout")
    p.set_defaults(run=run)


def run(args) -> int:
    start_pool(args)  # these verbs always evaluate
    from magpie.supervision import zygote

    with zygote.session(prestart=True):
        project, out = build_project(args, "analyze", baseline_index=None)
        comparison = run_and_collect(project, args.jobs, "analyze", args.trust_code)
    row = comparison["results"][0]
    report = {"kernel": row["implementation"], **{k: row.get(k) for k in STATE_KEYS}}
    kernel = project.manifest.kernel[0]
    report["type"] = kernel.impl_type(kernel.baseline)
    report["source"] = kernel.baseline.source
    from magpie.report.models import AnalyzeReport, checked

    write_json(out / "analyze_report.json", checked(AnalyzeReport, report))
    if args.json:
        print(json.dumps(report, indent=1, sort_keys=True))
    else:
        from magpie.report.render import spread_text

        perf = report["performance_result"]
        timing = f"median {perf['median_us']:.2f} µs (n={perf['n']}, p20-p80 {spread_text(perf)})" if perf else "not timed"
        print(f"{report['kernel']}: compile {report['compiling_state']}, correctness {report['correctness_state']} "
              f"({report['verdict']}), {timing}")
        print(f"report: {out / 'analyze_report.json'}")
    return 0 if report["correctness_state"] == "SUCCESS" else 1
