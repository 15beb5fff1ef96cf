"""No file code under test can change becomes setuid or setgid (issue 38, requirements 1 and 7).
What the sandbox's root makes or writes belongs to the host's user that runs magpie (root in CI):
on 872a590 a root-owned file went from mode 600 to 4777, and in its own scratch folder, or in a
GPU worker's /dev/shm, where its evaluator's CUDA IPC files (root's, linked from the host's
/dev/shm, which every user reaches) are the worker's to write, code could still write a program
and make it setuid. Every call that sets a mode is refused a setuid or setgid bit; other modes
stay its to set on its own files."""

import errno
import json
import os
import platform
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from magpie import sandbox

pytestmark = pytest.mark.skipif(sandbox.unavailable_reason() is not None, reason="no sandbox on this host")

FCHMODAT2 = 452  # one number on every architecture

# Sets `mode` on a file by every call that sets a mode, then a mode with neither bit by chmod.
CHMOD_EVERY_WAY = """
import ctypes, os, sys
path, mode = sys.argv[1], int(sys.argv[2], 8)
libc = ctypes.CDLL(None, use_errno=True)


def fchmodat2():
    if libc.syscall({fchmodat2}, -100, path.encode(), mode, 0) != 0:
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))


def fchmod():
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fchmod(fd, mode)
    finally:
        os.close(fd)


def fchmodat():
    folder = os.open(os.path.dirname(path), os.O_RDONLY)
    try:
        os.chmod(os.path.basename(path), mode, dir_fd=folder)
    finally:
        os.close(folder)


calls = {{"fchmod": fchmod, "fchmodat": fchmodat, "fchmodat2": fchmodat2}}
if {has_chmod}:
    calls["chmod"] = lambda: libc.chmod(path.encode(), mode) == 0 or fail()


def fail():
    raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))


for name, call in calls.items():
    try:
        call()
        print("SUCCEEDED", name, flush=True)
    except OSError as err:
        print("failed", name, err.errno, flush=True)
os.chmod(path, 0o700)
print("plain", oct(os.stat(path).st_mode & 0o7777), flush=True)
"""


def chmod_every_way(policy: sandbox.Policy, path: str, mode: int, script: Path) -> dict[str, str]:
    """Each call's outcome ("SUCCEEDED", or "failed ERRNO") setting `mode` on `path` from inside
    a sandbox of `policy`; under "plain", the mode it then read after chmod 700."""
    script.write_text(
        CHMOD_EVERY_WAY.format(fchmodat2=FCHMODAT2, has_chmod=platform.machine() == "x86_64"),
    )
    proc = subprocess.run(
        [sys.executable, "-m", "magpie.sandbox", json.dumps(policy.to_json()), "--"]
        + [sys.executable, str(script), path, oct(mode)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    outcomes = {}
    for words in map(str.split, proc.stdout.splitlines()):
        if words[0] == "plain":
            outcomes["plain"] = words[1]
        else:
            outcomes[words[1]] = " ".join([words[0], *words[2:]])
    return outcomes


@pytest.mark.parametrize("mode", [0o4755, 0o2755, 0o6777], ids=oct)
def test_no_call_makes_a_file_of_its_own_scratch_folder_setuid_or_setgid(tmp_path, mode):
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    program = scratch / "program"
    program.write_bytes(b"\x7fELF")
    program.chmod(0o644)
    outcomes = chmod_every_way(sandbox.Policy(write=[str(scratch)]), str(program), mode, scratch / "chmod.py")
    calls = {name: outcome for name, outcome in outcomes.items() if name != "plain"}
    assert {"fchmod", "fchmodat", "fchmodat2"} <= set(calls), outcomes
    assert all(outcome == f"failed {errno.EPERM}" for outcome in calls.values()), outcomes
    assert outcomes["plain"] == "0o700", outcomes  # a mode with neither bit is its to set
    assert program.stat().st_mode & 0o7777 == 0o700


def test_a_gpu_worker_cannot_make_its_evaluators_cuda_ipc_file_setuid(tmp_path):
    """A GPU worker's /dev/shm is a folder of its own into which the evaluator links its CUDA IPC
    files (here one named as torch's reference counts are); the worker writes them, and they are
    the evaluator's, in the host's /dev/shm."""
    if not os.path.isdir(sandbox.SHARED_MEMORY):
        pytest.skip("no shared memory folder on this host")
    scratch, lent = tmp_path / "scratch", Path(sandbox.SHARED_MEMORY) / f"magpie-test-lent-{uuid.uuid4().hex[:12]}"
    scratch.mkdir()
    lent.mkdir(mode=0o700)
    evaluators = Path(sandbox.SHARED_MEMORY) / f"torch_{os.getpid()}_{uuid.uuid4().int % 10**9}_0"
    try:
        evaluators.write_bytes(b"counts")
        evaluators.chmod(0o600)
        os.link(evaluators, lent / evaluators.name)
        policy = sandbox.Policy(write=[str(scratch)], gpu=True, shared_memory=str(lent))
        outcomes = chmod_every_way(policy, f"{sandbox.SHARED_MEMORY}/{evaluators.name}", 0o4777, scratch / "chmod.py")
        calls = {name: outcome for name, outcome in outcomes.items() if name != "plain"}
        assert calls and all(outcome == f"failed {errno.EPERM}" for outcome in calls.values()), outcomes
        assert evaluators.stat().st_mode & 0o6000 == 0, oct(evaluators.stat().st_mode)
    finally:
        evaluators.unlink(missing_ok=True)
        for left in lent.iterdir():
            left.unlink()
        lent.rmdir()
