"""Scratch folders: one per evaluator job and one per worker process, all under one private
root per user, so a sandbox can hide them all and bind back only its own.

In memory (/dev/shm) where it has room (containers often cap it at 64 MB), else in the
temporary folder. Each folder names the process that owns it; the next build removes those
whose owner is gone (a build killed with SIGKILL leaves them)."""

from __future__ import annotations

import errno
import os
import shutil
import stat
import tempfile
import time
from pathlib import Path

from magpie.linux.processes import runs
from magpie.linux.procfs import pid_namespace
from magpie.private_folders import SHARED_MEMORY, scratch_root, scratch_root_name

OWNER = ".owner"
# A folder without an owner file yet (or with one not yet written: a sweep can read it between
# its creation and its write) is being made; one this old without one was abandoned.
UNOWNED_GRACE_S = 3600


def root() -> Path:
    """The private root, made if it is not there (`private_folders.scratch_root`)."""
    folder = scratch_root()
    folder.mkdir(mode=0o700, exist_ok=True)
    return folder


def _lent_root() -> Path:
    """Where the folders GPU workers see as /dev/shm lie (`lent_folder`)."""
    return SHARED_MEMORY / f"{scratch_root_name()}-lent"


def lent_folder(scratch: Path, make: bool = False) -> Path:
    """What a GPU worker whose scratch folder this is sees as /dev/shm (`shared_memory`):
    always in /dev/shm, wherever the scratch folder lies, since the files linked into it are
    there; it goes with the scratch folder (`remove`)."""
    folder = _lent_root() / scratch.name
    if make:
        folder.parent.mkdir(mode=0o700, exist_ok=True)
        folder.mkdir(mode=0o700, exist_ok=True)
    return folder


def remove(scratch: Path | str) -> None:
    """A scratch folder and what its process saw as /dev/shm, if it had one."""
    shutil.rmtree(scratch, ignore_errors=True)
    shutil.rmtree(lent_folder(Path(scratch)), ignore_errors=True)


def make(prefix: str, owner: int | None = None) -> Path:
    """A new folder, owned by the process `owner` (this one by default) until it is removed."""
    folder = Path(tempfile.mkdtemp(prefix=prefix, dir=root()))
    own(folder, owner or os.getpid())
    return folder


def own(folder: Path, pid: int) -> None:
    """The owner is a pid of this PID namespace: a build in another (a sandbox's, a
    container's) cannot tell whether it lives, and leaves the folder alone."""
    with os.fdopen(create(folder / OWNER), "w") as out:  # the worker may have put a link there
        out.write(f"{pid} {pid_namespace()}")


def sweep() -> int:
    """Remove the folders whose owner has ended; the count removed."""
    removed = 0
    try:
        entries = list(root().iterdir())
    except OSError:
        return 0
    here = pid_namespace()
    for folder in entries:
        try:
            with os.fdopen(open_left(folder / OWNER)) as owner:  # not a fifo left to stall the build
                pid, namespace = (int(field) for field in owner.read().split())
            alive = namespace != here or runs(pid)
        except (FileNotFoundError, ValueError):  # no owner written yet (or half written): being made
            alive = _made_lately(folder)
        except OSError:
            alive = False
        if not alive:
            remove(folder)
            removed += 1
    return removed + _sweep_lent()


def _made_lately(folder: Path) -> bool:
    """Changed within UNOWNED_GRACE_S, or gone already (its owner removed it meanwhile)."""
    try:
        return time.time() - folder.stat().st_mtime < UNOWNED_GRACE_S
    except FileNotFoundError:
        return True


def _sweep_lent() -> int:
    """Remove the folders lent to workers whose scratch folder is gone."""
    try:
        folders = list(_lent_root().iterdir())
    except OSError:
        return 0
    gone = [f for f in folders if not exists(f.name)]
    for folder in gone:
        shutil.rmtree(folder, ignore_errors=True)
    return len(gone)


def create(path: Path) -> int:
    """A new file, for reading and writing, at a name in a folder code under test can write
    (its scratch): what it left at that name is removed first, and a name it puts back in
    between fails the open. Opening the name as it stood would write through a link it planted
    to any file magpie may write (a stored result, a project's source)."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)


def open_left(path: Path) -> int:
    """A file code under test left in its scratch folder, for reading: a regular file of one
    link only, never through a link it planted to a file it may not read itself (magpie would
    read it and put it in a log or a report); PermissionError otherwise."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
        os.close(fd)
        raise PermissionError(errno.EPERM, "not a file of its own", str(path))
    return fd


def last_lines(path: Path, lines: int = 3) -> str:
    """The last lines of a file on one line (at most 400 characters), read from its end only."""
    data, _ = tail(path, 16 << 10)
    return " | ".join(data.decode(errors="replace").strip().splitlines()[-lines:])[:400]


def tail(path: Path, limit: int) -> tuple[bytes, int]:
    """The last `limit` bytes of a file and its whole size, without reading the rest."""
    try:
        with os.fdopen(open_left(path), "rb") as handle:
            size = handle.seek(0, os.SEEK_END)
            handle.seek(max(0, size - limit))
            return handle.read(limit), size
    except OSError:
        return b"", 0


def exists(name: str) -> bool:
    """Whether a scratch folder of this name is there, in either root it may be in (which one
    depends on the room when it was made)."""
    return any((base / scratch_root_name() / name).exists() for base in (SHARED_MEMORY, Path(tempfile.gettempdir())))
