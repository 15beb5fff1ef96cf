"""Whether code under test may run on this host: in a sandbox where one can be set up (tried once,
then remembered until what the answer depends on changes), else only if the user trusts it."""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import tempfile
from pathlib import Path

from magpie.environment import TRUST_CODE
from magpie.linux import namespaces, procfs
from magpie.private_folders import NotPrivate, lock_folder
from magpie.sandbox import landlock
from magpie.sandbox.containment import contain
from magpie.sandbox.policy import Policy


def trusted() -> bool:
    return os.environ.get(TRUST_CODE, "") not in ("", "0")


@functools.lru_cache(maxsize=1)
def unavailable_reason() -> str | None:
    """Why no sandbox can be set up on this host (None: it can). Tried once per process, in
    a fork that sets one up and exits, unless one of this user's builds found it could since
    the host last changed what it allows (`_proof`)."""
    if sys.platform != "linux":
        return f"no sandbox on {sys.platform} (Linux namespaces and Landlock are needed)"
    if landlock.abi_version() < 1:
        return "the kernel has no Landlock (Linux 5.13+ with landlock in the enabled LSMs)"
    proof = _proof()
    with contextlib.suppress(OSError):
        if proof is not None and proof[0].read_text() == proof[1]:
            return None
    reason = _tried()
    if reason is None and proof is not None:
        from magpie.store import atomic_write

        with contextlib.suppress(OSError):
            atomic_write(proof[0], proof[1])
    return reason


# What a host's answer to "can a sandbox be set up" depends on besides the kernel and its boot:
# the switches that allow or forbid unprivileged user namespaces.
USER_NAMESPACE_SWITCHES = (
    "/proc/sys/kernel/unprivileged_userns_clone",
    "/proc/sys/user/max_user_namespaces",
    "/proc/sys/kernel/apparmor_restrict_unprivileged_userns",
)


def _proof() -> tuple[Path, str] | None:
    """Where a build that set a sandbox up leaves word of it, and the word: the boot, the
    kernel, the user and its namespaces, Landlock's ABI, the user-namespace switches, seccomp
    and no_new_privs, magpie's sandbox code, as they were (the fork that sets a sandbox up took
    25-35 ms on the CPU machine, before every build's first job; reading the word, 1 ms). In
    the user's private lock folder, out of code under test's sight; None where there is none."""
    try:
        folder = lock_folder()
        parts = [procfs.boot_id(), os.uname().release, str(os.geteuid()), str(landlock.abi_version())]
        # the namespaces this build runs in, and its seccomp and no_new_privs (a build inside a
        # sandbox or a container of its own is another host)
        parts += [procfs.namespace_link(kind) for kind in ("user", "pid", "mnt")]
        parts += procfs.status_lines("self", ("Seccomp:", "NoNewPrivs:"))
    except (OSError, NotPrivate):
        return None
    parts += ["-" if value is None else value for value in procfs.values(USER_NAMESPACE_SWITCHES)]
    # its own code, and the floor's calls it makes
    for code in (Path(__file__).resolve().parent, Path(namespaces.__file__).resolve().parent):
        parts += [f"{f.name}:{f.stat().st_mtime_ns}:{f.stat().st_size}" for f in sorted(code.glob("*.py"))]
    return folder / "sandbox-set-up", "\n".join(parts)


def _tried() -> str | None:
    """Why a fork could not set a sandbox up (None: it did)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the whole set-up, the init's /proc included; what fails says so on the pipe
        os.close(read)
        os.dup2(write, 2)
        code = 0
        try:
            contain(Policy(write=[tempfile.gettempdir()]))
        except BaseException as err:  # noqa: BLE001 - told to the parent, which decides
            os.write(write, str(err).encode()[:500])
            code = 1
        os._exit(code)
    os.close(write)
    with os.fdopen(read, "rb") as reason:
        message = reason.read().decode(errors="replace")
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        return message or f"the sandbox test process ended with status {status}"
    return None


def admit(trust: bool) -> None:
    """Before a build runs code under test: with trust (--trust-code, [project] trust_code),
    the processes it starts run it without a sandbox; without, a host that allows none is
    refused in one line (UserError)."""
    if trust:
        os.environ[TRUST_CODE] = "1"
    if trusted():
        return
    reason = unavailable_reason()
    if reason is not None:
        from magpie.errors import UserError

        raise UserError(
            f"cannot sandbox code under test here: {reason}; run it only if you trust it, "
            "with --trust-code or [project] trust_code = true"
        )
