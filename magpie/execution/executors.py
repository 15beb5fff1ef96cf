"""Executors run jobs. doit schedules; an executor decides where a job's work happens.

Picked by name from EXECUTORS (`ray`: ray_executor.py, imported only when picked). Where a
build's jobs run on devices, `Placed` puts each on one (devices.py) and records it in the
result. Also how a build stops what it started: `stop_descendants`.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor

from magpie.environment import JOBS
from magpie.errors import UserError
from magpie.execution import pool
from magpie.execution.devices import CPU, PLACED_RULES, Device, Placement, device_of, placed_on
from magpie.execution.job import Job, JobOutput, run_job
from magpie.linux.procfs import parent_and_state, parents_and_states


class InlineExecutor:
    """Runs each job in the calling thread (the default for -j 1)."""

    def __init__(self, workers: int = 1):
        self.workers = workers

    def submit(self, job: Job) -> Future:
        future: Future = Future()
        try:
            future.set_result(run_job(job))
        except BaseException as err:
            future.set_exception(err)
        return future

    def shutdown(self) -> None:
        pass


def _take_environment(environment: dict) -> None:
    os.environ.clear()
    os.environ.update(environment)


def _start_job_process(environment: dict, build_pid: int) -> None:
    """A pool process's start: the build's environment, and an end with the build. It is the
    forkserver's child, not the build's, and the forkserver outlives the build as long as any
    pool process does (each holds the pipe whose end-of-file would end it): so each watches
    the build itself, and when it ends, stops what it started and ends too; the forkserver
    and the resource tracker then read end-of-file and end. Should the forkserver go first,
    the kernel ends it (PR_SET_PDEATHSIG)."""
    _take_environment(environment)
    with contextlib.suppress(OSError, AttributeError):  # AttributeError: no prctl (not Linux)
        from magpie.linux import namespaces

        namespaces.prctl(namespaces.PR_SET_PDEATHSIG, signal.SIGKILL)
    threading.Thread(target=_end_with, args=(build_pid,), name="magpie-end-with-build", daemon=True).start()


def _end_with(pid: int) -> None:
    try:
        watch = os.pidfd_open(pid)
    except ProcessLookupError:
        watch = None  # already gone
    except (AttributeError, OSError):  # no pidfds (Linux before 5.3): look every second
        while _alive(pid):
            time.sleep(1.0)
        watch = None
    if watch is not None:
        select.select([watch], [], [])
    stop_descendants(os.getpid())
    os._exit(1)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's (the build's pid went to another process)
        return True
    return True


class LocalProcessExecutor:
    """A pool of local processes; jobs and their outputs cross the boundary by pickling.

    The processes are forked from a server that imported the job code once (where there is
    one: Linux), instead of each starting an interpreter and importing it; they take the
    environment the build has now, not the one the server started with."""

    def __init__(self, workers: int):
        self.workers = workers
        self._pool = ProcessPoolExecutor(
            max_workers=workers,
            mp_context=pool.context(),
            initializer=_start_job_process,
            initargs=(dict(os.environ), os.getpid()),
        )

    def submit(self, job: Job) -> Future:
        return self._pool.submit(run_job, job)

    def shutdown(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


# How long stop_descendants waits for the processes it stopped to be stopped (a thread in
# uninterruptible sleep stops when that ends) before it kills them all anyway.
STOP_WAIT_S = 2.0


def stop_descendants(root: int, spare: frozenset[int] = frozenset()) -> list[int]:
    """Kill every descendant of `root` (not root itself), except the processes in `spare`
    and theirs; the pids killed. Each is stopped (SIGSTOP) first and the tree walked again
    until no new process appears: a process killed before its children were found would
    leave them orphaned, out of the walk's reach, and a running one may fork meanwhile.
    Signals go through pidfds where there are, so a pid reused meanwhile is not hit."""
    held: dict[int, int | None] = {}  # pid -> its pidfd (None: signalled by pid)
    deadline = time.monotonic() + STOP_WAIT_S
    try:
        while True:
            # looked at before the walk: a process stopped then has forked nothing since
            settled = all(_stopped(pid) for pid in held)
            table = parents_and_states()
            found = [pid for pid in _subtree(table, root, spare) if pid not in held]
            for pid in found:
                try:
                    fd = os.pidfd_open(pid)
                except ProcessLookupError:
                    continue
                except (AttributeError, OSError):
                    fd = None
                row = parent_and_state(pid)
                if row is None or row[0] != table[pid][0]:  # it ended (its pid may be another's now)
                    if fd is not None:
                        os.close(fd)
                    continue
                held[pid] = fd
                _signal(pid, fd, signal.SIGSTOP)
            if (settled and not found) or time.monotonic() > deadline:
                break
            time.sleep(0.002)
    finally:
        for pid, fd in held.items():
            _signal(pid, fd, signal.SIGKILL)
            if fd is not None:
                os.close(fd)
    return list(held)


def _subtree(table: dict[int, tuple[int, str]], root: int, spare: frozenset[int]) -> list[int]:
    children: dict[int, list[int]] = {}
    for pid, (parent, _) in table.items():
        children.setdefault(parent, []).append(pid)
    found, stack = [], [root]
    while stack:
        for child in children.get(stack.pop(), []):
            if child not in spare:
                found.append(child)
                stack.append(child)
    return found


def _stopped(pid: int) -> bool:
    row = parent_and_state(pid)
    return row is None or row[1] in ("T", "t", "Z", "X")


def _signal(pid: int, fd: int | None, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if fd is not None:
            signal.pidfd_send_signal(fd, sig)
        else:
            os.kill(pid, sig)


class Placed:
    """An executor whose jobs are put on devices first (`devices.Placement`): a job of a placed
    rule (timing, profile, correctness) that names a device waits for one, runs with its
    settings naming that device, and its result records the device (`device`: index, name,
    UUID where known)."""

    def __init__(self, inner, placement: Placement):
        self.inner = inner
        self.workers = inner.workers
        self.placement = placement

    def submit(self, job: Job) -> Future:
        spec = job.spec
        if spec.rule not in PLACED_RULES or device_of(spec) is None:
            return self.inner.submit(job)
        device = self.placement.take(spec.rule, spec.kernel)
        placed = Job(placed_on(spec, device), job.dep_results, job.dep_dirs, job.input_secret)
        try:
            inner = self.inner.submit(placed)
        except BaseException:
            self.placement.give_back(device, spec.rule)
            raise
        outer: Future = Future()

        def finish(done: Future) -> None:
            # given back before the waiter sees the result: its next job may take the device
            self.placement.give_back(device, spec.rule)
            try:
                output = done.result()
            except BaseException as err:
                outer.set_exception(err)
                return
            output.result["device"] = device.record()
            outer.set_result(output)

        inner.add_done_callback(finish)
        return outer

    def shutdown(self) -> None:
        self.inner.shutdown()


def _ray_executor(workers: int, address: str | None = None):
    from magpie.execution.ray_executor import RayExecutor

    return RayExecutor(workers, address)


EXECUTORS: dict[str, Callable] = {"inline": InlineExecutor, "local": LocalProcessExecutor, "ray": _ray_executor}


def make_executor(
    jobs: int, name: str | None = None, devices: list[Device] | None = None, ray_address: str | None = None
):
    """The executor a build runs its jobs on. With `devices` (devices.build_devices), the local
    executors place each job on one of them; Ray places them itself, by the resources each job
    asks for (ray_executor.py)."""
    os.environ[JOBS] = str(jobs)  # for its evaluators: a worker's default memory limit (`sandbox.default_memory_mb`)
    name = pool.executor_name(jobs, name)
    if name == "ray":
        return _ray_executor(jobs, ray_address)
    if ray_address is not None:
        raise UserError("--ray-address: only with --executor ray")
    executor = EXECUTORS[name](jobs)
    if devices is None:
        return executor
    # The CPU is one device, and its measured phases are held alone inside each job
    # (device_lock): placing its whole timings one at a time would also serialize their
    # first calls and checks, which today overlap under -j N.
    alone = devices != [CPU]
    return Placed(executor, Placement(devices, measurements_alone=alone))


__all__ = [
    "EXECUTORS",
    "InlineExecutor",
    "LocalProcessExecutor",
    "Placed",
    "make_executor",
    "stop_descendants",
    "JobOutput",
]
