"""One memory account for a sandbox: a memory cgroup of its own, made with its pids cgroup
(`groups`: on v2 one group holds both, where the controllers are delegated, else v1's memory
hierarchy). RLIMIT_AS bounds only a process's address space: memfds, shared memory and files in
its tmpfs scratch folder (unlinked ones too) lie outside it, and a candidate held 3 GiB in
memfds under a limit of 2 GiB. The kernel charges all of them, page by page, to the cgroup of the process that made
them; past the cgroup's limit its OOM killer ends a process of the sandbox, which the waiter
reads from the cgroup's count of OOM kills and reports as `memory limit exceeded` (an exit
status of its own, `init.SANDBOX_MEMORY`).

The waiter makes the cgroup, its init is forked into it, and the waiter then leaves it: the
OOM killer chooses among the sandbox's own processes only, and the waiter lives to say why."""

from __future__ import annotations

import contextlib
import os

from magpie.sandbox import pids

# What names this failure: on the waiter's stderr, and in a worker's verdict (`init.SANDBOX_MEMORY`).
EXCEEDED = "memory limit exceeded"


def available() -> bool:
    """Whether `groups.enter` would find a place for a memory cgroup (as a report says what is
    in force)."""
    return pids.available("memory")


def oom_kills(folder: str) -> int:
    """How many processes the kernel killed in the cgroup for going over its limit."""
    for name in ("memory.events", "memory.oom_control"):  # v2's, v1's
        with contextlib.suppress(OSError), open(os.path.join(folder, name)) as counts:
            for line in counts:
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
    return 0
