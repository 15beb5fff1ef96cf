"""The `benchmark` rule's action (rules/serving.toml): one declared `[[benchmark]]` run into the store.

The run's workspace is the artifact's folder: `benchmark_report.json`, `bench_serve_result.json`,
`server.log`, `benchmark_config.json`. The result carries a summary for the build report
(throughput, TTFT/TPOT/ITL/E2EL medians and p99, counts, errors). A run that fails raises, so
nothing is stored and the next build runs it again (a server that did not start is not a
result worth keeping); its one-line reason is the task's error. The failed run's files (its server log and
report; not its traces) are kept in `<workspace>/failed/<rule>/<id>/`, which that line names, until a run
of the task succeeds.

A benchmark declared with `profiler = true` has two more nodes: `benchmark_profile` (`profile_rule`: the same
run, diagnostic, under the engine's torch profiler, its traces in the artifact's `torch_trace/`, left
unanalysed) and `benchmark_trace_analysis` (`trace_analysis_rule`: those traces in inference mode into
`tracelens/`, `gap_analysis/`, `trace_report.html`, and the profiled run's `benchmark_report.json` with its
`tracelens_analysis`, `gap_analysis`, `kernel_summary` and `top_bottlenecks` filled). The measurement run never
runs under a profiler.
"""

from __future__ import annotations

import json
import math
from pathlib import Path


class BenchmarkFailed(RuntimeError):
    """A declared benchmark did not succeed; the message is its first error."""


def config_of(bench: dict, root: Path, out_dir: Path, profiler: bool = False):
    """The run config of a `[[benchmark]]` table (as the manifest model dumps it); with `profiler`, of its
    profiled (diagnostic) run."""
    from magpie.serving.report import BenchmarkConfig

    def beside_manifest(name):
        if name is None or Path(name).is_absolute() or not (root / name).exists():
            return name
        return str((root / name).resolve())

    model = beside_manifest(bench["model"])
    load, slo = bench["load"], bench["slo"]
    rate = load["request_rate"]
    return BenchmarkConfig(
        framework=bench["engine"],
        model=model,
        precision=bench["precision"],
        tp=bench["tp"],
        max_model_len=bench["max_model_len"],
        extra_server_args=bench["extra_server_args"],
        env=bench["env"],
        run_kind=bench["run_kind"],
        run_mode=bench["run_mode"],
        docker_image=bench["docker_image"],
        host=bench["host"],
        port=bench["port"],
        base_url=bench["base_url"],
        endpoint=load["endpoint"],
        concurrency=load["concurrency"],
        input_len=load["input_len"],
        output_len=load["output_len"],
        range_ratio=load["range_ratio"],
        num_prompts=load["num_prompts"],
        prefix_len=load["prefix_len"],
        tokenizer=beside_manifest(load["tokenizer"]),
        request_rate=math.inf if rate in (None, "inf", "Infinity") else float(rate),
        burstiness=load["burstiness"],
        num_warmups=load["num_warmups"],
        seed=load["seed"],
        timeout_s=bench["timeout_s"],
        goodput={name[:-3]: value for name, value in slo.items() if value is not None},
        output_dir=str(out_dir),
        profiler=profiler,
        # a profiled run's server runs under the profiler's launcher: never one to keep or reuse
        server_lifecycle="reuse" if bench.get("keep_server") and not profiler else "fresh",
    )


def summary(report) -> dict:
    """What the build report shows of a run."""
    out = {"success": report.success, "errors": list(report.errors)}
    if report.throughput is not None:
        thr = report.throughput
        out["throughput"] = {"request": thr.request_throughput, "output_tokens": thr.output_throughput}
    if report.latency is not None:
        out["latency"] = {
            name: {"median": getattr(report.latency, name).median, "p99": getattr(report.latency, name).p99}
            for name in ("ttft", "tpot", "itl", "e2el")
        }
    if report.run is not None:
        out["completed"], out["failed"], out["duration_s"] = (
            report.run.completed,
            report.run.failed,
            report.run.duration_s,
        )
    if report.provenance is not None:
        out["engine_version"] = report.provenance.engine_version
        out["server_reused"] = report.provenance.server_reused
    return out


def failed_run_folder(job) -> Path | None:
    """Where a failed run of this task keeps its files (`<workspace>/failed/<rule>/<id>/`, a sweep point's in
    `<id>/<point>/`); None on a read-only workspace."""
    snapshots = job.spec.params.get("snapshots")
    if snapshots is None:
        return None
    return Path(snapshots).parent / "failed" / job.spec.rule / job.spec.name.split(":", 1)[1]


def _keep_failed_run(out_dir: Path, kept: Path) -> None:
    """The failed run's files (its traces aside) copied to `kept`, their paths to the run's folder made `kept`'s:
    the artifact's folder is removed with the failed task, and the error line names the server log."""
    import shutil

    from magpie.serving.profiling import TRACE_DIR

    shutil.rmtree(kept, ignore_errors=True)
    shutil.copytree(out_dir, kept, ignore=shutil.ignore_patterns(TRACE_DIR))  # traces: too large to keep
    for path in kept.glob("*.json"):
        text = path.read_text()
        for old in {str(out_dir), str(out_dir.resolve())}:
            text = text.replace(json.dumps(old)[1:-1], json.dumps(str(kept))[1:-1])
        path.write_text(text)


def _failed(job, out_dir: Path, first: str, what: str) -> BenchmarkFailed:
    """The failure's one line, its files kept in the failed-run folder that line names."""
    bench = job.spec.params["benchmark"]
    kept = failed_run_folder(job)
    where = ""
    if kept is not None:
        try:
            _keep_failed_run(out_dir, kept)
            first = first.replace(str(out_dir.resolve()), str(kept)).replace(str(out_dir), str(kept))
            where = f"; its files are kept in {kept}"
        except OSError as err:  # a full disk: the failure's own line matters more
            where = f"; its files could not be kept in {kept}: {err.strerror}"
    return BenchmarkFailed(
        f"benchmark {bench['id']!r} ({bench['engine']} {bench['model']}) {what}failed: {first}{where}"
    )


def _succeeded(job) -> None:
    import shutil

    kept = failed_run_folder(job)
    if kept is not None:
        shutil.rmtree(kept, ignore_errors=True)  # an earlier failure's files, superseded


def _run(job, out_dir: Path, profiler: bool):
    from magpie.serving.runner import run_benchmark

    bench = job.spec.params["benchmark"]
    root = job.spec.params["root"]
    if job.spec.params.get("point") is not None:
        return bench, _run_point(job, out_dir)
    report = run_benchmark(config_of(bench, Path(root), out_dir, profiler), analyse=False, project=str(root))
    if not report.success:
        first = report.errors[0] if report.errors else "no request completed"
        raise _failed(job, out_dir, first, "profiled run " if profiler else "")
    _succeeded(job)
    return bench, {
        "state": "SUCCESS",
        "benchmark": bench["id"],
        "engine": bench["engine"],
        "model": bench["model"],
        "run_kind": report.run_kind,
        "summary": summary(report),
        "files": sorted(report.outputs),
        "errors": [],
    }


def _run_point(job, out_dir: Path) -> dict:
    """A sweep point's node: its repeats against the server the sweep's points share (kept by the first, reused
    by the rest; the last point stops it unless the benchmark keeps it), `point.json` beside their folders."""
    from magpie.manifest.sweep_axes import SweepAxes
    from magpie.serving.sweep import run_point, served_port, stop_sweep_server

    params = job.spec.params
    bench, root = params["benchmark"], Path(params["root"])
    point = {axis: math.inf if value == "inf" else value for axis, value in params["point"].items()}
    result, reports = run_point(config_of(bench, root, out_dir), point, params["repeats"], out_dir, str(root))
    if not result.success:
        raise _failed(job, out_dir, result.errors[0] if result.errors else "no run", f"sweep point {result.label} ")
    if not bench["keep_server"] and SweepAxes.model_validate(bench["sweep"]).points()[-1] == point:
        # the last point: no later one of the sweep reuses the server, whether or not its node runs next
        stop_sweep_server([result], bench["host"], served_port([(out_dir, result)]))
    _succeeded(job)
    return {
        "state": "SUCCESS",
        "benchmark": bench["id"],
        "point": result.label,
        "engine": bench["engine"],
        "model": bench["model"],
        "run_kind": reports[0].run_kind,
        "summary": _median_summary([summary(r) for r in reports]),
        "inferencemax": {
            k: result.inferencemax.get(k) for k in ("tput_per_gpu", "output_tput_per_gpu", "median_intvty")
        },
        "errors": [],
    }


def _median_summary(parts: list[dict]) -> dict:
    """The build report's row of a sweep point: each figure the median over its repeats, the counts summed."""
    import statistics

    def median(values):
        return None if any(v is None for v in values) else statistics.median(values)

    out = {"success": all(p["success"] for p in parts), "errors": [e for p in parts for e in p["errors"]]}
    out["repeats"] = len(parts)
    out["throughput"] = {key: median([p["throughput"][key] for p in parts]) for key in ("request", "output_tokens")}
    out["latency"] = {
        name: {stat: median([p["latency"][name][stat] for p in parts]) for stat in ("median", "p99")}
        for name in ("ttft", "tpot", "itl", "e2el")
    }
    out["completed"] = sum(p["completed"] for p in parts)
    out["failed"] = sum(p["failed"] for p in parts)
    out["duration_s"] = sum(p["duration_s"] for p in parts)
    out["engine_version"] = parts[0].get("engine_version")
    out["server_reused"] = [p.get("server_reused", False) for p in parts]
    return out


def benchmark_rule(job, out_dir: Path) -> dict:
    return _run(job, out_dir, profiler=False)[1]


def profile_rule(job, out_dir: Path) -> dict:
    """The `benchmark_profile` rule: the declared benchmark's profiled run, its traces in torch_trace/."""
    from magpie.serving.profiling import TRACE_DIR, traces

    bench, result = _run(job, out_dir, profiler=True)
    found = traces(out_dir / TRACE_DIR)
    if not found:
        raise BenchmarkFailed(f"benchmark {bench['id']!r}: the profiled run wrote no trace into {TRACE_DIR}/")
    return {**result, "traces": [p.relative_to(out_dir).as_posix() for p in found]}


def sweep_rule(job, out_dir: Path) -> dict:
    """The `benchmark_sweep` rule: the points' results (their artifacts' `point.json`) as the sweep's report, table
    and Pareto plot; the server the points kept stopped unless the benchmark keeps it."""
    from magpie.manifest.sweep_axes import DEFAULT_REPEATS, SweepAxes
    from magpie.serving.sweep import POINT, PointResult, served_port, server_of, stop_sweep_server, sweep_report

    params = job.spec.params
    bench, root = params["benchmark"], Path(params["root"])
    points = [name for name in job.spec.deps if name in job.dep_dirs]
    results = [PointResult.model_validate_json((Path(job.dep_dirs[n]) / POINT).read_text()) for n in points]
    stopped = False
    if not bench["keep_server"] and results:
        port = served_port([(Path(job.dep_dirs[n]), r) for n, r in zip(points, results)])
        stopped = stop_sweep_server(results, bench["host"], port)
    axes = SweepAxes.model_validate(bench["sweep"])
    repeats = bench["repeats"] or DEFAULT_REPEATS
    kept = bench["keep_server"] and not stopped
    report = sweep_report(
        config_of(bench, root, out_dir), axes, repeats, results, out_dir, server=server_of(results, kept)
    )
    return {
        "state": "SUCCESS" if report.success else "FAILED",
        "benchmark": bench["id"],
        "repeats": repeats,
        "points": [
            {
                "label": p.label,
                "pareto": p.label in report.pareto_frontier,
                **{k: p.inferencemax.get(k) for k in ("tput_per_gpu", "output_tput_per_gpu", "median_intvty")},
            }
            for p in report.points
        ],
        "pareto_frontier": report.pareto_frontier,
        "server_stopped": stopped,
        "files": sorted(report.outputs),
        "errors": report.errors,
    }


def trace_analysis_rule(job, out_dir: Path) -> dict:
    """The `benchmark_trace_analysis` rule: the profiled run's traces analysed (inference mode) into the artifact,
    with that run's report completed by the analysis. Paths of this artifact's files are relative to it; those of
    the profiled run's name its artifact in the store."""
    from magpie.serving.profiling import TRACE_DIR, analyse
    from magpie.serving.report import BenchmarkReport
    from magpie.serving.runner import REPORT
    from magpie.traces.ingest import TraceError

    bench = job.spec.params["benchmark"]
    profiled = f"benchmark_profile:{bench['id']}"
    run_dir = Path(job.dep_dirs[profiled])
    base = {"benchmark": bench["id"], "profiled_run": job.dep_results[profiled]["summary"]}
    try:
        fields = analyse(run_dir / TRACE_DIR, out_dir)
    except TraceError as err:
        return {"state": "FAILED", **base, "errors": [str(err)]}
    recorded = json.loads((run_dir / REPORT).read_text())
    text = json.dumps(recorded).replace(json.dumps(recorded["workspace_dir"])[1:-1], json.dumps(str(run_dir))[1:-1])
    report = {**json.loads(text), **fields}
    report["outputs"] = {
        **report["outputs"],
        "tracelens": str(out_dir / "tracelens"),
        "gap_analysis": fields["gap_analysis"]["outputs"]["gap_analysis"],
        "trace_report": str(out_dir / "trace_report.html"),
    }
    BenchmarkReport.model_validate(report)
    text = json.dumps(report, indent=1).replace(json.dumps(str(out_dir) + "/")[1:-1], "")
    (out_dir / REPORT).write_text(text + "\n")
    analysed = json.loads(text)
    gap = analysed["gap_analysis"]  # the totals the build report shows (the report's kernel_summary lists)
    kernels = {
        "traces": len(gap["traces"]),
        "kernels": gap["kernels"],
        "total_kernel_time_us": gap["total_kernel_time_us"],
        "explanation": gap["explanation"],
    }
    return {
        "state": "SUCCESS",
        **base,
        "tracelens_analysis": analysed["tracelens_analysis"],
        "kernel_summary": kernels,
        "top_bottlenecks": analysed["top_bottlenecks"][:5],
        "warnings": analysed["gap_analysis"]["warnings"],
        "errors": [],
    }
