"""Who may call the server over HTTP: every request carries `Authorization: Bearer <token>`.

Loopback alone does not say who connects: any local user, or any process of this one (a
browser page among them, past the DNS-rebinding check), can reach a port on 127.0.0.1. The
token is MAGPIE_MCP_TOKEN where given (taken out of the environment first, so no job
inherits it), else made at start; it is written, readable by this user alone, to
`<workspace>/mcp/http-<port>.token` (the workspace is hidden from sandboxed code) and removed
when the server stops."""

from __future__ import annotations

import hmac
import json
import os
import secrets
import string
import tempfile
from pathlib import Path

from magpie.environment import MCP_TOKEN
from magpie.errors import UserError

MIN_TOKEN_CHARS = 32
TOKEN_CHARS = frozenset(string.ascii_letters + string.digits + "-._~+/=")


def take_token_from_environment() -> str | None:
    """The token the invoker gave, out of the environment every later process inherits."""
    given = os.environ.pop(MCP_TOKEN, "").strip()
    if not given:
        return None
    if len(given) < MIN_TOKEN_CHARS or not set(given) <= TOKEN_CHARS:
        raise UserError(
            f"{MCP_TOKEN}: a bearer token of at least {MIN_TOKEN_CHARS} letters, digits or -._~+/= "
            '(e.g. from `python -c "import secrets; print(secrets.token_urlsafe(32))"`)'
        )
    return given


def new_token() -> str:
    return secrets.token_urlsafe(32)


def token_path(workspace: Path, port: int) -> Path:
    return workspace / "mcp" / f"http-{port}.token"


def write_token(path: Path, token: str) -> None:
    """Mode 0600 from its first byte (mkstemp), put in place whole."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(token + "\n")
        os.replace(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise


class BearerGate:
    """An ASGI app in front of the server's: an HTTP request without the token is answered
    401, whatever its path or method; the server's lifespan passes through."""

    def __init__(self, app, token: str):
        self.app = app
        self.expected = f"Bearer {token}".encode()

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] in ("http", "websocket") and not self.authorized(scope):
            if scope["type"] == "websocket":
                await send({"type": "websocket.close", "code": 1008})
                return
            body = json.dumps({"error": "unauthorized: send 'Authorization: Bearer <token>' (magpie mcp --http)"})
            await send(
                {
                    "type": "http.response.start",
                    "status": 401,
                    "headers": [
                        (b"content-type", b"application/json"),
                        (b"www-authenticate", b'Bearer realm="magpie"'),
                    ],
                }
            )
            await send({"type": "http.response.body", "body": body.encode()})
            return
        await self.app(scope, receive, send)

    def authorized(self, scope) -> bool:
        given = [value for name, value in scope.get("headers", ()) if name == b"authorization"]
        return len(given) == 1 and hmac.compare_digest(given[0], self.expected)
