"""The MCP server of one project: `make_server(root)` builds it (tools, resources, prompt) on
the official SDK's `MCPServer`; `serve(...)` runs it over stdio or streamable HTTP."""

from __future__ import annotations

import functools
import inspect
import json
import logging
import signal
import socket
import sys
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.transport_security import TransportSecuritySettings
from mcp_types import CallToolResult, ResourceLink, TextContent, ToolAnnotations
from pydantic import BaseModel

from magpie import __version__
from magpie.errors import UserError
from magpie.mcp.confine import Confinement
from magpie.mcp.jobs import Jobs, workspace_of

INSTRUCTIONS = (
    "magpie judges GPU kernels of one project (magpie.toml in the server's root): correctness against a "
    "reference on random inputs, then timing against the baseline. Paths are relative to the project root. "
    "Write a candidate with write_candidate, then build (a job: wait=true to wait, or poll job_status), "
    "then get_report for verdicts and speedups. The prompt optimize_kernel walks the whole loop. "
    "With a [[benchmark]]: loop_status says where the workload's loop stands and its next step."
)
LOOPBACK = ("127.0.0.1", "localhost", "::1")
# a synchronous tool's progress notifications, this often while it runs
HEARTBEAT_S = 0.5
HEARTBEAT_CONTEXT = "heartbeat_context"


class Services:
    """What every tool of one server shares: the project root and its confinement, the jobs."""

    def __init__(self, root: Path):
        self.confinement = Confinement(root)
        self.root = self.confinement.root
        self.workspace = workspace_of(self.root)
        self.jobs = Jobs(self.root)

    @property
    def manifest(self) -> Path:
        return self.root / "magpie.toml"

    def mcp_folder(self, kind: str) -> Path:
        """Where the server's own outputs of one kind go: `<workspace>/mcp/<kind>/`."""
        return self.workspace / "mcp" / kind


def annotated(*, read_only: bool, destructive: bool = False, idempotent: bool = False) -> ToolAnnotations:
    return ToolAnnotations(
        readOnlyHint=read_only, destructiveHint=destructive, idempotentHint=idempotent, openWorldHint=False
    )


def one_line(err: BaseException) -> str:
    if isinstance(err, OSError) and err.strerror:
        return f"{err.filename}: {err.strerror}" if err.filename else err.strerror
    return (str(err).strip().splitlines() or [type(err).__name__])[0]


async def with_heartbeat(ctx: Context, name: str, work) -> Any:
    """Run a synchronous tool's work on a worker thread, a progress notification every
    HEARTBEAT_S while it runs (none for a call quicker than that; none where the client asked
    for no progress)."""
    async with anyio.create_task_group() as beats:

        async def beat() -> None:
            started = anyio.current_time()
            while True:
                await anyio.sleep(HEARTBEAT_S)
                elapsed = anyio.current_time() - started
                await ctx.report_progress(elapsed, None, f"{name}: running for {elapsed:.1f} s")

        beats.start_soon(beat)
        try:
            return await anyio.to_thread.run_sync(work)
        except Exception as err:  # noqa: BLE001 - raised as itself below, not inside the group's ExceptionGroup
            failure = err
        finally:
            beats.cancel_scope.cancel()
    raise failure


def tool(app: MCPServer, annotations: ToolAnnotations, title: str | None = None):
    """Register `fn` as a tool whose bad input (a UserError, an unusable file) is one line of
    tool error, never a traceback. A synchronous one runs on a worker thread with a heartbeat of
    progress notifications (requirement: at least one a second while any tool runs)."""

    def register(fn):
        if inspect.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def guarded(*args, **kwargs):
                try:
                    return await fn(*args, **kwargs)
                except (UserError, OSError) as err:
                    raise ToolError(one_line(err)) from None

        else:

            @functools.wraps(fn)
            async def guarded(*args, **kwargs):
                ctx = kwargs.pop(HEARTBEAT_CONTEXT)
                try:
                    return await with_heartbeat(ctx, fn.__name__, functools.partial(fn, *args, **kwargs))
                except (UserError, OSError) as err:
                    raise ToolError(one_line(err)) from None

            # the SDK gives the wrapper a Context (kept out of the input schema), which its heartbeat needs
            signature = inspect.signature(fn, eval_str=True)
            context = inspect.Parameter(HEARTBEAT_CONTEXT, inspect.Parameter.KEYWORD_ONLY, annotation=Context)
            parameters = [*signature.parameters.values(), context]
            guarded.__signature__ = signature.replace(parameters=parameters)  # type: ignore[attr-defined]
            guarded.__annotations__ = {**fn.__annotations__, HEARTBEAT_CONTEXT: Context}

        app.tool(annotations=annotations, title=title, description=inspect.cleandoc(fn.__doc__ or ""))(guarded)
        return fn

    return register


def structured(model: BaseModel, links: list[ResourceLink] = ()) -> CallToolResult:  # type: ignore[assignment]
    """A result as structured content, its JSON as text beside it, and links to the files a
    client reads as resources rather than inline."""
    data = model.model_dump(mode="json")
    content: list[Any] = [TextContent(type="text", text=json.dumps(data, indent=1))]
    return CallToolResult(content=content + list(links), structured_content=data)


def make_server(root: str | Path) -> MCPServer:
    from magpie.mcp import benchmark_tools, job_tools, kernel_tools, loop_tools, project_tools, resources, trace_tools

    services = Services(Path(root))
    app: MCPServer = MCPServer(name="magpie", version=__version__, instructions=INSTRUCTIONS, log_level="WARNING")
    for module in (project_tools, job_tools, kernel_tools, trace_tools, benchmark_tools, loop_tools, resources):
        module.register(app, services)
    return app


def serve(
    root: str | Path, *, http: bool = False, host: str = "127.0.0.1", port: int = 8000, token: str | None = None
) -> None:
    """Run the server until its client goes (stdio) or it is stopped (HTTP). Over HTTP every
    request must carry the bearer token (`token`, else one made now: printed once to stderr and
    written to `<workspace>/mcp/http-<port>.token`, mode 0600, removed at the end), and the
    SDK's DNS-rebinding protection is on: only Host and Origin headers naming this server's
    own address are answered."""
    app = make_server(root)
    logging.getLogger("mcp").setLevel(logging.WARNING)
    if not http:
        app.run("stdio")
        return
    import anyio
    import uvicorn

    from magpie.mcp.http_auth import BearerGate, new_token, token_path, write_token

    names = ["127.0.0.1", "localhost", "[::1]"] if host in LOOPBACK else [f"[{host}]" if ":" in host else host]
    hosts = [f"{name}:*" for name in names]
    security = TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=hosts,
        allowed_origins=[f"http://{name}" for name in hosts],
    )
    listening = bound(host, port)  # before the token file is written: a port in use is another server's
    given = token is not None
    token = token or new_token()
    path = token_path(workspace_of(Path(root)), port)
    write_token(path, token)
    url = f"http://{f'[{host}]' if ':' in host else host}:{port}/mcp"
    told = "MAGPIE_MCP_TOKEN's token" if given else f"'Authorization: Bearer {token}'"
    print(f"magpie mcp: {url}: every request needs {told} (also in {path}, mode 0600)", file=sys.stderr, flush=True)
    gated = BearerGate(app.streamable_http_app(transport_security=security, host=host), token)
    server = uvicorn.Server(uvicorn.Config(gated, log_level="warning"))
    # uvicorn stops gracefully on SIGTERM, then raises it again under this handler: the token file goes
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    try:
        anyio.run(functools.partial(server.serve, sockets=[listening]))
    finally:
        path.unlink(missing_ok=True)
        listening.close()


def bound(host: str, port: int) -> socket.socket:
    """The server's listening socket, or one line saying why there is none."""
    listening = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    listening.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listening.bind((host, port))
    except OSError as err:
        listening.close()
        raise UserError(f"--host/--port: cannot listen on {host}:{port} ({err.strerror or err})") from None
    return listening
