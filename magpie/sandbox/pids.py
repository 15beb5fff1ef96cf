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


def v2_parents(controller: str) -> list[str]:
    """The v2 groups under which a group with controller may be made for this process: its own
    where controller is delegated to it (a container's may have memory alone: a child made there
    has no pids.max), then the group above it where that one hands controller down already (a
    container or a delegated unit whose processes were moved to a leaf group: a v2 group with
    processes in it hands no controller down, but the machine's root group)."""
    own = own_folder("")
    if own is None or not os.path.isfile(os.path.join(own, "cgroup.controllers")):
        return []
    found = [own] if controller in controllers_of(own) else []
    above = os.path.dirname(own.rstrip("/"))
    if not machine_root(own) and controller in handed_down(above):
        found.append(above)
    return found


def machine_root(group: str) -> bool:
    """Whether a v2 group is the machine's root group, the one that may hand controllers down
    while it holds processes (every other group has a cgroup.type; a container's root is one)."""
    return not os.path.isfile(os.path.join(group, "cgroup.type"))


def controllers_of(group: str) -> list[str]:
    """The controllers a v2 group may hand to its children (none where it cannot be read)."""
    return _words(os.path.join(group, "cgroup.controllers"))


def handed_down(group: str) -> list[str]:
    """The controllers a v2 group hands to its children now (its subtree_control)."""
    return _words(os.path.join(group, "cgroup.subtree_control"))


def _words(path: str) -> list[str]:
    try:
        with open(path) as listed:
            return listed.read().split()
    except OSError:
        return []


def own_folder(controller: str) -> str | None:
    """The folder of this process's group: in v2 for "", else in controller's v1 hierarchy."""
    own = own_cgroup(controller)
    if own is None:
        return None
    return os.path.join(ROOT, controller, own.lstrip("/")) if controller else os.path.join(ROOT, own.lstrip("/"))


def parents(controller: str = "pids") -> list[str]:
    """Where a cgroup with `controller` can be made for this process: v2 (`v2_parents`), then
    v1's hierarchy of that controller."""
    found = v2_parents(controller)
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
    what is in force): a v1 hierarchy's, or a v2 group that hands it down or can be made to (the
    machine's root group: any other this process is in holds a process, and cannot)."""
    for parent in parents(controller):
        if not os.access(parent, os.W_OK):
            continue
        if parent != own_folder("") or machine_root(parent) or controller in handed_down(parent):
            return True
    return False
