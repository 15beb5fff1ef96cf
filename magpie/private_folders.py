"""Where one user's magpie keeps what code under test must not see: the root of its scratch
folders and its folder of lock files, each private to the user. The sandbox hides them;
supervision keeps its scratch folders and device locks in them."""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

SHARED_MEMORY = Path("/dev/shm")
# Scratch folders lie in memory only where it has this much room (containers often cap it at 64 MB).
SHARED_MEMORY_MIN_FREE = 4 << 30


class NotPrivate(RuntimeError):
    """A private folder could not be made, or is not the user's alone; str() says which and why."""


def scratch_root_name() -> str:
    """The scratch root's name, in /dev/shm or the temporary folder (`scratch_root`)."""
    return f"magpie-{os.getuid()}"


def scratch_root() -> Path:
    """Where the scratch root lies: in /dev/shm where it has room, else in the temporary folder."""
    try:
        stats = os.statvfs(SHARED_MEMORY)
        base = SHARED_MEMORY if stats.f_bavail * stats.f_frsize >= SHARED_MEMORY_MIN_FREE else None
    except OSError:
        base = None
    return Path(base or tempfile.gettempdir()) / scratch_root_name()


def lock_folder() -> Path:
    """The user's private folder of lock files (made here, mode 0700); NotPrivate where it
    cannot be made or is not this user's alone."""
    path = Path(tempfile.gettempdir()) / f"magpie-locks-{os.getuid()}"
    try:
        path.mkdir(mode=0o700, exist_ok=True)
        info = os.lstat(path)
    except OSError as err:
        raise NotPrivate(f"cannot make the lock folder {path}: {err.strerror}") from None
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise NotPrivate(
            f"{path} is not a private folder of this user (owner uid "
            f"{info.st_uid}, mode {stat.filemode(info.st_mode)}); remove it"
        )
    return path
