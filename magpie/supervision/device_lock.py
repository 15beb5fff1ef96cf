"""Who may use a device while something is measured on it.

Checking, input making and first calls (JIT, context creation) may share a device; a
measurement (timing, a profiler's replays) holds it alone, so nothing another job of the
build runs lands in its numbers, also under `-j N`. Both are advisory `flock`s on files in a
private folder of the user's under the temporary folder (code under test, sandboxed, cannot
see it), shared by every magpie process of that user on the machine, and released by the
kernel when their holder dies.

A job that waits to measure holds the turnstile, so that new sharers queue behind it:
without it, a stream of checking jobs could keep a measurement waiting to the end.

No wait is endless: a process left holding a lock (one stopped, or stuck in the driver)
would stall every build on the host. A waiter gives up once the same processes have held
what it waits for (and, behind the turnstile, the lock) MAGPIE_DEVICE_LOCK_TIMEOUT_S seconds
(600 by default; a queue that keeps moving never trips it), with DeviceLockTimeout, whose
one line names the lock file and, as /proc/locks tells, the holders' pids and command lines.
"""

from __future__ import annotations

import fcntl
import os
import struct
import time
from contextlib import contextmanager
from pathlib import Path

from magpie.environment import DEVICE_LOCK_TIMEOUT_S
from magpie.linux.procfs import command_words, file_locks
from magpie.private_folders import NotPrivate, lock_folder

DEFAULT_TIMEOUT_S = 600.0
POLL_S = 0.02  # between attempts to take a lock that is held
LOOK_S = 1.0  # at most this long between looks at who holds it


class DeviceLockError(RuntimeError):
    """The device lock could not be taken; str() is the one-line verdict."""


class DeviceLockTimeout(DeviceLockError):
    """Waited too long for a device lock held by the same processes all along."""


def timeout_s() -> float:
    """How long a wait may see the same holders (inf: for ever)."""
    try:
        value = float(os.environ.get(DEVICE_LOCK_TIMEOUT_S) or DEFAULT_TIMEOUT_S)
    except ValueError:
        return DEFAULT_TIMEOUT_S
    return value if value > 0 else DEFAULT_TIMEOUT_S


def folder() -> Path:
    """The user's private folder of lock files (made here, mode 0700; refused if not ours alone)."""
    try:
        return lock_folder()
    except NotPrivate as err:
        raise DeviceLockError(f"device lock: {err}") from None


def _path(device: str, role: str) -> Path:
    return folder() / f"{device.replace(':', '-').replace(os.sep, '-')}.{role}"


@contextmanager
def _flock(path: Path, mode: int, purpose: str, behind: Path | None = None):
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        _acquire(fd, path, mode, purpose, behind)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _acquire(fd: int, path: Path, mode: int, purpose: str, behind: Path | None) -> None:
    """Take the lock, polling (the wait must be able to end); DeviceLockTimeout once the same
    processes have held it timeout_s() seconds, and those of `behind` too (the lock the
    turnstile's holder may be waiting for: a measurement waiting behind checks that keep
    ending is a queue that moves)."""
    try:
        fcntl.flock(fd, mode | fcntl.LOCK_NB)
        return
    except BlockingIOError:
        pass
    global _last_look
    started = _last_look = time.monotonic()
    _tell_waits(polled=started)
    try:
        _wait_for(fd, path, mode, purpose, behind, started)
    finally:
        _looked(time.monotonic())
        _tell_waits(polled=0.0)


def _wait_for(fd: int, path: Path, mode: int, purpose: str, behind: Path | None, started: float) -> None:
    limit = timeout_s()
    holders = _holders(fd, behind)
    since = started  # when the holders were last seen to change
    look = started + min(LOOK_S, limit / 4)
    while True:
        time.sleep(POLL_S)
        try:
            fcntl.flock(fd, mode | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            pass
        now = time.monotonic()
        _looked(now)
        if now >= look or now - since >= limit:
            seen = _holders(fd, behind)
            if seen != holders:
                holders, since = seen, now
            look = now + min(LOOK_S, limit / 4)
        if now - since >= limit:
            raise DeviceLockTimeout(
                _timeout_line(path, purpose, now - started, now - since, None if holders is None else holders[0])
            )


# Where this process tells how long it has waited for locks, for the job that keeps its step's
# hard limit (`session.Worker.receive`), which counts none of it: under -j N a timing job may
# wait for the measurements of every other job of the build. Two doubles: the seconds waited
# so far, and, while a wait is under way, the CLOCK_MONOTONIC second (the same in every
# process) it last looked at the lock (else 0). A waiter that stops looking (stopped, or stuck)
# waits no more: no more than POLLED_S after a look counts as waiting, whenever it looks again.
WAITS_FILE = "device-waits"
_WAITS = struct.Struct("dd")
POLLED_S = 1.0
_told: int | None = None
_waited_s = 0.0
_last_look = 0.0


@contextmanager
def telling_waits(path: Path):
    """While the block runs, this process's waits for locks are told in the file at path."""
    global _told, _waited_s
    _told, _waited_s = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600), 0.0
    try:
        _tell_waits(polled=0.0)
        yield
    finally:
        os.close(_told)
        _told = None


def _looked(now: float) -> None:
    """A waiter looked at the lock: the time since its last look waited, up to POLLED_S."""
    global _waited_s, _last_look
    _waited_s += min(now - _last_look, POLLED_S)
    _last_look = now
    _tell_waits(polled=now)


def _tell_waits(polled: float) -> None:
    if _told is not None:
        os.pwrite(_told, _WAITS.pack(_waited_s, polled), 0)


def waited_s(path: Path) -> float:
    """How long the process telling its waits at path (`telling_waits`) has waited for locks,
    the wait under way included, up to POLLED_S after its last look at the lock; 0 where it
    has told nothing."""
    try:
        with open(path, "rb") as told:
            data = told.read(_WAITS.size)
    except OSError:
        return 0.0
    if len(data) != _WAITS.size:
        return 0.0
    waited, polled = _WAITS.unpack(data)
    return waited + (min(time.monotonic() - polled, POLLED_S) if polled else 0.0)


def _timeout_line(path: Path, purpose: str, waited: float, held: float, holders: list[int] | None) -> str:
    if holders is None:
        who = "by a process /proc/locks does not show"
    elif not holders:
        who = "by no process /proc/locks names"
    else:
        who = "by " + ", ".join(f"pid {pid} ({_command_line(pid)})" for pid in holders[:3])
        who += f" and {len(holders) - 3} more" if len(holders) > 3 else ""
    when = "all that time" if held >= waited - 0.5 else f"the last {held:.0f} s"
    return (
        f"device lock: gave up after {waited:.0f} s waiting for {path} ({purpose}), held {when} {who}; "
        f"{DEVICE_LOCK_TIMEOUT_S} sets the wait"
    )


def _command_line(pid: int) -> str:
    if pid == os.getpid():
        return "this process"
    if pid <= 0:
        return "in a PID namespace this one does not see"
    try:
        words = command_words(pid)
    except (FileNotFoundError, ProcessLookupError):
        return "ended; a process it started holds the file"
    except OSError:
        return "command line not readable"
    line = " ".join(w.decode(errors="replace") for w in words).replace("\n", " ").strip()
    if not line:
        return "no command line"
    return line if len(line) <= 160 else line[:157] + "..."


def _holders(fd: int, behind: Path | None = None) -> list[list[int]] | None:
    """The pids /proc/locks gives as holding a lock on fd's file (sorted), then on `behind`'s;
    None where it cannot be read."""
    files = [os.fstat(fd)]
    if behind is not None:
        try:
            files.append(os.stat(behind))
        except OSError:
            pass
    try:
        lines = file_locks()
    except OSError:
        return None
    found: list[tuple[set[int], set[int]]] = [(set(), set()) for _ in files]  # (same device, any device) per file
    for line in lines:
        parts = line.split()
        # "1: FLOCK  ADVISORY  WRITE 23087 fe:00:2146442 0 EOF"; a blocked waiter's has "->"
        if len(parts) < 6 or parts[1] == "->":
            continue
        dev, _, inode = parts[5].rpartition(":")
        for info, (exact, same_inode) in zip(files, found):
            if inode == str(info.st_ino):
                try:
                    pid = int(parts[4])
                except ValueError:
                    continue
                exact_dev = dev == f"{os.major(info.st_dev):02x}:{os.minor(info.st_dev):02x}"
                (exact if exact_dev else same_inode).add(pid)
    # by inode alone where the device numbering differs (an overlay file system's)
    return [sorted(exact or same_inode) for exact, same_inode in found]


@contextmanager
def shared(device: str):
    """Use the device beside other sharers, never during a measurement."""
    with _flock(_path(device, "turnstile"), fcntl.LOCK_EX, "to share the device", _path(device, "lock")):
        pass
    with _flock(_path(device, "lock"), fcntl.LOCK_SH, "to share the device"):
        yield


def share_held(device: str) -> int | None:
    """A descriptor of its own holding the device shared, for a process that starts its use of
    the device after its starter's job may have ended (a spare worker making its CUDA context):
    the lock lasts until every copy of the descriptor is closed. Taken only beside a sharer
    (under `shared`, where no measurement holds the device); None if it could not be."""
    fd = os.open(_path(device, "lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


@contextmanager
def exclusive(device: str):
    """Hold the device alone: every sharer has left, and none enters until the block ends."""
    with (
        _flock(_path(device, "turnstile"), fcntl.LOCK_EX, "to hold the device alone", _path(device, "lock")),
        _flock(_path(device, "lock"), fcntl.LOCK_EX, "to hold the device alone"),
    ):
        yield
