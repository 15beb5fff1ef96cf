"""The optimization loop's tools beside the project's build and write_candidate: loop_status (where the loop of a
[[benchmark]] stands, what is stale, the next step: magpie.execution.loop), kernel_from_trace (a [[kernel]]'s spec
and baseline from a profiled workload's op: magpie.traces.to_spec) and get_ab_report (a benchmark's A/B)."""

from __future__ import annotations

import json
from typing import Annotated, Any

from mcp.server.mcpserver import MCPServer
from pydantic import BaseModel, ConfigDict, Field

from magpie.errors import UserError
from magpie.execution import loop
from magpie.execution.loop import LoopStatus
from magpie.mcp.server import Services, annotated, tool

BenchmarkId = Annotated[str | None, Field(description="the [[benchmark]]'s id (default: the manifest's first)")]


class KernelFromTrace(BaseModel):
    model_config = ConfigDict(extra="forbid")

    op: str
    kernel: str  # the id the [[kernel]] table declares
    files: list[str]  # written, relative to the project root
    kernel_toml: str  # the [[kernel]] table to add to magpie.toml (then name it in the benchmark's use)
    signatures: list[dict[str, Any]]  # {share, calls, sizes, dtype} of each testcase, by share of the workload


class ABReportResult(BaseModel):
    model_config = ConfigDict(extra="forbid")

    benchmark: str
    task: str
    current: bool  # False: a build would run the A/B again (its inputs changed, or an input is provisional)
    why_stale: str | None
    report: dict[str, Any]  # ab_report.json (serving/ab.py's ABReport): metrics with intervals, gate, claim


def register(app: MCPServer, services: Services) -> None:
    confine = services.confinement

    @tool(app, annotated(read_only=True, idempotent=True))
    def loop_status(benchmark: BenchmarkId = None) -> LoopStatus:
        """Where the optimization loop of a [[benchmark]] stands: baseline benchmarked, top bottlenecks (the
        profiled run's trace analysis), kernels used for them, candidates judged (the winner), the A/B in the
        workload (change, interval, gate); which steps a build would run again, and the one next step (a command
        or the edit to make). Start here, follow next_step, call again."""
        from magpie.project import Project

        return loop.loop_status(Project.load(services.manifest), benchmark)

    @tool(app, annotated(read_only=False, destructive=True, idempotent=True))
    def kernel_from_trace(
        trace: Annotated[str, Field(description="a PyTorch profiler trace (.json, .json.gz), relative to the root")],
        op: Annotated[str, Field(min_length=1, description="the op, as the trace names it (aten::mm)")],
        top: Annotated[int, Field(ge=1, le=16, description="signatures to take, by share of the workload")] = 3,
        folder: Annotated[str | None, Field(description="folder for spec.py and baseline.py (kernels/<op>)")] = None,
    ) -> KernelFromTrace:
        """Declare a kernel from what the workload ran: spec.py (the op's top recorded signatures: shapes, dtypes,
        strides; the recorded op as reference; tolerances by dtype) and baseline.py written (replaced where
        there), and the [[kernel]] table to add to magpie.toml."""
        from magpie.traces import to_spec

        path = confine.path(trace, "trace")
        groups, workload_us = to_spec.workload_ops(path)
        signatures = to_spec.top_signatures(groups, workload_us, op, top)
        out = confine.path(folder or f"kernels/{to_spec.kernel_id(op)}", "folder", must_exist=False)
        relative = confine.relative(out)
        try:
            out.mkdir(parents=True, exist_ok=True)
            (out / "spec.py").write_text(to_spec.spec_text(op, trace, signatures))
            (out / "baseline.py").write_text(to_spec.baseline_text(op, signatures))
        except OSError as err:
            raise UserError(f"folder {relative}: cannot be written: {err.strerror}") from None
        return KernelFromTrace(
            op=op,
            kernel=to_spec.kernel_id(op),
            files=[f"{relative}/spec.py", f"{relative}/baseline.py"],
            kernel_toml=to_spec.kernel_toml(op, relative, signatures),
            signatures=[{"share": s.share, "calls": s.calls, "sizes": s.sizes, "dtype": s.dtype} for s in signatures],
        )

    @tool(app, annotated(read_only=True, idempotent=True))
    def get_ab_report(benchmark: BenchmarkId = None) -> ABReportResult:
        """A [[benchmark]]'s A/B with its kernels put in (build benchmark_ab:<id> first): per metric B/A with its
        interval and verdict, the output-equivalence gate, the claim; and whether it is current."""
        from magpie.execution.build import Build, BuildOptions
        from magpie.serving.ab import REPORT

        bench = benchmark or _first_benchmark(services)
        task = f"benchmark_ab:{bench}"
        build = Build(BuildOptions(manifest=services.manifest, targets=[task]))
        try:
            plan = dict(build.dry_run().would_run)
        except UserError:
            raise UserError(f"benchmark {bench!r}: no A/B (no such benchmark, or its use names no kernel)") from None
        assert build.project is not None
        spec = build.project.tasks[task]
        recorded = (build.project.store.recorded(task) or {}).get("key")
        key = spec.key if build.project.store.has(spec.key) else recorded
        report_path = build.project.store.path(key) / REPORT if key else None
        if report_path is None or not report_path.is_file():
            raise UserError(f"{task}: not built yet; build it (the build tool, targets [{task!r}])")
        return ABReportResult(
            benchmark=bench,
            task=task,
            current=task not in plan,
            why_stale=plan.get(task),
            report=json.loads(report_path.read_text()),
        )


def _first_benchmark(services: Services) -> str:
    from magpie.manifest.load import load_manifest

    benchmarks = load_manifest(services.manifest)[0].benchmark
    if not benchmarks:
        raise UserError(f"{services.manifest}: no [[benchmark]]")
    return benchmarks[0].id
