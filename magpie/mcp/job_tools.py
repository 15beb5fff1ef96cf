"""job_status, job_result, job_cancel, job_list; and how the job-starting tools (build,
analyze, compare, benchmark) start one and, when asked, wait for it with progress."""

from __future__ import annotations

from typing import Annotated

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp_types import CallToolResult, ResourceLink
from pydantic import Field

from magpie.errors import UserError
from magpie.mcp.jobs import FINAL, RESULT, read_json
from magpie.mcp.models import JobList, JobView
from magpie.mcp.server import Services, annotated, structured, tool

# a result larger than this is a resource link, not inline JSON
INLINE_BYTES = 64 * 1024
# a waited-for job's state is read this often (its end answered within it), and a progress
# notification sent at least every NOTIFY_S (at least one a second)
POLL_S = 0.05
NOTIFY_S = 0.5

JobId = Annotated[str, Field(description="a job's id, as its starting tool or job_list gave it")]


def result_uri(job_id: str) -> str:
    return f"magpie://jobs/{job_id}/result"


def view(services: Services, job_id: str, *, with_result: bool) -> tuple[JobView, list[ResourceLink]]:
    state = services.jobs.status(job_id)
    fields = {k: state.get(k) for k in JobView.model_fields if k in state and k not in ("result", "result_uri")}
    links: list[ResourceLink] = []
    path = services.jobs.folder_of(job_id) / RESULT
    if state["state"] == "succeeded" and path.is_file():
        fields["result_uri"] = result_uri(job_id)
        size = path.stat().st_size
        if with_result and size <= INLINE_BYTES:
            fields["result"] = read_json(path)
        elif with_result:
            links.append(
                ResourceLink(
                    type="resource_link",
                    name=f"{job_id} result",
                    uri=result_uri(job_id),
                    mime_type="application/json",
                    size=size,
                    description="the job's result (too large to inline)",
                )
            )
    return JobView(**fields), links


async def follow(ctx: Context, services: Services, job_id: str) -> None:
    """Wait for the job, a progress notification every NOTIFY_S with the step running."""
    notified = -NOTIFY_S
    while True:
        state = services.jobs.status(job_id)  # two small files read: no thread needed
        if state["state"] in FINAL:
            return
        if anyio.current_time() - notified >= NOTIFY_S:
            notified = anyio.current_time()
            message = f"{state['kind']} {job_id}: {state.get('step')}"
            await ctx.report_progress(state.get("done") or 0, state.get("total"), message)
        await anyio.sleep(POLL_S)


async def start_job(ctx: Context, services: Services, kind: str, params: dict, wait: bool) -> CallToolResult:
    job_id = services.jobs.start(kind, params)
    if wait:
        await follow(ctx, services, job_id)
    return structured(*view(services, job_id, with_result=True))


def register(app: MCPServer, services: Services) -> None:
    @tool(app, annotated(read_only=True, idempotent=True))
    def job_status(job_id: JobId) -> JobView:
        """A job's state (running, succeeded, failed, cancelled, lost), the step running and how many are
        done; its result is job_result's."""
        return view(services, job_id, with_result=False)[0]

    @tool(app, annotated(read_only=True, idempotent=True))
    def job_result(job_id: JobId) -> Annotated[CallToolResult, JobView]:
        """A job's result once it has one (inline when small, else as a resource link to its file)."""
        state = services.jobs.status(job_id)
        if state["state"] == "running":
            raise UserError(f"job {job_id} is still running ({state.get('step')}); job_status follows it")
        return structured(*view(services, job_id, with_result=True))

    @tool(app, annotated(read_only=False, destructive=True, idempotent=True))
    def job_cancel(job_id: JobId) -> JobView:
        """Stop a running job: its whole process tree is killed within a second. A finished job is left as
        it was."""
        services.jobs.cancel(job_id)
        return view(services, job_id, with_result=False)[0]

    @tool(app, annotated(read_only=True, idempotent=True))
    def job_list() -> JobList:
        """Every job this project's servers started (this one or an earlier one), oldest first."""
        return JobList(jobs=[view(services, job_id, with_result=False)[0] for job_id in services.jobs.ids()])
