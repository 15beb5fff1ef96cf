"""Readers of /proc: what the kernel tells of processes and their threads, namespaces, locks
and the host. A process or thread gone meanwhile reads as None or nothing where the caller
can only go on; where it must tell the causes apart, OSError reaches it."""

from __future__ import annotations

import contextlib
import os


def descriptor_path(fd: int) -> str:
    """A path that opens what this process's descriptor fd holds (a folder held O_PATH, one
    whose own path may have changed or been covered)."""
    return f"/proc/self/fd/{fd}"


def _state(stat_path: str) -> str | None:
    """The state letter in a /proc stat file (after the name, which may hold ')'); None once
    the process or thread is gone."""
    try:
        with open(stat_path, "rb") as stat_file:
            return stat_file.read().rsplit(b")", 1)[1].split()[0].decode()
    except FileNotFoundError:
        return None


def process_state(pid: int) -> str | None:
    """R, S, D, T, t, Z, X...: the process's state; None once it is gone (IndexError where
    what was read is not a stat line)."""
    return _state(f"/proc/{pid}/stat")


def task_ids(pid: int) -> list[str]:
    """The ids of the process's threads (OSError once it is gone)."""
    return os.listdir(f"/proc/{pid}/task")


def child_pids(pid: int) -> list[int]:
    """The processes whose parent is pid (any of its threads), as the kernel lists them."""
    found: list[int] = []
    try:
        tids = task_ids(pid)
    except OSError:
        return found
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as listed:
                found += [int(child) for child in listed.read().split()]
        except OSError:  # the thread ended, or the kernel keeps no list of children
            continue
    return found


def descendants(pid: int) -> list[int]:
    """pid and every process below it (a sandbox's waiter, its init, the worker, what it
    started), each after its parent."""
    out, todo = [], [pid]
    while todo:
        current = todo.pop()
        out.append(current)
        todo += child_pids(current)
    return out


def all_stopped(pid: int) -> bool:
    """Every thread of pid, and of its children and theirs, is stopped (or gone)."""
    for process in descendants(pid):
        try:
            tasks = task_ids(process)
        except FileNotFoundError:
            continue
        if any(_state(f"/proc/{process}/task/{tid}/stat") not in (None, "T", "t", "Z", "X") for tid in tasks):
            return False
    return True


def exists(pid: int) -> bool:
    """Whether /proc shows a process of that pid (a zombie too)."""
    return os.path.exists(f"/proc/{pid}")


def parents_and_states() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, state) of every process /proc shows; empty where there is no /proc."""
    table = {}
    with contextlib.suppress(OSError):
        for entry in os.scandir("/proc"):
            if entry.name.isdigit():
                row = parent_and_state(int(entry.name))
                if row is not None:
                    table[int(entry.name)] = row
    return table


def parent_and_state(pid: int) -> tuple[int, str] | None:
    """The process's parent pid and state; None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            fields = handle.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[1]), fields[0].decode()


def tasks_in_namespace() -> int:
    """The processes and threads this process's /proc shows: in a PID namespace with its own
    /proc mounted, that namespace's."""
    count = 0
    for name in os.listdir("/proc"):
        if name.isdigit():
            with contextlib.suppress(OSError):  # ended since listed
                count += len(task_ids(int(name)))
    return count


def pid_namespace() -> int:
    """This process's PID namespace (the inode of its link); 0 where it cannot be read."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


def namespace_link(kind: str) -> str:
    """What /proc/self/ns/<kind> ("user", "pid", "mnt"...) points at: which namespace of that
    kind this process is in (OSError where it cannot be read)."""
    return os.readlink(f"/proc/self/ns/{kind}")


def status_lines(pid: int | str, fields: tuple[str, ...]) -> list[str]:
    """The lines of /proc/<pid>/status ("self" for this process) that start with one of
    `fields` ("Seccomp:", "NSpid:"...), stripped (OSError where it cannot be read)."""
    with open(f"/proc/{pid}/status") as status:
        return [line.strip() for line in status if line.startswith(fields)]


def namespace_pids(pid: int) -> list[str] | None:
    """The pid of process pid in this PID namespace and in each one below it, down to its own
    (NSpid); None where the kernel does not tell it (before Linux 4.1). OSError once gone."""
    found = status_lines(pid, ("NSpid:",))
    return found[0].split()[1:] if found else None


def command_words(pid: int) -> list[bytes]:
    """The process's command line, word by word, of its first 4 KiB (OSError where it cannot
    be read: FileNotFoundError or ProcessLookupError once it has ended)."""
    with open(f"/proc/{pid}/cmdline", "rb") as handle:
        return handle.read(4096).rstrip(b"\0").split(b"\0")


def file_locks() -> list[str]:
    """The lines of /proc/locks: every file lock on the host, with its holder's pid (OSError
    where it cannot be read)."""
    with open("/proc/locks") as handle:
        return handle.read().splitlines()


def boot_id() -> str:
    """What tells this boot of the host from every other (OSError where it cannot be read)."""
    with open("/proc/sys/kernel/random/boot_id") as boot:
        return boot.read().strip()


def own_cgroup(controller: str) -> str | None:
    """This process's cgroup in the v1 hierarchy of `controller`, or in v2 for ""."""
    try:
        with open("/proc/self/cgroup") as lines:
            for line in lines:
                _, controllers, path = line.rstrip("\n").split(":", 2)
                wanted = controller in controllers.split(",") if controller else controllers == ""
                if wanted:
                    return path
    except (OSError, ValueError):
        return None
    return None


def start_time(pid: int) -> int | None:
    """When the process started, in clock ticks since boot (with its pid, what tells it from a
    later process given the same pid); None when there is no such live process (a zombie)."""
    try:
        with open(f"/proc/{pid}/stat") as stat_file:
            text = stat_file.read()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()
    return None if fields[0] in ("Z", "X") else int(fields[19])


def group_has_live_process(pgid: int) -> bool:
    """Whether /proc shows a process of process group pgid that is not a zombie."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat_file:
                text = stat_file.read()
        except OSError:
            continue
        fields = text[text.rindex(")") + 2 :].split()
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


def cpu_model_name() -> str | None:
    """The CPU's model name as /proc/cpuinfo gives it; None where it gives none."""
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


# Where the NVIDIA driver describes each GPU it drives (its UUID, its node's minor number).
NVIDIA_GPUS = "/proc/driver/nvidia/gpus"


def nvidia_gpu_descriptions() -> list[dict[str, str]]:
    """What the NVIDIA driver tells of each GPU it drives ("GPU UUID", "Device Minor"... as
    written, values unstripped); none where there is no driver."""
    try:
        folders = os.listdir(NVIDIA_GPUS)
    except OSError:
        return []
    found = []
    for folder in folders:
        try:
            with open(os.path.join(NVIDIA_GPUS, folder, "information")) as f:
                found.append(dict(line.split(":", 1) for line in f if ":" in line))
        except OSError:
            continue
    return found


def values(paths: tuple[str, ...]) -> list[str | None]:
    """The value in each file (a /proc/sys setting), stripped; None for one that cannot be read."""
    found: list[str | None] = []
    for path in paths:
        try:
            with open(path) as value:
                found.append(value.read().strip())
        except OSError:
            found.append(None)
    return found
