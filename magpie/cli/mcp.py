"""magpie mcp: serve the project to agents over the Model Context Protocol."""

from __future__ import annotations

import os

from magpie.errors import UserError


def add_parser(sub) -> None:
    p = sub.add_parser(
        "mcp",
        help="serve this project to agents over MCP (stdio, or streamable HTTP with --http)",
        description="An MCP server of one project (the current folder, or --root): tools to build, judge, "
        "compare and benchmark, long work as jobs, every path confined to the project. Needs the mcp "
        "extra (pip install 'magpie[mcp]').",
    )
    p.add_argument("--root", default=".", help="the project's folder, holding magpie.toml (default: the current one)")
    p.add_argument(
        "--http",
        action="store_true",
        help="streamable HTTP instead of stdio; every request needs the bearer token, "
        "MAGPIE_MCP_TOKEN's or one made at start (printed, and written to <workspace>/mcp/http-PORT.token)",
    )
    p.add_argument("--host", default="127.0.0.1", help="with --http: the address to listen on (default: %(default)s)")
    p.add_argument("--port", type=int, default=8000, help="with --http: the port (default: %(default)s)")
    p.set_defaults(run=run)


def run(args) -> int:
    root = os.path.realpath(args.root)
    if not os.path.isdir(root):
        raise UserError(f"--root: {args.root}: not a folder")
    if not args.http and (args.host != "127.0.0.1" or args.port != 8000):
        raise UserError("--host/--port: give them with --http (stdio has no address)")
    if not 0 < args.port < 65536:
        raise UserError(f"--port: {args.port} is not a port (1-65535)")
    from magpie.mcp.http_auth import take_token_from_environment

    token = take_token_from_environment()  # before any process starts: no job inherits it
    try:
        from magpie.mcp.server import serve
    except ImportError as err:
        if (err.name or "").split(".")[0] not in ("mcp", "mcp_types", "tomlkit"):
            raise
        raise UserError(f"mcp: the MCP SDK is not installed ({err.name}); pip install 'magpie[mcp]'") from None
    serve(root, http=args.http, host=args.host, port=args.port, token=token)
    return 0
