"""One memory account for a sandbox: a memory cgroup of its own, made as `pids` makes its pids
cgroup (v2 where the memory controller is delegated, else v1's memory hierarchy). RLIMIT_AS
bounds only a process's address space: memfds, shared memory and files in its tmpfs scratch
folder (unlinked ones too) lie outside it, and a candidate held 3 GiB in memfds under a limit of
2 GiB. The kernel charges all of them, page by page, to the cgroup of the process that made
them; past the cgroup's limit its OOM killer ends a process of the sandbox, which the waiter
reads from the cgroup's count of OOM kills and reports as `memory limit exceeded` (an exit
status of its own, `init.SANDBOX_MEMORY`).

The waiter makes the cgroup, its init is forked into it, and the waiter then leaves it: the
OOM killer chooses among the sandbox's own processes only, and the waiter lives to say why."""

from __future__ import annotations

import contextlib
import os

from magpie.sandbox.pids import new_group, parents, sweep, write

# What names this failure: on the waiter's stderr, and in a worker's verdict (`init.SANDBOX_MEMORY`).
EXCEEDED = "memory limit exceeded"


def bound(limit_mb: int) -> str | None:
    """Move this process into a new memory cgroup that holds at most `limit_mb` MiB, swap
    included; the cgroup's folder, or None where none can be made (not root, no memory
    controller to be had, a read-only cgroup file system)."""
    limit = str(limit_mb << 20)
    for parent in parents("memory"):
        sweep(parent)
        try:
            folder = new_group(parent, "memory")
        except OSError:
            continue
        try:
            if os.path.isfile(os.path.join(folder, "memory.max")):  # v2
                write(os.path.join(folder, "memory.max"), limit)
                with contextlib.suppress(FileNotFoundError):  # a kernel without swap accounting
                    write(os.path.join(folder, "memory.swap.max"), "0")
            else:  # v1: memory and swap together no more than the limit
                write(os.path.join(folder, "memory.limit_in_bytes"), limit)
                with contextlib.suppress(FileNotFoundError):
                    write(os.path.join(folder, "memory.memsw.limit_in_bytes"), limit)
            write(os.path.join(folder, "cgroup.procs"), str(os.getpid()))
            return folder
        except OSError:
            with contextlib.suppress(OSError):
                os.rmdir(folder)
    return None


def available() -> bool:
    """Whether `bound` would find a place for a cgroup (as a report says what is in force)."""
    return any(os.access(parent, os.W_OK) for parent in parents("memory"))


def leave(folder: str) -> None:
    """Move this process back to the cgroup's parent; what it forked while inside stays."""
    write(os.path.join(os.path.dirname(folder), "cgroup.procs"), str(os.getpid()))


def oom_kills(folder: str) -> int:
    """How many processes the kernel killed in the cgroup for going over its limit."""
    for name in ("memory.events", "memory.oom_control"):  # v2's, v1's
        with contextlib.suppress(OSError), open(os.path.join(folder, name)) as counts:
            for line in counts:
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
    return 0


def release(folder: str) -> None:
    """Remove the cgroup once its processes have ended (what they left in tmpfs stays charged to
    the removed cgroup until freed, as the kernel does for any removed cgroup)."""
    with contextlib.suppress(OSError):
        os.rmdir(folder)
