"""The build report's action: gathers what the report shows from the results it depends on (comparisons,
trace analyses, benchmarks and their sweeps) and renders it with `magpie.report.render`. It lives here, above
serving, because a sweep's section is drawn by serving's own table and plot."""

from __future__ import annotations

import json
from pathlib import Path

from markupsafe import Markup

from magpie.report.render import render


def sweep_section(name: str, folder: Path) -> dict:
    """A declared sweep's section: its table and Pareto plot, drawn from the sweep's report in its artifact."""
    from magpie.serving.sweep import SWEEP_REPORT, SweepReport
    from magpie.serving.sweep_plot import COLUMNS, pareto_svg, table_rows

    sweep = SweepReport.model_validate_json((folder / SWEEP_REPORT).read_text())
    return {
        "benchmark": name.split(":", 1)[1],
        "success": sweep.success,
        "repeats": sweep.repeats,
        "server": sweep.server,
        "headings": [heading for _, heading, _ in COLUMNS],
        "rows": table_rows(sweep),
        "svg": Markup(pareto_svg(sweep)),
    }


def report(job, out_dir: Path) -> dict:
    comparisons = [job.dep_results[name] for name in sorted(job.dep_results) if name.startswith("comparison:")]
    trace_sets = [job.dep_results[name] for name in sorted(job.dep_results) if name.startswith("trace_analysis:")]
    # a profiled benchmark's trace analysis is shown with its measurement (the row it belongs to)
    analyses = {
        result["benchmark"]: result
        for name, result in job.dep_results.items()
        if name.startswith("benchmark_trace_analysis:")
    }
    benchmarks = [
        {**job.dep_results[name], "analysis": analyses.get(job.dep_results[name]["benchmark"])}
        for name in sorted(job.dep_results)
        if name.startswith("benchmark:")
    ]
    sweeps = [
        sweep_section(name, Path(job.dep_dirs[name]))
        for name in sorted(job.dep_results)
        if name.startswith("benchmark_sweep:")
    ]
    from magpie.serving.ab import REPORT

    ab_tests = [
        json.loads((Path(job.dep_dirs[name]) / REPORT).read_text())
        for name in sorted(job.dep_results)
        if name.startswith("benchmark_ab:")
    ]
    project = job.spec.params["project"]
    for name, text in render(comparisons, project, trace_sets, benchmarks, sweeps, ab_tests).items():
        (out_dir / name).write_text(text)
    return {
        "state": "SUCCESS",
        "kernels": [c["kernel"] for c in comparisons],
        "trace_sets": [t["trace_set"] for t in trace_sets],
        "files": ["report.html", "summary.md"],
        "errors": [],
    }
