"""User, PID, mount (and network) namespaces through libc, for a process that is still
single-threaded (a fork of the zygote, or the sandbox launcher before it runs anything)."""

from __future__ import annotations

import ctypes
import os
import struct

CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x00020000, 0x10000000, 0x20000000, 0x40000000
CLONE_NEWIPC = 0x08000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS, PR_SET_DUMPABLE, PR_CAPBSET_DROP, PR_SET_CHILD_SUBREAPER = 1, 38, 4, 24, 36
CAP_LAST = 63

_libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def unshare(flags: int) -> None:
    _check(_libc.unshare(flags), "unshare")


def map_own_ids(uid: int, gid: int) -> None:
    """In a new user namespace, be the same user and group as outside (the one mapping an
    unprivileged process may write for itself); supplementary groups can no longer change."""
    with open("/proc/self/setgroups", "w") as f:
        f.write("deny")
    with open("/proc/self/uid_map", "w") as f:
        f.write(f"{uid} {uid} 1")
    with open("/proc/self/gid_map", "w") as f:
        f.write(f"{gid} {gid} 1")


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    def enc(s: str | None) -> bytes | None:
        return None if s is None else s.encode()

    _check(_libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)), f"mount {target}")


# mount_setattr(2) (Linux 5.12; every kernel with Landlock has it): one mount's flags, or a
# whole tree's, changed without naming the flags it keeps (a remount must repeat the locked ones).
MOUNT_SETATTR, AT_RECURSIVE, MOUNT_ATTR_RDONLY = 442, 0x8000, 0x1
AT_FDCWD = -100


def _set_read_only(path: str, read_only: bool, recursive: bool) -> None:
    attr = struct.pack("=QQQQ", MOUNT_ATTR_RDONLY if read_only else 0, 0 if read_only else MOUNT_ATTR_RDONLY, 0, 0)
    _check(
        _libc.syscall(
            MOUNT_SETATTR,
            ctypes.c_int(AT_FDCWD),
            path.encode(),
            ctypes.c_uint(AT_RECURSIVE if recursive else 0),
            ctypes.c_char_p(attr),
            ctypes.c_size_t(len(attr)),
        ),
        f"mount_setattr {path}",
    )


def read_only_but(writable: list[str]) -> None:
    """Every mount read-only but the trees in `writable` (each bound onto itself, then made
    writable alone, what is mounted beneath it staying read-only). Landlock has no right for a
    file's metadata: where the sandbox's root is the host's root, or the user who owns the
    project, chmod, utime and setxattr succeeded on every file it could read; on a read-only
    mount they fail (EROFS) whoever owns the file."""
    _set_read_only("/", True, recursive=True)
    for tree in writable:
        _bind(tree, tree)
        _set_read_only(tree, False, recursive=False)


def make_private() -> None:
    """Nothing mounted here from now on is seen outside the namespace."""
    mount(None, "/", None, MS_REC | MS_PRIVATE)


def cover(folder: str, keep: list[str], backing: str | None = None, size_mb: int = 0) -> None:
    """Hide everything under folder behind an empty tmpfs (of at most size_mb, where given), or
    the folder `backing` bound there, except the folders in keep (each beneath folder), which
    are bound back where they were."""
    kept = [(path, os.open(path, os.O_PATH | os.O_CLOEXEC)) for path in keep]
    try:
        if backing is None:
            options = "mode=1777" + (f",size={size_mb}m" if size_mb else "")
            mount("tmpfs", folder, "tmpfs", MS_NOSUID | MS_NODEV, options)
        else:
            _bind(backing, folder)
        for path, fd in kept:
            os.makedirs(path, exist_ok=True)
            mount(f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC)
    finally:
        for _, fd in kept:
            os.close(fd)


def _bind(source: str, target: str) -> None:
    """In a mount namespace of a user namespace a bind must take the source's mounts with it
    (or it would show what they cover) and name it by a descriptor opened there."""
    fd = os.open(source, os.O_PATH | os.O_CLOEXEC)
    try:
        mount(f"/proc/self/fd/{fd}", target, None, MS_BIND | MS_REC)
    finally:
        os.close(fd)


def blank(path: str) -> None:
    """Show an empty file where the file at path is (/dev/null bound over it)."""
    mount("/dev/null", path, None, MS_BIND)


def mount_proc() -> None:
    """A /proc that shows only this PID namespace's processes."""
    mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)


# What of /proc stays read-only where the rest of it is writable: the files the host's root
# may write (this namespace's root is the host's root to file permissions), as container
# runtimes keep them.
PROC_READ_ONLY = (
    "/proc/sys",
    "/proc/sysrq-trigger",
    "/proc/irq",
    "/proc/bus",
    "/proc/fs",
    "/proc/acpi",
    "/proc/scsi",
    "/proc/driver",
    "/proc/sysvipc",
    "/proc/tty",
)


def protect_proc() -> None:
    for path in PROC_READ_ONLY:
        if os.path.exists(path):
            mount(path, path, None, MS_BIND | MS_REC)
            mount(None, path, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC)


def prctl(option: int, value: int) -> None:
    _check(_libc.prctl(option, ctypes.c_ulong(value), 0, 0, 0), f"prctl({option})")


def drop_capabilities() -> None:
    """Give up every capability this process holds in its user namespace, and the right to
    get any back through exec."""
    for cap in range(CAP_LAST + 1):
        if _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            break  # past the kernel's last capability
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
    data = (ctypes.c_uint32 * 6)()  # effective, permitted, inheritable, twice: all empty
    _check(_libc.capset(header, data), "capset")


def still_hidden(pid: int, folders: list[str]) -> bool:
    """Whether process pid's view of the files still hides each folder that exists here: what
    it sees at that path is not the folder itself. A folder removed and made again outside
    (a store cleaned between builds) takes the cover mounted on the old one with it, so a
    process kept from before would see the new one. False where its view cannot be read."""
    for folder in folders:
        try:
            here = os.stat(folder)
        except FileNotFoundError:
            continue
        try:
            seen = os.stat(f"/proc/{pid}/root{os.path.realpath(folder)}")
        except FileNotFoundError:
            continue
        except OSError:
            return False
        if (seen.st_dev, seen.st_ino) == (here.st_dev, here.st_ino):
            return False
    return True
