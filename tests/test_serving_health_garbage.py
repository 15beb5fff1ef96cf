"""A server that answers garbage on its health route while it starts is waited for, not a crash of the run."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import pytest

from magpie.serving.local import ServerError, health_ok, wait_healthy

# each is an answer http.client refuses with an HTTPException that is not an OSError
GARBAGE = {
    "bad status line": b"NOT-HTTP garbage\r\n\r\n",
    "header line too long": b"HTTP/1.1 200 OK\r\nX: " + b"a" * 70000 + b"\r\n\r\n",
}


class GarbagePeer:
    """A real listening socket that answers every connection with `answer` and closes it."""

    def __init__(self, answer: bytes) -> None:
        self.answer = answer
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.2)
        self.port = self.listener.getsockname()[1]
        self.connections = 0
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)

    def _serve(self) -> None:
        while not self.stopped.is_set():
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            with conn:
                self.connections += 1
                conn.settimeout(2)
                try:
                    conn.recv(65536)
                    conn.sendall(self.answer)
                except OSError:
                    pass

    def __enter__(self) -> GarbagePeer:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stopped.set()
        self.thread.join(5)
        self.listener.close()


class StartingServer:
    """The part of a server wait_healthy reads: alive the whole time, its health route on the peer."""

    def __init__(self, port: int, log_path: Path) -> None:
        self.health_url = f"http://127.0.0.1:{port}/health"
        self.log_path = log_path
        self.started_at = time.monotonic()

    def alive(self) -> bool:
        return True

    def exit_code(self) -> int | None:
        return None


@pytest.mark.parametrize("answer", list(GARBAGE.values()), ids=list(GARBAGE))
def test_health_check_reads_garbage_as_not_ready(answer):
    with GarbagePeer(answer) as peer:
        assert health_ok(f"http://127.0.0.1:{peer.port}/health", timeout=2.0) is False
        assert peer.connections >= 1


def test_wait_healthy_on_garbage_fails_in_one_line_at_its_timeout(tmp_path):
    log = tmp_path / "server.log"
    log.write_text("starting\n")
    with GarbagePeer(GARBAGE["bad status line"]) as peer:
        server = StartingServer(peer.port, log)
        with pytest.raises(ServerError) as caught:
            wait_healthy(server, timeout_s=1.0, interval_s=0.1)
        assert peer.connections >= 2  # it kept asking instead of stopping at the first bad answer
    message = str(caught.value)
    assert "\n" not in message
    assert "was not ready within 1 s" in message and str(log) in message
