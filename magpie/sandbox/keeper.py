"""Where no sandbox holds code under test (`--trust-code`), what its processes start still
ends with them.

Without a PID namespace, a process that leaves its process group (a new session, a double
fork) outlived the group's kill: a `sleep` started that way was still there after the build.
The process about to run the code forks: its child runs the code, and it stays as the
code's keeper, a child subreaper, to which the kernel reparents whatever the code's processes
orphan instead of to init. Once the code's process ends, the keeper kills every process still
below it and ends as the code's process did; a kill from outside (`linux.processes.kill_tree`) finds
them below it as long as it lives. Trusted code can still end its keeper first: this is
tidiness for code the user vouched for, not a defence (the sandbox's PID namespace is that).
"""

from __future__ import annotations

import os
import signal

from magpie.linux import namespaces
from magpie.linux.processes import close_all_but, end_like, kill_below


def keep() -> None:
    """Fork; the child returns, to run the code. This process becomes its keeper and never
    returns: it reaps, and ends as the code's process ended once nothing below it runs."""
    namespaces.prctl(namespaces.PR_SET_CHILD_SUBREAPER, 1)
    keeper = os.getpid()
    code = os.fork()
    if code == 0:
        namespaces.prctl(namespaces.PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != keeper:  # the keeper ended before the line above
            os._exit(1)
        return
    close_all_but(2)  # the code's pipes: their readers see its end, not this process's
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda *_: os.kill(code, signal.SIGKILL))
    status = _reap_until(code)
    kill_below(keeper)
    _reap_until(None)
    end_like(status)


def _reap_until(code: int | None) -> int:
    """Reap children until `code` ends (its wait status), or, with None, until none is left."""
    while True:
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:
            return 0
        if pid == code:
            return status
