"""A workspace magpie cannot write (issue 37 point 6): restored read-only (as a CI cache may
be) or on a full disk. A no-op build and --dry-run work on a read-only one; a build that must
store something says so in one line (exit 2); a disk that fills up mid-build ends the build in
one line, and what was stored before is intact. The tests run as root here, where chmod does not
stop a write: the workspace is a real read-only bind mount, or a small tmpfs, in a mount
namespace of the command's own (`unshare -m`): those commands are processes of their own, the
first build runs in this one."""

import json
import os
import shutil
import subprocess
import sys
import time

import pytest
from conftest import magpie_in_process

MAGPIE = f"{sys.executable} -m magpie"


def _can_mount() -> bool:
    if os.geteuid() != 0 or not shutil.which("unshare"):
        return False
    probe = subprocess.run(["unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt"], capture_output=True)
    return probe.returncode == 0


pytestmark = pytest.mark.skipif(
    not _can_mount(), reason="needs root and unshare -m to mount a read-only workspace or a small tmpfs"
)

READ_ONLY = "mount --bind workspaces workspaces && mount -o remount,bind,ro workspaces && "


def in_namespace(root, script: str) -> subprocess.CompletedProcess:
    """`script` (sh) in a mount namespace of its own, in the project's folder: its mounts end with it."""
    return subprocess.run(["unshare", "-m", "sh", "-c", script], cwd=root, capture_output=True, text=True, timeout=600)


def one_line(proc: subprocess.CompletedProcess, start: str) -> None:
    assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith(start), proc.stderr


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    from conftest import COMMAND_PROJECT, write

    root = tmp_path_factory.mktemp("unwritable")
    write(root, COMMAND_PROJECT)
    assert json.loads(magpie_in_process("build", "--json", cwd=root, check=0).stdout)["failed"] == []
    return root


def test_a_read_only_workspace_builds_nothing_without_an_error(built):
    fast = in_namespace(built, READ_ONLY + f"{MAGPIE} build")
    assert fast.returncode == 0 and "18 artifacts up to date" in fast.stdout, fast.stderr
    # a restored cache's files have new stats: the snapshot does not hold, the full load runs
    time.sleep(0.01)
    os.utime(built / "k1/a.py")
    full = in_namespace(built, READ_ONLY + f"{MAGPIE} build")
    assert full.returncode == 0 and "Traceback" not in full.stderr, full.stderr
    dry = in_namespace(built, READ_ONLY + f"{MAGPIE} build --dry-run")
    assert dry.returncode == 0 and "0 to run, 18 up to date" in dry.stdout, dry.stderr


def test_a_read_only_workspace_with_something_to_store_is_one_line(built):
    source = built / "k1/a.py"
    kept = source.read_text()
    source.write_text("def kernel(x):\n    return x + 0.0\n")
    try:
        proc = in_namespace(built, READ_ONLY + f"{MAGPIE} build")
        one_line(
            proc,
            "magpie: workspaces/ is read-only: 5 stale tasks would store their artifacts there (first: compile:k1/a)",
        )
        dry = in_namespace(built, READ_ONLY + f"{MAGPIE} build --dry-run")
        assert dry.returncode == 0 and "5 to run, 13 up to date" in dry.stdout, dry.stderr
    finally:
        source.write_text(kept)


def test_a_disk_full_mid_build_ends_in_one_line_and_loses_nothing_stored(command_project):
    """The workspace on a 4 MiB tmpfs: a first build, then the disk filled but for two pages
    (enough to keep the edited source's bytes, not to store its compile's artifact)."""
    script = f"""
mount -t tmpfs -o size=4m tmpfs workspaces || exit 90
{MAGPIE} build >/dev/null 2>&1 || exit 91
head -c 8192 /dev/zero > workspaces/spare
head -c 100000000 /dev/zero > workspaces/filler 2>/dev/null
rm workspaces/spare
printf 'def kernel(x):\\n    return x + 0.0\\n' > k1/a.py
{MAGPIE} build 2>&1
echo "exit=$?"
rm workspaces/filler
{MAGPIE} build --dry-run
{MAGPIE} verify || exit 92
"""
    (command_project / "workspaces").mkdir()
    proc = in_namespace(command_project, script)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    failed = out[: out.index("exit=")].strip().splitlines()
    assert "Traceback" not in out
    assert out.count("exit=2\n") == 1
    assert failed[-1].startswith("magpie: no space left on the device of workspaces/: could not write workspaces/"), out
    assert all(line.startswith("run ") for line in failed[:-1]), out  # no line per task failed after it
    assert "5 to run, 13 up to date" in out  # every artifact stored before is there, and intact
