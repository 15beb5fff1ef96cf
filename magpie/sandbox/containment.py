"""Entering the sandbox (`contain`), narrowing what a worker may read once it knows its
implementation (`narrow`), and the launcher's two ways in (`command`, `enter_or_exit`)."""

from __future__ import annotations

import contextlib
import os
import resource
import sys
from pathlib import Path

from magpie.linux import namespaces, procfs
from magpie.sandbox import groups, landlock, seccomp
from magpie.sandbox.devices import device_files
from magpie.sandbox.init import SANDBOX_FAILED, wait_as_parent
from magpie.sandbox.policy import (
    GPU_SOCKET_FAMILIES,
    SECRET_FILES,
    SECRET_FOLDERS,
    SHARED_MEMORY,
    SOCKET_FOLDERS,
    Policy,
    listed_folders,
    read_trees,
    write_trees,
)


class SandboxError(RuntimeError):
    pass


# What `narrow` keeps readable besides the files it is told of, taken as the sandbox is entered
# (after its mounts, before Landlock, which would refuse the listings): everything beside the
# policy's project (every entry of each of its ancestors but the next one down), and the trees
# of the system and magpie that lie inside it. None: nothing to narrow.
_BESIDE_PROJECT: list[str] | None = None
# The sandbox's write trees, held open (O_PATH) since it was entered, as its first layer holds
# them: by what they are, not by their paths. An adopted spare's compiler caches are renamed
# after it entered (`harness.spares`); granted by their old paths, which lead nowhere where the
# caches lie in the project, they went unreadable at `narrow`.
_WRITE_TREES: list[int] = []


def _beside(project: str, inside: list[str]) -> list[str]:
    """Every path of the file tree but those beneath project, as few as name it all (what could
    not be listed, left out: narrower), and the trees of `inside` beneath it."""
    found, folder = [], "/"
    for part in Path(project).relative_to("/").parts:
        with contextlib.suppress(OSError):
            found += [os.path.join(folder, name) for name in os.listdir(folder) if name != part]
        folder = os.path.join(folder, part)
    beneath = project.rstrip(os.sep) + os.sep
    return found + [t for t in inside if os.path.realpath(t).startswith(beneath)]


def narrow(readable: list[str]) -> None:
    """Read, of the policy's project, only `readable` (and what it held of the system's and the
    process's own trees) from now on: a second Landlock layer that handles reading files (and
    moving them between folders), allowing it everywhere but in the project, and in its write
    trees wherever they lie and whatever they are called now. A process not in a sandbox with a
    project: nothing. Called by a worker before its implementation's code loads, so a spare,
    started before it knew its implementation, shares its policy with every implementation of
    the project."""
    global _BESIDE_PROJECT
    if _BESIDE_PROJECT is None:
        return
    held = [procfs.descriptor_path(fd) for fd in _WRITE_TREES]
    try:
        if not all(os.path.isdir(tree) for tree in held):
            raise SandboxError("narrow: its write trees cannot be reached through /proc/self/fd")
        # REFER (moving a file from one folder to another: Triton's cache moves each compiled file
        # out of a folder of its own) is refused by every layer that does not grant it, handled or
        # not: granted here where the first layer grants it, in the write trees.
        landlock.restrict(
            read=[*_BESIDE_PROJECT, *readable],
            write=held,
            devices=[],
            network=True,
            handled=landlock.READ_FILE | landlock.REFER,
            scopes=0,
        )
    finally:
        # held for this layer alone: the code that loads next gets no descriptor it does not need
        for fd in _WRITE_TREES:
            os.close(fd)
        _WRITE_TREES.clear()
        _BESIDE_PROJECT = None  # narrowed once; layers only ever narrow further


def contain(policy: Policy, fork: bool = True) -> None:
    """Put this process in the sandbox. With fork, the process becomes a waiter and the
    sandboxed code continues in a process of the new PID namespace (its init's child); the
    waiter ends as that process does (with its exit status or signal). Raises SandboxError."""
    uid, gid = os.getuid(), os.getgid()
    reads = read_trees(policy)
    # as root no RLIMIT_NPROC holds: a pids cgroup bounds the processes instead, and a memory
    # cgroup everything it holds (memfds, shared memory, its tmpfs scratch files) in one account
    cgroups = groups.enter(policy.processes, policy.memory_mb) if fork and os.geteuid() == 0 else groups.Groups()
    isolate_network = not (policy.network or policy.gpu)
    try:
        # System V IPC of its own: a segment made in the host's namespace outlives the build and
        # lets candidates meet by key
        namespaces.unshare(
            namespaces.CLONE_NEWUSER
            | namespaces.CLONE_NEWNS
            | namespaces.CLONE_NEWPID
            | namespaces.CLONE_NEWIPC
            | (namespaces.CLONE_NEWNET if isolate_network else 0)
        )
        namespaces.map_own_ids(uid, gid)
        namespaces.make_private()
        # what the sandbox may use stays where it is, hidden folders around it or not (a source
        # checkout of magpie, or a project, under /tmp)
        # (a file, by the folder it is in: only a folder can be bound back into an empty tmpfs)
        usable = list(
            dict.fromkeys(
                p if os.path.isdir(p) else os.path.dirname(p)
                for p in (*policy.write, *reads, *listed_folders())
                if os.path.exists(p)
            )
        )
        system = [f for f in (*SOCKET_FOLDERS, *SECRET_FOLDERS) if os.path.isdir(f)]
        hidden = [*policy.hide, *policy.temporary, *system]
        if policy.gpu and os.path.isdir(SHARED_MEMORY):
            shared = os.path.realpath(SHARED_MEMORY)
            namespaces.cover(
                shared,
                [p for p in usable if os.path.realpath(p).startswith(shared + os.sep)],
                backing=policy.shared_memory,
                size_mb=policy.written_mb,
            )
            # what lies beneath (the scratch root) is covered with it
            hidden = [f for f in hidden if not os.path.realpath(f).startswith(shared + os.sep)]
        for folder in dict.fromkeys(os.path.realpath(f) for f in hidden):
            beneath = folder + os.sep
            try:
                namespaces.cover(folder, [p for p in usable if os.path.realpath(p).startswith(beneath)])
            except FileNotFoundError:
                continue  # removed since it was listed: nothing left to hide
        for path in SECRET_FILES:
            if os.path.isfile(path):
                namespaces.blank(path)
    except OSError as err:
        raise SandboxError(f"namespaces: {err}") from None
    if fork:
        # as root with no pids cgroup, the sandbox's init counts its processes instead
        wait_as_parent(policy, cgroups, count_processes=cgroups.processes is None and os.geteuid() == 0)
    # The CUDA driver names its threads (it writes /proc/PID/task/*/comm, of whichever process
    # starts it: a profiler's child too); what the host's root may write there stays read-only.
    proc = ["/proc"] if policy.gpu else []
    try:
        if fork:  # a mount namespace of the code's own: the waiter still removes its pids cgroup
            namespaces.unshare(namespaces.CLONE_NEWNS)
        namespaces.read_only_but([p for p in (*write_trees(policy), *proc) if os.path.isdir(p)])
        # the working folder again by its path: one of the writable mounts now lies on top of it
        with contextlib.suppress(OSError):
            os.chdir(os.getcwd())
    except OSError as err:
        raise SandboxError(f"read-only mounts: {err}") from None
    try:
        if policy.project:
            global _BESIDE_PROJECT
            own = [*read_trees(Policy(write=[])), *device_files(policy), *listed_folders()]
            _BESIDE_PROJECT = _beside(os.path.realpath(policy.project), own)
            _WRITE_TREES[:] = [
                os.open(tree, os.O_PATH | os.O_CLOEXEC) for tree in write_trees(policy) if os.path.isdir(tree)
            ]
        # no memory cgroup: RLIMIT_AS is its account, and what lies outside it is refused or bounded
        address_space = bool(policy.memory_mb) and cgroups.memory is None and not policy.gpu
        _limits(policy, address_space)
        namespaces.prctl(namespaces.PR_SET_NO_NEW_PRIVS, 1)
        landlock.restrict(
            read=reads,
            write=[*write_trees(policy), *proc],
            devices=device_files(policy),
            network=policy.network,
            listed=listed_folders(),
        )
        if seccomp.supported():
            seccomp.install(policy.network, GPU_SOCKET_FAMILIES if policy.gpu else (), uncounted=not address_space)
        namespaces.drop_capabilities()
    except OSError as err:
        raise SandboxError(str(err)) from None


def _limits(policy: Policy, address_space: bool) -> None:
    """The rlimits; `memory_mb` as RLIMIT_AS only with `address_space` (no memory cgroup holds
    the sandbox: one counts what it holds, however held, and needs no other bound; nor on a GPU,
    where CUDA reserves far more address space than it uses)."""
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    file_bytes = policy.file_mb << 20
    resource.setrlimit(resource.RLIMIT_FSIZE, (file_bytes, file_bytes))
    resource.setrlimit(resource.RLIMIT_NPROC, (policy.processes, policy.processes))
    if address_space:
        limit = policy.memory_mb << 20
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def command(argv: list[str], policy: Policy | None) -> list[str]:
    """argv as run inside the sandbox (a launcher contains itself, then executes it), or, when
    the code is trusted (no policy), below a keeper (`enter_or_exit`)."""
    import json

    from magpie.paths import python_module_command

    return python_module_command("magpie.sandbox") + [json.dumps(policy.to_json() if policy else None), "--", *argv]


def enter_or_exit(policy: Policy | None) -> None:
    """For a process about to run code under test: contain it, or end it with SANDBOX_FAILED
    and one line on stderr saying why. Trusted code (no policy) runs below a keeper, which
    ends what it leaves (`supervision.keeper`)."""
    if policy is None:
        from magpie.sandbox import keeper

        keeper.keep()
        return
    try:
        contain(policy)
    except SandboxError as err:
        print(f"sandbox: {err}", file=sys.stderr, flush=True)
        os._exit(SANDBOX_FAILED)
