"""A workspace magpie cannot write: mounted read-only (a CI cache restored so), not ours to
write, or on a full disk. A build that needs nothing written works on it; one that must write
ends in one line saying what it needed to write (`describe`), never a traceback, and a full
disk loses nothing already stored (artifacts, records and the snapshot are written beside
their place and renamed into it). Imports nothing heavy on purpose."""

from __future__ import annotations

import errno
import os
from pathlib import Path

READ_ONLY = frozenset({errno.EROFS})
DENIED = frozenset({errno.EACCES, errno.EPERM})
FULL = frozenset({errno.ENOSPC, errno.EDQUOT})


def unwritable(err: BaseException) -> bool:
    """Whether the error is a write refused by the file system (not a fault of magpie's)."""
    return isinstance(err, OSError) and err.errno in READ_ONLY | DENIED | FULL


def writable(path: str | Path) -> bool:
    """Whether magpie may write under `path`: the nearest folder of it that exists (a workspace
    not made yet is made in its parent) allows writing (a read-only mount does not, for root too)."""
    path = Path(path).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return os.access(path, os.W_OK)


def _shown(path: str | Path) -> str:
    """The path relative to the current folder when inside it (as the user typed paths)."""
    try:
        return os.path.relpath(path) if Path(path).absolute().is_relative_to(Path.cwd()) else str(path)
    except (OSError, ValueError):
        return str(path)


def top_folder(path: str | Path) -> str:
    """The first folder of the path as shown: 'workspaces/' for workspaces/store/ab/..."""
    shown = _shown(path)
    head = shown.split(os.sep, 1)[0] if not os.path.isabs(shown) else os.path.dirname(shown)
    return head + ("/" if not head.endswith("/") else "")


def read_only_line(folder: str | Path, needed: str) -> str:
    return (
        f"{top_folder(folder)} is read-only: {needed}; make it writable, or build in a writable copy "
        f"(cp -r the project)"
    )


def describe(err: OSError) -> str:
    """The one line (without the leading 'magpie: ') for a write the file system refused."""
    if not err.filename:
        return f"{err.strerror or err}: a write magpie needed was refused; free space or make its folders writable"
    path = err.filename
    shown = _shown(path)
    if err.errno in READ_ONLY:
        return read_only_line(path, f"could not write {shown}")
    if err.errno in FULL:
        return (
            f"no space left on the device of {top_folder(path)}: could not write {shown}; free some "
            f"space and run magpie build again (what was stored before is kept)"
        )
    return (
        f"permission denied: {shown} ({err.strerror}); magpie needs to write there: give it the right or "
        f"build in a copy of the project that you own"
    )
