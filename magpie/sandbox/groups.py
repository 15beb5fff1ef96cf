"""The cgroups of one sandbox run as root, made, left and removed together: its process limit
(`pids.max`, as RLIMIT_NPROC does not bind root) and its memory account (`memory`). On cgroup v2
a process sits in one group only, so one group holds both controllers: made one after the other,
the first group took the waiter, and the second, made under it, could not have the memory
controller (a v2 group with a process in it cannot hand controllers to its children). On v1 each
controller has a hierarchy of its own and the sandbox gets a group in each.

A v2 group with processes in it cannot enable a controller for its children either (only the
machine's root group may): a container's own root group, where a build runs, holds every process
of the container. There the first sandbox moves them all into a leaf group of their own beside the
sandboxes' (`LEAF`), as a container's init does before it hands controllers down; elsewhere (a
systemd unit's group holding other processes) no v2 group can be had and the sandbox falls back
(`pids`: its init counts processes; `memory`: RLIMIT_AS, memfd denied)."""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import os

from magpie.linux.procfs import own_cgroup
from magpie.sandbox import pids
from magpie.sandbox.pids import LEAF, PREFIX, controllers_of, own_folder, sweep, v2_parent, write


@dataclasses.dataclass
class Groups:
    """Where one sandbox's limits are held: the folder of its pids group and of its memory group
    (the same folder on v2); None where that limit could not be had."""

    processes: str | None = None
    memory: str | None = None
    # the groups this process was in before it entered them, to go back to (by folder)
    homes: list[str] = dataclasses.field(default_factory=list)

    def folders(self) -> list[str]:
        return list(dict.fromkeys(f for f in (self.processes, self.memory) if f))

    def leave(self) -> None:
        """Move this process back where it was; what it forked while inside stays."""
        for home in self.homes:
            with contextlib.suppress(OSError):
                write(os.path.join(home, "cgroup.procs"), str(os.getpid()))

    def release(self) -> None:
        """Leave the groups and remove them, once their processes have ended (what they left in
        tmpfs stays charged to a removed memory group until freed, as the kernel does)."""
        self.leave()
        for folder in self.folders():
            with contextlib.suppress(OSError):
                os.rmdir(folder)


def enter(processes: int, memory_mb: int) -> Groups:
    """Move this process into new cgroups that hold at most `processes` processes and threads
    and, with `memory_mb`, that many MiB of memory, swap included: one v2 group with both
    controllers where v2 delegates them, else a group in each v1 hierarchy that has one."""
    limits = {"pids": {"pids.max": str(processes)}}
    if memory_mb:
        limit = str(memory_mb << 20)
        limits["memory"] = {
            "memory.max": limit,  # v2's names
            "memory.swap.max": "0",
            "memory.limit_in_bytes": limit,  # v1's: memory, then memory and swap together
            "memory.memsw.limit_in_bytes": limit,
        }
    groups = Groups()
    parent = v2_parent()
    if parent is not None:
        wanted = [c for c in limits if c in controllers_of(parent)]
        made = _made(parent, wanted, limits) if wanted else None
        if made is not None:
            _held_by(groups, *made, wanted)
    for controller in limits:
        if _held(groups, controller):
            continue
        v1 = own_cgroup(controller)
        if v1 is None or not os.path.isdir(os.path.join(pids.ROOT, controller)):
            continue
        made = _made(os.path.join(pids.ROOT, controller, v1.lstrip("/")), [controller], limits)
        if made is not None:
            _held_by(groups, *made, [controller])
    return groups


def _held(groups: Groups, controller: str) -> bool:
    return (groups.processes if controller == "pids" else groups.memory) is not None


def _held_by(groups: Groups, folder: str, home: str, controllers: list[str]) -> None:
    """Record folder as holding controllers, and home as where this process goes back to."""
    groups.homes.append(home)
    for controller in controllers:
        if controller == "pids":
            groups.processes = folder
        else:
            groups.memory = folder


def _made(parent: str, controllers: list[str], limits: dict[str, dict[str, str]]) -> tuple[str, str] | None:
    """A group of this process's own under parent holding controllers' limits, this process in
    it, and the group it was in before; None where none can be made there (nothing left)."""
    sweep(parent)
    folder = os.path.join(parent, f"{PREFIX}{os.getpid()}")
    try:
        _enable(parent, controllers)
        os.mkdir(folder)
    except OSError:
        return None
    # where it was, after `_enable` may have moved it (into a container's leaf group)
    home = own_folder("" if os.path.isfile(os.path.join(parent, "cgroup.controllers")) else controllers[0])
    try:
        for controller in controllers:
            # of the other version's names, and a swap limit where the kernel keeps no swap account
            present = [name for name in limits[controller] if os.path.isfile(os.path.join(folder, name))]
            if not present:  # a group made where the controller is not delegated has no limit file
                raise OSError(errno.ENOENT, f"no {controller} limit in {folder}")
            for name in present:
                write(os.path.join(folder, name), limits[controller][name])
        if home is None:
            raise OSError(errno.ENOENT, "this process's own group cannot be read")
        write(os.path.join(folder, "cgroup.procs"), str(os.getpid()))
        return folder, home
    except OSError:
        with contextlib.suppress(OSError):
            os.rmdir(folder)
        return None


def _enable(parent: str, controllers: list[str]) -> None:
    """Have parent hand controllers to its children (v2; v1's hierarchies need nothing). In a
    container's root group, which holds processes, they are first moved to its leaf group."""
    control = os.path.join(parent, "cgroup.subtree_control")
    if not os.path.isfile(control):
        return
    with open(control) as enabled:
        missing = [c for c in controllers if c not in enabled.read().split()]
    if not missing:
        return
    change = " ".join(f"+{c}" for c in missing)
    try:
        write(control, change)
    except OSError as err:
        if err.errno != errno.EBUSY or own_cgroup("") not in ("/", f"/{LEAF}"):
            raise
        _empty_into_leaf(parent)
        write(control, change)


def _empty_into_leaf(parent: str) -> None:
    """Move every process of a container's root group into its leaf group: a v2 group hands
    controllers to its children only once it holds no process of its own."""
    leaf = os.path.join(parent, LEAF)
    with contextlib.suppress(FileExistsError):
        os.mkdir(leaf)
    with open(os.path.join(parent, "cgroup.procs")) as members:
        found = members.read().split()
    for pid in found:
        with contextlib.suppress(ProcessLookupError):  # ended since listed
            write(os.path.join(leaf, "cgroup.procs"), pid)
