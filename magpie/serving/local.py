"""Local run mode: an engine's server as a child process group of ours, and its end.

`LocalServer` starts the command in a new session (its own process group, so workers it forks
are reached too), with stdout and stderr appended to a log file in the workspace. Before the
start it checks that nothing listens on the port; `wait_ready` polls the engine's health route
until it answers 200, the process exits (the log's tail is the reason, and `error_line` the engine's own words for
it, put in the message) or the timeout passes.
`stop` sends SIGTERM to the whole group, waits, then SIGKILLs what is left; it is idempotent
and runs from `__exit__`, so success, failure, timeout and Ctrl-C (KeyboardInterrupt) all end
the group. `install_sigterm` turns a SIGTERM of ours into KeyboardInterrupt for the same path.
"""

from __future__ import annotations

import errno
import http.client
import os
import re
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

from magpie.linux.procfs import group_has_live_process

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
# `ValueError: ...`, `torch.OutOfMemoryError: ...`, `RuntimeError` alone: a Python exception as a traceback ends
EXCEPTION_LINE = re.compile(r"^\s*(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception|Exit|Interrupt)(?::\s|\s*$)")
ERROR_LEVEL = re.compile(r"\b(?:ERROR|CRITICAL|FATAL)\b")


class ServerError(RuntimeError):
    """The server could not be started or stopped running; `log_tail` holds the end of its log."""

    def __init__(self, message: str, log_tail: str = "") -> None:
        super().__init__(message)
        self.log_tail = log_tail


def port_in_use(host: str, port: int) -> bool:
    """Whether a server already listens on host:port (a bind with SO_REUSEADDR fails, or a connect succeeds)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                return True
            raise
    target = "127.0.0.1" if host in ("0.0.0.0", "localhost") else ("::1" if host == "::" else host)
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex((target, port)) == 0


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _end_of(path: Path, max_bytes: int) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - max_bytes))
            return ANSI.sub("", f.read().decode("utf-8", "replace"))
    except OSError:
        return ""


def error_line(path: Path, max_bytes: int = 262144) -> str:
    """The engine's own words for why it stopped: the last exception line of the log's end (`ValueError: ...`),
    else its last line logged at ERROR, CRITICAL or FATAL; "" when there is none. Engines log their shutdown
    after the exception, so the line is often not among the last few."""
    lines = _end_of(path, max_bytes).splitlines()
    for pattern in (EXCEPTION_LINE, ERROR_LEVEL):
        for line in reversed(lines):
            if pattern.search(line):
                line = line.strip()
                return line if len(line) <= 400 else line[:400] + "..."
    return ""


def tail(path: Path, lines: int = 20, max_bytes: int = 16384) -> str:
    """The log's last `lines` lines, its error line (`error_line`) put first where it is not among them."""
    last = "\n".join(_end_of(path, max_bytes).splitlines()[-lines:])
    error = error_line(path)
    return f"{error}\n[...]\n{last}" if error and error not in last else last


def exit_words(path: Path) -> str:
    """': <the engine's error line>' for a message about its exit, "" when the log has none."""
    error = error_line(path)
    return f": {error}" if error else ""


def health_ok(url: str, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status == 200
    # a server still starting may answer garbage (a bad status line, an endless header): not ready yet, not a crash
    except (urllib.error.URLError, OSError, ValueError, http.client.HTTPException):
        return False


def wait_healthy(server, timeout_s: float, interval_s: float = 0.25, who: str = "the server", log_tail=None) -> float:
    """Seconds from `server.started_at` until its `health_url` answered 200, kept as `server.ready_after`;
    ServerError (with `log_tail()`, by default the log's last lines) once `server.alive()` is false or the
    timeout has passed. Local and docker servers alike."""
    log_tail = log_tail or (lambda: tail(server.log_path))
    deadline = time.monotonic() + timeout_s
    while True:
        if not server.alive():
            detail = log_tail()  # a container's log is complete once its stream has ended
            raise ServerError(
                f"{who} exited with code {server.exit_code()} before it was ready"
                f"{exit_words(server.log_path)}; log: {server.log_path}",
                detail,
            )
        if health_ok(server.health_url, timeout=min(2.0, max(0.1, deadline - time.monotonic()))):
            server.ready_after = time.monotonic() - server.started_at
            return server.ready_after
        if time.monotonic() >= deadline:
            raise ServerError(
                f"the server was not ready within {timeout_s:g} s ({server.health_url} did not "
                f"answer 200); log: {server.log_path}",
                tail(server.log_path),
            )
        time.sleep(interval_s)


class LocalServer:
    """A server command run as its own process group, logged to `log_path`."""

    def __init__(
        self,
        command: list[str],
        *,
        env: dict[str, str] | None = None,
        log_path: str | Path,
        host: str,
        port: int,
        health_url: str,
        cwd: str | Path | None = None,
    ) -> None:
        self.command, self.extra_env = list(command), dict(env or {})
        self.log_path = Path(log_path)
        self.host, self.port, self.health_url = host, port, health_url
        self.cwd = cwd
        self.proc: subprocess.Popen | None = None
        self.started_at = 0.0
        self.ready_after: float | None = None

    # -- life
    def start(self) -> LocalServer:
        if port_in_use(self.host, self.port):
            raise ServerError(
                f"port {self.port} on {self.host} is already taken (another server?); stop it or choose another port"
            )
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **self.extra_env}
        with open(self.log_path, "ab") as log:
            log.write(("$ " + " ".join(self.command) + "\n").encode())
            log.flush()
            try:
                self.proc = subprocess.Popen(
                    self.command,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    env=env,
                    cwd=self.cwd,
                    start_new_session=True,
                )
            except OSError as exc:
                raise ServerError(f"cannot run {self.command[0]}: {exc.strerror or exc}") from None
        self.started_at = time.monotonic()
        return self

    @property
    def pid(self) -> int | None:
        """The server's process, leader of its own process group."""
        return self.proc.pid if self.proc is not None else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def exit_code(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def wait_exit(self, timeout_s: float) -> int | None:
        """Its exit code once it has exited, waiting up to `timeout_s`; None if it still runs."""
        if self.proc is None:
            return None
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def wait_ready(self, timeout_s: float, interval_s: float = 0.25) -> float:
        """Seconds until the health route answered 200; raises ServerError on exit or timeout."""
        return wait_healthy(self, timeout_s, interval_s)

    def stop(self, grace_s: float = 10.0) -> int | None:
        """SIGTERM to the group, SIGKILL after `grace_s`; the exit code (negative: the signal)."""
        if self.proc is None:
            return None
        pgid = self.proc.pid  # the session leader's pid is its group's id
        if self.proc.poll() is None:
            _signal_group(pgid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                pass
        # the leader may be gone while children it forked are not: the whole group gets SIGKILL,
        # and the stop returns once none of it runs (a killed process dies when next scheduled)
        _signal_group(pgid, signal.SIGKILL)
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        deadline = time.monotonic() + 5
        while group_alive(pgid) and time.monotonic() < deadline:
            time.sleep(0.01)
        return self.proc.returncode

    def __enter__(self) -> LocalServer:
        return self.start() if self.proc is None else self

    def __exit__(self, *exc) -> None:
        self.stop()


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def group_alive(pgid: int) -> bool:
    """Whether any process of group `pgid` remains (zombies aside)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return group_has_live_process(pgid)


class install_sigterm:
    """While active, SIGTERM raises KeyboardInterrupt in the main thread (the Ctrl-C path stops the server)."""

    def __enter__(self):
        self._old = None
        try:
            self._old = signal.signal(signal.SIGTERM, self._raise)
        except ValueError:  # not the main thread
            pass
        return self

    @staticmethod
    def _raise(signum, frame):
        raise KeyboardInterrupt

    def __exit__(self, *exc):
        if self._old is not None:
            signal.signal(signal.SIGTERM, self._old)
