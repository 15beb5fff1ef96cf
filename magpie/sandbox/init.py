"""The sandbox's init: the first process of its PID namespace, which reaps what is orphaned
there, watches what the sandbox's folders hold (and, as root without a pids cgroup, how many
processes it holds), kills them all past a limit, and says how the code's process ended."""

from __future__ import annotations

import os
import select
import signal
import stat
import sys

from magpie.linux import namespaces, procfs
from magpie.linux.processes import close_all_but, end_like
from magpie.sandbox import memory
from magpie.sandbox.groups import Groups
from magpie.sandbox.policy import MAX_FILES, WATCH_S, Policy, write_trees

# Exit status of a process whose sandbox could not be set up (nothing of the code under test ran).
SANDBOX_FAILED = 70
# Exit status of a sandbox whose code went over what its folders may hold: every process of it
# killed, one line on stderr says so.
SANDBOX_LIMIT = 71
# Exit status of a sandbox a process of which the kernel killed for its memory cgroup's limit
# (`memory.EXCEEDED`): a status of its own, as the waiter's stderr need not be the job's log.
SANDBOX_MEMORY = 72


def wait_as_parent(policy: Policy, cgroups: Groups, count_processes: bool) -> None:
    """Fork twice: the first child is the new PID namespace's init, which reaps what is
    orphaned there and says how the second ended; the second returns and runs the code (not
    as PID 1, to which the kernel delivers no signal it sends itself: abort() would end in a
    SIGSEGV). This process waits and ends the way the code's process ended, holding none of
    its descriptors; killing it, or the init, kills everything in the namespace. The init is
    forked into this process's cgroups, which it then leaves: a sandbox the kernel killed a
    process of for its memory cgroup's limit ends with SANDBOX_MEMORY."""
    status_read, status_write = os.pipe()
    init = os.fork()
    if init == 0:
        os.close(status_read)
        namespaces.prctl(namespaces.PR_SET_PDEATHSIG, signal.SIGKILL)
        _serve_as_init(status_write, policy, count_processes)
        return
    os.close(status_write)
    # not left (a group it cannot go back to): the OOM killer may choose this process too
    cgroups.leave()
    close_all_but(status_read)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda *_: os.kill(init, signal.SIGKILL))
    _, status = os.waitpid(init, 0)
    with os.fdopen(status_read, "rb") as told:
        reported = told.read()
    if len(reported) == 4:
        status = int.from_bytes(reported, "little")
    # every process of the namespace has ended with its init
    if cgroups.memory:
        if memory.oom_kills(cgroups.memory):
            print(
                f"sandbox: {memory.EXCEEDED} ({policy.memory_mb} MiB, its memfds, shared memory and scratch files "
                "counted): a process of it was killed",
                file=sys.stderr,
                flush=True,
            )
            status = SANDBOX_MEMORY << 8
    cgroups.release()
    end_like(status)


def _serve_as_init(status_write: int, policy: Policy, count_processes: bool) -> None:
    """In the new PID namespace, as its first process: fork the process that returns to run
    the code; reap every process until that one ends; report its status and exit. Every
    WATCH_S it looks at what the write trees hold and, with `count_processes`, how many
    processes and threads the namespace holds: past a limit, it kills them all."""
    try:
        namespaces.mount_proc()
        if policy.gpu:
            namespaces.protect_proc()
    except OSError as err:
        print(f"sandbox: /proc: {err}", file=sys.stderr, flush=True)
        os._exit(SANDBOX_FAILED)
    code = os.fork()
    if code == 0:
        os.close(status_write)
        namespaces.prctl(namespaces.PR_SET_PDEATHSIG, signal.SIGKILL)
        return
    close_all_but(status_write)
    ended = os.pidfd_open(code)
    while True:
        select.select([ended], [], [], WATCH_S)  # the code's end, or the next look at its folders
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == code:
                os.write(status_write, status.to_bytes(4, "little"))
                os._exit(0)
            if pid == 0:
                break
        over = _over_its_limits(policy, count_processes)
        if over:
            print(f"sandbox: {over} (the sandbox's limit): every process of it was killed", file=sys.stderr, flush=True)
            os.kill(-1, signal.SIGKILL)  # in its PID namespace: every process but this one
            os.write(status_write, (SANDBOX_LIMIT << 8).to_bytes(4, "little"))
            os._exit(0)


# how /proc/PID/maps marks a mapping whose file has no name left
DELETED = b" (deleted)"


def _over_its_limits(policy: Policy, count_processes: bool) -> str | None:
    """What the sandbox holds beyond its policy's limits, in words; None where nothing is."""
    held = _over_what_its_folders_may_hold(policy)
    if held:
        return f"its folders held {held}"
    if count_processes and procfs.tasks_in_namespace() > policy.processes:
        return f"it held more than {policy.processes} processes and threads"
    return None


def _over_what_its_folders_may_hold(policy: Policy) -> str | None:
    """What the policy's write trees hold beyond its limits (`written_mb`, MAX_FILES), or None:
    the blocks their files take, each entry counted once more, however deep, and the files its
    processes hold open or map that have no name left (`_held_without_a_name`,
    `_held_only_by_a_mapping`)."""
    limit = policy.written_mb << 20
    total, seen = _held_without_a_name()
    total += _held_only_by_a_mapping(policy, seen)
    files = len(seen)
    if total > limit:
        return f"more than {policy.written_mb} MiB"
    trees = write_trees(policy)
    todo = [tree for tree in trees if os.path.isdir(tree)]
    while todo:
        try:
            with os.scandir(todo.pop()) as entries:
                for entry in entries:
                    files += 1
                    if files > MAX_FILES:
                        return f"more than {MAX_FILES} files"
                    try:
                        if entry.path in trees:  # a tree bound back beneath another: counted as itself
                            continue
                        if entry.is_dir(follow_symlinks=False):
                            todo.append(entry.path)
                        else:
                            total += entry.stat(follow_symlinks=False).st_blocks * 512
                    except OSError:  # gone since listed
                        continue
                    if total > limit:
                        return f"more than {policy.written_mb} MiB"
        except OSError:
            continue
    return None


def _held_without_a_name() -> tuple[int, set[tuple[int, int]]]:
    """The blocks (in bytes) and the number of the regular files that the processes of this PID
    namespace hold open and that have no name left: removed after being opened, made without
    one (`O_TMPFILE`), memfds. No folder lists them, yet they hold their memory (in a tmpfs
    scratch folder) while open: a candidate held 1.25 GiB in removed, still-open files of its
    scratch folder, counted 0 MiB. Each file once, however many descriptors lead to it; returned
    with the (device, inode) of each."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        descriptors = f"/proc/{pid}/fd"
        try:
            names = os.listdir(descriptors)
        except OSError:  # ended since listed
            continue
        for name in names:
            try:
                held = os.stat(os.path.join(descriptors, name))
            except OSError:  # closed since listed
                continue
            if held.st_nlink or not stat.S_ISREG(held.st_mode) or (held.st_dev, held.st_ino) in seen:
                continue
            seen.add((held.st_dev, held.st_ino))
            total += held.st_blocks * 512
    return total, seen


def _held_only_by_a_mapping(policy: Policy, seen: set[tuple[int, int]]) -> int:
    """What the removed files of its write trees that its processes only map (the descriptor
    closed, the name removed) may hold, in bytes: no folder lists them and no descriptor leads to
    them, yet their pages stay (a candidate mapped one page of each of a run of files, closed
    and removed them, and held what they held while its folders counted each only while named).
    Their size cannot be read in here (/proc/PID/map_files needs the host's CAP_SYS_ADMIN), so
    each counts as the most it can hold: RLIMIT_FSIZE (`file_mb`), or its mapping where larger
    (a file the evaluator wrote). Each file once, and none already counted through a
    descriptor (`seen`). Only files of its own write trees: on a GPU, the semaphores Python's
    multiprocessing maps, removed, in the sandbox's /dev/shm are not candidates' storage."""
    trees = tuple(os.path.join(os.path.realpath(tree), "") for tree in policy.write)
    most = policy.file_mb << 20
    counted: dict[tuple[int, int], int] = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/maps", "rb") as maps:
                lines = maps.read().splitlines()
        except OSError:  # ended since listed
            continue
        for line in lines:
            if not line.endswith(DELETED):
                continue
            fields = line.split(maxsplit=5)
            if len(fields) < 6 or not os.fsdecode(fields[5][: -len(DELETED)]).startswith(trees):
                continue
            major, minor = (int(part, 16) for part in fields[3].split(b":"))
            held = (os.makedev(major, minor), int(fields[4]))
            if held in seen:
                continue
            start, end = (int(part, 16) for part in fields[0].split(b"-"))
            counted[held] = max(counted.get(held, most), end - start)
    return sum(counted.values())
