"""The sandbox every process that runs code under test starts in (workers, and the commands
of compile rules and command testcases).

`contain(policy)` turns the calling process, which must still be single-threaded (a fresh
fork), into the first process of new user, PID, mount and IPC namespaces (System V shared
memory, semaphores and queues go with it; CUDA IPC works across it) and, where no GPU is
needed, a network namespace of its own, which has nothing but a loopback that is down:

- every process it starts lives in that PID namespace and dies with it; it can name, signal
  or trace no process outside it (Landlock scopes signals and ptrace as well, and `/proc`
  shows only the namespace's processes);
- Landlock lets it write only its policy's `write` trees and read only the system's trees,
  the interpreter's and the policy's `read` trees: not the temporary folder (other jobs'
  scratch, magpie's locks and zygote sockets), nor the store unless it lies in the project,
  which is then read-only like everything else; no TCP unless the policy allows network; on
  a GPU, where CUDA needs /dev/shm, a /dev/shm of its own (empty, or the folder an evaluator
  links what it lends into), its own trees beneath the host's bound back;
- in a mount namespace of the code's own, every mount is read-only but its write trees:
  Landlock has no right for a file's metadata, so chmod, chown, utime and setxattr would
  otherwise work on every file it can see that its user owns (as root, every file);
- a seccomp filter makes the calls that reach into other processes or change the mount
  table fail, and without network, every socket (on a GPU, every one but a Unix socket,
  which CUDA needs); the folders where sockets live (`/run`, `/tmp`, homes) are covered;
  no_new_privs, no capabilities, and resource limits on memory, file size and processes.

It must work unprivileged and as root: root is root only in its own user namespace, and
Landlock holds whatever the file permissions say. The `describe()` of a policy is what a
report records as the isolation in force.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import re
import resource
import select
import signal
import site
import socket
import stat
import sys
import sysconfig
import tempfile
from pathlib import Path

from magpie import paths as magpie_paths
from magpie.linux import namespaces, procfs
from magpie.linux.processes import close_all_but, end_like
from magpie.private_folders import NotPrivate, lock_folder, scratch_root
from magpie.sandbox import landlock, pids, seccomp

# Exit status of a process whose sandbox could not be set up (nothing of the code under test ran).
SANDBOX_FAILED = 70
# Exit status of a sandbox whose code went over what its folders may hold: every process of it
# killed, one line on stderr says so.
SANDBOX_LIMIT = 71
# How often the sandbox's init looks at what its folders hold, and how many files they may.
WATCH_S = 0.1
MAX_FILES = 100_000
TRUST_VARIABLE = "MAGPIE_TRUST_CODE"


class SandboxError(RuntimeError):
    pass


@dataclasses.dataclass
class Policy:
    write: list[str]  # trees it may change: its scratch folder, its compiler caches
    read: list[str] = dataclasses.field(default_factory=list)  # trees (or files) to read besides the system's
    # a tree among `read` (the project) whose files the process reads, once it has been told which
    # (`narrow`: a worker, its implementation's declared files), only those
    project: str | None = None
    hide: list[str] = dataclasses.field(default_factory=list)  # covered by an empty tmpfs (usable trees beneath kept)
    # hidden the same way: where magpie's sockets and locks are, as seen where the policy is made
    temporary: list[str] = dataclasses.field(default_factory=lambda: temporary_folders())
    gpu: bool = False  # GPU devices usable; a /dev/shm of its own (`shared_memory`, or an empty one)
    # on a GPU, the folder (in /dev/shm) it sees as /dev/shm: what CUDA IPC needs of the memory an
    # evaluator lends it is linked there (`supervision.shared_memory`); None: an empty tmpfs
    shared_memory: str | None = None
    # the minor numbers of the NVIDIA GPUs it may open (/dev/nvidiaN); None: every one's
    gpu_minors: list[int] | None = None
    network: bool = False
    memory_mb: int = 0  # address space; 0: no limit (CUDA reserves far more than it uses)
    file_mb: int = 1024  # largest file it may write
    # what its write trees may hold together (its scratch folder lies in /dev/shm, which is
    # memory, where it has room): the init kills the sandbox soon after they hold more
    written_mb: int = 4096
    processes: int = 512  # processes and threads: RLIMIT_NPROC, or as root a pids cgroup (`pids`)

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> Policy:
        return cls(**data)


# Where daemons and users keep their sockets (Docker's, containerd's, D-Bus's under /run; an
# ssh agent's or a terminal multiplexer's under /tmp, covered as a temporary folder, or a
# home): covered in every sandbox, what the policy uses beneath them bound back. Landlock does
# not guard connecting to a socket by its path: as root code under test could ask Docker's
# daemon for a container with the host's files in it. On a GPU, where Unix sockets can be
# made, this is what keeps them from connecting anywhere but the readable trees.
SOCKET_FOLDERS = ("/run", "/var/run", "/root", "/home", "/var/tmp")

# The socket family a GPU sandbox may make without network: the CUDA driver's initialisation
# fails (error 304) when socket(AF_UNIX) is refused, though not when its connect (to the
# persistence daemon, under the covered /run) fails.
GPU_SOCKET_FAMILIES = (socket.AF_UNIX,)


# What of the readable /etc only root may read, and a sandbox run as root could: password
# hashes, the host's SSH and TLS private keys. Shown empty.
SECRET_FILES = ("/etc/shadow", "/etc/shadow-", "/etc/gshadow", "/etc/gshadow-")
SECRET_FOLDERS = ("/etc/ssh", "/etc/ssl/private")


def temporary_folders() -> list[str]:
    """Where magpie's processes keep their sockets (the zygote's, the job pool's), locks and
    scratch folders (the scratch root, in /dev/shm where it has room): hidden from code under
    test, which Landlock alone would let connect to a socket whose path it learnt
    (/proc/net/unix lists them). Taken where a policy is made, not in the sandbox (whose
    TMPDIR is its own folder)."""
    return sorted({"/tmp", os.path.realpath(tempfile.gettempdir()), os.path.realpath(scratch_root())})


def describe(policy: Policy | None) -> str:
    """The isolation a report records."""
    if policy is None:
        return "none: code trusted (--trust-code)"
    layers = ["user, PID, mount and IPC namespaces" + ("" if policy.network or policy.gpu else ", network namespace"),
              f"landlock ABI {landlock.abi_version()}"]
    if seccomp.supported():
        layers.append("seccomp")
    layers.append("no_new_privs, no capabilities")
    if policy.gpu:
        layers.append("every GPU of the host" if policy.gpu_minors is None
                      else "GPU " + ", ".join(f"/dev/nvidia{m}" for m in policy.gpu_minors) + " only")
        layers.append("a /dev/shm of its own" + (" (what is lent to it linked there)" if policy.shared_memory else ""))
    if policy.network:
        layers.append("network sockets allowed")
    limits = [f"files {policy.file_mb} MiB", _process_limit(policy)]
    if policy.memory_mb:
        limits.insert(0, f"memory {policy.memory_mb} MiB")
    return "; ".join(layers) + "; limits: " + ", ".join(limits)


def _process_limit(policy: Policy) -> str:
    """How many processes the sandbox may hold, and what holds them to it: RLIMIT_NPROC, or as
    root (which it does not bind) a pids cgroup, where one can be made."""
    if os.geteuid() != 0:
        return f"{policy.processes} processes"
    return f"{policy.processes} processes (pids cgroup)" if pids.available() else \
        f"{policy.processes} processes (counted every {WATCH_S:g} s: root, and no pids cgroup to be had)"


def trusted() -> bool:
    return os.environ.get(TRUST_VARIABLE, "") not in ("", "0")


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
USER_NAMESPACE_SWITCHES = ("/proc/sys/kernel/unprivileged_userns_clone", "/proc/sys/user/max_user_namespaces",
                           "/proc/sys/kernel/apparmor_restrict_unprivileged_userns")


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
    for switch in USER_NAMESPACE_SWITCHES:
        try:
            with open(switch) as value:
                parts.append(value.read().strip())
        except OSError:
            parts.append("-")
    code = [Path(__file__).resolve().parent, Path(namespaces.__file__).resolve().parent]
    parts += [f"{f.name}:{f.stat().st_mtime_ns}:{f.stat().st_size}" for folder in code for f in sorted(folder.glob("*.py"))]
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
        os.environ[TRUST_VARIABLE] = "1"
    if trusted():
        return
    reason = unavailable_reason()
    if reason is not None:
        from magpie.errors import UserError

        raise UserError(f"cannot sandbox code under test here: {reason}; run it only if you trust it, "
                        "with --trust-code or [project] trust_code = true")


# The system's trees code under test may read: programs, libraries, configuration, the kernel's
# views. Not the others: home folders (keys, tokens, cloud credentials: code that read them
# could print them into its log, which the report shows), other projects and their stores,
# other mounts (/mnt, /srv, /media, a host's old root).
SYSTEM_TREES = ("usr", "lib", "lib32", "lib64", "libx32", "bin", "sbin", "etc", "opt", "proc", "sys", "nix", "gnu",
                "snap")


def _system_reads() -> list[str]:
    return [os.path.join("/", name) for name in SYSTEM_TREES if os.path.isdir(os.path.join("/", name))]


# magpie's package, and the folder it is found in (a source checkout's, which the import system
# lists to find it, and which may hold a project too: the example's)
PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE_PARENT = os.path.dirname(PACKAGE)


def read_trees(policy: Policy) -> list[str]:
    """The system's trees (SYSTEM_TREES), the interpreter and its libraries, magpie, and the
    policy's trees: not the temporary folder (where other jobs' scratch, magpie's locks and
    sockets live)."""
    paths = sysconfig.get_paths()
    interpreter = [sys.prefix, sys.base_prefix, sys.exec_prefix, paths["stdlib"], paths["platstdlib"],
                   paths["purelib"], paths["platlib"], PACKAGE, *site.getsitepackages(), site.getusersitepackages()]
    # the built-in rules and templates, beside the package in a checkout
    data = [str(magpie_paths.rules_dir()), str(magpie_paths.templates_dir())]
    return [*_system_reads(), *interpreter, *data, *policy.read]


def listed_folders() -> list[str]:
    """Folders whose entries it may list without reading their files: magpie's parent."""
    return [PACKAGE_PARENT]


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
        landlock.restrict(read=[*_BESIDE_PROJECT, *readable], write=held, devices=[], network=True,
                          handled=landlock.READ_FILE | landlock.REFER, scopes=0)
    finally:
        # held for this layer alone: the code that loads next gets no descriptor it does not need
        for fd in _WRITE_TREES:
            os.close(fd)
        _WRITE_TREES.clear()
        _BESIDE_PROJECT = None  # narrowed once; layers only ever narrow further


# The device nodes code under test may open: the byte sources and sinks; a GPU's nodes only for
# a GPU project. Nothing else: as root, a process in the sandbox could otherwise open a loop
# device's blocks, /dev/kvm or btrfs-control for writing, or a terminal (TIOCSTI types into
# it).
DEVICES = ("null", "zero", "full", "random", "urandom")


# Shared memory: on a GPU, where CUDA and torch keep files there, the sandbox has one of its own
# (its policy's `shared_memory` folder, or an empty tmpfs), which it may write; its own trees
# beneath the host's are bound back. Elsewhere it is out of reach.
SHARED_MEMORY = "/dev/shm"


def write_trees(policy: Policy) -> list[str]:
    """What the sandbox may change, and what its init counts against `written_mb`."""
    return [*policy.write, *([SHARED_MEMORY] if policy.gpu and os.path.isdir(SHARED_MEMORY) else [])]


def device_files(policy: Policy) -> list[str]:
    """The device nodes the sandbox may use (DEVICES); for a GPU project also the GPU's nodes:
    work a CPU project's code sent to a GPU would escape the CPU time that times it."""
    try:
        names = os.listdir("/dev")
    except OSError:
        return []
    found = [os.path.join("/dev", n) for n in names
             if (n in DEVICES or (policy.gpu and _is_gpu_node(n) and _one_of_its_gpus(n, policy.gpu_minors)))
             and _is_device(os.path.join("/dev", n))]
    return found


def _is_gpu_node(name: str) -> bool:
    """A GPU's device node or folder of them: NVIDIA's, AMD's compute (kfd), DRM's render and
    card nodes (dri), compute accelerators (accel)."""
    return name.startswith("nvidia") or name in ("kfd", "dri", "accel")


# The node of one NVIDIA GPU, named by its minor number; the others (nvidiactl, nvidia-uvm, ...)
# all GPUs share.
NVIDIA_GPU_NODE = re.compile(r"nvidia(\d+)")


def nvidia_gpu_nodes() -> list[str]:
    """The host's NVIDIA GPUs' own nodes (/dev/nvidiaN)."""
    try:
        return [n for n in os.listdir("/dev") if NVIDIA_GPU_NODE.fullmatch(n)]
    except OSError:
        return []


def _one_of_its_gpus(name: str, minors: list[int] | None) -> bool:
    """Whether a GPU node is usable under a policy that names its GPUs: the nodes all GPUs
    share are; a GPU's own only if its minor number is one of them."""
    own = NVIDIA_GPU_NODE.fullmatch(name)
    return minors is None or own is None or int(own.group(1)) in minors


# Where the NVIDIA driver describes each GPU it drives (its UUID, its node's minor number).
NVIDIA_GPUS = "/proc/driver/nvidia/gpus"


def nvidia_minor(uuid: str) -> int | None:
    """The minor number of the node (/dev/nvidiaN) of the NVIDIA GPU with this UUID (with or
    without its "GPU-" prefix), from the driver's own description; None where the driver says
    nothing of it."""
    wanted = uuid.lower().removeprefix("gpu-")
    try:
        folders = os.listdir(NVIDIA_GPUS)
    except OSError:
        return None
    for folder in folders:
        try:
            with open(os.path.join(NVIDIA_GPUS, folder, "information")) as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
        except OSError:
            continue
        told = fields.get("GPU UUID", "").strip().lower().removeprefix("gpu-")
        if told == wanted and fields.get("Device Minor", "").strip().isdigit():
            return int(fields["Device Minor"])
    return None


def _is_device(path: str) -> bool:
    """A character device or a folder of them; not a link (/dev/stdin and friends point at
    descriptors, which Landlock rules cannot name)."""
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return False
    return stat.S_ISCHR(mode) or stat.S_ISDIR(mode)


def contain(policy: Policy, fork: bool = True) -> None:
    """Put this process in the sandbox. With fork, the process becomes a waiter and the
    sandboxed code continues in a process of the new PID namespace (its init's child); the
    waiter ends as that process does (with its exit status or signal). Raises SandboxError."""
    uid, gid = os.getuid(), os.getgid()
    reads = read_trees(policy)
    # as root no RLIMIT_NPROC holds: a pids cgroup bounds the processes instead
    cgroup = pids.bound(policy.processes) if fork and os.geteuid() == 0 else None
    isolate_network = not (policy.network or policy.gpu)
    try:
        # System V IPC of its own: a segment made in the host's namespace outlives the build and
        # lets candidates meet by key
        namespaces.unshare(namespaces.CLONE_NEWUSER | namespaces.CLONE_NEWNS | namespaces.CLONE_NEWPID
                           | namespaces.CLONE_NEWIPC | (namespaces.CLONE_NEWNET if isolate_network else 0))
        namespaces.map_own_ids(uid, gid)
        namespaces.make_private()
        # what the sandbox may use stays where it is, hidden folders around it or not (a source
        # checkout of magpie, or a project, under /tmp)
        # (a file, by the folder it is in: only a folder can be bound back into an empty tmpfs)
        usable = list(dict.fromkeys(p if os.path.isdir(p) else os.path.dirname(p)
                                    for p in (*policy.write, *reads, *listed_folders()) if os.path.exists(p)))
        system = [f for f in (*SOCKET_FOLDERS, *SECRET_FOLDERS) if os.path.isdir(f)]
        hidden = [*policy.hide, *policy.temporary, *system]
        if policy.gpu and os.path.isdir(SHARED_MEMORY):
            shared = os.path.realpath(SHARED_MEMORY)
            namespaces.cover(shared, [p for p in usable if os.path.realpath(p).startswith(shared + os.sep)],
                             backing=policy.shared_memory, size_mb=policy.written_mb)
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
        _wait_as_parent_of_sandbox(policy, cgroup, count_processes=cgroup is None and os.geteuid() == 0)
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
            _WRITE_TREES[:] = [os.open(tree, os.O_PATH | os.O_CLOEXEC) for tree in write_trees(policy)
                               if os.path.isdir(tree)]
        _limits(policy)
        namespaces.prctl(namespaces.PR_SET_NO_NEW_PRIVS, 1)
        landlock.restrict(read=reads, write=[*write_trees(policy), *proc], devices=device_files(policy),
                          network=policy.network, listed=listed_folders())
        if seccomp.supported():
            seccomp.install(policy.network, GPU_SOCKET_FAMILIES if policy.gpu else ())
        namespaces.drop_capabilities()
    except OSError as err:
        raise SandboxError(str(err)) from None


def _limits(policy: Policy) -> None:
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    file_bytes = policy.file_mb << 20
    resource.setrlimit(resource.RLIMIT_FSIZE, (file_bytes, file_bytes))
    resource.setrlimit(resource.RLIMIT_NPROC, (policy.processes, policy.processes))
    if policy.memory_mb:
        memory = policy.memory_mb << 20
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))


def _wait_as_parent_of_sandbox(policy: Policy, cgroup: str | None, count_processes: bool) -> None:
    """Fork twice: the first child is the new PID namespace's init, which reaps what is
    orphaned there and says how the second ended; the second returns and runs the code (not
    as PID 1, to which the kernel delivers no signal it sends itself: abort() would end in a
    SIGSEGV). This process waits and ends the way the code's process ended, holding none of
    its descriptors; killing it, or the init, kills everything in the namespace."""
    status_read, status_write = os.pipe()
    init = os.fork()
    if init == 0:
        os.close(status_read)
        namespaces.prctl(namespaces.PR_SET_PDEATHSIG, signal.SIGKILL)
        _serve_as_init(status_write, policy, count_processes)
        return
    os.close(status_write)
    close_all_but(status_read)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda *_: os.kill(init, signal.SIGKILL))
    _, status = os.waitpid(init, 0)
    if cgroup:  # every process of the namespace has ended with its init
        pids.release(cgroup)
    with os.fdopen(status_read, "rb") as told:
        reported = told.read()
    if len(reported) == 4:
        status = int.from_bytes(reported, "little")
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
            print(f"sandbox: {over} (the sandbox's limit): every process of it was killed", file=sys.stderr,
                  flush=True)
            os.kill(-1, signal.SIGKILL)  # in its PID namespace: every process but this one
            os.write(status_write, (SANDBOX_LIMIT << 8).to_bytes(4, "little"))
            os._exit(0)


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
    the blocks their files take, each entry counted once more, however deep."""
    limit = policy.written_mb << 20
    total = files = 0
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
