"""Wall seconds of the steps of a piece of work, so that start-up costs (process start, JIT on
first calls, input transfer) are reported apart from what was measured."""

from __future__ import annotations

import time


class Laps:
    def __init__(self):
        self.seconds: dict[str, float] = {}
        self._last = time.perf_counter()

    def mark(self, name: str) -> None:
        now = time.perf_counter()
        self.seconds[name] = round(self.seconds.get(name, 0.0) + now - self._last, 4)
        self._last = now
