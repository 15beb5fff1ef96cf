"""Serving benchmarks: benchmark (a job), list_benchmark_results, get_benchmark_result,
compare_benchmark_results (magpie.serving). Results live under `<workspace>/mcp/benchmarks/`."""

from __future__ import annotations

import json
import os
import re
import secrets
import time
from pathlib import Path
from typing import Annotated, Literal

from mcp.server.mcpserver import Context, MCPServer
from mcp_types import CallToolResult
from pydantic import Field, ValidationError

from magpie.errors import UserError
from magpie.mcp.confine import identifier
from magpie.mcp.job_tools import start_job
from magpie.mcp.models import BenchmarkComparison, BenchmarkResultInfo, BenchmarkResults, JobView
from magpie.mcp.server import Services, annotated, tool

REPORT = "benchmark_report.json"
# a hub id (owner/name) read from the local cache: never a path
HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*/[A-Za-z0-9][A-Za-z0-9_.\-]*$")
ResultId = Annotated[str, Field(description="a benchmark result's id, as list_benchmark_results gives it")]


def output_folder(services: Services, kind: str) -> Path:
    return services.mcp_folder(kind) / f"{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"


def model_of(services: Services, model: str) -> str:
    """A model folder inside the project (confined), or a hub id."""
    # a name whose first part is in the project is a path there, never a hub id
    if (services.root / model.split("/")[0]).exists() or model.startswith((".", "/", "~")) or model.count("/") != 1:
        return str(services.confinement.path(model, "model"))
    if not HUB_ID.match(model) or ".." in model:
        raise UserError(f"model: {model!r} is neither a folder in the project nor a hub id (owner/name)")
    return model


def info(services: Services, folder: Path) -> BenchmarkResultInfo:
    try:
        report = json.loads((folder / REPORT).read_text())
    except (OSError, ValueError):
        report = {}
    config = report.get("config") or {}
    return BenchmarkResultInfo(
        result_id=folder.name,
        framework=config.get("framework"),
        model=config.get("model"),
        success=report.get("success"),
        run_kind=config.get("run_kind"),
        throughput=report.get("throughput"),
        report=os.path.relpath(folder / REPORT, services.root),
    )


def result_folder(services: Services, result_id: str, field: str) -> Path:
    folder = services.mcp_folder("benchmarks") / identifier(result_id, field)
    if not (folder / REPORT).is_file():
        raise UserError(f"{field}: no benchmark result {result_id!r} (list_benchmark_results lists them)")
    return folder


def register(app: MCPServer, services: Services) -> None:
    @tool(app, annotated(read_only=False, idempotent=False))
    async def benchmark(
        ctx: Context,
        engine: Literal["transformers", "vllm", "sglang", "atom"],
        model: Annotated[str, Field(description="a model folder relative to the project root, or a hub id")],
        precision: str = "auto",
        tp: Annotated[int, Field(ge=1, le=64)] = 1,
        max_model_len: Annotated[int | None, Field(ge=1)] = None,
        port: Annotated[
            int | None, Field(ge=1024, le=65535, description="the local server's port (default: the engine's)")
        ] = None,
        endpoint: Literal["completions", "chat"] = "completions",
        concurrency: Annotated[int | None, Field(ge=1)] = None,
        input_len: Annotated[int, Field(ge=1)] = 1024,
        output_len: Annotated[int, Field(ge=1)] = 128,
        num_prompts: Annotated[int, Field(ge=1)] = 100,
        request_rate: Annotated[float | None, Field(gt=0, description="requests/s; none: all at once")] = None,
        seed: int = 0,
        timeout_s: Annotated[float, Field(gt=0, le=86_400)] = 3600.0,
        profile: Annotated[
            bool, Field(description="record a torch profiler window (a diagnostic run, never a measurement)")
        ] = False,
        wait: Annotated[bool, Field(description="run to the end before answering")] = False,
    ) -> Annotated[CallToolResult, JobView]:
        """Benchmark a serving engine under load (vLLM bench-serve's), as a job: a measurement run unless a
        profile is asked for. Its report is a benchmark result (list_benchmark_results)."""
        from magpie.serving.report import BenchmarkConfig

        folder = output_folder(services, "benchmarks")
        fields = {
            "framework": engine,
            "model": model_of(services, model),
            "precision": precision,
            "tp": tp,
            "max_model_len": max_model_len,
            "port": port,
            "endpoint": endpoint,
            "concurrency": concurrency,
            "input_len": input_len,
            "output_len": output_len,
            "num_prompts": num_prompts,
            "seed": seed,
            "timeout_s": timeout_s,
            "profiler": profile,
            "output_dir": str(folder),
            **({"request_rate": request_rate} if request_rate is not None else {}),
        }
        try:
            config = BenchmarkConfig(**fields)
        except ValidationError as err:
            first = err.errors()[0]
            raise UserError(f"{'.'.join(str(x) for x in first['loc']) or 'benchmark'}: {first['msg']}") from None
        return await start_job(ctx, services, "benchmark", {"config": config.model_dump(mode="json")}, wait)

    @tool(app, annotated(read_only=True, idempotent=True))
    def list_benchmark_results() -> BenchmarkResults:
        """Every serving benchmark result of this project, oldest first, with its headline throughput."""
        folder = services.mcp_folder("benchmarks")
        found = sorted(path.parent for path in folder.glob(f"*/{REPORT}")) if folder.is_dir() else []
        return BenchmarkResults(results=[info(services, path) for path in found])

    @tool(app, annotated(read_only=True, idempotent=True))
    def get_benchmark_result(result_id: ResultId) -> BenchmarkResultInfo:
        """One benchmark result's summary; its whole report is the resource magpie://workspace/... it names."""
        return info(services, result_folder(services, result_id, "result_id"))

    @tool(app, annotated(read_only=True, idempotent=True))
    def compare_benchmark_results(before: ResultId, after: ResultId) -> BenchmarkComparison:
        """Compare two benchmark results of the same workload: per metric each side and whether the change
        is beyond the noise."""
        from magpie.serving.compare import CompareError, compare

        sides = [result_folder(services, before, "before"), result_folder(services, after, "after")]
        try:
            return BenchmarkComparison(comparison=compare(str(sides[0]), str(sides[1])))
        except CompareError as err:
            raise UserError(str(err)) from None
