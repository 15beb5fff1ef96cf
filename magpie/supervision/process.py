"""The processes magpie starts (a worker, an evaluator, a command of code under test): their
limits, log, main loop's pipes and clean-up between jobs; a tree stopped while another is
measured and continued after; a command whose timeout kills its whole tree (`run_tree`).
Reading /proc and killing trees is the Linux floor's (`magpie.linux`)."""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import time

from magpie.linux.processes import kill_tree, signal_each
from magpie.linux.procfs import all_stopped, descendants


def limits(memory_mb: int):
    def apply():
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if memory_mb:
            limit = memory_mb * 1024 * 1024
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    return apply


# How long a stop waits for every thread to stop: the kernel stops the other threads of a
# process only when the one it woke for the signal runs, which on a busy machine can be
# milliseconds later; one in uninterruptible sleep may not stop in time.
STOP_WAIT_S = 2.0


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


def stop_tree(pid: int) -> bool:
    """SIGSTOP to pid and to every process below it, each on its own (one that left the process
    group too), again until every thread of them has stopped (`wait_stopped`)."""
    return wait_stopped(pid, lambda: signal_each(descendants(pid), signal.SIGSTOP))


def continue_tree(pid: int) -> None:
    signal_each(descendants(pid), signal.SIGCONT)


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
