"""A seccomp filter: system calls code under test has no business making fail with EPERM
(reaching into other processes, changing the mount table or a mount's flags (the read-only
mounts that keep it from changing files' metadata), loading kernel code, io_uring,
which seccomp cannot see into; where no memory cgroup counts them, memfd_create and shmget,
whose memory lies outside RLIMIT_AS), a change of mode that sets a setuid or setgid bit, and,
without network, every `socket()` (`socketpair` stays): a Unix socket's path can name a
daemon's, Docker's say, which Landlock does not guard, and a VM's vsock reaches its host from
any network namespace. System calls of another architecture's ABI kill the process: they would
bypass the table."""

from __future__ import annotations

import ctypes
import errno
import platform
import struct

PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 22, 2
LD_W_ABS, JEQ_K, JGE_K, JSET_K, RET_K = 0x20, 0x15, 0x35, 0x45, 0x06
ALLOW, KILL_PROCESS = 0x7FFF0000, 0x80000000
ERRNO = 0x00050000

DENIED = (
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "mount",
    "umount2",
    "pivot_root",
    "kexec_load",
    "init_module",
    "finit_module",
    "delete_module",
    "bpf",
    "keyctl",
    "add_key",
    "request_key",
    "unshare",
    "setns",
    "userfaultfd",
    "open_tree",
    "move_mount",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "mount_setattr",
)
# Memory that lies outside RLIMIT_AS: a memfd's pages once unmapped, a System V segment once
# detached (it outlives every attachment). Refused where no memory cgroup counts them.
UNCOUNTED = ("memfd_create", "shmget")
# The calls that set a file's mode, by the index of their mode argument. A file the sandbox's root
# makes or may write belongs to the host's user that runs magpie (root in CI), and may lie where
# other users reach it: a worker's /dev/shm on a GPU holds its evaluator's CUDA IPC files, linked
# from the host's /dev/shm, which the worker writes. Written and made setuid, such a file would
# run as that user for anyone; no code under test needs either bit.
MODE_ARGUMENT = {"chmod": 1, "fchmod": 1, "fchmodat": 2, "fchmodat2": 2}
SETUID_SETGID = 0o6000
# (audit architecture, syscall numbers, numbers at or above this are another ABI's)
ARCHES = {
    "x86_64": (
        0xC000003E,
        0x40000000,
        {
            "ptrace": 101,
            "process_vm_readv": 310,
            "process_vm_writev": 311,
            "mount": 165,
            "umount2": 166,
            "pivot_root": 155,
            "kexec_load": 246,
            "init_module": 175,
            "finit_module": 313,
            "delete_module": 176,
            "bpf": 321,
            "keyctl": 250,
            "add_key": 248,
            "request_key": 249,
            "unshare": 272,
            "setns": 308,
            "userfaultfd": 323,
            "socket": 41,
            "memfd_create": 319,
            "shmget": 29,
            "chmod": 90,
            "fchmod": 91,
            "fchmodat": 268,
        },
    ),
    "aarch64": (
        0xC00000B7,
        1 << 31,
        {
            "ptrace": 117,
            "process_vm_readv": 270,
            "process_vm_writev": 271,
            "mount": 40,
            "umount2": 39,
            "pivot_root": 41,
            "kexec_load": 104,
            "init_module": 105,
            "finit_module": 273,
            "delete_module": 106,
            "bpf": 280,
            "keyctl": 219,
            "add_key": 217,
            "request_key": 218,
            "unshare": 97,
            "setns": 268,
            "userfaultfd": 282,
            "socket": 198,
            "memfd_create": 279,
            "shmget": 194,
            "fchmod": 52,
            "fchmodat": 53,
        },
    ),
}
# Added after the tables were unified: one number everywhere.
COMMON = {
    "open_tree": 428,
    "move_mount": 429,
    "fsopen": 430,
    "fsconfig": 431,
    "fsmount": 432,
    "fspick": 433,
    "io_uring_setup": 425,
    "io_uring_enter": 426,
    "io_uring_register": 427,
    "mount_setattr": 442,
    "fchmodat2": 452,
}


class SeccompError(OSError):
    pass


def supported() -> bool:
    return platform.machine() in ARCHES


def _instruction(code: int, jt: int, jf: int, k: int) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def program(network: bool, families: tuple[int, ...] = (), machine: str | None = None, uncounted: bool = True) -> bytes:
    """Without network, `socket()` fails unless its family is one of `families`; without
    `uncounted`, so do `memfd_create()` and `shmget()` (where no memory cgroup counts them)."""
    arch, foreign_from, numbers = ARCHES[machine or platform.machine()]
    numbers = {**numbers, **COMMON}
    eperm = ERRNO | errno.EPERM
    code = [
        _instruction(LD_W_ABS, 0, 0, 4),  # seccomp_data.arch
        _instruction(JEQ_K, 1, 0, arch),
        _instruction(RET_K, 0, 0, KILL_PROCESS),
        _instruction(LD_W_ABS, 0, 0, 0),  # seccomp_data.nr
        _instruction(JGE_K, 0, 1, foreign_from),
        _instruction(RET_K, 0, 0, KILL_PROCESS),
    ]
    for name in (*DENIED, *(() if uncounted else UNCOUNTED)):
        code += [_instruction(JEQ_K, 0, 1, numbers[name]), _instruction(RET_K, 0, 0, eperm)]
    for name, argument in MODE_ARGUMENT.items():
        if name not in numbers:  # aarch64 has no chmod
            continue
        # its mode's low word (seccomp_data.args[argument], little-endian): refused with either bit
        code += [
            _instruction(JEQ_K, 0, 4, numbers[name]),
            _instruction(LD_W_ABS, 0, 0, 16 + 8 * argument),
            _instruction(JSET_K, 0, 1, SETUID_SETGID),
            _instruction(RET_K, 0, 0, eperm),
            _instruction(RET_K, 0, 0, ALLOW),
        ]
    if not network:
        # socket(family, ...): its first argument's low word (seccomp_data.args[0], little-endian)
        code += [_instruction(JEQ_K, 0, 2 + len(families), numbers["socket"]), _instruction(LD_W_ABS, 0, 0, 16)]
        for at, family in enumerate(families):
            code.append(_instruction(JEQ_K, len(families) - at, 0, family))
        code.append(_instruction(RET_K, 0, 0, ERRNO | errno.EACCES))
    code.append(_instruction(RET_K, 0, 0, ALLOW))
    return b"".join(code)


def install(network: bool, families: tuple[int, ...] = (), uncounted: bool = True) -> None:
    """no_new_privs must be set."""
    code = program(network, families, uncounted=uncounted)
    buffer = ctypes.create_string_buffer(code, len(code))
    fprog = struct.pack("=HxxxxxxQ", len(code) // 8, ctypes.addressof(buffer))
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.c_char_p(fprog), 0, 0) != 0:
        err = ctypes.get_errno()
        raise SeccompError(err, f"seccomp filter: {errno.errorcode.get(err, err)}")
