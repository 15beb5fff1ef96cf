"""The served side of a process magpie starts (a worker, an evaluator): its limits, its
log, its main loop's pipes, its clean-up between jobs."""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import time


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
    """pid and every process below it (a sandbox's waiter, its init, the worker, what it
    started), each after its parent."""
    out, todo = [], [pid]
    while todo:
        current = todo.pop()
        out.append(current)
        todo += children(current)
    return out


# How long a stop waits for every thread to stop: the kernel stops the other threads of a
# process only when the one it woke for the signal runs, which on a busy machine can be
# milliseconds later; one in uninterruptible sleep may not stop in time.
STOP_WAIT_S = 2.0


def _state(stat_path: str) -> str | None:
    """The state letter in a /proc stat file (after the name, which may hold ')'); None once
    the process or thread is gone."""
    try:
        with open(stat_path, "rb") as stat_file:
            return stat_file.read().rsplit(b")", 1)[1].split()[0].decode()
    except FileNotFoundError:
        return None


def all_stopped(pid: int) -> bool:
    """Every thread of pid, and of its children and theirs, is stopped (or gone)."""
    for process in descendants(pid):
        try:
            tasks = os.listdir(f"/proc/{process}/task")
        except FileNotFoundError:
            continue
        if any(_state(f"/proc/{process}/task/{tid}/stat") not in (None, "T", "t", "Z", "X") for tid in tasks):
            return False
    return True


def _signal_each(pids: list[int], sig: int) -> None:
    for process in pids:
        try:
            os.kill(process, sig)
        except ProcessLookupError:
            continue


def wait_stopped(pid: int, resend=None) -> bool:
    """Whether every thread of pid and of the processes below it stops within STOP_WAIT_S
    (looked at again and again; `resend`, where given, signals before each look)."""
    deadline = time.monotonic() + STOP_WAIT_S
    while True:
        if resend is not None:
            resend()
        if all_stopped(pid):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.0001)


def runs(pid: int) -> bool:
    """Whether the process lives: one ended but not yet reaped (a zombie) does not."""
    try:
        return _state(f"/proc/{pid}/stat") not in (None, "Z", "X")
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
    ends too, and one orphaned meanwhile is found again below a keeper (`keeper`), whose living
    children they become: a process killed can fork no more."""
    deadline = time.monotonic() + KILL_TREE_S
    while (living := [p for p in descendants(pid)[1:] if runs(p)]) and time.monotonic() < deadline:
        _signal_each(living, signal.SIGKILL)
        time.sleep(0.001)


def kill_tree(pid: int) -> None:
    """Every process below pid (`kill_below`), then pid's process group."""
    kill_below(pid)
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def run_tree(argv: list[str], timeout: float, **popen) -> subprocess.CompletedProcess:
    """`subprocess.run(argv, capture_output=True, timeout=timeout, **popen)` for a command that
    runs code under test (through `magpie.sandbox`: in a sandbox, or below a keeper): past the
    timeout every process below the one started is killed (`kill_tree`), not that one alone.
    Killed alone, a keeper left what was below it running, holding the output pipes: a
    profiler that waits for every process of its target (ncu) never ends on its own while the
    code left one behind."""
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, **popen) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_tree(proc.pid)
            proc.communicate()
            raise
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


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


def stop_tree(pid: int) -> bool:
    """SIGSTOP to pid and to every process below it, each on its own (one that left the process
    group too), again until every thread of them has stopped (`wait_stopped`)."""
    return wait_stopped(pid, lambda: _signal_each(descendants(pid), signal.SIGSTOP))


def continue_tree(pid: int) -> None:
    _signal_each(descendants(pid), signal.SIGCONT)


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
