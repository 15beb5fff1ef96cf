"""The zygote itself: it imports torch (and Triton) once, then forks evaluators and workers on
request, each in a session of its own with the requested working folder, environment, memory
limit and log (in a sandbox where one is asked for), reports each one's exit status over the
connection it was asked on, and keeps finished ones parked for adoption (`Children`). The
requester's side is `zygote`.

Usage (started by `zygote.launch`): python -m magpie.supervision.zygote_server SOCKET OWNER_PID IDLE_S
(OWNER_PID 0: no owner; it ends once idle IDLE_S seconds)
"""

from __future__ import annotations

import collections
import contextlib
import gc
import json
import os
import select
import signal
import socket
import struct
import sys
import tempfile
import time
from typing import Any

from magpie import environment, sandbox
from magpie.linux import namespaces
from magpie.linux.processes import close_all_but, kill_tree
from magpie.linux.procfs import namespace_pids
from magpie.supervision import scratch as scratch_folders
from magpie.supervision import shared_memory
from magpie.supervision.process import continue_tree, limits, log_to, stop_tree
from magpie.supervision.zygote import slot

# Imported before forking (torch.multiprocessing: the reducers that lend CUDA tensors).
PRELOAD = (
    "torch",
    "torch.multiprocessing",
    "triton",
    "triton.language",
    "magpie.harness.worker",
    "magpie.harness.evaluate",
)
# Then called (module:function), for what every child would otherwise compute for itself.
WARM_UPS = ("magpie.harness.compiler_caches:warm_triton",)


# Idle children kept for adoption at once. Each holds its process and, on a GPU, its CUDA
# context: about half a GiB of device memory, so no more than fit in an eighth of the
# smallest device's (32 on an H200; a compare of 8 candidates under -j 8 parks about 20).
MAX_PARKED = 32
CONTEXT_BYTES = 512 << 20
# How long a reservation to park a spare (`Children.reserve`) holds without the spare coming.
RESERVATION_S = 60.0


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
            return [
                pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(i)).total
                for i in range(pynvml.nvmlDeviceGetCount())
            ]
        finally:
            pynvml.nvmlShutdown()
    except pynvml.NVMLError:
        return []


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


def _serve_children(
    listener: socket.socket, socket_path: str, owner: list[int], state: Children, idle_s: float
) -> None:
    last_activity = time.monotonic()
    while True:
        timeout = max(0.0, last_activity + idle_s - time.monotonic()) if idle_s else None
        requesters = state.requesters()
        watched: list[Any] = [listener, *owner, *state.running, *requesters]  # sockets and descriptors
        ready, _, _ = select.select(watched, [], [], timeout)
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
        return (
            []
            if own is None
            else [fd for fd, (other, _, _) in self.parked.items() if slot(other) == own and other != key]
        )

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
        _become_child(
            request, args, [listener, conn, *(c for _, c, _ in state.running.values() if c is not None)], fds, zygote
        )
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
            # where the zygote listens: none of its business
            for name in (environment.ZYGOTE_DIR, environment.ZYGOTE_OWNER):
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
