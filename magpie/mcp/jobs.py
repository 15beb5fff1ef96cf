"""Long work (build, analyze, compare, benchmark) as jobs: each a child process of its own
session (worker.py), whose request, state and result are files under the project's workspace
(`<workspace>/mcp/jobs/<id>/`), so a restarted server still answers for the jobs it started.

The server never blocks on a job: it starts the process and returns its id. A cancel stops
every process below the job's (the worker is their subreaper: an orphan stays in its tree),
then kills the job's whole process group, and marks the job cancelled."""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import time
from pathlib import Path

from magpie.errors import UserError
from magpie.mcp.confine import identifier

KINDS = ("build", "analyze", "compare", "benchmark", "gap_analysis", "compare_traces")
FINAL = ("succeeded", "failed", "cancelled", "lost")
REQUEST, STATE, RESULT, PROCESS, CANCELLED, LOG = (
    "request.json",
    "state.json",
    "result.json",
    "process.json",
    "cancelled.json",
    "job.log",
)
CANCEL_WAIT_S = 1.0


def workspace_of(root: Path) -> Path:
    """The project's workspace folder, read from magpie.toml's [project] workspace (the
    default `workspaces`) without loading the project."""
    from magpie.manifest.load import tomllib

    try:
        with open(root / "magpie.toml", "rb") as file:
            named = tomllib.load(file).get("project", {}).get("workspace", "workspaces")
    except (OSError, tomllib.TOMLDecodeError, AttributeError):
        named = "workspaces"
    return root / str(named)


def write_json(path: Path, data) -> None:
    """Whole or not at all: a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(json.dumps(data, indent=1))
    os.replace(temporary, path)


def read_json(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def signing_secret_to_pass() -> bytes:
    """What a job reads on its stdin before anything else: the CI signing secret this server
    took from its environment (hex), so the job's build signs as the server's invoker would; or
    nothing, and the job reads this user's key file as the server would. Never the job's
    environment or arguments, which every process it starts (code under test among them) could read."""
    from magpie.store import signing

    signing.take_secret_from_environment()  # a server made without the CLI takes it here
    return signing.secret().hex().encode() if signing.secret_from_environment() else b""


def _start_time(pid: int) -> int | None:
    from magpie.linux.procfs import start_time

    return start_time(pid)


class Jobs:
    """The jobs of one project: started as children of this server, read back from disk."""

    def __init__(self, root: Path):
        self.root = root
        self.folder = workspace_of(root) / "mcp" / "jobs"
        self._children: dict[str, subprocess.Popen] = {}  # started by this server: reaped here

    def start(self, kind: str, params: dict) -> str:
        assert kind in KINDS
        self._reap()
        job_id = f"{time.strftime('%Y%m%d-%H%M%S')}-{kind}-{secrets.token_hex(3)}"
        folder = self.folder / job_id
        folder.mkdir(parents=True)
        write_json(folder / REQUEST, {"kind": kind, "params": params, "created": time.time()})
        from magpie.paths import python_module_command, subprocess_env

        passed = signing_secret_to_pass()  # first: the environment copied below no longer holds it
        env = subprocess_env()
        for name in ("MAGPIE_ZYGOTE_DIR", "MAGPIE_ZYGOTE_OWNER"):  # the job's build owns its own zygote
            env.pop(name, None)
        with open(folder / LOG, "ab") as log:
            child = subprocess.Popen(
                [*python_module_command("magpie.mcp.worker"), str(folder)],
                cwd=self.root,
                env=env,
                stdin=subprocess.PIPE,
                stdout=log,
                stderr=log,
                start_new_session=True,  # a group of its own: a cancel is one killpg, the server's untouched
            )
        assert child.stdin is not None
        with child.stdin:  # a few bytes: the pipe's buffer holds them whether or not the worker reads yet
            child.stdin.write(passed)
        self._children[job_id] = child
        write_json(folder / PROCESS, {"pid": child.pid, "start_time": _start_time(child.pid)})
        return job_id

    def folder_of(self, job_id: str) -> Path:
        folder = self.folder / identifier(job_id, "job_id")
        if not (folder / REQUEST).is_file():
            raise UserError(f"job_id: no job {job_id!r} in this project (job_list lists them)")
        return folder

    def _alive(self, job_id: str, folder: Path) -> bool:
        child = self._children.get(job_id)
        if child is not None:
            return child.poll() is None
        process = read_json(folder / PROCESS)
        if not process:
            return False
        pid, started = process.get("pid"), process.get("start_time")
        # a pid alone may be another process's by now: its start time says whether it is the job's
        return isinstance(pid, int) and started is not None and _start_time(pid) == started

    def _reap(self) -> None:
        """Jobs of this server's that ended are waited for: none stays a zombie."""
        for job_id, child in list(self._children.items()):
            if child.poll() is not None:
                del self._children[job_id]

    def status(self, job_id: str) -> dict:
        """The job's request, state and where its result is: {kind, params, created, state,
        step, done, total, started, finished, error}."""
        folder = self.folder_of(job_id)
        self._reap()
        request = read_json(folder / REQUEST) or {}
        state = read_json(folder / STATE) or {"state": "running", "step": "starting", "done": 0, "total": None}
        view = {
            "job_id": job_id,
            "kind": request.get("kind"),
            "params": request.get("params", {}),
            "created": request.get("created"),
            **state,
        }
        if view["state"] not in FINAL:
            cancelled = read_json(folder / CANCELLED)
            if cancelled:
                view.update(state="cancelled", finished=cancelled.get("at"), error="cancelled by job_cancel")
            elif not self._alive(job_id, folder):
                view.update(state="lost", error="the job's process ended without recording a result (killed?)")
        return view

    def result_path(self, job_id: str) -> Path:
        return self.folder_of(job_id) / RESULT

    def cancel(self, job_id: str) -> dict:
        """Kill the job's whole process tree (its descendants stopped first so none forks away,
        then its process group), wait up to a second for its process to go, mark it cancelled."""
        folder = self.folder_of(job_id)
        view = self.status(job_id)
        if view["state"] in FINAL:
            return view
        process = read_json(folder / PROCESS) or {}
        pid = process.get("pid")
        if isinstance(pid, int) and self._alive(job_id, folder):
            from magpie.execution.executors import stop_descendants
            from magpie.linux.procfs import process_state

            try:
                os.kill(pid, signal.SIGSTOP)  # it starts nothing more while its tree is walked
            except ProcessLookupError:
                pass
            killed = stop_descendants(pid)
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            child = self._children.get(job_id)
            if child is not None:
                child.poll()  # reaped: it is no zombie of ours
            # a killed process is gone once it is no more than a zombie (its parent, or init, reaps it)
            deadline = time.monotonic() + CANCEL_WAIT_S
            while time.monotonic() < deadline and any(process_state(p) not in (None, "Z", "X") for p in [pid, *killed]):
                time.sleep(0.005)
                if child is not None:
                    child.poll()
        write_json(folder / CANCELLED, {"at": time.time()})
        return self.status(job_id)

    def ids(self) -> list[str]:
        if not self.folder.is_dir():
            return []
        return sorted(path.parent.name for path in self.folder.glob(f"*/{REQUEST}"))
