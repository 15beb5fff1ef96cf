"""An OpenAI-compatible streaming server that answers from a script: the peer of the client's tests
and of `bench/serving_client.py`, never an engine.

`/v1/completions` and `/v1/chat/completions` stream `max_tokens` (`max_completion_tokens`) chunks as
SSE over chunked HTTP/1.1 with keep-alive; chat opens with a role-only chunk and both close with a
finish chunk, a usage chunk when `stream_options.include_usage` asks, and `data: [DONE]`. A
`script(path, body) -> Reply` decides the status, delays (before the first token, between tokens),
a drop of the connection after some tokens, and whether usage is sent; with no delays the whole
response goes out in one write, from a cache. Prompt tokens are its whitespace-separated words.

    python -m magpie.serving.stub_server --port 8765      # instant answers, until killed
"""

from __future__ import annotations

import argparse
import asyncio
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import msgspec

_decode = msgspec.json.Decoder()
_encode = msgspec.json.encode


@dataclass
class Reply:
    status: int = 200
    tokens: int | None = None  # None: the request's max_tokens
    first_delay: float = 0.0  # seconds before the first token chunk
    delays: list[float] = field(default_factory=list)  # seconds before token i+1 (missing: 0)
    drop_after: int | None = None  # close the connection after this many token chunks
    usage: bool | None = None  # None: as the request asks
    text: str = "tok "  # each token chunk's text
    error_chunk: str | None = None  # an in-stream error payload after the tokens
    abort: bool = False  # reset the connection without answering (a stale keep-alive peer)


Script = Callable[[str, dict], Reply]


def _frame(payload: bytes) -> bytes:
    event = b"data: " + payload + b"\n\n"
    return b"%x\r\n%s\r\n" % (len(event), event)


def _events(path: str, reply: Reply, n: int, prompt_tokens: int, usage: bool, model: str) -> list[bytes]:
    """The frames of one response: [head frames, token frames..., tail frames] as a flat list with the
    index of the first token frame at 1 (the head is possibly empty bytes)."""
    chat = path.endswith("chat/completions")
    obj = "chat.completion.chunk" if chat else "text_completion"
    base = {"id": "stub", "object": obj, "created": 0, "model": model}
    head = b""
    if chat:
        head = _frame(
            _encode(
                {
                    **base,
                    "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}],
                }
            )
        )
    if chat:
        tok = _frame(
            _encode({**base, "choices": [{"index": 0, "delta": {"content": reply.text}, "finish_reason": None}]})
        )
        fin = _frame(_encode({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]}))
    else:
        tok = _frame(_encode({**base, "choices": [{"index": 0, "text": reply.text, "finish_reason": None}]}))
        fin = _frame(_encode({**base, "choices": [{"index": 0, "text": "", "finish_reason": "length"}]}))
    tail = fin
    if reply.error_chunk is not None:
        tail = _frame(_encode({"error": {"message": reply.error_chunk}}))
    if usage:
        tail += _frame(
            _encode(
                {
                    **base,
                    "choices": [],
                    "usage": {
                        "prompt_tokens": prompt_tokens,
                        "completion_tokens": n,
                        "total_tokens": prompt_tokens + n,
                    },
                }
            )
        )
    tail += _frame(b"[DONE]") + b"0\r\n\r\n"
    return [head] + [tok] * n + [tail]


_HEAD_OK = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n"
    b"transfer-encoding: chunked\r\n\r\n"
)


class _ServerConnection(asyncio.Protocol):
    def __init__(self, server: StubServer) -> None:
        self.server = server
        self.buf = b""
        self.transport = None

    def connection_made(self, transport) -> None:
        self.transport = transport
        self.server.connections += 1
        self.server.live.add(self)

    def connection_lost(self, exc) -> None:
        self.transport = None
        self.server.live.discard(self)

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while True:
            cut = self.buf.find(b"\r\n\r\n")
            if cut < 0:
                return
            head = self.buf[:cut]
            length = 0
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            if len(self.buf) < cut + 4 + length:
                return
            body = self.buf[cut + 4 : cut + 4 + length]
            self.buf = self.buf[cut + 4 + length :]
            self.server._handle(self, head.split(b" ", 2)[1].decode(), body)


class StubServer:
    """Serves until `close()`; `port=0` picks a free port (read `.port` after `start()`)."""

    def __init__(
        self, host: str = "127.0.0.1", port: int = 0, script: Script | None = None, record: bool = False
    ) -> None:
        self.host, self.port, self.script = host, port, script
        self.record = record
        self.requests: list[tuple[str, dict]] = []
        self.connections = 0  # accepted so far
        self.live: set[_ServerConnection] = set()
        self._server = None
        self._cache: dict[tuple, bytes] = {}

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def start(self) -> StubServer:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _ServerConnection(self), self.host, self.port, backlog=4096)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None

    def _handle(self, conn: _ServerConnection, path: str, raw: bytes) -> None:
        body = _decode.decode(raw) if raw else {}
        if self.record:
            self.requests.append((path, body))
        if not path.endswith(("/completions",)):
            conn.transport.write(b"HTTP/1.1 404 Not Found\r\ncontent-length: 9\r\n\r\nnot found")
            return
        reply = self.script(path, body) if self.script else Reply()
        if reply.abort:
            conn.transport.abort()
            return
        if reply.status != 200:
            msg = _encode({"error": {"message": f"scripted status {reply.status}"}})
            conn.transport.write(
                b"HTTP/1.1 %d Error\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                % (reply.status, len(msg), msg)
            )
            return
        n = (
            reply.tokens
            if reply.tokens is not None
            else int(body.get("max_tokens") or body.get("max_completion_tokens") or 16)
        )
        usage = (
            reply.usage if reply.usage is not None else bool((body.get("stream_options") or {}).get("include_usage"))
        )
        if "messages" in body:
            prompt = " ".join(str(m.get("content", "")) for m in body["messages"])
        else:
            prompt = str(body.get("prompt", ""))
        prompt_tokens = len(prompt.split())
        model = str(body.get("model", "stub"))
        instant = not reply.first_delay and not any(reply.delays) and reply.drop_after is None
        if instant:
            key = (path, n, prompt_tokens, usage, model, reply.text, reply.error_chunk)
            data = self._cache.get(key)
            if data is None:
                data = _HEAD_OK + b"".join(_events(path, reply, n, prompt_tokens, usage, model))
                if len(self._cache) < 4096:
                    self._cache[key] = data
            conn.transport.write(data)
            return
        frames = _events(path, reply, n, prompt_tokens, usage, model)
        asyncio.get_running_loop().create_task(self._paced(conn, frames, reply, n))

    async def _paced(self, conn: _ServerConnection, frames: list[bytes], reply: Reply, n: int) -> None:
        transport = conn.transport
        transport.write(_HEAD_OK + frames[0])
        for i in range(n):
            delay = reply.first_delay if i == 0 else (reply.delays[i - 1] if i - 1 < len(reply.delays) else 0.0)
            if delay:
                await asyncio.sleep(delay)
            if reply.drop_after is not None and i >= reply.drop_after:
                transport.abort()
                return
            if transport.is_closing():
                return
            transport.write(frames[1 + i])
        if reply.drop_after is not None and n >= reply.drop_after:
            transport.abort()
            return
        transport.write(frames[-1])


class ThreadedStubServer:
    """A `StubServer` on its own event loop in a daemon thread: `with ThreadedStubServer(...) as srv:`."""

    def __init__(self, **kwargs) -> None:
        self.kwargs = kwargs
        self.server: StubServer | None = None
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def __enter__(self) -> StubServer:
        self._thread.start()
        self.server = asyncio.run_coroutine_threadsafe(StubServer(**self.kwargs).start(), self.loop).result(10)
        return self.server

    def __exit__(self, *exc) -> None:
        asyncio.run_coroutine_threadsafe(self.server.close(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)

    async def serve() -> None:
        server = await StubServer(args.host, args.port).start()
        print(f"listening {server.base_url}", flush=True)
        await asyncio.Event().wait()

    try:
        asyncio.run(serve())
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
