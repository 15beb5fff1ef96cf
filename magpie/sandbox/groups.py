"""The cgroups of one sandbox run as root, made, left and removed together: its process limit
(`pids.max`, as RLIMIT_NPROC does not bind root) and its memory account (`memory`). On cgroup v2
a process sits in one group only, so one group holds both controllers: made one after the other,
the first group took the waiter, and the second, made under it, could not have the memory
controller (a v2 group with a process in it cannot hand controllers to its children). On v1 each
controller has a hierarchy of its own and the sandbox gets a group in each.

A v2 group with processes in it cannot hand a controller down (only the machine's root group
may), so on v2 the group is made under this process's own group where that is the machine's
root group (a VM's, a bare host's), else beside it, under the group above, where that one hands
both down already (a container or a delegated systemd unit whose processes were moved into a
leaf group, as a container's init does before it hands controllers down). magpie moves no other
process itself: a container's root group that hands controllers down can no longer take one, and
a later `docker exec` into it would fail. Elsewhere no v2 group can be had and the sandbox falls
back (`pids`: its init counts processes; `memory`: RLIMIT_AS, memfd and System V segments
refused)."""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import os

from magpie.linux.procfs import own_cgroup
from magpie.sandbox import pids
from magpie.sandbox.pids import PREFIX, handed_down, own_folder, sweep, v2_parents, write


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
    for parent in dict.fromkeys(p for c in limits for p in v2_parents(c)):
        wanted = [c for c in limits if parent in v2_parents(c)]
        made = _made(parent, wanted, limits)
        if made is not None:
            _held_by(groups, *made, wanted)
            break
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
    # where it goes back to as it leaves
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
    """Have parent hand controllers to its children (v2: the machine's root group, or one that
    does already; v1's hierarchies need nothing)."""
    control = os.path.join(parent, "cgroup.subtree_control")
    if not os.path.isfile(control):
        return
    missing = [c for c in controllers if c not in handed_down(parent)]
    if missing:
        write(control, " ".join(f"+{c}" for c in missing))
