"""What a sandbox allows (`Policy`), the trees it may read and write besides, and the words a
report records for it (`describe`)."""

from __future__ import annotations

import dataclasses
import os
import site
import socket
import sys
import sysconfig
import tempfile

from magpie import paths as magpie_paths
from magpie.environment import JOBS
from magpie.private_folders import scratch_root
from magpie.sandbox import landlock, memory, pids, seccomp

# How often the sandbox's init looks at what its folders hold, and how many files they may.
WATCH_S = 0.1
MAX_FILES = 100_000


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
    # all it holds (anonymous memory, memfds, shared memory, its tmpfs files) where a memory cgroup can
    # be had (`memory`), else its address space, but on a GPU (CUDA reserves far more address space
    # than it uses): no limit there; 0: no limit
    memory_mb: int = 0
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


def default_memory_mb(jobs: int | None = None) -> int:
    """A worker's memory limit where the manifest sets none: half the machine's memory (the rest
    for the system, magpie's own processes and parked workers), shared by the workers that may
    run at once, a baseline's and a candidate's for each of the build's jobs (`jobs`, else the
    build's -j as its executor tells its evaluators); never under the manifest's least, 256."""
    if jobs is None:
        jobs = int(os.environ.get(JOBS, "1") or 1)
    total_kib = 0
    with open("/proc/meminfo") as meminfo:
        for line in meminfo:
            if line.startswith("MemTotal:"):
                total_kib = int(line.split()[1])
    return max(256, total_kib // 1024 // 2 // (2 * max(1, jobs)))


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
    layers = [
        "user, PID, mount and IPC namespaces" + ("" if policy.network or policy.gpu else ", network namespace"),
        f"landlock ABI {landlock.abi_version()}",
    ]
    if seccomp.supported():
        layers.append("seccomp")
    layers.append("no_new_privs, no capabilities")
    if policy.gpu:
        layers.append(
            "every GPU of the host"
            if policy.gpu_minors is None
            else "GPU " + ", ".join(f"/dev/nvidia{m}" for m in policy.gpu_minors) + " only"
        )
        layers.append("a /dev/shm of its own" + (" (what is lent to it linked there)" if policy.shared_memory else ""))
    if policy.network:
        layers.append("network sockets allowed")
    limits = [f"files {policy.file_mb} MiB", _process_limit(policy)]
    if policy.memory_mb and os.geteuid() == 0 and memory.available():
        limits.insert(0, f"memory {policy.memory_mb} MiB, all it holds (memory cgroup)")
    elif policy.memory_mb and not policy.gpu:
        limits.insert(0, f"memory {policy.memory_mb} MiB, address space (memfds, System V segments refused)")
    return "; ".join(layers) + "; limits: " + ", ".join(limits)


def _process_limit(policy: Policy) -> str:
    """How many processes the sandbox may hold, and what holds them to it: RLIMIT_NPROC, or as
    root (which it does not bind) a pids cgroup, where one can be made."""
    if os.geteuid() != 0:
        return f"{policy.processes} processes"
    return (
        f"{policy.processes} processes (pids cgroup)"
        if pids.available()
        else f"{policy.processes} processes (counted every {WATCH_S:g} s: root, and no pids cgroup to be had)"
    )


# The system's trees code under test may read: programs, libraries, configuration, the kernel's
# views. Not the others: home folders (keys, tokens, cloud credentials: code that read them
# could print them into its log, which the report shows), other projects and their stores,
# other mounts (/mnt, /srv, /media, a host's old root).
SYSTEM_TREES = (
    "usr",
    "lib",
    "lib32",
    "lib64",
    "libx32",
    "bin",
    "sbin",
    "etc",
    "opt",
    "proc",
    "sys",
    "nix",
    "gnu",
    "snap",
)


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
    interpreter = [
        sys.prefix,
        sys.base_prefix,
        sys.exec_prefix,
        paths["stdlib"],
        paths["platstdlib"],
        paths["purelib"],
        paths["platlib"],
        PACKAGE,
        *site.getsitepackages(),
        site.getusersitepackages(),
    ]
    # the built-in rules and templates, beside the package in a checkout
    data = [str(magpie_paths.rules_dir()), str(magpie_paths.templates_dir())]
    return [*_system_reads(), *interpreter, *data, *policy.read]


def listed_folders() -> list[str]:
    """Folders whose entries it may list without reading their files: magpie's parent."""
    return [PACKAGE_PARENT]


# Shared memory: on a GPU, where CUDA and torch keep files there, the sandbox has one of its own
# (its policy's `shared_memory` folder, or an empty tmpfs), which it may write; its own trees
# beneath the host's are bound back. Elsewhere it is out of reach.
SHARED_MEMORY = "/dev/shm"


def write_trees(policy: Policy) -> list[str]:
    """What the sandbox may change, and what its init counts against `written_mb`."""
    return [*policy.write, *([SHARED_MEMORY] if policy.gpu and os.path.isdir(SHARED_MEMORY) else [])]
