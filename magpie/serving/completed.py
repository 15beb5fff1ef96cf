"""The measured requests that completed, kept so that an interrupted run (Ctrl-C, SIGTERM) still reports them.

The load client holds its requests' records in its own tasks until the run ends; an interruption cancels the
run and those records go with it. `CompletedRequests` is installed as the event loop's task factory: from
`start()` (called once the warm-ups are done, as the measured requests begin) it keeps every task made, and
`outputs()` returns the records (`RequestOutput`) of those that finished, whether they succeeded or failed,
leaving out the ones cancelled in flight. `elapsed()` is the time from `start()`, the interrupted run's
duration.
"""

from __future__ import annotations

import asyncio
import time

from magpie.serving.stream import Clock, RequestOutput


class CompletedRequests:
    def __init__(self, clock: Clock = time.perf_counter) -> None:
        self.clock = clock
        self.started: float | None = None
        self._tasks: list[asyncio.Task] = []

    def install(self, loop: asyncio.AbstractEventLoop) -> None:
        made_by = loop.get_task_factory()

        def factory(loop, coro, **kwargs):
            task = made_by(loop, coro, **kwargs) if made_by is not None else asyncio.Task(coro, loop=loop, **kwargs)
            if self.started is not None:
                self._tasks.append(task)
            return task

        loop.set_task_factory(factory)

    def start(self) -> None:
        self.started = self.clock()

    def elapsed(self) -> float:
        return 0.0 if self.started is None else self.clock() - self.started

    def outputs(self) -> list[RequestOutput]:
        """The finished requests' records, in the order they were sent."""
        done = [
            task.result() for task in self._tasks if task.done() and not task.cancelled() and task.exception() is None
        ]
        return sorted((out for out in done if isinstance(out, RequestOutput)), key=lambda out: out.start_time)
