"""Executors run jobs. doit schedules; an executor decides where a job's work happens.

Picked by name from EXECUTORS; a Ray executor for clusters is one more class here.
"""

from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import Future, ProcessPoolExecutor

from magpie.execution.job import Job, JobOutput, run_job


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


class LocalProcessExecutor:
    """A pool of local processes; jobs and their outputs cross the boundary by pickling.

    The processes are forked from a server that imported the job code once (where there is
    one: Linux), instead of each starting an interpreter and importing it; they take the
    environment the build has now, not the one the server started with."""

    def __init__(self, workers: int):
        self.workers = workers
        if "forkserver" in multiprocessing.get_all_start_methods():
            context = multiprocessing.get_context("forkserver")
            context.set_forkserver_preload(["magpie.execution.job", "magpie.execution.actions"])
        else:
            context = multiprocessing.get_context("spawn")
        self._pool = ProcessPoolExecutor(max_workers=workers, mp_context=context, initializer=_take_environment,
                                         initargs=(dict(os.environ),))

    def submit(self, job: Job) -> Future:
        return self._pool.submit(run_job, job)

    def shutdown(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


EXECUTORS = {"inline": InlineExecutor, "local": LocalProcessExecutor}


def make_executor(jobs: int, name: str | None = None):
    name = name or ("inline" if jobs <= 1 else "local")
    return EXECUTORS[name](jobs)


__all__ = ["EXECUTORS", "InlineExecutor", "LocalProcessExecutor", "make_executor", "JobOutput"]
