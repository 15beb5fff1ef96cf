"""The local process pool's server: on Linux a process that imported the job code once, from
which the pool's processes are forked. Nothing of magpie is imported here, so that a build can
start the server before it imports and loads anything itself."""

from __future__ import annotations

import multiprocessing
import os
import sys
from multiprocessing import forkserver, resource_tracker

PRELOAD = [
    "magpie.execution.server_exit",
    "magpie.execution.job",
    "magpie.execution.actions",
    "magpie.report.render",
    "magpie.execution.report_action",
]


def executor_name(jobs: int, name: str | None = None) -> str:
    """Where a build's jobs run: the name asked for, else inline for one job at a time."""
    return name or ("inline" if jobs <= 1 else "local")


def context():
    """The pool's multiprocessing context: a forkserver that preloads the job code where there
    is one, else spawn."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    forkserver = multiprocessing.get_context("forkserver")
    forkserver.set_forkserver_preload(PRELOAD)
    return forkserver


def prestart(jobs: int, name: str | None = None) -> None:
    """Start the server now, where the build's jobs will run in the local pool. Its imports take
    0.3-0.5 s in a fresh interpreter: started by the first job, they delay that job, and where
    tasks run one after another (an edited candidate's compile, correctness, timing, ...) the
    verdict; started here, they overlap the build's own imports and loading of the project."""
    if executor_name(jobs, name) == "local" and context().get_start_method() == "forkserver":
        start_resource_tracker()
        forkserver.ensure_running()


def start_resource_tracker() -> None:
    """multiprocessing's resource tracker, started with its output streams on the null device
    (a process of its own, which the pool's server and processes report their semaphores to).
    It outlives the build by the moment it takes to read end-of-file and leave, and a caller
    that reads the build's output through a pipe waits for every holder of that pipe: 8 ms
    after every build on the CPU machine. What it prints, warnings about semaphores left
    behind by a build that was killed, has no reader."""
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    saved = [os.dup(1), os.dup(2)]
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 1)
        os.dup2(null, 2)
        resource_tracker.ensure_running()
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, null):
            os.close(fd)
