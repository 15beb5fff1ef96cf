"""Server reuse (Magpie's `server_lifecycle`): a local server kept running after a run, and reused by a later run
that would start the same server; and the records by which a server left behind by a killed magpie is found.

Every local server magpie starts has a record while it runs: a small JSON (`ServerRecord`: engine and version,
model and its content key, the command line, the environment given to it, host, port, pid, process group, the
process's start time, and the magpie process whose run it serves, with that process's start time) in a private
per-user runtime folder (`$MAGPIE_SERVER_DIR`, else `<tmp>/magpie-servers-<uid>/`), one per host and port. A run
that ends stops its server and removes the record, or (reuse) keeps it, the record's owner cleared. A record
whose owner is gone marks a server that a magpie killed with SIGKILL never stopped: `sweep()`, run before each
benchmark starts a server and by `--stop-servers`, stops its process group (only while it is the recorded
process: pid and start time) and says so in one line. A server whose owner still runs is never touched.

With `server_lifecycle: reuse` (`magpie benchmark ... --keep-server`, `keep_server = true` in a `[[benchmark]]`)
the run's server is a `KeptServer`. It reuses the server kept on its host and port only when the recorded config
equals the one this run would start and the server still runs (the same process) and answers its health route;
otherwise it stops what is left of the recorded server's process group and starts a fresh server. A server that
served a run without errors is kept; one whose run failed, or was interrupted, is stopped like any local server.
A kept server's output goes to a log beside its record (a run's workspace may be gone before the server); each
run's part of it is copied into the run's `server.log`. A run that is not reusing stops a kept server in the way
of its own on that port.

`stop_all()` (`magpie benchmark --stop-servers`; `magpie clean` for the servers kept by a project's build) stops
the kept servers and those of dead runs.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import stat
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from magpie.environment import SERVER_DIR
from magpie.linux.procfs import start_time
from magpie.serving.local import LocalServer, ServerError, _signal_group, group_alive, health_ok

# What must be equal for a kept server to serve another run: everything that decides what the server does.
MATCHED = ("engine", "engine_version", "model", "model_key", "command", "env", "host", "port")


class ServerRecord(BaseModel):
    model_config = ConfigDict(extra="forbid")

    engine: str
    engine_version: str | None
    model: str
    model_key: str | None  # a local model's content hash, else the hub revision
    command: list[str]
    env: dict[str, str]  # what the server was given over magpie's environment, and magpie's that matters
    host: str
    port: int
    pid: int = 0  # leader of the server's own process group (pgid == pid)
    process_start: int = 0  # its start time in clock ticks since boot (/proc/PID/stat): a reused pid is not it
    log: str = ""
    started_at: str = ""
    owner: int = 0  # the magpie process whose run the server serves now; 0: kept between runs
    owner_start: int = 0  # that process's start time (a reused pid is not it)
    project: str = ""  # the project whose build kept it: `magpie clean` there stops it

    def config(self) -> dict:
        return self.model_dump(include=set(MATCHED))


def record_for(provenance, command: list[str], env: dict[str, str], host: str, port: int) -> ServerRecord:
    """The server a run would start: its provenance (engine, version, model and content key, magpie's environment
    that matters), its command line and the environment given to it."""
    return ServerRecord(
        engine=provenance.engine,
        engine_version=provenance.engine_version,
        model=provenance.model,
        model_key=provenance.model_hash or provenance.model_revision,
        command=list(command),
        env={**provenance.environment, **env},
        host=host,
        port=port,
    )


def runtime_dir() -> Path:
    """The user's private folder of kept servers' records and logs (made here, mode 0700; refused if not ours)."""
    path = Path(os.environ.get(SERVER_DIR) or Path(tempfile.gettempdir()) / f"magpie-servers-{os.getuid()}")
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


def read_record(path: Path) -> ServerRecord | None:
    try:
        return ServerRecord.model_validate_json(path.read_text())
    except (OSError, ValueError):
        return None


def running(record: ServerRecord) -> bool:
    """Whether the recorded server's leader still runs (the same process, not a reused pid)."""
    return record.pid > 0 and start_time(record.pid) == record.process_start


def stop_recorded(record: ServerRecord, path: Path, grace_s: float = 10.0) -> bool:
    """Stops what is left of a recorded server's process group and removes its record; whether anything ran.
    A leader that is gone while its group is not leaves its pid reserved as the group's id, so the group is ours;
    a pid that runs another process means the whole group is long gone."""
    if record.pid <= 0:  # never started: nothing to stop (and killpg(0) would signal our own group)
        path.unlink(missing_ok=True)
        return False
    start = start_time(record.pid)
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


def owner_alive(record: ServerRecord) -> bool:
    return record.owner > 0 and start_time(record.owner) == record.owner_start


def describe(record: ServerRecord) -> str:
    return f"{record.engine} {record.model} on {record.host}:{record.port} (pid {record.pid})"


@contextlib.contextmanager
def _locked():
    """The records held alone: two runs deciding about one host and port take turns."""
    with open(runtime_dir() / "lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _clear(path: Path, why: str) -> list[str]:
    """Makes room at a record's host and port for this run's server: a kept server or a dead run's is stopped, a
    live run's refuses (ServerError); the lines say what was stopped. Called holding the records' lock."""
    record = read_record(path) if path.exists() else None
    if record is None:
        path.unlink(missing_ok=True)
        return []
    if record.owner not in (0, os.getpid()) and owner_alive(record):
        raise ServerError(
            f"the server on {record.host}:{record.port} serves the run of magpie pid {record.owner}: "
            f"run the benchmarks one after another, or give another port"
        )
    if not stop_recorded(record, path):
        return []
    if record.owner:
        return [f"stopped the server {describe(record)}, left by magpie pid {record.owner}, which is gone"]
    return [f"stopped the kept server {describe(record)}: {why}"]


def sweep() -> list[str]:
    """Stops the servers of runs whose magpie is gone (killed before it stopped them) and removes their records;
    a line for each. Kept servers and the servers of live runs stay."""
    lines = []
    with _locked():
        for path in sorted(runtime_dir().glob("*.json")):
            record = read_record(path)
            if record is not None and record.owner and not owner_alive(record):
                lines += _clear(path, "")
    return lines


def make_room(host: str, port: int, why: str) -> list[str]:
    """A kept server (or a dead run's) recorded on host:port stopped, so that this run can start its own."""
    with _locked():
        return _clear(_record_path(host, port), why)


# The variables that say which GPUs a server was given
DEVICE_VARIABLES = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")


def kept_devices(host: str, port: int) -> dict[str, str]:
    """The GPU variables of the server kept on host:port (running, serving no run), {} where there is none: a run
    that may reuse it takes the same GPUs, which the kept server itself makes look busy."""
    path = _record_path(host, port)
    record = read_record(path) if path.exists() else None
    if record is None or record.owner or not running(record):
        return {}
    return {name: record.env[name] for name in DEVICE_VARIABLES if name in record.env}


def stop_kept(host: str, port: int, pids: set[int]) -> bool:
    """The server kept on host:port stopped if it is one of `pids` (a sweep's, not asked to be kept) and no run
    is using it; whether one was."""
    with _locked():
        path = _record_path(host, port)
        record = read_record(path) if path.exists() else None
        if record is None or record.pid not in pids or record.owner:
            return False
        stopped = stop_recorded(record, path)
        if record.log:
            Path(record.log).unlink(missing_ok=True)
        return stopped


def stop_all(project: str | None = None) -> list[str]:
    """Stops every kept server of this user (with `project`, those its build kept) and every dead run's; one line
    per record, saying what was stopped. A live run's server is left to that run."""
    lines = []
    with _locked():
        for path in sorted(runtime_dir().glob("*.json")):
            record = read_record(path)
            if record is None:
                if project is None:
                    path.unlink(missing_ok=True)
                    lines.append(f"removed an unreadable record {path}")
                continue
            dead = record.owner and not owner_alive(record)
            if project is not None and record.project != project and not dead:
                continue
            if record.owner not in (0, os.getpid()) and not dead:
                lines.append(f"left {describe(record)}: it serves the run of magpie pid {record.owner}")
                continue
            was = "stopped" if stop_recorded(record, path) else "was no longer running:"
            gone = f", left by magpie pid {record.owner}, which is gone" if dead else ""
            lines.append(f"{was} {describe(record)}{gone}")
            if record.log:
                Path(record.log).unlink(missing_ok=True)
    return lines


class TrackedServer(LocalServer):
    """A run's own local server, recorded while it runs (see the module's text): should this magpie be killed
    before it stops the server, the next run finds the record and stops it. `record` is the server this run
    wants; pid, start time and owner are filled in when it starts."""

    def __init__(
        self, record: ServerRecord, *, env: dict[str, str], health_url: str, log_path: Path, cwd: Path
    ) -> None:
        super().__init__(
            record.command,
            env=env,
            log_path=log_path,
            host=record.host,
            port=record.port,
            health_url=health_url,
            cwd=cwd,
        )
        self.record = record
        self.record_path = _record_path(record.host, record.port)
        self.warnings: list[str] = []

    def start(self) -> TrackedServer:
        with _locked():
            self.warnings += _clear(self.record_path, "this run starts a server of its own on that port")
            self._launch()
        return self

    def _launch(self) -> None:
        """The server started and its record written, this process its owner. Called holding the records' lock."""
        super().start()
        self.record.pid = self.proc.pid
        self.record.process_start = start_time(self.proc.pid) or 0
        self.record.started_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
        self._own()

    def _own(self) -> None:
        from magpie.store import atomic_write

        me = os.getpid()
        self.record.owner, self.record.owner_start = me, start_time(me) or 0
        atomic_write(self.record_path, self.record.model_dump_json(indent=1))

    def stop(self, grace_s: float = 10.0) -> int | None:
        code = super().stop(grace_s)
        self.record_path.unlink(missing_ok=True)
        return code


class KeptServer(TrackedServer):
    """A local server that may be reused from an earlier run and kept for a later one (see the module's text).
    `run_log` is the run's `server.log`, which gets this run's part of the kept log; `project` is recorded as the
    project that kept it."""

    def __init__(
        self, record: ServerRecord, *, env: dict[str, str], health_url: str, run_log: Path, project: str = ""
    ) -> None:
        folder = runtime_dir()
        super().__init__(
            record.model_copy(update={"project": project}),
            env=env,
            health_url=health_url,
            log_path=folder / f"{_stem(record.host, record.port)}.log",
            cwd=folder,
        )
        self.record.log = str(self.log_path)
        self.run_log = Path(run_log)
        self.reused = False
        self._log_from = 0

    def start(self) -> KeptServer:
        with _locked():
            found = read_record(self.record_path) if self.record_path.exists() else None
            if (
                found is not None
                and found.owner == 0
                and found.config() == self.record.config()
                and running(found)
                and health_ok(self.health_url)
            ):
                self.record, self.reused = found.model_copy(update={"project": self.record.project}), True
                self._log_from = _size(self.log_path)
                self.started_at = time.monotonic()
                self._own()
                return self
            why = (
                "its config differs from this run's"
                if found is None or found.config() != self.record.config()
                else "it no longer answers its health route"
            )
            self.warnings += _clear(self.record_path, why)
            self._log_from = _size(self.log_path)
            self._launch()
        return self

    @property
    def pid(self) -> int:
        return self.record.pid

    def wait_ready(self, timeout_s: float, interval_s: float = 0.25) -> float:
        if self.reused:  # answered its health route a moment ago
            self.ready_after = 0.0
            return 0.0
        return super().wait_ready(timeout_s, interval_s)

    def alive(self) -> bool:
        return running(self.record) if self.reused else super().alive()

    def exit_code(self) -> int | None:
        return None if self.reused else super().exit_code()  # a reused server is no child of ours: unknown

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
        self._copy_log()
        return code

    def keep(self) -> None:
        """Leaves the server running for a later run, its record written with no owner."""
        from magpie.store import atomic_write

        self.record.owner = self.record.owner_start = 0
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
