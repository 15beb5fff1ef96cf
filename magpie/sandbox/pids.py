"""Where a sandbox run as root finds its cgroups (`groups` makes them). RLIMIT_NPROC does not
hold for the host's root (the kernel exempts it, whatever user namespace it is in), so as root
nothing but a pids cgroup bounds how many processes code under test may start: a fork bomb would
take every process ID of the host until its timeout. Its groups are made under the calling
process's own (cgroup v2 where the controllers can be had there, else v1's hierarchies), hold the
sandbox's init and everything it starts, and are removed when the sandbox ends; what a killed
waiter leaves is removed by the next sandbox made beside it."""

from __future__ import annotations

import contextlib
import os

from magpie.linux.procfs import exists, own_cgroup

ROOT = "/sys/fs/cgroup"
PREFIX = "magpie-sandbox-"
# In a container's v2 root group: where its processes go, so that it may hand controllers down.
LEAF = "magpie-processes"


def v2_parent() -> str | None:
    """The v2 group under which this process's sandboxes are made: its own, or, in a container
    whose processes were moved to their leaf group (`groups`), the container's root group; None
    where no v2 hierarchy holds it at ROOT (v1 alone, or v2 beside v1 with no controller)."""
    own = own_cgroup("")
    if own is None:
        return None
    group = os.path.join(ROOT, ("/" if own == f"/{LEAF}" else own).lstrip("/"))
    return group if os.path.isfile(os.path.join(group, "cgroup.controllers")) else None


def controllers_of(group: str) -> list[str]:
    """The controllers a v2 group may hand to its children (none where it cannot be read)."""
    try:
        with open(os.path.join(group, "cgroup.controllers")) as controllers:
            return controllers.read().split()
    except OSError:
        return []


def own_folder(controller: str) -> str | None:
    """The folder of this process's group: in v2 for "", else in controller's v1 hierarchy."""
    own = own_cgroup(controller)
    if own is None:
        return None
    return os.path.join(ROOT, controller, own.lstrip("/")) if controller else os.path.join(ROOT, own.lstrip("/"))


def parents(controller: str = "pids") -> list[str]:
    """Where a cgroup with `controller` can be made for this process: v2 where the controller is
    delegated to its cgroup (a container's may have memory alone: a child made there has no
    pids.max), then v1's hierarchy of that controller."""
    found = []
    v2 = v2_parent()
    if v2 is not None and controller in controllers_of(v2):
        found.append(v2)
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


def available(controller: str = "pids") -> bool:
    """Whether `groups.enter` would find a place for a group with controller (as a report says
    what is in force): a v1 hierarchy's, or a v2 group that hands it down or can be made to
    (the machine's or a container's root group: one that holds other processes cannot)."""
    for parent in parents(controller):
        if not os.access(parent, os.W_OK):
            continue
        if parent != v2_parent() or own_cgroup("") in ("/", f"/{LEAF}"):
            return True
        with contextlib.suppress(OSError), open(os.path.join(parent, "cgroup.subtree_control")) as enabled:
            if controller in enabled.read().split():
                return True
    return False
