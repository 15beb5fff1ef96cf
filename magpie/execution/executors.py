"""Executors run jobs. doit schedules; an executor decides where a job's work happens.

Picked by name from EXECUTORS; a Ray executor for clusters is one more class here.
Also how a build stops what it started: `stop_descendants`.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import threading
import time
from concurrent.futures import Future, ProcessPoolExecutor

from magpie.environment import JOBS
from magpie.execution import pool
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


EXECUTORS = {"inline": InlineExecutor, "local": LocalProcessExecutor}


def make_executor(jobs: int, name: str | None = None):
    os.environ[JOBS] = str(jobs)  # for its evaluators: a worker's default memory limit (`sandbox.default_memory_mb`)
    return EXECUTORS[pool.executor_name(jobs, name)](jobs)


__all__ = ["EXECUTORS", "InlineExecutor", "LocalProcessExecutor", "make_executor", "stop_descendants", "JobOutput"]
