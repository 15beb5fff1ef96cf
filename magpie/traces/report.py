"""Write the trace analysis: gap analysis CSVs (all ranks and per rank, sources when asked),
GPU timelines, per-trace roofline CSVs and op tables, a JSON summary for agents and a page
for people. Callable from the CLI and from rules alike."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

from magpie.report.render import render_trace_report
from magpie.roofline.model import roofline
from magpie.roofline.specs import lookup
from magpie.store import atomic_write
from magpie.traces.collectives import COLUMNS as COLL_COLUMNS
from magpie.traces.collectives import coll_analysis
from magpie.traces.gap import COLUMNS, Window, gap_rows, window_total_us
from magpie.traces.ingest import NotATrace, Trace, TraceError, collector_paused, load_trace, trace_files
from magpie.traces.kernels import normalize
from magpie.traces.ops_tables import MIB, PERF_FAMILIES, table_columns
from magpie.traces.perf_rows import TraceCalls, trace_tables
from magpie.traces.roofline_table import COLUMNS as ROOFLINE_COLUMNS
from magpie.traces.roofline_table import roofline_rows
from magpie.traces.sources import SourceIndex, resolve
from magpie.traces.stages import split_steps, stage_traces
from magpie.traces.steady import steady_state_window
from magpie.traces.timeline import COLUMNS as TIMELINE_COLUMNS
from magpie.traces.timeline import gpu_timeline


def _csv(rows: list[dict], columns: list[str]) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=columns, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()


def _rank_label(trace: Trace, index: int) -> str:
    """The rank a trace claims: its distributedInfo's, else its position."""
    return str(trace.rank if trace.rank is not None else index)


def _rank_labels(traces: list[Trace]) -> list[str]:
    """Each trace's rank, with its position added where several traces claim one (repeated
    captures of rank 0, or a rank beside an unranked trace), so that no rank's rows, per-rank CSV
    or timeline takes another's place."""
    return _numbered_where_shared([_rank_label(t, i) for i, t in enumerate(traces)])


def _numbered_where_shared(labels: list[str]) -> list[str]:
    """The labels, each one that several share followed by its position."""
    return [f"{label}_{i}" if labels.count(label) > 1 else label for i, label in enumerate(labels)]


def _shared_ranks(traces: list[Trace], ranks: list[str]) -> list[str]:
    """A warning per rank that several traces claim, naming them and their labels."""
    claims: dict[str, list[int]] = {}
    for i, trace in enumerate(traces):
        claims.setdefault(_rank_label(trace, i), []).append(i)
    return [
        f"rank {rank} is claimed by {len(found)} traces ({', '.join(traces[i].path for i in found)}): "
        f"labelled {', '.join(ranks[i] for i in found)}"
        for rank, found in claims.items()
        if len(found) > 1
    ]


@collector_paused()
def analyze_traces(
    trace_dir: str | Path,
    out_dir: str | Path,
    *,
    top_k: int = 20,
    window: Window | None = None,
    include: set[str] | None = None,
    exclude: set[str] | None = None,
    min_duration_us: float = 0.0,
    arch_name: str | None = None,
    source_repos: list[str | Path] | None = None,
    steady_state: bool = False,
    analysis_mode: str = "pytorch",
) -> dict:
    window = window or Window()
    out = Path(out_dir)
    traces, skipped, bad = _load_all(trace_dir)
    windows, picks = [window] * len(traces), []
    if steady_state:
        for i, trace in enumerate(traces):
            picked, info = steady_state_window(trace)
            picks.append({"trace": trace.path, **info})
            windows[i] = picked or window
    ranks = _rank_labels(traces)
    per_rank = {
        ranks[i]: gap_rows(
            t, windows[i], include=include, exclude=exclude, min_duration_us=min_duration_us, rank_label=ranks[i]
        )
        for i, t in enumerate(traces)
    }
    timelines = {ranks[i]: gpu_timeline(t) for i, t in enumerate(traces)}
    top = _combined_top(per_rank, top_k, {ranks[i]: Path(t.path).name for i, t in enumerate(traces)})
    columns = list(COLUMNS)
    if source_repos:
        columns += _map_sources(top, source_repos, out)
    atomic_write(out / "gap_analysis" / "gap_analysis.csv", _csv(top, columns))
    if len(per_rank) > 1:
        for rank, rows in per_rank.items():
            atomic_write(out / "gap_analysis" / f"gap_analysis_rank{rank}.csv", _csv(rows[:top_k], COLUMNS))
    for rank, devices in timelines.items():
        for device, rows in devices.items():
            suffix = "" if len(timelines) == 1 and len(devices) == 1 else f"_rank{rank}_dev{device}"
            atomic_write(out / f"gpu_timeline{suffix}.csv", _csv(rows, TIMELINE_COLUMNS))
    labels = _labels(traces)
    pages, calls = [], []
    for i, t in enumerate(traces):
        trace_calls = TraceCalls.of(t)
        pages.append(
            _per_trace_outputs(
                t, out / "tracelens", labels[i], arch_name, timelines[ranks[i]], rank=ranks[i], calls=trace_calls
            )
        )
        calls.append(trace_calls if analysis_mode == "inference" else None)  # what its stages' tables are made of
    tracelens = _tracelens_analysis(traces, labels, out, analysis_mode, arch_name, top_k, pages, calls)
    without_kernels = [t for t in traces if not t.kernels]
    summary = {
        "explanation": _explanation(traces, without_kernels),
        "bad_traces": bad,
        "traces": [
            {
                "path": t.path,
                "rank": ranks[i],
                "device": t.device_name(),
                "kernels": len(t.kernels),
                "unlinked": t.unlinked,
                "skipped_events": t.skipped,
            }
            for i, t in enumerate(traces)
        ],
        "window": {"start_pct": window.start_pct, "end_pct": window.end_pct, "steady_state": steady_state},
        "window_picks": picks,
        "total_kernel_time_us": sum(window_total_us(t, windows[i]) for i, t in enumerate(traces)),
        "top_k": top_k,
        "top": top,
        "gpu_timeline": timelines,
        "outputs": {
            "gap_analysis": str(out / "gap_analysis" / "gap_analysis.csv"),
            "kernel_roofline_simple": [page["roofline_file"] for page in pages],
        },
        "warnings": [
            f"{t.path}: {n} kernels could not be linked to a launch"
            for t in traces
            if (n := t.unlinked.get("kernels_without_launch"))
        ]
        + [f"skipped {message}" for message in skipped]
        + [f"skipped a bad trace, the other {len(traces)} analysed: {b['error']}" for b in bad]
        + _shared_ranks(traces, ranks)
        + [f"{t.path}: {_no_kernels(t)}" for t in without_kernels]
        + [
            f"{p['trace']}: no steady state picked ({p['reason']}); the whole window is used"
            for p in picks
            if not p["picked"]
        ],
        "errors": [],
        "tracelens_analysis": tracelens,
    }
    summary["warnings"] += tracelens["warnings"]
    summary["pages"] = [{k: v for k, v in page.items() if k not in ("roofline_file", "table_files")} for page in pages]
    atomic_write(out / "gap_analysis" / "gap_analysis.json", json.dumps(summary, indent=1))
    atomic_write(out / "trace_report.html", render_trace_report(summary))
    summary["outputs"]["report"] = str(out / "trace_report.html")
    return summary


def _no_kernels(trace: Trace) -> str:
    """Why a trace gives no kernel rows, in one line."""
    if not trace.gpu:
        return (
            "no GPU activity recorded (a CPU-only profile? record with ProfilerActivity.CUDA); "
            "its GPU outputs are empty"
        )
    return f"no GPU kernels, only {len(trace.gpu)} memcpy/memset; its kernel tables are empty"


def _explanation(traces: list[Trace], without_kernels: list[Trace]) -> str:
    """Non-empty where the outputs are empty for a reason the reader should hear: no trace has kernels."""
    if traces and len(without_kernels) == len(traces):
        return "no GPU kernels in any trace, so every kernel table is empty: " + "; ".join(
            f"{Path(t.path).name}: {_no_kernels(t)}" for t in traces
        )
    return ""


def _load_all(trace_dir) -> tuple[list[Trace], list[str], list[dict]]:
    """The traces under trace_dir; JSON that is no trace is skipped (its message kept), and so is
    a truncated or corrupt trace while another one loads (one bad rank does not stop the others:
    {"path", "error"} each); with none loaded, the first bad trace's error."""
    traces, skipped, bad = [], [], []
    for path in trace_files(trace_dir):
        try:
            traces.append(load_trace(path))
        except NotATrace as err:
            skipped.append(str(err))
        except TraceError as err:
            bad.append({"path": str(path), "error": str(err)})
    if not traces:
        if bad:
            raise TraceError(bad[0]["error"] + (f" (and {len(bad) - 1} more bad traces)" if len(bad) > 1 else ""))
        raise TraceError(f"{trace_dir}: no PyTorch profiler traces among its JSON files ({skipped[0]})")
    return traces, skipped, bad


def _combined_top(per_rank: dict[str, list[dict]], top_k: int, files: dict[str, str]) -> list[dict]:
    """Rows of every rank ranked together, percentages taken over all ranks' kernel time; each
    row names its trace's file (`Trace`): a rank label alone may be a trace's place in the folder."""
    rows = [r for rank_rows in per_rank.values() for r in rank_rows]
    total = sum(r["Self CUDA total (us)"] for r in rows) or 1.0
    rows = [
        {**r, "% Total": round(100 * r["Self CUDA total (us)"] / total, 3), "Trace": files.get(r["Rank"])} for r in rows
    ]
    rows.sort(key=lambda r: -r["Self CUDA total (us)"])
    return rows[:top_k]


def _map_sources(top: list[dict], source_repos, out: Path) -> list[str]:
    """Resolve each top kernel to its source; returns the CSV columns this adds."""
    index = SourceIndex([Path(r) for r in source_repos])
    for row in top:
        found = resolve(row["Name"], index)
        row["source"] = found
        row["Source State"] = found["state"]
        row["Source"] = (
            f"{found['file']}:{found['line']}"
            if found["state"] == "resolved"
            else found.get("library") or "; ".join(f"{c['file']}:{c['line']}" for c in found.get("candidates", []))
        )
        row["Source Confidence"] = found["confidence"]
    atomic_write(
        out / "gap_analysis" / "kernel_sources.json",
        json.dumps(
            {
                "repositories": [str(r) for r in index.repos],
                "files_indexed": index.files_read,
                "kernels": [{"name": r["Name"], **r["source"]} for r in top],
            },
            indent=1,
        ),
    )
    return ["Source State", "Source", "Source Confidence"]


def _labels(traces: list[Trace]) -> list[str]:
    """A label per trace for its output files: the file name, with its folder where two traces
    share a name (rank0/trace.json, rank1/trace.json), and its position where that still does."""
    names = [Path(t.path).name.removesuffix(".gz").removesuffix(".json") for t in traces]
    return _numbered_where_shared(
        [f"{Path(t.path).parent.name}_{n}" if names.count(n) > 1 else n for t, n in zip(traces, names)]
    )


def _tracelens_analysis(
    traces: list[Trace],
    labels: list[str],
    out: Path,
    mode: str,
    arch_name: str | None,
    top_k: int,
    pages: list[dict],
    calls: list[TraceCalls | None],
) -> dict:
    """The `tracelens_analysis` block: what was written, and in inference mode the per-stage
    outputs of each trace (from its calls) with the steps picked and why."""
    outputs = [path for page in pages for path in (page["roofline_file"]["path"], *page["table_files"])]
    block = {"analysis_mode": mode, "outputs": outputs, "per_stage": {}, "picks": [], "warnings": [], "errors": []}
    if mode != "inference":
        return block
    for trace, label, page, trace_calls in zip(traces, labels, pages, calls):
        steps, how = split_steps(trace)
        block["picks"].append({"trace": trace.path, **{k: v for k, v in how.items() if k != "warnings"}})
        block["warnings"] += [f"{trace.path}: {w}" for w in how.get("warnings", [])]
        if not steps:
            block["warnings"].append(f"{trace.path}: no steps found ({how['reason']}); no per-stage outputs")
            continue
        stages = {}
        for stage, (view, spans, pick) in stage_traces(trace, steps).items():
            folder = out / "tracelens" / label / stage
            atomic_write(folder / "gap_analysis.csv", _csv(gap_rows(view, Window(), top_k=top_k), COLUMNS))
            timeline_files = []
            for device, rows in gpu_timeline(view, spans).items():
                # named as the whole trace's: by the devices it ran on, not those its process saw
                suffix = "" if len(page["timelines"]) <= 1 else f"_dev{device}"
                timeline_files.append(str(folder / f"gpu_timeline{suffix}.csv"))
                atomic_write(folder / f"gpu_timeline{suffix}.csv", _csv(rows, TIMELINE_COLUMNS))
            page = _per_trace_outputs(
                view,
                folder,
                f"{label}_{stage}",
                arch_name,
                {},
                tables_folder=folder,
                whole_trace=False,
                calls=trace_calls.stage(view),
            )
            files = [
                str(folder / "gap_analysis.csv"),
                *timeline_files,
                page["roofline_file"]["path"],
                *page["table_files"],
            ]
            stages[stage] = {**pick, "files": files}
            block["outputs"] += files
        block["per_stage"][label] = stages
    return block


def _per_trace_outputs(
    trace: Trace,
    folder: Path,
    label: str,
    arch_name: str | None,
    timelines: dict,
    tables_folder: Path | None = None,
    whole_trace: bool = True,
    rank: str = "",
    calls: TraceCalls | None = None,
) -> dict:
    """The roofline CSV and op tables of one trace (made of its `calls`), with its collective
    analysis where it has collectives (or, not `whole_trace`, one stage of it: the family sheets
    then leave out the calls that launched nothing); returns what its section of the page shows."""
    arch = trace_arch(trace, arch_name)
    target = folder / f"{label}_kernel_roofline_simple.csv"
    groups, tables = trace_tables(trace, arch, idle_calls=whole_trace, calls=calls)
    atomic_write(target, _csv(roofline_rows(groups, arch), ROOFLINE_COLUMNS))
    table_files = []
    for name, rows in tables.items():
        if rows or name not in PERF_FAMILIES:  # a family sheet only where the trace has such ops, as TraceLens does
            table_files.append(str((tables_folder or folder / label) / f"{name}.csv"))
            atomic_write(Path(table_files[-1]), _csv(rows, table_columns(name, rows)))
    for device, rows in timelines.items():  # beside the trace's other tables, where TraceLens writes it
        suffix = "" if len(timelines) == 1 else f"_dev{device}"
        table_files.append(str(folder / label / f"gpu_timeline{suffix}.csv"))
        atomic_write(Path(table_files[-1]), _csv(rows, TIMELINE_COLUMNS))
    if whole_trace and trace.collectives:  # as TraceLens's, only where there are collectives
        table_files.append(str(folder / label / "coll_analysis.csv"))
        atomic_write(Path(table_files[-1]), _csv(coll_analysis(trace, rank), COLL_COLUMNS))
    peaks = ("measured (magpie calibrate)" if arch.measured else arch.source) if arch else "none: pass --arch"
    return {
        "label": label,
        "device": trace.device_name(),
        "kernels": len(trace.kernels),
        "unlinked": trace.unlinked,
        "peaks": peaks,
        "timelines": timelines,
        "ops": _named_launches(tables["ops_summary"][:15], groups),
        "roofline_points": _roofline_points(tables["unified_perf_summary"], arch),
        "roofline_file": {"path": str(target), "arch": arch.name if arch else None, "peaks": peaks},
        "table_files": table_files,
    }


def trace_arch(trace: Trace, arch_name: str | None):
    """The peaks a trace's rooflines are held against: its own device's, else `arch_name`'s."""
    return (lookup(trace.device_name()) if trace.device_name() else None) or (lookup(arch_name) if arch_name else None)


def _named_launches(ops: list[dict], groups) -> list[dict]:
    """The page's op rows, where a row is a runtime call outside any op (cudaGraphLaunch,
    cuLaunchKernelEx) named with the kernels it launched: the call's name alone says nothing."""
    kernels: dict[str, dict] = {}
    for group in groups:
        if group.op is None:
            for name in group.kernel_names:
                kernels.setdefault(group.op_name, {})[normalize(name)] = True
    shown = []
    for row in ops:
        names = list(kernels.get(row["name"], ()))
        if names:
            more = f", +{len(names) - 3} more" if len(names) > 3 else ""
            row = {**row, "name": f"{row['name']}: {', '.join(names[:3])}{more}"}
        shown.append(row)
    return shown


def _roofline_points(unified: list[dict], arch, limit: int = 12) -> list[tuple[str, dict]]:
    if arch is None:
        return []
    points = []
    for row in unified:
        if row.get("GFLOPS") and row.get("Data Moved (MB)") and row["Kernel Time (µs)_mean"] > 0:
            r = roofline(
                row["GFLOPS"] * 1e9,
                row["Data Moved (MB)"] * MIB,
                row["Kernel Time (µs)_mean"] / 1e6,
                arch,
                row["compute_spec"],
            )
            points.append((row["name"].removeprefix("aten::"), {**r, "shapes": _shapes(row.get("Input Dims"))}))
        if len(points) == limit:
            break
    return points


def _shapes(dims) -> str:
    """An op's input dims as the report shows them: the tensors' shapes, not the trailing empty
    entries of its scalar arguments (a convolution lists six)."""
    text = str(dims or "")
    while text.endswith(", []]"):
        text = text[: -len(", []]")] + "]"
    return text


def trace_analysis_rule(job, out_dir: Path) -> dict:
    """The trace_analysis rule: one declared folder of traces analysed into the artifact."""
    trace = job.spec.params["settings"]["trace"]
    root = Path(job.spec.params["root"])
    try:
        summary = analyze_traces(
            root / trace["dir"],
            out_dir,
            top_k=trace["top_k"],
            arch_name=trace["arch"],
            steady_state=trace["steady_state"],
            analysis_mode=trace["analysis_mode"],
            source_repos=[root / r for r in trace["kernel_source_repos"]] or None,
        )
    except TraceError as err:
        return {"state": "FAILED", "trace_set": trace["id"], "errors": [str(err)]}
    from magpie.report.models import TraceSummary, checked  # here, not on the CLI's path: pydantic costs 0.18 s

    checked(TraceSummary, summary)
    # Paths inside the artifact are kept relative to it: the artifact moves into the store.
    text = json.dumps(summary).replace(json.dumps(str(out_dir) + "/")[1:-1], "")
    return {"state": "SUCCESS", "trace_set": trace["id"], "summary": json.loads(text), "errors": []}
