"""A pids cgroup of its own for a sandbox run as root. RLIMIT_NPROC does not hold for the host's
root (the kernel exempts it, whatever user namespace it is in), so as root nothing but a
cgroup bounds how many processes code under test may start: a fork bomb would take every
process ID of the host until its timeout. The cgroup is made under the calling process's own
(cgroup v2 where its pids controller can be had there, else v1's pids hierarchy), holds the
sandbox's waiter, init and everything they start, and is removed when the sandbox ends;
what a killed waiter leaves is removed by the next sandbox made beside it."""

from __future__ import annotations

import contextlib
import os

from magpie.linux.procfs import exists, own_cgroup

ROOT = "/sys/fs/cgroup"
PREFIX = "magpie-sandbox-"


def parents(controller: str = "pids") -> list[str]:
    """Where a cgroup with `controller` can be made for this process: v2 where the controller is
    delegated to its cgroup (a container's may have memory alone: a child made there has no
    pids.max), then v1's hierarchy of that controller."""
    found = []
    v2 = own_cgroup("")
    if v2 is not None:
        parent = os.path.join(ROOT, v2.lstrip("/"))
        try:
            with open(os.path.join(parent, "cgroup.controllers")) as controllers:
                if controller in controllers.read().split():
                    found.append(parent)
        except OSError:
            pass
    v1 = own_cgroup(controller)
    if v1 is not None and os.path.isdir(os.path.join(ROOT, controller)):
        found.append(os.path.join(ROOT, controller, v1.lstrip("/")))
    return found


def write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def sweep(parent: str) -> None:
    """Remove what sandboxes whose waiter has died left here: not one another sandbox has just
    made and not yet entered, nor one with a process in it."""
    with contextlib.suppress(OSError):
        for name in os.listdir(parent):
            maker = name.removeprefix(PREFIX)
            if name.startswith(PREFIX) and maker.isdigit() and not exists(int(maker)):
                with contextlib.suppress(OSError):
                    os.rmdir(os.path.join(parent, name))


def new_group(parent: str, controller: str) -> str:
    """A cgroup of this process's own under `parent` with `controller` (enabled for the parent's
    children where v2 needs it); OSError where none can be made there."""
    folder = os.path.join(parent, f"{PREFIX}{os.getpid()}")
    control = os.path.join(parent, "cgroup.subtree_control")  # v2's: its children's controllers
    if os.path.isfile(control):
        with open(control) as enabled:
            if controller not in enabled.read().split():
                write(control, f"+{controller}")
    os.mkdir(folder)
    return folder


def bound(limit: int) -> str | None:
    """Move this process into a new pids cgroup that holds at most `limit` processes and
    threads; the cgroup's folder, or None where none can be made (not root, no pids
    controller to be had, a read-only cgroup file system)."""
    for parent in parents():
        sweep(parent)
        try:
            folder = new_group(parent, "pids")
        except OSError:
            continue
        try:
            write(os.path.join(folder, "pids.max"), str(limit))
            write(os.path.join(folder, "cgroup.procs"), str(os.getpid()))
            return folder
        except OSError:
            with contextlib.suppress(OSError):
                os.rmdir(folder)
    return None


def available() -> bool:
    """Whether `bound` would find a place for a cgroup (as a report says what is in force)."""
    return any(os.access(parent, os.W_OK) for parent in parents())


def release(folder: str) -> None:
    """Leave the cgroup (back to its parent) and remove it; once its processes have ended."""
    with contextlib.suppress(OSError):
        write(os.path.join(os.path.dirname(folder), "cgroup.procs"), str(os.getpid()))
    with contextlib.suppress(OSError):
        os.rmdir(folder)
