"""Profiler traces: gap_analysis and compare_traces as jobs (worker.py runs them), find_kernel_sources inline
(magpie.traces)."""

from __future__ import annotations

import os
from typing import Annotated, Literal

from mcp.server.mcpserver import Context, MCPServer
from mcp_types import CallToolResult, ResourceLink
from pydantic import Field

from magpie.errors import UserError
from magpie.mcp.job_tools import start_job
from magpie.mcp.models import JobView, KernelSource, KernelSources
from magpie.mcp.server import Services, annotated, tool

TraceSide = Annotated[str, Field(description="a trace file or a folder of traces, relative to the project root")]
Repos = Annotated[list[str], Field(description="source folders to search, relative to the project root")]
Wait = Annotated[bool, Field(description="run to the end before answering (progress notifications meanwhile)")]


def with_output_link(services: Services, started: CallToolResult, output: str, description: str) -> CallToolResult:
    """A finished trace job's answer, with a resource link to its whole output file (too large to inline)."""
    result = (started.structured_content or {}).get("result") or {}
    written = (result.get("outputs") or {}).get(output)
    if isinstance(written, str):
        path = services.root / written
        relative = os.path.relpath(path, services.workspace)
        link = ResourceLink(
            type="resource_link",
            name=path.name,
            uri=f"magpie://workspace/{relative}",
            description=description,
            mime_type="application/json",
            size=path.stat().st_size,
        )
        started.content.append(link)
    return started


def register(app: MCPServer, services: Services) -> None:
    confine = services.confinement

    @tool(app, annotated(read_only=False, idempotent=True))
    async def gap_analysis(
        ctx: Context,
        trace_dir: TraceSide,
        top_k: Annotated[int, Field(ge=1, le=500)] = 20,
        start_pct: Annotated[float, Field(ge=0, le=100)] = 0.0,
        end_pct: Annotated[float, Field(ge=0, le=100)] = 100.0,
        steady_state: Annotated[bool, Field(description="pick each trace's steady-state window")] = False,
        analysis_mode: Literal["pytorch", "inference"] = "pytorch",
        kernel_source_repos: Repos = [],  # noqa: B006
        wait: Wait = False,
    ) -> Annotated[CallToolResult, JobView]:
        """Where the GPU time goes in PyTorch profiler traces, as a job (a big trace takes minutes): the top
        kernels of a window by total contribution, with the op and shapes that launched them (and their
        sources where repos are given). The full analysis is written in the job's folder and linked."""
        if start_pct >= end_pct:
            raise UserError("start_pct/end_pct: need start_pct < end_pct")
        params = {
            "trace_dir": str(confine.path(trace_dir, "trace_dir")),
            "kernel_source_repos": [str(path) for path in confine.paths(kernel_source_repos, "kernel_source_repos")],
            "top_k": top_k,
            "start_pct": start_pct,
            "end_pct": end_pct,
            "steady_state": steady_state,
            "analysis_mode": analysis_mode,
        }
        started = await start_job(ctx, services, "gap_analysis", params, wait)
        return with_output_link(services, started, "json", "the whole analysis")

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

    @tool(app, annotated(read_only=False, idempotent=True))
    async def compare_traces(
        ctx: Context, before: TraceSide, after: TraceSide, wait: Wait = False
    ) -> Annotated[CallToolResult, JobView]:
        """Compare two sets of traces (before and after a change), as a job: per kernel and op, the time each
        side spent and whether the change is beyond the noise. The full comparison is written and linked."""
        if "," in before or "," in after:  # the library reads a comma as a list of sides' files
            raise UserError("before/after: one trace file or folder each, without commas")
        params = {"before": str(confine.path(before, "before")), "after": str(confine.path(after, "after"))}
        started = await start_job(ctx, services, "compare_traces", params, wait)
        return with_output_link(services, started, "json", "the whole comparison")
