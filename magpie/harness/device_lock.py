"""Who may use a device while something is measured on it.

Checking, input making and first calls (JIT, context creation) may share a device; a
measurement (timing, a profiler's replays) holds it alone, so nothing another job of the
build runs lands in its numbers, also under `-j N`. Both are advisory `flock`s on files in
the temporary folder, shared by every magpie process on the machine, and released by the
kernel when their holder dies.

A job that waits to measure holds the turnstile, so that new sharers queue behind it:
without it, a stream of checking jobs could keep a measurement waiting to the end.
"""

from __future__ import annotations

import fcntl
import tempfile
from contextlib import contextmanager
from pathlib import Path


def _path(device: str, role: str) -> Path:
    return Path(tempfile.gettempdir()) / f"magpie-{device.replace(':', '-')}.{role}"


@contextmanager
def _flock(path: Path, mode: int):
    with open(path, "a+") as handle:
        fcntl.flock(handle, mode)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@contextmanager
def shared(device: str):
    """Use the device beside other sharers, never during a measurement."""
    with _flock(_path(device, "turnstile"), fcntl.LOCK_EX):
        pass
    with _flock(_path(device, "lock"), fcntl.LOCK_SH):
        yield


@contextmanager
def exclusive(device: str):
    """Hold the device alone: every sharer has left, and none enters until the block ends."""
    with _flock(_path(device, "turnstile"), fcntl.LOCK_EX), _flock(_path(device, "lock"), fcntl.LOCK_EX):
        yield
