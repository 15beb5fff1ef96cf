"""The served side of a process magpie starts (a worker, an evaluator): its limits, its
log, its main loop's pipes, its clean-up between jobs."""

from __future__ import annotations

import os
import resource
import sys


def limits(memory_mb: int):
    def apply():
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if memory_mb:
            limit = memory_mb * 1024 * 1024
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    return apply


def children(pid: int) -> list[int]:
    found = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
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
    """pid and every process below it (a sandbox's waiter, its init, the worker, what it started)."""
    out, todo = [], [pid]
    while todo:
        current = todo.pop()
        out.append(current)
        todo += children(current)
    return out


def log_to(path: str) -> None:
    """Point this process's stdout and stderr at a new log (a parked process adopted by a job)."""
    sys.stdout.flush()
    sys.stderr.flush()
    log = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)


def serve_pipes(argv: list[str], serve) -> int:
    """The served side's main: commands on the first descriptor, answers on the second; its
    own stdout goes to stderr, so nothing printed mixes with the protocol."""
    command_fd, answer_fd = int(argv[0]), int(argv[1])
    os.dup2(2, 1)
    with os.fdopen(command_fd, "r") as commands, os.fdopen(answer_fd, "w") as answers:
        serve(commands, answers)
    return 0


def release_memory() -> None:
    """Between jobs: what the last one left goes, on the device too."""
    import gc

    gc.collect()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        torch.cuda.empty_cache()
