"""Profiler traces: gap_analysis, find_kernel_sources, compare_traces (magpie.traces)."""

from __future__ import annotations

import os
import secrets
import time
from pathlib import Path
from typing import Annotated, Literal

from mcp.server.mcpserver import MCPServer
from mcp_types import CallToolResult, ResourceLink
from pydantic import Field

from magpie.errors import UserError
from magpie.mcp.models import KernelSource, KernelSources, TraceAnalysis, TraceComparison
from magpie.mcp.server import Services, annotated, structured, tool

TraceSide = Annotated[str, Field(description="a trace file or a folder of traces, relative to the project root")]
Repos = Annotated[list[str], Field(description="source folders to search, relative to the project root")]


def output_folder(services: Services, kind: str) -> Path:
    return services.mcp_folder(kind) / f"{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"


def file_link(services: Services, path: Path, description: str) -> ResourceLink:
    relative = os.path.relpath(path, services.workspace)
    return ResourceLink(
        type="resource_link",
        name=path.name,
        uri=f"magpie://workspace/{relative}",
        description=description,
        size=path.stat().st_size,
    )


def relative_outputs(services: Services, outputs: dict) -> dict[str, str]:
    return {k: os.path.relpath(v, services.root) for k, v in outputs.items() if isinstance(v, str)}


def register(app: MCPServer, services: Services) -> None:
    confine = services.confinement

    @tool(app, annotated(read_only=True, idempotent=True))
    def gap_analysis(
        trace_dir: TraceSide,
        top_k: Annotated[int, Field(ge=1, le=500)] = 20,
        start_pct: Annotated[float, Field(ge=0, le=100)] = 0.0,
        end_pct: Annotated[float, Field(ge=0, le=100)] = 100.0,
        steady_state: Annotated[bool, Field(description="pick each trace's steady-state window")] = False,
        analysis_mode: Literal["pytorch", "inference"] = "pytorch",
        kernel_source_repos: Repos = [],  # noqa: B006
    ) -> Annotated[CallToolResult, TraceAnalysis]:
        """Where the GPU time goes in PyTorch profiler traces: the top kernels of a window by total
        contribution, with the op and shapes that launched them (and their sources where repos are given).
        The full analysis is written to the workspace and linked."""
        from magpie.traces.gap import Window
        from magpie.traces.ingest import TraceError
        from magpie.traces.report import analyze_traces

        if start_pct >= end_pct:
            raise UserError("start_pct/end_pct: need start_pct < end_pct")
        folder = confine.path(trace_dir, "trace_dir")
        repos = confine.paths(kernel_source_repos, "kernel_source_repos")
        out = output_folder(services, "traces")
        try:
            summary = analyze_traces(
                folder,
                out,
                top_k=top_k,
                window=Window(start_pct, end_pct),
                source_repos=list(repos) or None,
                steady_state=steady_state,
                analysis_mode=analysis_mode,
            )
        except TraceError as err:
            raise UserError(f"trace_dir: {err}") from None
        result = TraceAnalysis(
            traces=summary["traces"],
            total_kernel_time_us=summary["total_kernel_time_us"],
            top=summary["top"],
            warnings=summary["warnings"],
            outputs=relative_outputs(services, summary["outputs"]),
        )
        return structured(
            result, [file_link(services, out / "gap_analysis" / "gap_analysis.json", "the whole analysis")]
        )

    @tool(app, annotated(read_only=True, idempotent=True))
    def find_kernel_sources(
        kernels: Annotated[list[str], Field(min_length=1, description="kernel names as a trace shows them")],
        repos: Repos,
    ) -> KernelSources:
        """Map kernel names (from a trace) to their definitions (@triton.jit, __global__) in the given source
        folders, or to the known library that owns them."""
        from magpie.traces.sources import SourceIndex, resolve

        if not repos:
            raise UserError("repos: give the source folders to search")
        index = SourceIndex(confine.paths(repos, "repos"))
        found = []
        for name in kernels:
            match = resolve(name, index)
            where = match.get("file")
            found.append(
                KernelSource(
                    kernel=name,
                    symbol=match["symbol"],
                    state=match["state"],
                    file=os.path.relpath(where, services.root) if where else None,
                    line=match.get("line"),
                    candidates=[
                        {**c, "file": os.path.relpath(c["file"], services.root)} for c in match.get("candidates", [])
                    ],
                    library=match.get("library"),
                )
            )
        return KernelSources(kernels=found)

    @tool(app, annotated(read_only=True, idempotent=True))
    def compare_traces(before: TraceSide, after: TraceSide) -> Annotated[CallToolResult, TraceComparison]:
        """Compare two sets of traces (before and after a change): per kernel and op, the time each side
        spent and whether the change is beyond the noise. The full comparison is written and linked."""
        from magpie.traces.compare import compare_traces as compared
        from magpie.traces.ingest import TraceError

        if "," in before or "," in after:  # the library reads a comma as a list of sides' files
            raise UserError("before/after: one trace file or folder each, without commas")
        sides = [str(confine.path(before, "before")), str(confine.path(after, "after"))]
        out = output_folder(services, "trace-comparisons")
        try:
            summary = compared(sides[0], sides[1], out)
        except TraceError as err:
            raise UserError(str(err)) from None
        outputs = relative_outputs(services, summary.pop("outputs"))
        result = TraceComparison(summary=summary, outputs=outputs)
        return structured(result, [file_link(services, out / "trace_compare.json", "the whole comparison")])
