"""Memory a sandbox with no memory cgroup could hold beyond its RLIMIT_AS (issue 38, requirement
2): not root, no cgroup can be made, and RLIMIT_AS bounds only the address space. A memfd's pages
lie outside it once unmapped (a candidate held 3 GiB in memfds under 2 GiB), and a System V
segment outlives every attachment. There memfd_create and shmget are refused; on 872a590 both
were had at will."""

import json
import os
import shutil
import subprocess
import sys
import tempfile

import pytest

from magpie import sandbox

HOARD = """
import ctypes, os
try:
    os.memfd_create("hoard")
    print("memfd made")
except PermissionError:
    print("memfd refused")
libc = ctypes.CDLL(None, use_errno=True)
made = libc.shmget(0, ctypes.c_size_t(64 << 20), 0o1600) >= 0  # IPC_PRIVATE, IPC_CREAT | 0600
print("segment made" if made else "segment refused")
"""


def world_readable(path: str) -> bool:
    return all(os.stat(p).st_mode & 0o005 == 0o005 for p in [path, *map(str, __import__("pathlib").Path(path).parents)])


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root to become another user")
def test_without_a_memory_cgroup_memfds_and_system_v_segments_are_refused():
    repo = os.path.dirname(os.path.dirname(os.path.abspath(sandbox.__file__)))
    python = next((p for p in ("/usr/bin/python3", sys.executable) if os.path.exists(p) and world_readable(p)), None)
    if not world_readable(repo) or python is None:
        pytest.skip("magpie or an interpreter is not readable by another user here")
    scratch = tempfile.mkdtemp()
    try:
        os.chown(scratch, 65534, 65534)
        with open(os.path.join(scratch, "hoard.py"), "w") as script:
            script.write(HOARD)
        policy = sandbox.Policy(write=[scratch], memory_mb=256)
        proc = subprocess.run(
            ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", python, "-m", "magpie.sandbox"]
            + [json.dumps(policy.to_json()), "--", python, os.path.join(scratch, "hoard.py")],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "PYTHONPATH": repo},
            check=False,
        )
    finally:
        shutil.rmtree(scratch)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["memfd refused", "segment refused"], proc.stdout


def test_the_isolation_line_says_what_is_refused_without_a_memory_cgroup(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 65534)  # not root: no cgroup to be had
    line = sandbox.describe(sandbox.Policy(write=[], memory_mb=256))
    assert "memory 256 MiB, address space (memfds, System V segments refused)" in line, line
