"""Resources (the manifest, the latest report, each kernel's verdicts, a job's result, the
workspace's files) and the prompt of the optimization workflow."""

from __future__ import annotations

import os
from pathlib import Path

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ResourceError

from magpie.errors import UserError
from magpie.mcp.jobs import RESULT
from magpie.mcp.project_tools import read_report
from magpie.mcp.server import Services

WORKFLOW = """Optimize kernel {kernel} of this magpie project, measuring every step:

1. Baseline: `project_status`, then `build` (wait=true) and `get_report` for {kernel}: the baseline's time, the
   timed shapes and how it was timed. For a model served by an engine, `benchmark` it (a measurement run) and keep
   its result id.
2. Where the time goes: with profiler traces, `gap_analysis` (the top kernels by total time), then
   `find_kernel_sources` to find the code of the ones worth the work. `gpu_info` says what the device can do.
3. Candidates: write each with `write_candidate` (kernel {kernel}, a new candidate id, the whole source). Each is
   judged against the reference on random inputs, sandboxed: an incorrect one is excluded, never ranked.
4. Judge: `build` (wait=true, or poll `job_status`), then `get_report` kernel={kernel}: per candidate its
   verdict, failure kinds and speedup with its interval. Only a speedup whose interval clears 1 is faster; an
   implausible one is timed again. Read the failure kinds of a failed candidate and fix the cause.
5. Re-benchmark: `benchmark` again with the same workload and `compare_benchmark_results` (or `compare_traces` on
   new traces) to confirm the end-to-end effect.

Do not change clocks, power or the baseline; report only what a tool measured."""


def register(app: MCPServer, services: Services) -> None:
    def checked(call, *args):
        try:
            return call(*args)
        except (UserError, OSError) as err:
            raise ResourceError(str(err)) from None

    @app.resource("magpie://project/manifest", name="manifest", mime_type="application/toml")
    def manifest() -> str:
        """The project's magpie.toml."""
        return checked(services.manifest.read_text)

    @app.resource("magpie://project/report", name="report", mime_type="application/json")
    def report() -> str:
        """The latest published verdicts of every kernel (get_report's result)."""
        return checked(read_report, services, None).model_dump_json(indent=1)

    @app.resource("magpie://kernels/{kernel}/verdicts", name="kernel_verdicts", mime_type="application/json")
    def kernel_verdicts(kernel: str) -> str:
        """One kernel's latest published verdicts."""
        return checked(read_report, services, kernel).kernels[0].model_dump_json(indent=1)

    @app.resource("magpie://jobs/{job_id}/result", name="job_result", mime_type="application/json")
    def job_result(job_id: str) -> str:
        """A finished job's whole result."""
        path = checked(services.jobs.folder_of, job_id) / RESULT
        if not path.is_file():
            raise ResourceError(f"job {job_id} has no result (job_status says why)")
        return path.read_text()

    @app.resource("magpie://workspace/{+path}", name="workspace_file")
    def workspace_file(path: str) -> str:
        """A file the server wrote into the project's workspace (analyses, comparisons, benchmark reports)."""
        workspace = Path(os.path.realpath(services.workspace))
        real = Path(os.path.realpath(workspace / path))
        if os.path.isabs(path) or not real.is_relative_to(workspace) or not real.is_file():
            raise ResourceError(f"{path}: no such file in the workspace")
        return real.read_text(errors="replace")

    @app.prompt(name="optimize_kernel", description="The optimization loop for one kernel, measured at every step")
    def optimize_kernel(kernel: str) -> str:
        return WORKFLOW.format(kernel=kernel)
