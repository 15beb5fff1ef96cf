"""A zygote: one process that imports torch (and Triton) once and forks evaluators and
workers on request, so each of them starts in milliseconds instead of paying the imports.

A build owns at most one. `session()` marks the build's folder for it in the environment;
the first evaluation that needs a process starts the zygote there (under a lock, so parallel
jobs share one), and the build stops it at the end. The zygote never initialises CUDA, so a
forked child creates its own context as a fresh process would. A child runs in its own
session with the requested working folder, environment, memory limit and log, and the
zygote reports its exit status to the requester over the connection it asked on.

Children whose environments differ in anything imports read come from different zygotes.
Without a zygote folder (outside a build), or where a zygote cannot start, `launch` starts a
fresh process instead.
This module is the requester's side (`session`, `launch`, `adopt`, `reserve`, `ForkedProcess`);
the zygote itself is `zygote_server`.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from magpie import environment
from magpie.linux.processes import kill_tree
from magpie.supervision import scratch as scratch_folders
from magpie.supervision.process import limits

# Variables a forked child may set differently from its zygote: none of them is read while
# torch or Triton are imported (CUDA reads its own at context creation, magpie's at run time).
# Any other difference gets a zygote of its own (TRITON_INTERPRET, for one, decides how
# triton.language's own functions are built when it is imported).
FORK_SAFE_VARIABLES = {
    "CUDA_VISIBLE_DEVICES",
    "HIP_VISIBLE_DEVICES",
    "CUDA_LAUNCH_BLOCKING",
    "TRITON_CACHE_DIR",
    "CUDA_CACHE_PATH",
    "TORCH_EXTENSIONS_DIR",
    "TMPDIR",
    "PYTHONPATH",
    environment.IMPL_ID,
    environment.IMPL_SOURCE,
    environment.CUDA_IPC,
    environment.TRUST_CODE,
    environment.ZYGOTE_DIR,
    environment.ZYGOTE_OWNER,
    environment.KEEP_WARM_S,
}


# How long a zygote may take to start listening, and to answer a fork or an adopt.
START_TIMEOUT_S = 120.0


def slot(key: str) -> str | None:
    """Of a key "<slot>/<content>" (a worker's: how it was started, what it loaded), the slot;
    None for a key with no slash (an evaluator's)."""
    return key.split("/", 1)[0] if "/" in key else None


@contextlib.contextmanager
def session(prestart: bool = False):
    """While the block runs, processes launched by this build (and its job processes) may be
    forked from one shared zygote; it is stopped when the block ends, or, with
    MAGPIE_KEEP_WARM_S set, once it has been idle that long. With prestart, the zygote for
    this process's environment (the evaluators') starts importing at once, beside the
    scheduler's set-up and the first jobs, instead of when the first evaluator is needed."""
    if os.environ.get(environment.ZYGOTE_DIR):
        yield
        return
    scratch_folders.sweep()  # what builds killed before they could clean up left
    folder = _warm_folder() if keep_warm_s() else None
    if folder is None:
        folder = scratch_folders.make("zygote-")  # the next build's sweep removes it if this one is killed
        os.environ[environment.ZYGOTE_OWNER] = str(os.getpid())
    os.environ[environment.ZYGOTE_DIR] = str(folder)
    if prestart:
        from magpie.paths import subprocess_env

        threading.Thread(target=_ensure, args=(folder, subprocess_env()), daemon=True).start()
    try:
        yield
    finally:
        del os.environ[environment.ZYGOTE_DIR]
        if os.environ.pop(environment.ZYGOTE_OWNER, None):
            _stop(folder)
            scratch_folders.remove(folder)


def keep_warm_s() -> float:
    try:
        return max(0.0, float(os.environ.get(environment.KEEP_WARM_S) or 0))
    except ValueError:
        return 0.0


def _warm_folder() -> Path | None:
    """The folder zygotes that outlive builds share: one per user, private, or None."""
    folder = Path(tempfile.gettempdir()) / f"magpie-zygotes-{os.getuid()}"
    try:
        folder.mkdir(mode=0o700, exist_ok=True)
        info = folder.stat()
    except OSError:
        return None
    if info.st_uid != os.getuid() or info.st_mode & 0o077:
        return None  # not ours alone: fall back to a zygote per build
    for marker in folder.glob("*.failed"):  # a zygote that failed to start may start next time
        marker.unlink(missing_ok=True)
    return folder


@functools.lru_cache(maxsize=1)
def _code_version() -> str:
    """What a zygote's imports depend on besides the environment: the interpreter, magpie's
    own files, torch's and Triton's versions. A warm zygote of older code is not used."""
    from importlib import metadata

    package = Path(__file__).resolve().parent.parent
    parts = [sys.executable, sys.version]
    parts += [f"{p}:{p.stat().st_mtime_ns}:{p.stat().st_size}" for p in sorted(package.rglob("*.py"))]
    for name in ("torch", "triton"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            parts.append(f"{name}=={metadata.version(name)}")
    return "\n".join(parts)


def launch(
    module: str,
    args: list[str],
    *,
    cwd: str,
    env: dict,
    log_path: Path,
    memory_mb: int = 0,
    pass_fds: tuple[int, ...] = (),
    sandbox: dict | None = None,
    scratch: str | None = None,
    under_test: bool = False,
):
    """Start `module.main(args)` in a process of its own; returns an object with pid, poll()
    and wait(timeout) like subprocess.Popen. Arguments equal to a passed descriptor's number
    are rewritten to that descriptor's number in the child. With a sandbox policy (code under
    test) the process starts inside it; the zygote removes its scratch folder when it ends.
    under_test: the module runs code under test, which imports what lies beside it (the
    module path starts with the working folder; magpie's own processes never look there)
    and, trusted (no sandbox), runs below a keeper (`keeper`)."""
    folder = os.environ.get(environment.ZYGOTE_DIR)
    socket_path = _ensure(Path(folder), env) if folder else None
    if socket_path is not None:
        try:
            return ForkedProcess(
                socket_path,
                module,
                args,
                cwd=cwd,
                env=env,
                log_path=log_path,
                memory_mb=memory_mb,
                pass_fds=pass_fds,
                sandbox=sandbox,
                scratch=scratch,
                under_test=under_test,
            )
        except OSError:
            pass  # the zygote went away: a fresh process does the same work
    from magpie.paths import python_module_command

    command = python_module_command(module) + list(args)
    if sandbox is not None or under_test:
        command = python_module_command("magpie.sandbox") + [json.dumps(sandbox), "--module", module, *args]
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            command,
            pass_fds=pass_fds,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            cwd=cwd,
            env=env,
            preexec_fn=limits(0 if sandbox else memory_mb),
            start_new_session=True,
        )


def adopt(key: str, env: dict) -> tuple[ForkedProcess, list[int], str | None] | None:
    """A child parked under key by an earlier job (of this build, or of an earlier one kept warm), if there is one."""
    folder = os.environ.get(environment.ZYGOTE_DIR)
    socket_path = _ensure(Path(folder), env) if folder else None
    if socket_path is None:
        return None
    try:
        return ForkedProcess.adopt(socket_path, key)
    except OSError:
        return None


def reserve(key: str, env: dict) -> bool:
    """Whether this job is to start the spare parked under key: none is parked and no other job
    is starting one (`Children.reserve`). False without a zygote (nothing could park it)."""
    folder = os.environ.get(environment.ZYGOTE_DIR)
    socket_path = _ensure(Path(folder), env) if folder else None
    return socket_path is not None and _ask(socket_path, {"op": "reserve", "key": key}).startswith(b'{"reserved": true')


def _ask(socket_path: Path, message: dict, fds: Sequence[int] = ()) -> bytes:
    """One request that takes no child's connection (a park, a reservation): the start of its
    answer, or b"" where the zygote did not answer."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        try:
            conn.settimeout(30)
            conn.connect(str(socket_path))
            socket.send_fds(conn, [json.dumps(message).encode() + b"\n"], list(fds))
            return conn.recv(64)
        except OSError:
            return b""


def _ensure(folder: Path, env: dict) -> Path | None:
    """The socket of the zygote for this environment (one per set of variables that imports
    read), starting it if no job has yet; None if it cannot start."""
    import hashlib

    imported = sorted((k, v) for k, v in env.items() if k not in FORK_SAFE_VARIABLES)
    key = hashlib.sha1(json.dumps([imported, _code_version()]).encode()).hexdigest()[:12]
    socket_path = folder / f"{key}.sock"
    try:
        with open(folder / f"{key}.lock", "a+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if (folder / f"{key}.failed").exists():
                return None
            if _listening(socket_path):
                return socket_path
            # Owned by the build (it ends when the build's process does), or by nobody: it ends
            # once idle for MAGPIE_KEEP_WARM_S.
            owner = os.environ.get(environment.ZYGOTE_OWNER, "0")
            idle_s = "0" if owner != "0" else str(keep_warm_s() or START_TIMEOUT_S)
            with open(folder / f"{key}.log", "ab") as log:
                from magpie.paths import python_module_command

                server = python_module_command("magpie.supervision.zygote_server")
                proc = subprocess.Popen(
                    [*server, str(socket_path), owner, idle_s],
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=log,
                    env=env,
                    start_new_session=True,
                )
            (folder / f"{key}.pid").write_text(str(proc.pid))
            deadline = time.monotonic() + START_TIMEOUT_S
            while time.monotonic() < deadline and proc.poll() is None:
                if _listening(socket_path):
                    return socket_path
                time.sleep(0.02)
            proc.kill()
            (folder / f"{key}.failed").write_text(f"the zygote did not start; see {key}.log\n")
            return None
    except FileNotFoundError:  # the build ended and removed the folder
        return None


def _listening(path: Path) -> bool:
    if not path.exists():
        return False
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(10)  # a zygote that does not answer a ping in that time is not used
        try:
            probe.connect(str(path))
            probe.sendall(b'{"op": "ping"}\n')
            return probe.recv(64).startswith(b"{")
        except OSError:
            return False


def _stop(folder: Path) -> None:
    for pid_file in folder.glob("*.pid"):
        with contextlib.suppress(OSError, ValueError):
            os.kill(int(pid_file.read_text()), signal.SIGTERM)


class ForkedProcess:
    """A child of the zygote, seen from the process that asked for it (or adopted it)."""

    def __init__(
        self,
        socket_path: Path,
        module: str,
        args: list[str],
        *,
        cwd: str,
        env: dict,
        log_path: Path,
        memory_mb: int,
        pass_fds: tuple[int, ...],
        sandbox: dict | None = None,
        scratch: str | None = None,
        under_test: bool = False,
    ):
        self.args = [module, *args]
        message = {
            "op": "fork",
            "module": module,
            "args": list(args),
            "cwd": cwd,
            "env": env,
            "log": str(log_path),
            "memory_mb": memory_mb,
            "fds": list(pass_fds),
            "sandbox": sandbox,
            "scratch": scratch,
            "under_test": under_test,
        }
        reply, _ = self._connect(socket_path, message, list(pass_fds))
        if reply is None or "pid" not in reply:
            self._conn.close()
            raise OSError(f"the zygote did not fork: {reply}")
        self.pid = reply["pid"]

    def _connect(self, socket_path: Path, message: dict, fds: list[int]) -> tuple[dict | None, list[int]]:
        """Send one request; its reply and the descriptors that came with it."""
        self.socket_path = socket_path
        self.returncode: int | None = None
        self._buffer = b""
        self._conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._conn.connect(str(socket_path))
            socket.send_fds(self._conn, [json.dumps(message).encode() + b"\n"], fds)
            ready, _, _ = select.select([self._conn], [], [], START_TIMEOUT_S)
            if not ready:
                raise subprocess.TimeoutExpired(message["op"], START_TIMEOUT_S)
            data, received, _, _ = socket.recv_fds(self._conn, 4096, 4)
            self._buffer = data
            return (self._read_line(START_TIMEOUT_S) if data else None), received
        except (OSError, subprocess.TimeoutExpired) as err:
            self._conn.close()
            raise OSError(f"the zygote did not answer: {err}") from None

    @classmethod
    def adopt(cls, socket_path: Path, key: str) -> tuple[ForkedProcess, list[int], str | None] | None:
        """A parked child for this key, with its descriptors and scratch folder, or None."""
        proc = cls.__new__(cls)
        proc.args = ["adopted", key]
        reply, fds = proc._connect(socket_path, {"op": "adopt", "key": key}, [])
        if reply is None or "pid" not in reply or len(fds) != 2:
            proc._conn.close()
            for fd in fds:
                os.close(fd)
            return None
        proc.pid = reply["pid"]
        return proc, fds, reply.get("scratch")

    def park(self, key: str, fds: list[int], stop: bool = True) -> bool:
        """Hand this live child and the descriptors that talk to it to the zygote, for a later
        adopt(key); this side keeps nothing. False if the zygote refused it. stop=False: it
        runs on while parked (a spare that has run no code under test, still making its
        context)."""
        message = {"op": "park", "pid": self.pid, "key": key, "stop": stop}
        parked = _ask(self.socket_path, message, fds).startswith(b'{"parked": true')
        if parked:
            self._conn.close()
            self.returncode = 0  # no longer this side's child
        return parked

    def _read_line(self, timeout_s: float | None) -> dict | None:
        """The zygote's next message (the fork's pid, later the exit status: both can arrive
        in one read when the child ends at once); None if the zygote closed the connection."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while b"\n" not in self._buffer:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, _, _ = select.select([self._conn], [], [], remaining)
            if not ready:  # only with a deadline: select waits for ever without one
                raise subprocess.TimeoutExpired(self.args, timeout_s or 0.0)
            chunk = self._conn.recv(4096)
            if not chunk:
                return None
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return json.loads(line)

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            reply = self._read_line(timeout)
            # A zygote that vanished cannot say how its child ended; the child's tree is killed.
            self.returncode = reply["exit"] if reply else -signal.SIGKILL
            if reply is None:
                kill_tree(self.pid)
            self._conn.close()
        return self.returncode

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                return self.wait(0)
            except subprocess.TimeoutExpired:
                return None
        return self.returncode

    def kill(self) -> None:
        kill_tree(self.pid)
