"""CPU time and scheduler waits as the Linux kernel counts them, read from outside a process
tree: each process's CPU clock (every thread it has had, ended ones included) and what the
children it reaped spent (`TreeTimes`), a thread's time runnable but waiting for a CPU
(`/proc/.../schedstat`: `CallWaits`, `MachineShare`, `own_wait`), the process that a pid in
another PID namespace names (`process_named`), and threads pinned to CPUs apart (`apart`)."""

from __future__ import annotations

import contextlib
import os
import time

from magpie.linux.procfs import descendants

# Whether the kernel keeps per-thread scheduler statistics (CONFIG_SCHED_INFO): without them
# a batch is timed by the wall clock alone.
SCHEDSTAT = os.path.exists("/proc/thread-self/schedstat")


def schedstat(path: str) -> tuple[int, int]:
    """(ns on a CPU, ns runnable but waiting for one) of a thread, from the kernel."""
    try:
        with open(path) as stat:
            on_cpu, waiting = stat.read().split()[:2]
        return int(on_cpu), int(waiting)
    except (OSError, ValueError):  # the thread ended, or the kernel keeps no scheduler statistics
        return 0, 0


def process_named(root: int, own_pid: int) -> int:
    """The process below `root` that calls itself `own_pid` in its PID namespace (the worker,
    which says its pid): its pid here; `root` where none does."""
    for pid in descendants(root):
        try:
            with open(f"/proc/{pid}/status") as status:
                line = next((x for x in status if x.startswith("NSpid:")), "")
        except OSError:
            continue
        if line.split()[-1:] == [str(own_pid)]:
            return pid
    return root


# A process's CPU clock in clock_gettime's terms (the kernel's MAKE_PROCESS_CPUCLOCK(pid, SCHED)):
# the run time of every thread it has had, ended ones included.
_CPUCLOCK_SCHED = 2
CLOCK_TICK_NS = 1e9 / os.sysconf("SC_CLK_TCK")


def process_cpu(pid: int) -> tuple[tuple[int, str], int, int] | None:
    """((pid, start time), CPU clock ns, reaped children's clock ticks) of a process: its clock
    holds the run time of every thread it has had; what the children it reaped spent the
    kernel keeps in clock ticks only. None once it is gone."""
    try:
        own = time.clock_gettime_ns(((~pid) << 3) | _CPUCLOCK_SCHED)
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        reaped = int(fields[13]) + int(fields[14])
    except (OSError, ValueError, IndexError):
        return None
    return (pid, fields[19]), own, reaped


class TreeTimes:
    """A snapshot of scheduler times: the CPU time and the waits of the thread that runs the
    calls (the worker's main thread, `main`), and the CPU time of every process of the
    worker's tree (`process_cpu`), by process (a pid and its start time)."""

    def __init__(self, root: int, main: int):
        self.main_cpu, self.waiting = schedstat(f"/proc/{main}/task/{main}/schedstat")
        self.cpu: dict[tuple[int, str], int] = {}
        self.reaped_ticks = 0
        for pid in descendants(root):
            if found := process_cpu(pid):
                key, own, reaped = found
                self.cpu[key] = own + round(reaped * CLOCK_TICK_NS)
                self.reaped_ticks += reaped

    def cpu_since(self, before: TreeTimes) -> int:
        """CPU ns the tree spent since `before`: a thread that ended meanwhile still counts (its
        process's clock keeps it), a process started since counts whole, one that ended since
        counts whole in the process that reaped it (more than since `before`: slower, never
        faster)."""
        return sum(ns - before.cpu.get(key, 0) for key, ns in self.cpu.items())

    def processes_changed(self, before: TreeTimes) -> bool:
        """Whether a process of the tree started, ended or was reaped since `before`: the time
        of one that ended is known in clock ticks only (10 ms), in whoever reaped it, which a
        batch's median could leave out."""
        return self.cpu.keys() != before.cpu.keys() or self.reaped_ticks != before.reaped_ticks


class CallWaits:
    """How long the worker's calling thread and the evaluator's own have waited for a CPU, from
    the kernel's scheduler statistics, read around each call handed over through descriptors
    kept open (a read costs about 0.5 µs, an open and read 7 µs)."""

    def __init__(self, worker: int):
        paths = (f"/proc/{worker}/task/{worker}/schedstat", "/proc/thread-self/schedstat") if SCHEDSTAT else ()
        self._fds = [os.open(path, os.O_RDONLY | os.O_CLOEXEC) for path in paths]

    def read(self) -> int:
        waited = 0
        for fd in self._fds:
            with contextlib.suppress(OSError, ValueError, IndexError):  # the worker ended meanwhile
                waited += int(os.pread(fd, 128, 0).split()[1])
        return waited

    def close(self) -> None:
        for fd in self._fds:
            os.close(fd)


class MachineShare:
    """How busy the machine kept a measurement: of the time the evaluator's thread and the
    workers' calling threads could run, the share they spent waiting for a CPU (the kernel's
    scheduler statistics), from its creation until `share`. On the 2-core machine a quiet
    measurement's threads wait a few percent of it; beside two CPU hogs, about half."""

    def __init__(self, callers: list[int]):
        self._paths = ["/proc/thread-self/schedstat", *(f"/proc/{pid}/task/{pid}/schedstat" for pid in callers)]
        self._start = [schedstat(path) for path in self._paths]

    def share(self) -> float | None:
        """None where the kernel keeps no scheduler statistics. A thread that ended meanwhile
        reads (0, 0): left out."""
        if not SCHEDSTAT:
            return None
        on_cpu = waiting = 0
        for path, (cpu_then, wait_then) in zip(self._paths, self._start):
            cpu_now, wait_now = schedstat(path)
            if cpu_now >= cpu_then and wait_now >= wait_then:
                on_cpu += cpu_now - cpu_then
                waiting += wait_now - wait_then
        return waiting / (on_cpu + waiting) if on_cpu + waiting > 0 else 0.0


def own_wait() -> int:
    """ns the calling thread has spent runnable but waiting for a CPU."""
    return schedstat("/proc/thread-self/schedstat")[1]


def threads(pid: int) -> list[int]:
    """Every thread of `pid` and of its descendants."""
    found: list[int] = []
    for process in descendants(pid):
        with contextlib.suppress(OSError):  # it ended meanwhile
            found.extend(int(tid) for tid in os.listdir(f"/proc/{process}/task"))
    return found


@contextlib.contextmanager
def apart(pids: list[int]):
    """While batches are handed over one call at a time: the calling thread on one allowed CPU,
    every thread of the processes `pids` and their descendants on another, their CPU masks
    restored after. Each side looks for the other's word without sleeping; on one CPU, or on
    CPUs the scheduler lets them share, each would wait out the other's time slice (on the
    2-CPU machine, 4-11 ms in one batch of four, instead of 10 µs). Yields the workers' CPU,
    or None, changing nothing, where fewer than two CPUs are allowed."""
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        yield None
        return
    masks = {0: os.sched_getaffinity(0)}
    for pid in pids:
        for tid in threads(pid):
            with contextlib.suppress(OSError):  # a thread that ended meanwhile
                masks[tid] = os.sched_getaffinity(tid)
                os.sched_setaffinity(tid, {allowed[1]})
    os.sched_setaffinity(0, {allowed[0]})
    try:
        yield allowed[1]
    finally:
        for tid, mask in masks.items():
            with contextlib.suppress(OSError):
                os.sched_setaffinity(tid, mask)


def moved_threads(pid: int, cpu: int) -> list[int]:
    """The threads of `pid` and its descendants whose CPU mask is no longer {cpu} (`apart`)."""
    moved = []
    for tid in threads(pid):
        with contextlib.suppress(OSError):
            if os.sched_getaffinity(tid) != {cpu}:
                moved.append(tid)
    return moved
