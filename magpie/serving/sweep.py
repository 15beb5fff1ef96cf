"""Sweeps: one benchmark's load varied over points, each point repeated, against one server kept up across them.

A sweep varies `concurrency`, `request_rate`, `input_len` and `output_len` (the product of the values given, in that
order of axes). Each point is run `repeats` times (3 by default); every run is a whole `run_benchmark` with
`server_lifecycle: reuse`, so the first run starts the local server, keeps it, and every later run of the sweep
reuses it (Magpie's server reuse); at the end of the sweep the server is stopped unless it was asked to be kept.
Each run writes its workspace under `<label>/repeat_<n>/` and asks for InferenceMAX's percentiles (p75 and p99.9
besides p50/p90/p95/p99). A point's figures are InferenceMAX's keys (`agg_*.json` of its `process_result.py`:
`tput_per_gpu` = total tokens/s over the TP GPUs, `output_tput_per_gpu`, `input_tput_per_gpu`, each vLLM `*_ms`
statistic in seconds without the suffix, each TPOT statistic's `*_intvty` = 1000 / TPOT ms) per repeat, their
median over the repeats, and per key a 95% Student-t interval of the mean over the repeats. The Pareto view plots
output throughput per GPU against interactivity (`median_intvty`, tokens/s a user sees), the frontier the points no
other point beats on both.
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_serializer

from magpie.manifest.sweep_axes import DEFAULT_REPEATS, SweepAxes, label
from magpie.serving.report import BenchmarkConfig, BenchmarkReport

# InferenceMAX's percentiles (p75 to p99.9) beside the p50/p90/p95/p99 every run writes
SWEEP_PERCENTILES = [75.0, 99.9]
POINT = "point.json"
SWEEP_REPORT = "sweep_report.json"
PARETO_SVG = "sweep_pareto.svg"
SWEEP_HTML = "sweep_report.html"
# The Pareto view's axes: InferenceMAX's keys
PARETO_X = "median_intvty"
PARETO_Y = "output_tput_per_gpu"

# Two-sided 95% quantiles of Student's t by degrees of freedom (the normal's past the table)
_T95 = {
    1: 12.706,
    2: 4.303,
    3: 3.182,
    4: 2.776,
    5: 2.571,
    6: 2.447,
    7: 2.365,
    8: 2.306,
    9: 2.262,
    10: 2.228,
    12: 2.179,
    15: 2.131,
    20: 2.086,
    30: 2.042,
    60: 2.000,
}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Interval(_Strict):
    """One figure over a point's repeats: the median (the headline), the mean and its 95% Student-t interval (cut at
    0 for figures that cannot be negative)."""

    median: float
    mean: float
    low: float | None = Field(description="null with one repeat: no spread to judge")
    high: float | None
    n: int


def interval(values: list[float]) -> Interval:
    n = len(values)
    mean = statistics.fmean(values)
    if n < 2:
        return Interval(median=values[0], mean=mean, low=None, high=None, n=n)
    df = n - 1
    t = next((_T95[d] for d in sorted(_T95) if d >= df), 1.960) if df not in _T95 else _T95[df]
    half = t * statistics.stdev(values) / math.sqrt(n)
    # every figure swept is a rate, a time or a count: an interval reaching below 0 is cut there
    low = max(mean - half, 0.0) if min(values) >= 0 else mean - half
    return Interval(median=statistics.median(values), mean=mean, low=low, high=mean + half, n=n)


def inferencemax_keys(raw: dict[str, Any], config: BenchmarkConfig) -> dict[str, Any]:
    """A run's vLLM result under InferenceMAX's keys (its `utils/process_result.py` for one node): the workload,
    per-GPU throughputs over the TP size, each `*_ms` statistic in seconds under its name less `_ms`, and each TPOT
    statistic's interactivity `*_intvty` = 1000 / TPOT ms (null where the TPOT is 0: no request of two tokens)."""
    tp = config.tp
    total, output = float(raw["total_token_throughput"]), float(raw["output_throughput"])
    concurrency = raw.get("max_concurrency")
    keys: dict[str, Any] = {
        "conc": None if concurrency is None else int(concurrency),
        "request_rate": raw.get("request_rate"),
        "model": raw.get("model_id"),
        "framework": config.framework,
        "precision": config.precision,
        "isl": config.input_len,
        "osl": config.output_len,
        "tp": tp,
        "tput_per_gpu": total / tp,
        "output_tput_per_gpu": output / tp,
        "input_tput_per_gpu": (total - output) / tp,
        "request_throughput": raw.get("request_throughput"),
    }
    for key, value in raw.items():
        if not key.endswith("ms") or not isinstance(value, int | float):
            continue
        keys[key[: -len("_ms")]] = value / 1000.0
        if "tpot" in key:
            keys[key[: -len("_ms")].replace("tpot", "intvty")] = 1000.0 / value if value > 0 else None
    return keys


class RepeatRun(_Strict):
    workspace: str = Field(description="the run's folder, relative to the point's")
    success: bool
    errors: list[str] = []
    server_pid: int | None = None
    server_reused: bool = False
    inferencemax: dict[str, Any] | None = None


class PointResult(_Strict):
    label: str
    point: dict[str, Any]
    success: bool
    errors: list[str] = []
    repeats: list[RepeatRun]
    inferencemax: dict[str, Any] = Field(
        {}, description="InferenceMAX's keys, numbers the median over the repeats (null where a repeat had none)"
    )
    intervals: dict[str, Interval] = {}

    @field_serializer("point")
    def _point_in_strict_json(self, point):
        return {k: "inf" if isinstance(v, float) and math.isinf(v) else v for k, v in point.items()}


def point_result(point: dict[str, Any], reports: list[BenchmarkReport], folder: Path) -> PointResult:
    """A point's result from its repeats' reports (in the order run); a failed repeat fails the point."""
    runs = []
    for report in reports:
        keys = inferencemax_keys(report.raw_result, report.config) if report.raw_result and report.success else None
        runs.append(
            RepeatRun(
                workspace=Path(report.workspace_dir).resolve().relative_to(folder.resolve()).as_posix(),
                success=report.success,
                errors=report.errors,
                server_pid=report.server.pid if report.server else None,
                server_reused=bool(report.server and report.server.reused),
                inferencemax=keys,
            )
        )
    good = [r.inferencemax for r in runs if r.success and r.inferencemax is not None]
    success = bool(runs) and all(r.success for r in runs)
    errors = [f"{r.workspace}: {r.errors[0] if r.errors else 'no request completed'}" for r in runs if not r.success]
    merged: dict[str, Any] = {}
    intervals: dict[str, Interval] = {}
    for key in good[0] if good else {}:
        values = [g.get(key) for g in good]
        numbers = [v for v in values if isinstance(v, int | float) and not isinstance(v, bool)]
        if len(numbers) == len(values) and key not in ("conc", "isl", "osl", "tp"):
            merged[key] = statistics.median(numbers)
            intervals[key] = interval([float(v) for v in numbers])
        elif len(numbers) == len(values) or all(v == values[0] for v in values):
            merged[key] = values[0]
        else:
            merged[key] = None  # a figure some repeats lack (a TPOT of one-token outputs): no median to give
    return PointResult(
        label=label(point),
        point=point,
        success=success,
        errors=errors,
        repeats=runs,
        inferencemax=merged,
        intervals=intervals,
    )


def pareto_frontier(points: list[PointResult]) -> list[str]:
    """The labels of the points no other beats on both output throughput per GPU and interactivity, by rising
    interactivity."""
    placed = [
        (p.inferencemax[PARETO_X], p.inferencemax[PARETO_Y], p.label)
        for p in points
        if p.success and p.inferencemax.get(PARETO_X) is not None and p.inferencemax.get(PARETO_Y) is not None
    ]
    front = [
        (x, y, name)
        for x, y, name in placed
        if not any(ox >= x and oy >= y and (ox > x or oy > y) for ox, oy, _ in placed)
    ]
    return [name for _, _, name in sorted(front)]


class SweepServer(_Strict):
    starts: int = Field(description="runs of the sweep that started a server (the rest reused one)")
    pids: list[int] = Field(description="the servers' process ids, in the order they served")
    kept: bool = Field(False, description="left running after the sweep (--keep-server, keep_server)")


class SweepReport(_Strict):
    success: bool
    partial: bool = Field(False, description="interrupted: the points run before it")
    framework: str
    model: str
    axes: SweepAxes
    repeats: int
    interval: str = "median over the repeats; low/high: 95% Student-t interval of the mean over the repeats"
    pareto_x: str = PARETO_X
    pareto_y: str = PARETO_Y
    points: list[PointResult]
    pareto_frontier: list[str]
    server: SweepServer | None = None
    errors: list[str] = []
    config: BenchmarkConfig
    outputs: dict[str, str] = Field({}, description="the sweep's files, relative to its report's folder")


def sweep_report(
    config: BenchmarkConfig,
    axes: SweepAxes,
    repeats: int,
    points: list[PointResult],
    work: Path,
    *,
    errors: list[str] | None = None,
    partial: bool = False,
    server: SweepServer | None = None,
) -> SweepReport:
    """The sweep's report over its points' results, written with its table page and Pareto plot into `work`."""
    from magpie.serving.sweep_plot import write_pages

    errors = list(errors or []) + [f"{p.label}: {e}" for p in points for e in p.errors]
    report = SweepReport(
        success=not errors and not partial and len(points) == len(axes.points()) and all(p.success for p in points),
        partial=partial,
        framework=config.framework,
        model=config.model,
        axes=axes,
        repeats=repeats,
        points=points,
        pareto_frontier=pareto_frontier(points),
        server=server,
        errors=errors,
        config=config,
        outputs={name: name for name in (SWEEP_REPORT, PARETO_SVG, SWEEP_HTML)},  # beside the report
    )
    write_pages(report, work)
    _write_json(work / SWEEP_REPORT, report.model_dump(mode="json"))
    return report


def _write_json(path: Path, data) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, allow_nan=False) + "\n")
    tmp.replace(path)


def point_config(config: BenchmarkConfig, point: dict[str, Any], output_dir: Path) -> BenchmarkConfig:
    """A run of `point`: the base config with the point's values, InferenceMAX's percentiles, the server reused."""
    local = config.base_url is None and config.framework != "external"
    return BenchmarkConfig.model_validate(
        {
            **config.model_dump(),
            **point,
            "output_dir": str(output_dir),
            "metric_percentiles": sorted(set(config.metric_percentiles) | set(SWEEP_PERCENTILES)),
            "server_lifecycle": "reuse" if local else config.server_lifecycle,
        }
    )


def refuse(config: BenchmarkConfig, repeats: int) -> str | None:
    """Why `config` cannot be swept (one line), or None."""
    if repeats < 1:
        return "repeats: at least 1"
    if config.profiler:
        return "a sweep measures; profile one of its points as a run of its own (drop --torch-profiler)"
    if config.run_mode == "docker":
        return (
            "a sweep keeps one local server up across its points; docker mode starts a container per run: "
            "use run_mode local (or --base-url a server you started)"
        )
    return None


def run_point(config: BenchmarkConfig, point: dict[str, Any], repeats: int, folder: Path, project: str = ""):
    """`repeats` runs of `point` into `folder/repeat_<n>/` against the kept server; (PointResult, reports). A
    failed run ends the point (its server is stopped by that run); Ctrl-C goes on after the point's file is
    written."""
    from magpie.serving.runner import run_benchmark

    folder.mkdir(parents=True, exist_ok=True)
    reports: list[BenchmarkReport] = []
    try:
        for n in range(1, repeats + 1):
            run_dir = folder / f"repeat_{n}"
            report = run_benchmark(point_config(config, point, run_dir), project=project)
            reports.append(report)
            if not report.success:
                break
    except KeyboardInterrupt:
        _interrupted_run(folder, len(reports) + 1, reports)
        raise
    finally:
        result = point_result(point, reports, folder)
        _write_json(folder / POINT, result.model_dump(mode="json"))
    return result, reports


def _interrupted_run(folder: Path, n: int, reports: list[BenchmarkReport]) -> None:
    """The interrupted run's partial report, where it wrote one, joins the point's repeats (marked failed)."""
    path = folder / f"repeat_{n}" / "benchmark_report.json"
    if path.exists():
        try:
            reports.append(BenchmarkReport.model_validate_json(path.read_text()))
        except ValueError:
            pass  # a report cut short by a second Ctrl-C: the point's file says what finished


def check_points(config: BenchmarkConfig, axes: SweepAxes, work: Path) -> None:
    """Every point's lengths against the model's context and its tokenizer, before any server starts; ValueError
    with the first point's one line."""
    from magpie.serving.report import prompt_tokenizer

    for point in axes.points():
        try:
            prompt_tokenizer(point_config(config, point, work))
        except ValueError as err:
            raise ValueError(f"sweep point {label(point)}: {err}") from None


def server_of(points: list[PointResult], kept: bool) -> SweepServer | None:
    """How many of the points' runs started a server (the rest reused one), and which; None where none did."""
    runs = [r for p in points for r in p.repeats if r.server_pid is not None]
    if not runs:
        return None
    pids: list[int] = []
    for run in runs:
        if run.server_pid is not None and run.server_pid not in pids:
            pids.append(run.server_pid)
    return SweepServer(starts=sum(1 for r in runs if not r.server_reused), pids=pids, kept=kept)


def stop_sweep_server(points: list[PointResult], host: str, port: int | None) -> bool:
    """The server the sweep's runs kept on host:port, stopped (the sweep was not asked to keep it); whether one was
    still running to stop. Only one of the sweep's own servers is stopped, and only while no run uses it."""
    from magpie.serving import lifecycle

    pids = {r.server_pid for p in points for r in p.repeats if r.server_pid is not None}
    return bool(pids) and port is not None and lifecycle.stop_kept(host, port, pids)


def served_port(points: list[tuple[Path, PointResult]]) -> int | None:
    """The port the latest run that reached a local server reached it on (points as (folder, result), in the
    order run), from that run's report; None where no run did."""
    from urllib.parse import urlsplit

    for folder, result in reversed(points):
        for run in reversed(result.repeats):
            try:
                server = json.loads((folder / run.workspace / "benchmark_report.json").read_text()).get("server")
            except (OSError, ValueError):
                continue
            if server and server.get("mode") == "local":
                return urlsplit(server["base_url"]).port
    return None


def run_sweep(config: BenchmarkConfig, axes: SweepAxes, repeats: int = DEFAULT_REPEATS) -> SweepReport:
    """The sweep of `config` over `axes` into `config.output_dir`: each point `repeats` times against one server
    (a fresh one only where a run failed), stopped at the end unless `config.server_lifecycle` is reuse."""
    why = refuse(config, repeats)
    if why:
        raise ValueError(why)
    work = Path(config.output_dir).resolve()
    work.mkdir(parents=True, exist_ok=True)
    check_points(config, axes, work)
    keep = config.server_lifecycle == "reuse"
    results: list[PointResult] = []
    interrupted = False
    try:
        for point in axes.points():
            result, _ = run_point(config, point, repeats, work / label(point))
            results.append(result)
            if not result.success:
                break  # the failed run stopped the server: later points would measure a fresh start each
    except KeyboardInterrupt:
        interrupted = True
        partial = work / label(axes.points()[len(results)]) / POINT
        if partial.exists():
            results.append(PointResult.model_validate_json(partial.read_text()))
    finally:
        port = served_port([(work / p.label, p) for p in results])
        if not keep:
            stop_sweep_server(results, config.host, port)
    kept = keep and not interrupted and all(p.success for p in results)
    report = sweep_report(config, axes, repeats, results, work, partial=interrupted, server=server_of(results, kept))
    if interrupted:
        raise KeyboardInterrupt
    return report
