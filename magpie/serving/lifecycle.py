"""Server reuse (Magpie's `server_lifecycle`): a local server kept running after a run, and reused by a later run
that would start the same server.

With `server_lifecycle: reuse` (`magpie benchmark ... --keep-server`) the run's server is a `KeptServer`. At its
start it reads the record of the server kept on its host and port, if any: a small JSON (`ServerRecord`: engine
and version, model and its content key, the command line, the environment given to it, host, port, pid, process
group, the process's start time) in a private per-user runtime folder (`$MAGPIE_SERVER_DIR`, else
`<tmp>/magpie-servers-<uid>/`). It reuses that server only when the recorded config equals the one this run
would start and the server still runs (the same process: pid and start time) and answers its health route;
otherwise it stops what is left of the recorded server's process group, removes the record and starts a fresh
server. A server that served a run without errors is kept (its record written); one whose run failed, or was
interrupted, is stopped like any local server. The server's output goes to a log beside its record (a run's
workspace may be gone before the server); each run's part of it is copied into the run's `server.log`.

`stop_all()` (`magpie benchmark --stop-servers`) stops every kept server of the user.
"""
from __future__ import annotations

import os
import signal
import stat
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Optional

from pydantic import BaseModel, ConfigDict

from magpie.serving.local import LocalServer, ServerError, _signal_group, group_alive, health_ok

FOLDER_ENV = "MAGPIE_SERVER_DIR"
# What must be equal for a kept server to serve another run: everything that decides what the server does.
MATCHED = ("engine", "engine_version", "model", "model_key", "command", "env", "host", "port")


class ServerRecord(BaseModel):
    model_config = ConfigDict(extra="forbid")

    engine: str
    engine_version: Optional[str]
    model: str
    model_key: Optional[str]    # a local model's content hash, else the hub revision
    command: list[str]
    env: dict[str, str]         # what the server was given over magpie's environment, and magpie's that matters
    host: str
    port: int
    pid: int = 0                # leader of the server's own process group (pgid == pid)
    process_start: int = 0      # its start time in clock ticks since boot (/proc/PID/stat): a reused pid is not it
    log: str = ""
    started_at: str = ""

    def config(self) -> dict:
        return self.model_dump(include=set(MATCHED))


def record_for(provenance, command: list[str], env: dict[str, str], host: str, port: int) -> ServerRecord:
    """The server a run would start: its provenance (engine, version, model and content key, magpie's environment
    that matters), its command line and the environment given to it."""
    return ServerRecord(engine=provenance.engine, engine_version=provenance.engine_version, model=provenance.model,
                        model_key=provenance.model_hash or provenance.model_revision, command=list(command),
                        env={**provenance.environment, **env}, host=host, port=port)


def runtime_dir() -> Path:
    """The user's private folder of kept servers' records and logs (made here, mode 0700; refused if not ours)."""
    path = Path(os.environ.get(FOLDER_ENV) or Path(tempfile.gettempdir()) / f"magpie-servers-{os.getuid()}")
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = os.lstat(path)
    except OSError as err:
        raise ServerError(f"server reuse: cannot make the folder of kept servers {path}: {err.strerror}") from None
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise ServerError(f"server reuse: {path} is not a private folder of this user; remove it")
    return path


def _stem(host: str, port: int) -> str:
    return f"{host.replace(':', '_').replace(os.sep, '_')}_{port}"


def _record_path(host: str, port: int) -> Path:
    return runtime_dir() / f"{_stem(host, port)}.json"


def process_start(pid: int) -> int | None:
    """The process's start time in clock ticks since boot; None when there is no such (live) process."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()
    return None if fields[0] in ("Z", "X") else int(fields[19])


def read_record(path: Path) -> ServerRecord | None:
    try:
        return ServerRecord.model_validate_json(path.read_text())
    except (OSError, ValueError):
        return None


def running(record: ServerRecord) -> bool:
    """Whether the recorded server's leader still runs (the same process, not a reused pid)."""
    return record.pid > 0 and process_start(record.pid) == record.process_start


def stop_recorded(record: ServerRecord, path: Path, grace_s: float = 10.0) -> bool:
    """Stops what is left of a recorded server's process group and removes its record; whether anything ran.
    A leader that is gone while its group is not leaves its pid reserved as the group's id, so the group is ours;
    a pid that runs another process means the whole group is long gone."""
    if record.pid <= 0:               # never started: nothing to stop (and killpg(0) would signal our own group)
        path.unlink(missing_ok=True)
        return False
    start = process_start(record.pid)
    ours = start == record.process_start or (start is None and group_alive(record.pid))
    if ours:
        _signal_group(record.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while group_alive(record.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        _signal_group(record.pid, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while group_alive(record.pid) and time.monotonic() < deadline:
            time.sleep(0.01)
    path.unlink(missing_ok=True)
    return ours


def stop_all() -> list[str]:
    """Stops every kept server of this user; one line per record, saying what was stopped."""
    lines = []
    for path in sorted(runtime_dir().glob("*.json")):
        record = read_record(path)
        if record is None:
            path.unlink(missing_ok=True)
            lines.append(f"removed an unreadable record {path}")
            continue
        was = "stopped" if stop_recorded(record, path) else "was no longer running:"
        lines.append(f"{was} {record.engine} {record.model} on {record.host}:{record.port} (pid {record.pid})")
        Path(record.log).unlink(missing_ok=True)
    return lines


class KeptServer(LocalServer):
    """A local server that may be reused from an earlier run and kept for a later one (see the module's text).
    `record` is the server this run wants (pid and start time are filled in when it starts one); `run_log` is
    the run's `server.log`, which gets this run's part of the kept log."""

    def __init__(self, record: ServerRecord, *, env: dict[str, str], health_url: str, run_log: Path) -> None:
        folder = runtime_dir()
        log = folder / f"{_stem(record.host, record.port)}.log"
        super().__init__(record.command, env=env, log_path=log, host=record.host, port=record.port,
                         health_url=health_url, cwd=folder)
        self.record = record.model_copy(update={"log": str(log)})
        self.record_path = _record_path(record.host, record.port)
        self.run_log = Path(run_log)
        self.reused = False
        self._log_from = 0

    def start(self) -> "KeptServer":
        found = read_record(self.record_path) if self.record_path.exists() else None
        if found is not None and found.config() == self.record.config() and running(found) \
                and health_ok(self.health_url):
            self.record, self.reused = found, True
            self._log_from = _size(self.log_path)
            self.started_at = time.monotonic()
            return self
        if found is not None or self.record_path.exists():   # stale, dead or unreadable: it goes
            stop_recorded(found or self.record, self.record_path)
        self._log_from = _size(self.log_path)
        super().start()
        self.record.pid = self.proc.pid
        self.record.process_start = process_start(self.proc.pid) or 0
        self.record.started_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
        return self

    @property
    def pid(self) -> int:
        return self.record.pid

    def wait_ready(self, timeout_s: float, interval_s: float = 0.25) -> float:
        if self.reused:               # answered its health route a moment ago
            self.ready_after = 0.0
            return 0.0
        return super().wait_ready(timeout_s, interval_s)

    def alive(self) -> bool:
        return running(self.record) if self.reused else super().alive()

    def exit_code(self) -> int | None:
        return None if self.reused else super().exit_code()    # a reused server is no child of ours: unknown

    def wait_exit(self, timeout_s: float) -> int | None:
        if not self.reused:
            return super().wait_exit(timeout_s)
        deadline = time.monotonic() + timeout_s
        while self.alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        return None

    def stop(self, grace_s: float = 10.0) -> int | None:
        """Stops the server for good and removes its record (a failed or interrupted run)."""
        if self.reused:
            stop_recorded(self.record, self.record_path, grace_s)
            code = None
        else:
            code = super().stop(grace_s)
            self.record_path.unlink(missing_ok=True)
        self._copy_log()
        return code

    def keep(self) -> None:
        """Leaves the server running for a later run, its record written."""
        from magpie.store import atomic_write

        atomic_write(self.record_path, self.record.model_dump_json(indent=1))
        self._copy_log()

    def _copy_log(self) -> None:
        """This run's part of the kept log into the run's server.log."""
        try:
            with open(self.log_path, "rb") as log:
                log.seek(self._log_from)
                self.run_log.write_bytes(log.read())
        except OSError:
            pass


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0
