"""Removed files a sandbox holds only by a mapping (issue 38, requirement 2): write a file in the
tmpfs scratch folder, map one page of it, close the descriptor and remove the name. No folder
lists it, no descriptor leads to it, yet all its pages stay. On 872a590 (and after the count of
removed, still-open files) a run of such files, each under what the folders may hold while
named, held any amount: where no memory cgroup exists nothing counted it, and its one-page
mapping is all that RLIMIT_AS sees. The sandbox's init now counts each at the most it can hold
(RLIMIT_FSIZE, `file_mb`: its size cannot be read from inside a user namespace) against
`written_mb`: past it the sandbox is ended with one line (exit status 71). Run as root (a memory
cgroup of 1 GiB, not reached) and as an unprivileged user (none)."""

import json
import os
import shutil
import subprocess
import sys
import tempfile

import pytest

from magpie import sandbox
from magpie.sandbox.init import SANDBOX_LIMIT
from tests.test_sandbox_removed_files import NOBODY, REPO, world_readable

MAP_AND_REMOVE = """
import ctypes, mmap, os, sys, time
scratch, files, mb = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
# libc's mmap: Python's mmap object keeps a descriptor of its own, which would show the file
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
chunk = b"x" * (1 << 20)
for n in range(files):
    path = os.path.join(scratch, f"mapped{n}")
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    for _ in range(mb):
        os.write(fd, chunk)
    if libc.mmap(None, mmap.PAGESIZE, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0) in (None, ctypes.c_void_p(-1).value):
        sys.exit(f"mmap: {os.strerror(ctypes.get_errno())}")
    os.close(fd)
    os.unlink(path)
    time.sleep(0.3)  # past the init's look at the folders: each file counted once while named
print("held", flush=True)
time.sleep(2)
print("kept", flush=True)
"""


def mapped_in_a_sandbox(user: str, files: int, mb: int) -> subprocess.CompletedProcess:
    """The script, as `user` ("root", or "nobody" through setpriv: no memory cgroup), in a sandbox
    whose folders may hold 64 MiB, files of 24 MiB at most, its scratch folder in /dev/shm:
    `files` files of `mb` MiB each, written, mapped by one page, closed and removed."""
    prefix, python = [], sys.executable
    if user == "nobody":
        if os.geteuid() != 0 or not shutil.which("setpriv"):
            pytest.skip("needs root to become another user")
        python = next((p for p in ("/usr/bin/python3", sys.executable) if os.path.exists(p) and world_readable(p)), "")
        if not world_readable(REPO) or not python:
            pytest.skip("magpie or an interpreter is not readable by another user here")
        prefix = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
    elif os.geteuid() != 0:
        pytest.skip("runs as root")
    scratch = tempfile.mkdtemp(dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    try:
        if user == "nobody":
            os.chown(scratch, NOBODY, NOBODY)
        script = os.path.join(scratch, "map.py")
        with open(script, "w") as text:
            text.write(MAP_AND_REMOVE)
        policy = sandbox.Policy(write=[scratch], memory_mb=1024, written_mb=64, file_mb=24)
        return subprocess.run(
            [*prefix, python, "-m", "magpie.sandbox", json.dumps(policy.to_json()), "--"]
            + [python, script, scratch, str(files), str(mb)],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "PYTHONPATH": REPO},
            check=False,
        )
    finally:
        shutil.rmtree(scratch)


@pytest.mark.parametrize("user", ["root", "nobody"])
def test_removed_files_held_only_by_a_mapping_count_against_what_its_folders_may_hold(user):
    proc = mapped_in_a_sandbox(user, files=8, mb=20)  # 160 MiB against 64
    assert proc.returncode == SANDBOX_LIMIT, (proc.returncode, proc.stdout, proc.stderr)
    assert "kept" not in proc.stdout, proc.stdout
    assert proc.stderr.count("\n") == 1 and "its folders held more than 64 MiB" in proc.stderr, proc.stderr


@pytest.mark.parametrize("user", ["root", "nobody"])
def test_a_mapped_removed_file_under_the_limit_is_kept(user):
    proc = mapped_in_a_sandbox(user, files=2, mb=8)  # counted as 2 x 24 MiB, under 64
    assert proc.returncode == 0, (proc.returncode, proc.stdout, proc.stderr)
    assert proc.stdout.split() == ["held", "kept"], proc.stdout
