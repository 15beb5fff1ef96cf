"""One request's SSE stream turned into timings, independent of the transport.

`StreamRecorder.feed(bytes)` takes response-body bytes as they arrive; each complete SSE message
is stamped with one call of the injected clock (`time.perf_counter` by default) before it is
decoded. Only messages whose choice carries output text are token chunks: the chat role-only
chunk (`content: ""`), the finish chunk (empty delta) and usage-only chunks are not. TTFT is the
first token chunk minus the send time, E2EL the last token chunk minus the send time, ITLs every
gap between consecutive token chunks; output tokens come from `usage.completion_tokens` when the
server sent it, else they are the counted token chunks.

Success is vLLM's: a request succeeds when its stream answered (HTTP 200, at least one chunk decoded)
and carried no error, even with no output text; such an empty request's TTFT and E2EL are its first
and last chunk's times. vLLM asks for a chunk with a `choices` entry; a stream whose only chunk is a
usage chunk is a success here and a failure there.
"""

from __future__ import annotations

import time
from collections.abc import Callable

Clock = Callable[[], float]


class RequestOutput:
    """The record of one request (vLLM's `RequestFuncOutput` fields, plus the token chunk times)."""

    __slots__ = (
        "success",
        "start_time",
        "ttft",
        "latency",
        "itl",
        "output_tokens",
        "prompt_len",
        "generated_text",
        "error",
        "client_queue_time",
        "token_times",
        "usage_tokens",
    )

    def __init__(self, prompt_len: int = 0, start_time: float = 0.0) -> None:
        self.success = False
        self.start_time = start_time
        self.ttft = 0.0
        self.latency = 0.0
        self.itl: list[float] = []
        self.output_tokens = 0
        self.prompt_len = prompt_len
        self.generated_text = ""
        self.error = ""
        self.client_queue_time = 0.0
        self.token_times: list[float] = []
        self.usage_tokens: int | None = None

    def __repr__(self) -> str:
        return (
            f"RequestOutput(success={self.success}, ttft={self.ttft:.6f}, latency={self.latency:.6f}, "
            f"tokens={self.output_tokens}, error={self.error[:60]!r})"
        )


class StreamRecorder:
    """Parses one SSE body and records its token chunks' times into a `RequestOutput`."""

    __slots__ = ("endpoint", "clock", "out", "_buf", "_texts", "done", "failed", "first_chunk_at", "last_chunk_at")

    def __init__(self, endpoint, out: RequestOutput, clock: Clock = time.perf_counter) -> None:
        self.endpoint = endpoint
        self.clock = clock
        self.out = out
        self._buf = b""
        self._texts: list[str] = []
        self.done = False  # `data: [DONE]` seen
        self.failed = ""  # an error payload inside the stream
        self.first_chunk_at: float | None = None  # any decoded chunk, with or without output text
        self.last_chunk_at: float | None = None

    def feed(self, data: bytes) -> None:
        buf = self._buf + data if self._buf else data
        if b"\r" in buf:  # CRLF or CR line endings: normalise, keeping a trailing lone CR for later
            keep = buf.endswith(b"\r")
            buf = (buf[:-1] if keep else buf).replace(b"\r\n", b"\n").replace(b"\r", b"\n") + (b"\r" if keep else b"")
        start = 0
        while True:
            end = buf.find(b"\n\n", start)
            if end < 0:
                break
            block = buf[start:end]
            start = end + 2
            if block:
                self._message(block)
        self._buf = buf[start:]

    def _message(self, block: bytes) -> None:
        if block.startswith(b"data:") and b"\n" not in block:
            payload = block[6:] if block[5:6] == b" " else block[5:]
        else:  # several lines: data lines joined by newlines, comments and other fields ignored
            parts = []
            for line in block.split(b"\n"):
                if line.startswith(b"data:"):
                    parts.append(line[6:] if line[5:6] == b" " else line[5:])
            if not parts:
                return
            payload = b"\n".join(parts)
        now = self.clock()
        if payload == b"[DONE]":
            self.done = True
            return
        text, usage, error = self.endpoint.parse_chunk(payload)
        if error:
            self.failed = error
            return
        if self.first_chunk_at is None:
            self.first_chunk_at = now
        self.last_chunk_at = now
        if text:
            self.out.token_times.append(now)
            self._texts.append(text)
        if usage is not None:
            self.out.usage_tokens = usage.completion_tokens
            if usage.prompt_tokens is not None:
                self.out.prompt_len = usage.prompt_tokens

    def finish(self, error: str = "") -> RequestOutput:
        """Closes the record: success needs an answered stream (a decoded chunk) and no error."""
        out = self.out
        times = out.token_times
        st = out.start_time
        out.generated_text = "".join(self._texts)
        if times:
            out.ttft = times[0] - st
            out.latency = times[-1] - st
            out.itl = [b - a for a, b in zip(times, times[1:])]
        elif self.first_chunk_at is not None:
            out.ttft = self.first_chunk_at - st
            out.latency = self.last_chunk_at - st
        out.output_tokens = out.usage_tokens if out.usage_tokens else len(times)
        error = error or self.failed
        if error:
            out.error = error
        elif self.first_chunk_at is None:
            out.error = "no chunk arrived (the stream answered nothing)"
        else:
            out.success = True
        return out
