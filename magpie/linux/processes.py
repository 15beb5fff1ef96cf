"""Signals to processes and their trees, and how a process hands itself over: its
descriptors closed, its end made like another's."""

from __future__ import annotations

import os
import signal
import time

from magpie.linux.procfs import descendants, process_state


def signal_each(pids: list[int], sig: int) -> None:
    for process in pids:
        try:
            os.kill(process, sig)
        except ProcessLookupError:
            continue


def runs(pid: int) -> bool:
    """Whether the process lives: one ended but not yet reaped (a zombie) does not."""
    try:
        return process_state(pid) not in (None, "Z", "X")
    except (OSError, IndexError):
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# How long a kill of a tree goes on finding processes below it: each round kills every one found.
KILL_TREE_S = 1.0


def kill_below(pid: int) -> None:
    """SIGKILL to every process below pid, again until none runs, each parent before its
    children (`descendants` lists them so): a sandbox's init first, whose end kills everything
    in its PID namespace, stopped or not. One that left pid's process group (a new session)
    ends too, and one orphaned meanwhile is found again below a keeper (`sandbox.keeper`),
    whose living children they become: a process killed can fork no more."""
    deadline = time.monotonic() + KILL_TREE_S
    while (living := [p for p in descendants(pid)[1:] if runs(p)]) and time.monotonic() < deadline:
        signal_each(living, signal.SIGKILL)
        time.sleep(0.001)


def kill_tree(pid: int) -> None:
    """Every process below pid (`kill_below`), then pid's process group."""
    kill_below(pid)
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def close_all_but(*keep: int) -> None:
    """Every descriptor above stderr but those in `keep`."""
    low = 3
    for fd in sorted(set(keep)):
        if fd >= low:
            os.closerange(low, fd)
            low = fd + 1
    os.closerange(low, os.sysconf("SC_OPEN_MAX"))


def end_like(status: int) -> None:
    """End this process as the one whose wait status this is ended."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
    os._exit(os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 1)
