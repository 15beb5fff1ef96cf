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
Usage (started by `launch`): python -m magpie.supervision.zygote SOCKET OWNER_PID IDLE_S
(OWNER_PID 0: no owner; it ends once idle IDLE_S seconds)
"""

from __future__ import annotations

import collections
import contextlib
import fcntl
import functools
import gc
import json
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from magpie.linux import namespaces
from magpie.linux.procfs import namespace_pids
from magpie.linux.processes import close_all_but, kill_tree
from magpie.supervision import scratch as scratch_folders
from magpie.supervision import shared_memory
from magpie.supervision.process import continue_tree, limits, log_to, stop_tree

FOLDER_VARIABLE = "MAGPIE_ZYGOTE_DIR"
OWNER_VARIABLE = "MAGPIE_ZYGOTE_OWNER"
# Seconds a zygote (with its parked processes) outlives the build that started it, for the
# next build to use: repeated `magpie compare` runs skip torch's import and, for unchanged
# implementations, their workers' start-up. 0 (the default): it ends with its build.
KEEP_WARM_VARIABLE = "MAGPIE_KEEP_WARM_S"
# Variables a forked child may set differently from its zygote: none of them is read while
# torch or Triton are imported (CUDA reads its own at context creation, magpie's at run time).
# Any other difference gets a zygote of its own (TRITON_INTERPRET, for one, decides how
# triton.language's own functions are built when it is imported).
FORK_SAFE_VARIABLES = {"CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "CUDA_LAUNCH_BLOCKING",
                       "TRITON_CACHE_DIR", "CUDA_CACHE_PATH", "TORCH_EXTENSIONS_DIR", "TMPDIR", "PYTHONPATH",
                       "MAGPIE_IMPL_ID", "MAGPIE_IMPL_SOURCE", "MAGPIE_CUDA_IPC", "MAGPIE_TRUST_CODE",
                       FOLDER_VARIABLE, OWNER_VARIABLE, KEEP_WARM_VARIABLE}
# Imported before forking (torch.multiprocessing: the reducers that lend CUDA tensors).
PRELOAD = ("torch", "torch.multiprocessing", "triton", "triton.language", "magpie.harness.worker",
           "magpie.harness.evaluate")
# Then called (module:function), for what every child would otherwise compute for itself.
WARM_UPS = ("magpie.harness.compiler_caches:warm_triton",)

START_TIMEOUT_S = 120.0
# Idle children kept for adoption at once. Each holds its process and, on a GPU, its CUDA
# context: about half a GiB of device memory, so no more than fit in an eighth of the
# smallest device's (32 on an H200; a compare of 8 candidates under -j 8 parks about 20).
MAX_PARKED = 32
CONTEXT_BYTES = 512 << 20
# How long a reservation to park a spare (`Children.reserve`) holds without the spare coming.
RESERVATION_S = 60.0


def slot(key: str) -> str | None:
    """Of a key "<slot>/<content>" (a worker's: how it was started, what it loaded), the slot;
    None for a key with no slash (an evaluator's)."""
    return key.split("/", 1)[0] if "/" in key else None


def parked_cap(device_bytes: list[int]) -> int:
    return max(4, min([MAX_PARKED, *(size // 8 // CONTEXT_BYTES for size in device_bytes)]))


def nvidia_device_bytes() -> list[int]:
    """Each NVIDIA device's memory, through NVML (no CUDA context: the zygote forks); none
    where there is no NVML or no driver."""
    try:
        import pynvml
    except ImportError:
        return []
    try:
        pynvml.nvmlInit()
        try:
            return [pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(i)).total
                    for i in range(pynvml.nvmlDeviceGetCount())]
        finally:
            pynvml.nvmlShutdown()
    except pynvml.NVMLError:
        return []


# -- the requester's side ----------------------------------------------------------------
@contextlib.contextmanager
def session(prestart: bool = False):
    """While the block runs, processes launched by this build (and its job processes) may be
    forked from one shared zygote; it is stopped when the block ends, or, with
    MAGPIE_KEEP_WARM_S set, once it has been idle that long. With prestart, the zygote for
    this process's environment (the evaluators') starts importing at once, beside the
    scheduler's set-up and the first jobs, instead of when the first evaluator is needed."""
    if os.environ.get(FOLDER_VARIABLE):
        yield
        return
    scratch_folders.sweep()  # what builds killed before they could clean up left
    folder = _warm_folder() if keep_warm_s() else None
    if folder is None:
        folder = scratch_folders.make("zygote-")  # the next build's sweep removes it if this one is killed
        os.environ[OWNER_VARIABLE] = str(os.getpid())
    os.environ[FOLDER_VARIABLE] = str(folder)
    if prestart:
        from magpie.paths import subprocess_env

        threading.Thread(target=_ensure, args=(folder, subprocess_env()), daemon=True).start()
    try:
        yield
    finally:
        del os.environ[FOLDER_VARIABLE]
        if os.environ.pop(OWNER_VARIABLE, None):
            _stop(folder)
            scratch_folders.remove(folder)


def keep_warm_s() -> float:
    try:
        return max(0.0, float(os.environ.get(KEEP_WARM_VARIABLE) or 0))
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


def launch(module: str, args: list[str], *, cwd: str, env: dict, log_path: Path, memory_mb: int = 0,
           pass_fds: tuple[int, ...] = (), sandbox: dict | None = None, scratch: str | None = None,
           under_test: bool = False):
    """Start `module.main(args)` in a process of its own; returns an object with pid, poll()
    and wait(timeout) like subprocess.Popen. Arguments equal to a passed descriptor's number
    are rewritten to that descriptor's number in the child. With a sandbox policy (code under
    test) the process starts inside it; the zygote removes its scratch folder when it ends.
    under_test: the module runs code under test, which imports what lies beside it (the
    module path starts with the working folder; magpie's own processes never look there)
    and, trusted (no sandbox), runs below a keeper (`keeper`)."""
    folder = os.environ.get(FOLDER_VARIABLE)
    socket_path = _ensure(Path(folder), env) if folder else None
    if socket_path is not None:
        try:
            return ForkedProcess(socket_path, module, args, cwd=cwd, env=env, log_path=log_path,
                                 memory_mb=memory_mb, pass_fds=pass_fds, sandbox=sandbox, scratch=scratch,
                                 under_test=under_test)
        except OSError:
            pass  # the zygote went away: a fresh process does the same work
    from magpie.paths import python_module_command

    command = python_module_command(module) + list(args)
    if sandbox is not None or under_test:
        command = python_module_command("magpie.sandbox") + [json.dumps(sandbox), "--module", module, *args]
    with open(log_path, "ab") as log:
        return subprocess.Popen(command, pass_fds=pass_fds, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                cwd=cwd, env=env, preexec_fn=limits(0 if sandbox else memory_mb),
                                start_new_session=True)


def adopt(key: str, env: dict) -> tuple[ForkedProcess, list[int], str | None] | None:
    """A child parked under key by an earlier job (of this build, or of an earlier one kept warm), if there is one."""
    folder = os.environ.get(FOLDER_VARIABLE)
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
    folder = os.environ.get(FOLDER_VARIABLE)
    socket_path = _ensure(Path(folder), env) if folder else None
    return socket_path is not None and _ask(socket_path, {"op": "reserve", "key": key}).startswith(
        b'{"reserved": true')


def _ask(socket_path: Path, message: dict, fds: list[int] = ()) -> bytes:
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
            owner = os.environ.get(OWNER_VARIABLE, "0")
            idle_s = "0" if owner != "0" else str(keep_warm_s() or START_TIMEOUT_S)
            with open(folder / f"{key}.log", "ab") as log:
                from magpie.paths import python_module_command

                proc = subprocess.Popen(python_module_command("magpie.supervision.zygote") + [str(socket_path), owner,
                                                                                           idle_s],
                                        stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env,
                                        start_new_session=True)
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

    def __init__(self, socket_path: Path, module: str, args: list[str], *, cwd: str, env: dict, log_path: Path,
                 memory_mb: int, pass_fds: tuple[int, ...], sandbox: dict | None = None, scratch: str | None = None,
                 under_test: bool = False):
        self.args = [module, *args]
        message = {"op": "fork", "module": module, "args": list(args), "cwd": cwd, "env": env,
                   "log": str(log_path), "memory_mb": memory_mb, "fds": list(pass_fds), "sandbox": sandbox,
                   "scratch": scratch, "under_test": under_test}
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
            if not ready:
                raise subprocess.TimeoutExpired(self.args, timeout_s)
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


# -- the zygote's side -------------------------------------------------------------------
def serve(socket_path: str, owner_pid: int, idle_s: float = 0.0) -> None:
    import importlib

    namespaces.prctl(namespaces.PR_SET_DUMPABLE, 0)  # no process of the same user reads or writes its memory
    for name in PRELOAD:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    for name in WARM_UPS:
        module, _, function = name.partition(":")
        getattr(importlib.import_module(module), function)()
    # What the imports made lives as long as any child: out of the collector's sight, a child's
    # collections (a parked process empties itself between jobs) walk only its own objects, and
    # do not write to pages it shares with the zygote.
    gc.freeze()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    with contextlib.suppress(FileNotFoundError):  # left by a warm zygote that went idle
        os.unlink(socket_path)
    listener.bind(socket_path)
    listener.listen(64)
    owner = [os.pidfd_open(owner_pid)] if owner_pid else []
    state = Children()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        _serve_children(listener, socket_path, owner, state, idle_s)
    finally:  # its children end with it, killed: a parked one is stopped, and so may be one a
        # job was running (its evaluator stops a worker while another is measured), which
        # would never see its pipes close
        state.end_parked()
        state.end_all()
        for pid, _, _ in state.running.values():
            shared_memory.forget(pid)


def _serve_children(listener: socket.socket, socket_path: str, owner: list[int], state: Children,
                    idle_s: float) -> None:
    last_activity = time.monotonic()
    while True:
        timeout = max(0.0, last_activity + idle_s - time.monotonic()) if idle_s else None
        requesters = state.requesters()
        ready, _, _ = select.select([listener, *owner, *state.running, *requesters], [], [], timeout)
        if not ready:  # idle this long, with nothing running but parked processes: done
            if len(state.running) > len(state.parked):
                last_activity = time.monotonic()
                continue
            with contextlib.suppress(OSError):
                os.unlink(socket_path)
            return
        last_activity = time.monotonic()
        for item in ready:
            if item is listener:
                conn, _ = listener.accept()
                if not _answer(conn, listener, state):
                    conn.close()
            elif item in owner:  # the build ended, killed perhaps: so does all it started here
                state.end_all()
                return
            elif item in requesters:
                state.heard_from(requesters[item], item)
            elif item in state.running:
                state.reap(item)


class Children:
    """The zygote's children: who waits for each one's exit status, and which ones are parked
    (alive, idle, their pipes held here) for a later job to adopt."""

    def __init__(self):
        self.running: dict[int, list] = {}  # pidfd -> [pid, requester's connection or None, scratch folder]
        self.parked: dict[int, tuple[str, list[int], float]] = {}  # pidfd -> (key, descriptors, since)
        self.reserved: dict[str, float] = {}  # spare's key -> when a job said it would park one
        self.cap: int | None = None  # looked up at the first park, off the zygote's start

    def requesters(self) -> dict[socket.socket, int]:
        """The connection of each running child's requester (the process that asked for it or
        adopted it) -> the child's pidfd: it closes when that process ends."""
        return {conn: pidfd for pidfd, (_, conn, _) in self.running.items() if conn is not None}

    def heard_from(self, pidfd: int, conn: socket.socket) -> None:
        """A requester's connection became readable. A requester sends nothing after its
        request, so this is its end (a timed-out evaluator killed by its job, a job killed
        with its build, a crash): the child's tree is killed, stopped or not, as its requester
        would have killed it had it lived (an evaluator's workers are the zygote's children, not
        its own, and a worker it had stopped would wait for ever). Its folder goes as it is
        reaped."""
        try:
            gone = conn.recv(4096, socket.MSG_DONTWAIT) == b""
        except BlockingIOError:
            return
        except OSError:
            gone = True
        if not gone or self.running.get(pidfd, [None, None])[1] is not conn:
            return
        self.running[pidfd][1] = None
        conn.close()
        kill_tree(self.running[pidfd][0])

    def end_all(self) -> None:
        """Every child's process tree killed (what a job was running when its build was killed
        would run on to its own timeout), their folders removed."""
        for pid, _, scratch in self.running.values():
            kill_tree(pid)
            if scratch:
                scratch_folders.remove(scratch)

    def end_parked(self) -> None:
        """Every parked process ended as the zygote ends, its folder removed: not reaped here,
        it would have kept its inputs and outputs (megabytes to gigabytes, in memory under
        /dev/shm) until the next build's sweep."""
        for pidfd in list(self.parked):
            self._evict(pidfd)
            if scratch := self.running[pidfd][2]:
                scratch_folders.remove(scratch)

    def reap(self, pidfd: int) -> None:
        pid, conn, scratch = self.running.pop(pidfd)
        self._unpark(pidfd, close=True)
        shared_memory.forget(pid)  # before it is reaped, while its pid is still its own
        _, status = os.waitpid(pid, 0)
        os.close(pidfd)
        if scratch:
            scratch_folders.remove(scratch)
        if conn is not None:
            with contextlib.suppress(OSError):
                conn.sendall(json.dumps({"exit": os.waitstatus_to_exitcode(status)}).encode() + b"\n")
            conn.close()

    def reserve(self, key: str) -> bool:
        """Whether the asking job is to start a spare for key: one at most is parked or on its
        way (a cold build's first jobs all start new workers at once, and each spare holds a
        CUDA context)."""
        now = time.monotonic()
        on_its_way = key in self.reserved and now - self.reserved[key] < RESERVATION_S
        if on_its_way or any(k == key for k, _, _ in self.parked.values()):
            return False
        self.reserved[key] = now
        return True

    def park(self, pid: int, key: str, fds: list[int], stop: bool = True) -> bool:
        """Keep a child idle for a later adopt(key), stopped: nothing of it runs while parked,
        whatever it left behind that its job could not see (a thread of code under test that
        lied about itself), in this build's measurements or, kept warm, later builds'. With
        stop=False it runs on (a spare, which has run only magpie's code)."""
        pidfd = next((fd for fd, (p, _, _) in self.running.items() if p == pid), None)
        if pidfd is None or pidfd in self.parked:
            return False
        self.reserved.pop(key, None)
        if stop and not stop_tree(pid):  # a child whose threads have not all stopped is not parked
            continue_tree(pid)  # to end as a job ends an unparked process
            return False
        conn = self.running[pidfd][1]
        if conn is not None:
            conn.close()
        self.running[pidfd][1] = None
        self.parked[pidfd] = (key, fds, time.monotonic())
        if self.cap is None:
            self.cap = parked_cap(nvidia_device_bytes())
        for stale in self.stale(key):
            self._evict(stale)
        while len(self.parked) > self.cap:
            self._evict(self.victim())
        return True

    def _evict(self, pidfd: int) -> None:
        """A parked process ended (it is reaped when it has)."""
        self._unpark(pidfd, close=True)
        kill_tree(self.running[pidfd][0])

    def stale(self, key: str) -> list[int]:
        """Parked processes in the slot of the one parking `key` with other content: an
        implementation's earlier content, which no build adopts again unless the edit is undone.
        Left parked, such processes filled the cap and pushed out the evaluators (on the H200,
        kept-warm repeats of one compare slowed from 12 to 24 s over four builds)."""
        own = slot(key)
        return [] if own is None else [fd for fd, (other, _, _) in self.parked.items()
                                       if slot(other) == own and other != key]

    def victim(self) -> int:
        """Which parked process goes when too many wait: the longest parked among keys with
        more than one waiting (a second copy only serves jobs running at once, a unique one
        saves its implementation a whole start), else the longest parked."""
        counts = collections.Counter(key for key, _, _ in self.parked.values())
        pool = [fd for fd, (key, _, _) in self.parked.items() if counts[key] > 1] or list(self.parked)
        return min(pool, key=lambda fd: self.parked[fd][2])

    def adopt(self, key: str, conn: socket.socket) -> tuple[int, list[int], str | None] | None:
        pidfd = next((fd for fd, (k, _, _) in self.parked.items() if k == key), None)
        if pidfd is None:
            return None
        fds = self._unpark(pidfd, close=False)
        continue_tree(self.running[pidfd][0])
        self.running[pidfd][1] = conn
        return self.running[pidfd][0], fds, self.running[pidfd][2]

    def _unpark(self, pidfd: int, close: bool) -> list[int]:
        _, fds, _ = self.parked.pop(pidfd, ("", [], 0.0))
        if close:
            for fd in fds:
                os.close(fd)
        return fds


def _answer(conn: socket.socket, listener: socket.socket, state: Children) -> bool:
    """One request on a new connection: a ping, a fork, a park, a reservation or an adopt. True when the
    connection stays open to carry a child's exit status."""
    if not _same_pid_namespace(conn):
        return False  # code under test (in a sandbox's PID namespace) that found the socket
    conn.settimeout(30)
    try:
        data, fds, _, _ = socket.recv_fds(conn, 1 << 20, 16)
        while not data.endswith(b"\n"):
            more = conn.recv(1 << 20)
            if not more:
                return False
            data += more
    except OSError:
        return False
    request = json.loads(data)
    op = request["op"]
    if op == "ping":
        conn.sendall(b'{"pong": true}\n')
        return False
    if op == "park":
        parked = state.park(int(request["pid"]), request["key"], fds, stop=request.get("stop", True))
        if not parked:
            for fd in fds:
                os.close(fd)
        conn.sendall(json.dumps({"parked": parked}).encode() + b"\n")
        return False
    if op == "reserve":
        conn.sendall(json.dumps({"reserved": state.reserve(request["key"])}).encode() + b"\n")
        return False
    if op == "adopt":
        found = state.adopt(request["key"], conn)
        if found is None:
            conn.sendall(b'{"none": true}\n')
            return False
        pid, child_fds, scratch = found
        socket.send_fds(conn, [json.dumps({"pid": pid, "scratch": scratch}).encode() + b"\n"], child_fds)
        for fd in child_fds:
            os.close(fd)
        return True
    renumber = {str(old): str(new) for old, new in zip(request["fds"], fds)}
    args = [renumber.get(a, a) for a in request["args"]]
    zygote = os.getpid()
    pid = os.fork()
    if pid == 0:
        _become_child(request, args, [listener, conn, *(c for _, c, _ in state.running.values() if c is not None)],
                      fds, zygote)
    for fd in fds:
        os.close(fd)
    conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
    state.running[os.pidfd_open(pid)] = [pid, conn, request.get("scratch")]
    return True


def _same_pid_namespace(conn: socket.socket) -> bool:
    """Whether the peer is a process of this PID namespace: magpie's own processes are, code
    under test is not. Landlock does not guard connecting to a socket by its path, and a
    request here would fork a process outside the sandbox."""
    pid, _, _ = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
    # NSpid lists the process's pid in this namespace and in each one below it: one pid, ours.
    # (Its /proc/PID/ns link would need ptrace rights over it, which the evaluator, not
    # dumpable, does not give an unprivileged zygote.)
    try:
        nspid = namespace_pids(pid)
    except OSError:
        return False
    return nspid is None or len(nspid) == 1  # no NSpid (Linux before 4.1): no sandbox there either


def _become_child(request: dict, args: list[str], sockets: list, passed: list[int], zygote: int) -> None:
    """In a new child: hold no descriptor of the zygote's (its socket and connections, its
    other children's pipes and pidfds, its owner's pidfd) but the ones passed; die with the
    zygote (a stopped child would not see its pipes close); then run the module."""
    code = 1
    try:
        for sock in sockets:
            sock.close()
        close_all_but(*passed)
        namespaces.prctl(namespaces.PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != zygote:  # it ended before the line above
            os._exit(1)
        os.setsid()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        from magpie import sandbox

        sandboxed = request.get("sandbox")
        limits(0 if sandboxed else int(request["memory_mb"]))()
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        log_to(request["log"])
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        tempfile.tempdir = None  # TMPDIR is the child's own, not the one the zygote's imports saw
        extra = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p not in sys.path]
        # Code under test finds modules beside it as `python -m` would; magpie's own processes
        # never look in the folder they run in.
        sys.path[:0] = [request["cwd"], *extra] if request.get("under_test") else extra
        sys.argv = [request["module"], *args]
        if sandboxed:
            for name in (FOLDER_VARIABLE, OWNER_VARIABLE):  # where the zygote listens: none of its business
                os.environ.pop(name, None)
            # the zygote is not dumpable (its memory is nobody's to read); the child may map its ids
            namespaces.prctl(namespaces.PR_SET_DUMPABLE, 1)
            sandbox.enter_or_exit(sandbox.Policy.from_json(sandboxed))
        elif request.get("under_test"):
            sandbox.enter_or_exit(None)  # trusted: below a keeper
        import importlib

        module = importlib.import_module(request["module"])
        code = module.main(args) or 0
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    except BaseException:  # the child's failure is reported by its exit code and its log
        import traceback

        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def main(argv: list[str]) -> int:
    try:  # children and the owner are watched through pidfds (Linux 5.3+)
        os.close(os.pidfd_open(os.getpid()))
    except (AttributeError, OSError) as err:
        print(f"no zygote on this system: {err}", file=sys.stderr)
        return 3
    serve(argv[0], int(argv[1]), float(argv[2]) if len(argv) > 2 else 0.0)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
