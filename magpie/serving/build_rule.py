"""The `benchmark` rule's action (rules/serving.toml): one declared `[[benchmark]]` run into the store.

The run's workspace is the artifact's folder: `benchmark_report.json`, `bench_serve_result.json`,
`server.log`, `benchmark_config.json`. The result carries a summary for the build report
(throughput, TTFT/TPOT/ITL/E2EL medians and p99, counts, errors). A run that fails raises, so
nothing is stored and the next build runs it again (a server that did not start is not a
result worth keeping); its one-line reason is the task's error.
"""
from __future__ import annotations

import math
from pathlib import Path


class BenchmarkFailed(RuntimeError):
    """A declared benchmark did not succeed; the message is its first error."""


def config_of(bench: dict, root: Path, out_dir: Path):
    """The run config of a `[[benchmark]]` table (as the manifest model dumps it)."""
    from magpie.serving.report import BenchmarkConfig

    model = bench["model"]
    local = root / model
    if not Path(model).is_absolute() and local.exists():
        model = str(local.resolve())
    load, slo = bench["load"], bench["slo"]
    rate = load["request_rate"]
    return BenchmarkConfig(
        framework=bench["engine"], model=model, precision=bench["precision"], tp=bench["tp"],
        max_model_len=bench["max_model_len"], extra_server_args=bench["extra_server_args"], env=bench["env"],
        run_kind=bench["run_kind"], host=bench["host"], port=bench["port"], base_url=bench["base_url"],
        endpoint=load["endpoint"], concurrency=load["concurrency"], input_len=load["input_len"],
        output_len=load["output_len"], range_ratio=load["range_ratio"], num_prompts=load["num_prompts"],
        request_rate=math.inf if rate in (None, "inf", "Infinity") else float(rate), burstiness=load["burstiness"],
        num_warmups=load["num_warmups"], seed=load["seed"], timeout_s=bench["timeout_s"],
        goodput={name[:-3]: value for name, value in slo.items() if value is not None},
        output_dir=str(out_dir))


def summary(report) -> dict:
    """What the build report shows of a run."""
    out = {"success": report.success, "errors": list(report.errors)}
    if report.throughput is not None:
        thr = report.throughput
        out["throughput"] = {"request": thr.request_throughput, "output_tokens": thr.output_throughput}
    if report.latency is not None:
        out["latency"] = {name: {"median": getattr(report.latency, name).median,
                                 "p99": getattr(report.latency, name).p99}
                          for name in ("ttft", "tpot", "itl", "e2el")}
    if report.run is not None:
        out["completed"], out["failed"], out["duration_s"] = report.run.completed, report.run.failed, report.run.duration_s
    if report.provenance is not None:
        out["engine_version"] = report.provenance.engine_version
    return out


def benchmark_rule(job, out_dir: Path) -> dict:
    from magpie.serving.runner import run_benchmark

    bench = job.spec.params["benchmark"]
    report = run_benchmark(config_of(bench, Path(job.spec.params["root"]), out_dir))
    if not report.success:
        first = report.errors[0] if report.errors else "no request completed"
        raise BenchmarkFailed(f"benchmark {bench['id']!r} ({bench['engine']} {bench['model']}) failed: {first}")
    return {"state": "SUCCESS", "benchmark": bench["id"], "engine": bench["engine"], "model": bench["model"],
            "run_kind": report.run_kind, "summary": summary(report), "files": sorted(report.outputs), "errors": []}
