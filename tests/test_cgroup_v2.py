"""A sandbox's limits on cgroup v2 (issue 38, requirement 2): one group holds both its process
limit and its memory account. Made one after the other, the pids group took the waiter first and
the memory group, made under it, could not have the memory controller (a v2 group with a process
cannot hand controllers down): the memory account fell back to RLIMIT_AS, and a memfd hog went
uncounted. A container's root group holds processes too: there the first sandbox moves them to
a leaf group of their own.

These run where this process's v2 group can hand both controllers down as root (a VM's or a
machine's root group); this CPU machine's cgroups are v1 (hybrid, no controller on v2), so they
ran in a VM booted with cgroup v2 alone (`bench/cgroup_v2_vm.sh`)."""

import json
import os
import subprocess
import sys

import pytest

from magpie import sandbox
from magpie.linux.procfs import own_cgroup
from magpie.sandbox import pids

V2 = pids.v2_parent()
pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or V2 is None or not {"memory", "pids"} <= set(pids.controllers_of(V2)),
    reason="no cgroup v2 group that hands memory and pids down (cgroup v1 here, or not root)",
)

# Prints the limits of the group it runs in, then what `argv[1]` asks of it.
PROBE = """
import os, sys
group = "/sys/fs/cgroup" + open("/proc/self/cgroup").read().split("::", 1)[1].strip()
limits = {name: open(os.path.join(group, name)).read().strip() for name in ("pids.max", "memory.max")}
print(os.path.basename(group), limits["pids.max"], limits["memory.max"], flush=True)
if sys.argv[1] == "memfd":
    fd = os.memfd_create("hoard")
    for _ in range(512):
        os.write(fd, b"x" * (1 << 20))
    print("held", flush=True)
"""


def run_in_sandbox(tmp_path, ask: str, wrapper: list[str] | None = None) -> subprocess.CompletedProcess:
    (tmp_path / "probe.py").write_text(PROBE)
    policy = sandbox.Policy(write=[str(tmp_path)], read=[str(tmp_path)], memory_mb=256, processes=64)
    argv = [sys.executable, "-m", "magpie.sandbox", json.dumps(policy.to_json()), "--"]
    argv += [sys.executable, str(tmp_path / "probe.py"), ask]
    return subprocess.run([*(wrapper or []), *argv], capture_output=True, text=True, timeout=120, check=False)


def test_one_group_holds_the_process_limit_and_the_memory_account(tmp_path):
    proc = run_in_sandbox(tmp_path, "")
    assert proc.returncode == 0, proc.stderr
    group, processes, memory_max = proc.stdout.split()
    assert group.startswith(pids.PREFIX)
    assert (processes, memory_max) == ("64", str(256 << 20))


def test_a_memfd_hog_is_ended_by_the_v2_memory_account(tmp_path):
    proc = run_in_sandbox(tmp_path, "memfd")
    assert proc.returncode == sandbox.SANDBOX_MEMORY, (proc.stdout, proc.stderr)
    assert "memory limit exceeded" in proc.stderr
    assert "held" not in proc.stdout


@pytest.mark.skipif(own_cgroup("") != "/", reason="a container's root group is made from the machine's root group")
def test_a_containers_root_group_hands_both_down_once_its_processes_moved_to_a_leaf(tmp_path):
    """A container's root group holds its processes (as a build's shell and magpie, in CI): the
    sandbox moves them into a leaf group of their own, then makes its group beside it."""
    container = os.path.join(V2, "magpie-test-container")
    os.mkdir(container)
    try:
        # the container: a group of the machine's root, both controllers handed to it, seen as / from a
        # cgroup namespace of its own (what `docker run --cgroupns=private` makes)
        with open(os.path.join(V2, "cgroup.subtree_control"), "w") as control:
            control.write("+memory +pids")
        enter = f"echo $$ > {container}/cgroup.procs && exec unshare --cgroup --mount sh -c "
        enter += "'umount -l /sys/fs/cgroup && mount -t cgroup2 none /sys/fs/cgroup && exec \"$@\"' sh"
        proc = run_in_sandbox(tmp_path, "", wrapper=["sh", "-c", enter + ' "$@"', "sh"])
        assert proc.returncode == 0, proc.stderr
        group, processes, memory_max = proc.stdout.split()
        assert (processes, memory_max) == ("64", str(256 << 20))
        assert os.path.isdir(os.path.join(container, pids.LEAF))
    finally:
        for folder in (os.path.join(container, pids.LEAF), container):
            if os.path.isdir(folder):
                os.rmdir(folder)
