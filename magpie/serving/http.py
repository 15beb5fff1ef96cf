"""Keep-alive HTTP/1.1 connections that hand a response body to its `StreamRecorder` as it arrives.

Each connection is an `asyncio.Protocol`: bytes are parsed in `data_received` (status line and
headers, then chunked, sized or read-until-close bodies) and complete SSE messages are stamped
there, with no task switch between the bytes' arrival and their timestamp. One `Client` owns a
pool of idle connections (last used first); a request takes one or opens one, and gives it back
when its response ended with the connection kept alive. A reused connection the server had
already closed is retried once on a fresh one, before any byte of a response arrived.
"""

from __future__ import annotations

import asyncio
import os
import ssl as _ssl
import time
from urllib.parse import urlsplit

import msgspec

from magpie.serving.stream import Clock, RequestOutput, StreamRecorder

_IDLE, _HEAD, _BODY = 0, 1, 2
_encode = msgspec.json.encode


class _Connection(asyncio.Protocol):
    __slots__ = (
        "transport",
        "closed",
        "reused",
        "_state",
        "_buf",
        "_recorder",
        "_waiter",
        "_status",
        "_chunked",
        "_left",
        "_keep_alive",
        "_error_body",
        "_got_bytes",
    )

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.reused = False
        self._state = _IDLE
        self._buf = b""
        self._recorder: StreamRecorder | None = None
        self._waiter: asyncio.Future | None = None

    # -- asyncio callbacks
    def connection_made(self, transport) -> None:
        self.transport = transport

    def connection_lost(self, exc) -> None:
        self.closed = True
        if self._state == _BODY and not self._chunked and self._left is None:
            self._end("")  # a body delimited by the connection's close
        elif self._state != _IDLE:
            self._end(f"connection closed by the server{': ' + str(exc) if exc else ''}")

    def data_received(self, data: bytes) -> None:
        self._got_bytes = True
        if self._state == _HEAD:
            data = self._buf + data if self._buf else data
            cut = data.find(b"\r\n\r\n")
            if cut < 0:
                self._buf = data
                return
            self._head(data[:cut])
            data = data[cut + 4 :]
            self._buf = b""
            self._state = _BODY
        if self._state != _BODY:
            return
        if self._chunked:
            self._chunks(data)
        elif self._left is not None:
            take = data[: self._left]
            self._left -= len(take)
            self._deliver(take)
            if self._left == 0:
                self._end("")
        else:
            self._deliver(data)

    # -- parsing
    def _head(self, head: bytes) -> None:
        lines = head.split(b"\r\n")
        status = lines[0].split(b" ", 2)
        self._status = int(status[1]) if len(status) > 1 and status[1].isdigit() else 0
        self._keep_alive = not lines[0].startswith(b"HTTP/1.0")
        self._chunked = False
        self._left = None
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"transfer-encoding":
                self._chunked = b"chunked" in value.lower()
            elif name == b"content-length":
                self._left = int(value.strip())
            elif name == b"connection":
                self._keep_alive = b"close" not in value.lower()
        if self._chunked:
            self._left = None
        elif self._left is None:
            self._keep_alive = False  # read until close
        elif self._left == 0:
            self._state = _BODY
            self._end("")

    def _chunks(self, data: bytes) -> None:
        buf = self._buf + data if self._buf else data
        pos, pieces, n = 0, [], len(buf)
        while True:
            eol = buf.find(b"\r\n", pos)
            if eol < 0:
                break
            size = int(buf[pos:eol].split(b";", 1)[0], 16)
            start = eol + 2
            if size == 0:  # last chunk: trailers (if any) end with an empty line
                if buf.startswith(b"\r\n", start) or buf.find(b"\r\n\r\n", start - 2) >= 0:
                    self._buf = b""
                    if pieces:
                        self._deliver(b"".join(pieces))
                    self._end("")
                    return
                break
            if n - start < size + 2:
                break
            pieces.append(buf[start : start + size])
            pos = start + size + 2
        self._buf = buf[pos:]
        if pieces:
            self._deliver(pieces[0] if len(pieces) == 1 else b"".join(pieces))

    def _deliver(self, data: bytes) -> None:
        if not data:
            return
        if self._status == 200:
            self._recorder.feed(data)
        elif len(self._error_body) < 4096:
            self._error_body += data

    def _end(self, error: str) -> None:
        if self._state == _IDLE:
            return
        if not error and self._status != 200:
            text = self._error_body[:300].decode("utf-8", "replace").strip()
            error = f"HTTP {self._status}{': ' + text if text else ''}"
        self._state = _IDLE
        waiter, self._waiter, self._recorder = self._waiter, None, None
        if not self._keep_alive and self.transport is not None:
            self.transport.close()
            self.closed = True
        if waiter is not None and not waiter.done():
            waiter.set_result(error)

    # -- use
    def start(self, data: bytes, recorder: StreamRecorder, waiter: asyncio.Future) -> None:
        self._state = _HEAD
        self._buf = b""
        self._recorder = recorder
        self._waiter = waiter
        self._status = 0
        self._chunked = False
        self._left = None
        self._keep_alive = True
        self._error_body = b""
        self._got_bytes = False
        self.transport.write(data)

    def abort(self, reason: str) -> None:
        if self._state != _IDLE:
            self._keep_alive = False
            self._end(reason)
        if self.transport is not None:
            self.transport.abort()
        self.closed = True


class Client:
    """Sends streaming requests to one server; one per run, its idle connections shared by all requests."""

    def __init__(
        self,
        base_url: str,
        endpoint,
        *,
        model: str,
        headers: dict[str, str] | None = None,
        timeout_s: float | None = None,
        clock: Clock = time.perf_counter,
        ignore_eos: bool = False,
        extra_body: dict | None = None,
        force_len: str = "ignore_eos",
    ) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"base URL must be http://HOST[:PORT] or https://..., got {base_url!r}")
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.ssl = _ssl.create_default_context() if parts.scheme == "https" else None
        self.endpoint = endpoint
        self.path = parts.path.rstrip("/") + endpoint.path
        self.model = model
        self.clock = clock
        self.timeout_s = timeout_s
        self.ignore_eos = ignore_eos
        self.extra_body = extra_body
        self.force_len = force_len
        all_headers = {
            "Host": f"{self.host}:{self.port}",
            "Content-Type": "application/json",
            "Accept": "text/event-stream",
            "User-Agent": "magpie-serving",
        }
        key = os.environ.get("OPENAI_API_KEY")
        if key:
            all_headers["Authorization"] = f"Bearer {key}"
        all_headers.update(headers or {})
        self._head = (
            f"POST {self.path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in all_headers.items())
        ).encode("latin-1")
        self._idle: list[_Connection] = []
        self.opened = 0

    def encode(self, prompt: str, output_len: int) -> bytes:
        """The whole request's bytes, built before the send time is taken."""
        body = _encode(
            self.endpoint.body(
                model=self.model,
                prompt=prompt,
                output_len=output_len,
                ignore_eos=self.ignore_eos,
                extra_body=self.extra_body,
                force_len=self.force_len,
            )
        )
        return self._head + b"Content-Length: %d\r\n\r\n" % len(body) + body

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        _, conn = await loop.create_connection(_Connection, self.host, self.port, ssl=self.ssl)
        self.opened += 1
        return conn

    async def send(self, prompt: str, prompt_len: int, output_len: int, *, data: bytes | None = None) -> RequestOutput:
        """One streaming request; its send time is taken just before a connection is taken or opened."""
        if data is None:
            data = self.encode(prompt, output_len)
        loop = asyncio.get_running_loop()
        out = RequestOutput(prompt_len, self.clock())
        recorder = StreamRecorder(self.endpoint, out, self.clock)
        for attempt in (0, 1):
            conn = None
            try:
                while self._idle:
                    conn = self._idle.pop()
                    if not conn.closed and not conn.transport.is_closing():
                        conn.reused = True
                        break
                    conn = None
                if conn is None:
                    conn = await self._connect()
                waiter = loop.create_future()
                conn.start(data, recorder, waiter)
                timer = (
                    loop.call_later(self.timeout_s, conn.abort, f"timed out after {self.timeout_s} s")
                    if self.timeout_s
                    else None
                )
                try:
                    error = await waiter
                finally:
                    if timer is not None:
                        timer.cancel()
            except asyncio.CancelledError:
                if conn is not None:
                    conn.abort("cancelled")
                raise
            except OSError as exc:
                error = f"{type(exc).__name__}: {exc}"
                if conn is not None:
                    conn.abort(error)
            if error and attempt == 0 and conn is not None and conn.reused and not conn._got_bytes:
                conn.abort(error)
                continue  # a stale keep-alive connection: once more on a fresh one
            if conn is not None and not conn.closed and conn._state == _IDLE and not error:
                self._idle.append(conn)
            elif conn is not None and not conn.closed:
                conn.abort(error or "closed")
            return recorder.finish(error)
        raise AssertionError("unreachable")

    def close(self) -> None:
        for conn in self._idle:
            if conn.transport is not None:
                conn.transport.close()
        self._idle.clear()
