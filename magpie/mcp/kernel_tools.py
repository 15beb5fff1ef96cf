"""One-shot judging of kernel files outside the manifest (analyze, compare) and gpu_info."""

from __future__ import annotations

import json
import subprocess
from typing import Annotated, Literal

from mcp.server.mcpserver import Context, MCPServer
from mcp_types import CallToolResult
from pydantic import Field

from magpie.errors import UserError
from magpie.mcp.job_tools import start_job
from magpie.mcp.models import GpuInfo, JobView
from magpie.mcp.server import Services, annotated, tool

KernelType = Annotated[Literal["pytorch", "triton", "cuda", "hip"], Field(description="the kernels' language")]
Entry = Annotated[str | None, Field(description="the function each file defines (default: the type's)")]
Spec = Annotated[str, Field(description="the Python reference spec (make_inputs, reference), relative to the root")]
Shapes = Annotated[str, Field(description="input shapes, e.g. '64x1024,128x4096'")]
Dtypes = Annotated[str, Field(description="dtypes, comma-separated")]
Tolerance = Annotated[float | None, Field(ge=0)]
Budget = Annotated[float, Field(gt=0, le=60_000, description="measured time per implementation, in ms")]
Device = Annotated[str, Field(description="cpu, cuda, cuda:N")]
Wait = Annotated[bool, Field(description="run to the end before answering (progress notifications meanwhile)")]
GPU_INFO_TIMEOUT_S = 120


def one_shot_params(services: Services, sources: list[str], **options) -> dict:
    confine = services.confinement
    if not sources:
        raise UserError("sources: give at least one kernel file")
    paths = [str(path) for path in confine.paths(sources, "sources")]
    if any(not path.endswith((".py", ".cu", ".hip", ".cpp")) for path in paths):
        raise UserError("sources: each must be a kernel source file (.py, .cu, .hip, .cpp)")
    spec = str(confine.path(options.pop("spec"), "spec"))
    if options["device"] != "cpu" and not options["device"].startswith("cuda"):
        raise UserError(f"device: {options['device']!r}: give cpu, cuda or cuda:N")
    return {"paths": paths, "spec": spec, **options}


def register(app: MCPServer, services: Services) -> None:
    @tool(app, annotated(read_only=False, idempotent=True))
    async def analyze(
        ctx: Context,
        source: Annotated[str, Field(description="the kernel file, relative to the project root")],
        type: KernelType,
        spec: Spec,
        shapes: Shapes,
        entry: Entry = None,
        dtypes: Dtypes = "float32",
        rtol: Tolerance = None,
        atol: Tolerance = None,
        no_perf: Annotated[bool, Field(description="correctness only, not timed")] = False,
        budget_ms: Budget = 300.0,
        device: Device = "cpu",
        wait: Wait = False,
    ) -> Annotated[CallToolResult, JobView]:
        """Judge one kernel file (compile, correctness against the spec's reference, timing), sandboxed, as
        a job; its result is the analyze report (Magpie's keys)."""
        params = one_shot_params(
            services,
            [source],
            type=type,
            entry=entry,
            spec=spec,
            shapes=shapes,
            dtypes=dtypes,
            rtol=rtol,
            atol=atol,
            no_perf=no_perf,
            budget_ms=budget_ms,
            device=device,
        )
        return await start_job(ctx, services, "analyze", params, wait)

    @tool(app, annotated(read_only=False, idempotent=True))
    async def compare(
        ctx: Context,
        sources: Annotated[list[str], Field(min_length=2, description="kernel files, relative to the project root")],
        type: KernelType,
        spec: Spec,
        shapes: Shapes,
        baseline: Annotated[int, Field(ge=0, description="which of sources is the baseline")] = 0,
        entry: Entry = None,
        dtypes: Dtypes = "float32",
        rtol: Tolerance = None,
        atol: Tolerance = None,
        budget_ms: Budget = 300.0,
        device: Device = "cpu",
        wait: Wait = False,
    ) -> Annotated[CallToolResult, JobView]:
        """Check every kernel file, exclude the incorrect, time the rest interleaved with the baseline and
        judge their speedups (with intervals), as a job; its result is the compare report."""
        if baseline >= len(sources):
            raise UserError(f"baseline: {baseline} is past the last of {len(sources)} sources")
        params = one_shot_params(
            services,
            sources,
            type=type,
            entry=entry,
            spec=spec,
            shapes=shapes,
            dtypes=dtypes,
            rtol=rtol,
            atol=atol,
            budget_ms=budget_ms,
            device=device,
        )
        return await start_job(ctx, services, "compare", {**params, "baseline": baseline}, wait)

    described: list[GpuInfo] = []  # the machine's devices do not change while the server runs

    @tool(app, annotated(read_only=True, idempotent=True))
    def gpu_info() -> GpuInfo:
        """The accelerators (architecture, SMs/CUs, memory, clocks), CPU, compilers, profilers and packages
        of the machine the server runs on."""
        if not described:
            from magpie.paths import python_module_command, subprocess_env

            done = subprocess.run(
                [*python_module_command("magpie.mcp.worker"), "--gpu-info"],
                stdin=subprocess.DEVNULL,  # over stdio the server's stdin is the client's stream: never the child's
                capture_output=True,
                text=True,
                timeout=GPU_INFO_TIMEOUT_S,
                env=subprocess_env(),
                cwd=services.root,
            )
            if done.returncode != 0:
                raise UserError(f"gpu_info: the device query failed: {(done.stderr.strip().splitlines() or ['?'])[-1]}")
            described.append(GpuInfo(**json.loads(done.stdout)))
        return described[0]
