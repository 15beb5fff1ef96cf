"""Which layer of the sandbox, if any, stops CUDA (or anything else a process needs) on this
host: each layer is set up alone, then all together, in a fork that then initialises CUDA
and runs one kernel. Prints one line per layer. Usage: python bench/sandbox_layers.py"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from magpie import sandbox  # noqa: E402
from magpie.sandbox import landlock, namespaces, seccomp  # noqa: E402

SCRATCH = tempfile.mkdtemp()
POLICY = sandbox.Policy(write=[SCRATCH], gpu=True)
NS = namespaces.CLONE_NEWUSER | namespaces.CLONE_NEWNS | namespaces.CLONE_NEWPID


def user_mount_pid():
    uid, gid = os.getuid(), os.getgid()  # before: inside, until mapped, the ids read as the overflow id
    namespaces.unshare(NS)
    namespaces.map_own_ids(uid, gid)
    namespaces.make_private()


def fresh_proc():
    user_mount_pid()
    sandbox._wait_as_parent_of_sandbox()


def landlock_only():
    namespaces.prctl(namespaces.PR_SET_NO_NEW_PRIVS, 1)
    landlock.restrict(read=sandbox.read_trees(POLICY), write=[SCRATCH], devices=sandbox.device_files(POLICY),
                      network=False)


def landlock_variant(read=None, write=None, network=False, scopes=None):
    def apply():
        namespaces.prctl(namespaces.PR_SET_NO_NEW_PRIVS, 1)
        landlock.restrict(read=sandbox.read_trees(POLICY) if read is None else read,
                          write=[SCRATCH] if write is None else [os.path.realpath(w) for w in write], devices=sandbox.device_files(POLICY),
                          network=network,
                          scopes=landlock.SCOPE_ABSTRACT_UNIX_SOCKET | landlock.SCOPE_SIGNAL if scopes is None
                          else scopes)
    return apply


def seccomp_only():
    namespaces.prctl(namespaces.PR_SET_NO_NEW_PRIVS, 1)
    seccomp.install(network=False)


def no_capabilities():
    user_mount_pid()
    namespaces.drop_capabilities()


def limits():
    sandbox._limits(POLICY)


LAYERS = {"nothing": lambda: None, "user+mount+pid namespaces": user_mount_pid, "fresh /proc (init + child)": fresh_proc,
          "landlock": landlock_only,
          "landlock, no scopes": landlock_variant(scopes=0),
          "landlock, no signal scope": landlock_variant(scopes=landlock.SCOPE_ABSTRACT_UNIX_SOCKET),
          "landlock, no socket scope": landlock_variant(scopes=landlock.SCOPE_SIGNAL),
          "landlock, network allowed": landlock_variant(network=True),
          "landlock, / readable": landlock_variant(read=["/"]),
          "landlock, / writable": landlock_variant(write=["/"]),
          **{f"landlock, {path} writable": landlock_variant(write=[SCRATCH, path])
             for path in ("/proc", "/proc/self", "/proc/self/task", "/proc/driver", "/proc/sys", "/sys")}, "seccomp": seccomp_only, "no capabilities": no_capabilities, "rlimits": limits,
          "all (contain)": lambda: sandbox.contain(POLICY)}


def main() -> int:
    for name, layer in LAYERS.items():
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read)
            try:
                layer()
                x = torch.ones(1 << 20, device="cuda")
                message = f"ok ({float((x * 2).sum()):g})"
            except BaseException as err:  # noqa: BLE001 - reported
                message = f"{type(err).__name__}: {str(err).splitlines()[0][:300]}"
            os.write(write, message.encode())
            os._exit(0)
        os.close(write)
        with os.fdopen(read) as answer:
            print(f"{name:32s} {answer.read()}", flush=True)
        os.waitpid(pid, 0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
