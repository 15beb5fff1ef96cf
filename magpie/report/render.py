"""The report action: every kernel's comparison rendered to HTML and Markdown."""

from __future__ import annotations

import datetime
import os

from jinja2 import Environment, FileSystemBytecodeCache, FileSystemLoader, select_autoescape
from markupsafe import Markup

from magpie.paths import cache_root, templates_dir
from magpie.report.plots import roofline_chart, roofline_plot, speedup_bars, timeline_bar, timing_boxes


def time_spent_text(spent: dict) -> str:
    """A comparison's `time_s` in one sentence (the compare table, the HTML and Markdown reports)."""
    return (
        f"compile {spent['compile']:.1f} s; new workers' start (sandbox, CUDA context) "
        f"{spent.get('worker_starts') or 0.0:.1f} s; first calls in new workers (JIT, autotuning) "
        f"{spent['first_calls']:.1f} s; device held alone {spent['device_held']:.1f} s; job time summed: "
        f"correctness {spent['correctness']:.1f} s, timing {spent['timing']:.1f} s"
    )


def bounded_text(speedup: dict | None) -> str:
    """What a speedup credited at its candidate's calls made alone says beside its interval
    (the compare table, the HTML and Markdown reports); "" for any other."""
    bounded = (speedup or {}).get("bounded_by_calls_alone")
    return f" (credited at its calls made alone; its batches read {bounded['batches_value']:.3g}x)" if bounded else ""


def spread_text(perf: dict) -> str:
    """The headline spread of a timing: ±half the p20-p80 range over the median (robust to
    the tails that inflate the CV, which stays in the JSON)."""
    rel = perf.get("spread_rel")
    if rel is None:  # a result from before the key existed
        rel = (perf["p80_us"] - perf["p20_us"]) / (2 * perf["median_us"]) if perf["median_us"] else 0.0
    return f"±{rel:.1%}"


def profile_notes(rows: list[dict]) -> list[dict]:
    """What a kernel's profiles add to its table, a line each: a failed profile (a warning; the
    row's timing and ranking stand), a command-only kernel's profiler time (labelled so), or
    the profile's notes (no kernel ran in the profiled range)."""
    notes = []
    for row in rows:
        profile = row.get("profile") or {}
        if profile.get("state") == "FAILED":
            text = (
                f"profile failed, no counters or roofline ({'; '.join(profile.get('errors') or [])}); "
                f"its timing and ranking stand"
            )
            notes.append({"implementation": row["implementation"], "warning": True, "text": text})
        elif row.get("profiler_time"):
            spent = row["profiler_time"]
            notes.append(
                {
                    "implementation": row["implementation"],
                    "warning": False,
                    "text": f"{spent['kernel_us']:,.2f} µs of kernel time over {spent['launches']} profiled "
                    f"launch(es): {spent['method']}",
                }
            )
        elif profile.get("notes"):
            notes.append(
                {
                    "implementation": row["implementation"],
                    "warning": False,
                    "text": "profile: " + "; ".join(profile["notes"]),
                }
            )
    return notes


def clock_notes(rows: list[dict]) -> list[dict]:
    """The GPU clocks each row's timing ran at (`harness.clocks`), a line each; where none were
    read (the CPU, no NVML), one line that says why."""
    from magpie.harness.clocks import clock_text

    records = [(row["implementation"], (row.get("performance_result") or {}).get("clocks")) for row in rows]
    read = [
        {"implementation": impl, "text": clock_text(record)}
        for impl, record in records
        if (record or {}).get("readings")
    ]
    if read:
        return read
    reasons = sorted({record["reason"] for _, record in records if record and record.get("reason")})
    return [{"implementation": None, "text": f"clocks not read: {reason}"} for reason in reasons]


def template_environment(markup: str = "html") -> Environment:
    """The templates' environment for HTML pages (escaped) or Markdown (not). Templates are
    compiled once and kept in magpie's cache folder, one per kind (the kind changes the code
    Jinja makes, which its cache does not key by): compiling the report's took 40-60 ms in
    every report job on the CPU machine, loading them takes a few."""
    env = Environment(
        loader=FileSystemLoader(str(templates_dir())),
        autoescape=select_autoescape(["html", "j2"], default_for_string=False) if markup == "html" else False,
        trim_blocks=True,
        lstrip_blocks=True,
        bytecode_cache=_compiled_templates(markup),
    )
    env.filters["us"] = lambda v: "—" if v is None else f"{v:,.2f}"
    env.filters["time_spent"] = time_spent_text
    env.filters["spread"] = lambda p: "—" if not p else spread_text(p)
    env.filters["x"] = lambda s: (
        "—"
        if not s
        else (
            "baseline"
            if s.get("verdict") == "baseline"
            else f"{s['value']:.3g}× [{s['ci_low']:.3g}, {s['ci_high']:.3g}] {s['verdict']}{bounded_text(s)}"
            f"{against_text(s)}"
        )
    )
    env.filters["md"] = markdown_text
    env.filters["shapes_note"] = shapes_note
    env.filters["shape_rows"] = shape_rows
    return env


def shapes_note(row: dict) -> str:
    """What a row's speedup over several timed shapes is, beside it (the compare table, the
    reports): their geometric mean, or inconclusive where a shape's timing was; "" for one shape."""
    summary = row.get("shapes_summary")
    if not summary:
        return ""
    if summary["verdict"] == "inconclusive":
        return f" ({summary['shapes']} shapes: inconclusive, a shape's timing was)"
    return f" (geometric mean of {summary['shapes']} shapes)"


def shape_rows(row: dict) -> list[dict]:
    """A row's timed shapes, each with its own timing and speedup, where it was timed on several."""
    shapes = row.get("shapes") or []
    return shapes if len(shapes) > 1 else []


def against_text(speedup: dict) -> str:
    """The baseline median a speedup was computed from: the baseline timed beside that
    candidate, not the baseline's own row (timed alone)."""
    median = speedup.get("baseline_median_us")
    return f" vs baseline {median:,.2f} µs" if median is not None else ""


# What Markdown (and the HTML it allows inline) would read as markup in a line of text
MARKDOWN_SPECIALS = str.maketrans({c: "\\" + c for c in "\\`*_[]~|#"} | {"<": "&lt;", ">": "&gt;", "&": "&amp;"})


def markdown_text(text) -> str:
    """A line of text (a failure message, code under test's words among them) that a Markdown
    renderer shows as it is: no emphasis, links, HTML or table cells of its making."""
    return str(text).replace("\n", " ").translate(MARKDOWN_SPECIALS)


def _compiled_templates(markup: str) -> FileSystemBytecodeCache | None:
    """Where compiled templates are kept; None (each compiled where it is used) where the
    cache folder cannot be written (a read-only home)."""
    import jinja2

    folder = cache_root() / "templates" / f"jinja2-{jinja2.__version__}-{markup}"
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    return FileSystemBytecodeCache(str(folder)) if os.access(folder, os.W_OK) else None


def ab_evidence(report: dict) -> list[dict]:
    """What a kernel win inside the workload rests on (issue 43.5), each item present or missing: per kernel put
    in, its correctness record and its paired micro-benchmark; then the E2E A/B and the output-equivalence gate.
    A claim with any item missing is not a win, so the section shows the gaps as plainly as the evidence."""
    items = []
    for put_in in report.get("replacements", []):
        name = f"{put_in.get('kernel')}/{put_in.get('implementation')}"
        state = put_in.get("correctness_state")
        items.append({"what": f"{name} correctness", "present": state == "SUCCESS", "detail": str(state)})
        speedup = put_in.get("speedup") or {}
        if speedup.get("value") is None:
            items.append({"what": f"{name} paired micro-benchmark", "present": False, "detail": "none (baseline?)"})
        else:
            interval = (
                f" [{speedup['ci_low']:.3f}, {speedup['ci_high']:.3f}]" if speedup.get("ci_low") is not None else ""
            )
            items.append(
                {
                    "what": f"{name} paired micro-benchmark",
                    "present": True,
                    "detail": f"{speedup['value']:.3f}x{interval} {speedup.get('verdict', '')}".rstrip(),
                }
            )
    throughput = report.get("metrics", {}).get("output_throughput", {})
    measured = throughput.get("verdict") not in (None, "unmeasured")
    items.append(
        {
            "what": "end-to-end A/B",
            "present": measured,
            "detail": f"{report.get('pairs')} interleaved pair(s), output throughput {throughput.get('verdict')}",
        }
    )
    gate = report.get("gate", {})
    items.append(
        {
            "what": "output-equivalence gate",
            "present": bool(gate.get("passed")),
            "detail": f"{gate.get('matched')} of {gate.get('prompts')} greedy generations the same",
        }
    )
    return items


def render(
    comparisons: list[dict],
    project: str,
    trace_sets: list[dict] | None = None,
    benchmarks: list[dict] | None = None,
    sweeps: list[dict] | None = None,
    ab_tests: list[dict] | None = None,
) -> dict[str, str]:
    """The report's pages; `ab_tests`: the benchmarks' A/B reports (ab_report.json) as they were written."""
    env = template_environment()
    kernels = []
    for comp in comparisons:
        methods = sorted({r["performance_result"]["method"] for r in comp["results"] if r.get("performance_result")})
        kernels.append(
            {
                **comp,
                "methods": methods,
                "profile_notes": profile_notes(comp["results"]),
                "clock_notes": clock_notes(comp["results"]),
                "timed_shapes": comp.get("timed_shapes", []),
                "timing_svg": Markup(timing_boxes(comp["results"])),
                "speedup_svg": Markup(speedup_bars(comp["results"])),
                "roofline_svg": Markup(roofline_plot(comp["results"])),
            }
        )
    traces = [
        {**t, "pages": _trace_pages(t["summary"]), "per_stage": t["summary"]["tracelens_analysis"]["per_stage"]}
        if t.get("summary")
        else t
        for t in trace_sets or []
    ]
    context = {
        "project": project,
        "kernels": kernels,
        "trace_sets": traces,
        "benchmarks": benchmarks or [],
        "sweeps": sweeps or [],
        "ab_tests": [{**ab, "evidence": ab_evidence(ab)} for ab in ab_tests or []],
        "generated": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }
    html = env.get_template("report.html.j2").render(**context)
    markdown = template_environment("markdown").get_template("summary.md.j2").render(**context)
    return {"report.html": html, "summary.md": markdown}


def _trace_pages(summary: dict) -> list[dict]:
    """The summary's per-trace pages with their plots drawn (the summary is left as it is)."""
    pages = []
    for page in summary["pages"]:
        pages.append(
            {
                **page,
                "timeline_svgs": [(device, Markup(timeline_bar(rows))) for device, rows in page["timelines"].items()],
                "roofline_svg": Markup(roofline_chart([tuple(p) for p in page["roofline_points"]])),
            }
        )
    return pages


def render_trace_report(summary: dict) -> str:
    """The trace analysis as a page: per trace, the GPU timeline, the stages (inference mode),
    the top ops and the ops on the roofline; then the top kernels across traces."""
    env = template_environment()
    generated = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return env.get_template("trace_report.html.j2").render(
        pages=_trace_pages(summary),
        per_stage=summary["tracelens_analysis"]["per_stage"],
        top=summary["top"],
        window=summary["window"],
        generated=generated,
    )
