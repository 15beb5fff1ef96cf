"""Landlock (Linux 5.13+): the process and everything it starts may write only where it is
allowed to, read only what it is allowed to, open no TCP connection, signal and ptrace no
process outside its domain. Enforced by the kernel on top of file permissions, whatever
capabilities the process holds in its own user namespace."""

from __future__ import annotations

import ctypes
import os
import struct

# Syscall numbers are the same on every architecture (added after the tables were unified).
CREATE_RULESET, ADD_RULE, RESTRICT_SELF = 444, 445, 446
CREATE_RULESET_VERSION = 1
RULE_PATH_BENEATH, RULE_NET_PORT = 1, 2

EXECUTE, WRITE_FILE, READ_FILE, READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
REMOVE_DIR, REMOVE_FILE, MAKE_CHAR, MAKE_DIR, MAKE_REG = 1 << 4, 1 << 5, 1 << 6, 1 << 7, 1 << 8
MAKE_SOCK, MAKE_FIFO, MAKE_BLOCK, MAKE_SYM = 1 << 9, 1 << 10, 1 << 11, 1 << 12
REFER, TRUNCATE, IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15
BIND_TCP, CONNECT_TCP = 1 << 0, 1 << 1
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1 << 0, 1 << 1

# What each ABI version can handle: a right the kernel does not know makes the ruleset invalid.
FS_BY_ABI = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 4: (1 << 15) - 1, 5: (1 << 16) - 1}
READ = EXECUTE | READ_FILE | READ_DIR
FILE_ONLY = EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE | IOCTL_DEV
DEVICE = READ_FILE | WRITE_FILE | READ_DIR | IOCTL_DEV

_libc = ctypes.CDLL(None, use_errno=True)


class LandlockError(OSError):
    pass


def abi_version() -> int:
    """0 where the kernel has no Landlock (or it is disabled)."""
    version = _libc.syscall(CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(CREATE_RULESET_VERSION))
    return max(0, version)


def _check(result: int, what: str) -> int:
    if result < 0:
        err = ctypes.get_errno()
        raise LandlockError(err, f"landlock {what}: {os.strerror(err)}")
    return result


def restrict(
    *,
    read: list[str],
    write: list[str],
    devices: list[str],
    network: bool,
    listed: list[str] = (),
    scopes: int = SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL,
    handled: int | None = None,
) -> int:
    """Enforce on this process (and its future children): `read` trees (or files) readable and
    executable, `listed` folders' (and their subfolders') entries listable but their files not
    readable, `write` trees fully usable, `devices` readable, writable and ioctl-able, nothing else; no
    signal to, or abstract socket of, a process outside (`scopes`). With `handled`, only those file
    rights are restricted (a layer on top of an earlier one, which keeps restricting the rest).
    no_new_privs must be set. Returns the ABI version used."""
    abi = abi_version()
    if abi < 1:
        raise LandlockError(0, "landlock is not available on this kernel")
    handled_fs = FS_BY_ABI[min(abi, 5)] & (handled if handled is not None else ~0)
    handled_net = 0 if network or abi < 4 else BIND_TCP | CONNECT_TCP
    scoped = scopes if abi >= 6 else 0
    attr = struct.pack("=QQQ", handled_fs, handled_net, scoped)
    size = 8 if abi < 4 else (16 if abi < 6 else 24)
    ruleset = _check(
        _libc.syscall(CREATE_RULESET, ctypes.c_char_p(attr), ctypes.c_size_t(size), ctypes.c_uint32(0)),
        "create_ruleset",
    )
    try:
        for paths, access in ((listed, READ_DIR), (read, READ), (devices, DEVICE), (write, handled_fs)):
            for path in paths:
                _allow(ruleset, path, access & handled_fs)
        _check(_libc.syscall(RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(0)), "restrict_self")
    finally:
        os.close(ruleset)
    return abi


def _allow(ruleset: int, path: str, access: int) -> None:
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError:
        return  # a path that does not exist grants nothing
    try:
        if not os.path.isdir(path):
            access &= FILE_ONLY
        rule = struct.pack("=Qi", access, fd)
        _check(
            _libc.syscall(
                ADD_RULE,
                ctypes.c_int(ruleset),
                ctypes.c_int(RULE_PATH_BENEATH),
                ctypes.c_char_p(rule),
                ctypes.c_uint32(0),
            ),
            f"add_rule {path}",
        )
    finally:
        os.close(fd)
