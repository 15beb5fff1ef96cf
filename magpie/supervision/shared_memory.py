"""What a GPU worker's sandbox sees as /dev/shm: a folder of its own (`scratch.lent_folder`),
into which the evaluator links the files that CUDA IPC needs the worker to open by name,
and nothing else of the host's /dev/shm.

Memory lent through CUDA IPC meets in the driver, but two things of the lender's are files
in /dev/shm that the borrower opens by the name in what it was lent: torch's reference
counts of lent memory (`torch_<pid>_<n>_<n>`) and the driver's state of the lender's
interprocess events (`cuda.shm.<n>.<pid in hex>.<n>`, one file holding them all). The
evaluator makes them as it lends; `Lending.sync` hard-links them (same filesystem: the
folder lies in /dev/shm too) into the worker's folder before a request goes out, when the
evaluator has lent anything since the last one (`made`). Another job's files, another
program's, and the host's /dev/shm otherwise stay out of the worker's reach; what it writes
there is counted with its scratch folder."""

from __future__ import annotations

import contextlib
import os
import re
import stat
import uuid
from pathlib import Path

from magpie.supervision.scratch import SHARED_MEMORY, lent_folder

# How many times this process has lent memory or events (`made`): a worker's folder is synced
# only when it changed.
_lent = 0


def made() -> None:
    """This process has lent memory or events through CUDA IPC: the files for them may be new."""
    global _lent
    _lent += 1


def own_files(pid: int | None = None) -> list[str]:
    """The names in /dev/shm of the files CUDA IPC made for this process's lending: regular
    files of this user, named by its pid."""
    pid = os.getpid() if pid is None else pid
    names = re.compile(rf"torch_{pid}_\d+_\d+|cuda\.shm\.\d+\.{pid:x}\.\d+")
    try:
        with os.scandir(SHARED_MEMORY) as entries:
            found = [e.name for e in entries if names.fullmatch(e.name)]
    except OSError:
        return []
    uid = os.geteuid()
    kept = []
    for name in found:
        with contextlib.suppress(OSError):  # gone since listed
            info = os.lstat(os.path.join(SHARED_MEMORY, name))
            if stat.S_ISREG(info.st_mode) and info.st_uid == uid:
                kept.append(name)
    return kept


def forget(pid: int) -> None:
    """Remove what CUDA IPC made in /dev/shm for a process that has ended: the driver leaves
    its event pool there (80 KiB an evaluator on the H200, never removed). Called as it is
    reaped, before its pid can name another process; a worker that mapped a file keeps it."""
    for name in own_files(pid):
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(SHARED_MEMORY, name))


class Lending:
    """The files a worker's /dev/shm must hold for what this process lends it."""

    def __init__(self, folder: Path):
        self.folder = folder
        self._synced = -1

    @classmethod
    def for_worker(cls, scratch: Path) -> Lending | None:
        """The folder a worker with this scratch folder sees as /dev/shm, made if it is not yet;
        None where there is no /dev/shm to make it in (its sandbox's /dev/shm is then an empty
        tmpfs, and memory lent to it fails to map in one line that says what to do)."""
        try:
            return cls(lent_folder(scratch, make=True))
        except OSError:
            return None

    def sync(self) -> None:
        if self._synced == _lent:
            return
        for name in own_files():
            link(os.path.join(SHARED_MEMORY, name), self.folder / name)
        self._synced = _lent


def link(source: str, target: Path) -> None:
    """target made a hard link of source, whatever the worker left at that name (a file planted
    under a name the evaluator will use would be what its driver opened)."""
    try:
        if os.stat(target, follow_symlinks=False).st_ino == os.stat(source).st_ino:
            return
    except FileNotFoundError:
        pass
    except OSError:
        return
    staged = target.with_name(f".lent-{uuid.uuid4().hex}")
    try:
        os.link(source, staged)
        os.replace(staged, target)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(staged)
