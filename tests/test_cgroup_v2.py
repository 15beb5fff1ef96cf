"""A sandbox's limits on cgroup v2 (issue 38, requirement 2): one group holds both its process
limit and its memory account. Made one after the other, the pids group took the waiter first and
the memory group, made under it, could not have the memory controller (a v2 group with a process
cannot hand controllers down): the memory account fell back to RLIMIT_AS, and a memfd hog went
uncounted. In a container whose processes were moved to a leaf group (its root group handing
both down), the group is made beside that leaf.

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

V2 = pids.own_folder("")
pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not (pids.v2_parents("memory") and pids.v2_parents("pids")),
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


@pytest.mark.skipif(own_cgroup("") != "/", reason="a container's group is made under the machine's root group")
def test_in_a_container_whose_processes_moved_to_a_leaf_the_group_is_made_beside_it(tmp_path):
    """A container seen from its own cgroup namespace, whose init moved its processes into a leaf
    group and handed both controllers down from its root group (as docker-in-docker's does): the
    sandbox's group is made under that root group, beside the leaf, and nothing is moved."""
    container = os.path.join(V2, "magpie-test-container")
    os.mkdir(container)
    try:
        with open(os.path.join(V2, "cgroup.subtree_control"), "w") as control:
            control.write("+memory +pids")
        inside = (
            "umount -l /sys/fs/cgroup && mount -t cgroup2 none /sys/fs/cgroup && mkdir /sys/fs/cgroup/init"
            " && echo $$ > /sys/fs/cgroup/init/cgroup.procs"
            ' && echo +memory +pids > /sys/fs/cgroup/cgroup.subtree_control && exec "$@"'
        )
        enter = f"echo $$ > {container}/cgroup.procs && exec unshare --cgroup --mount sh -c '{inside}' sh \"$@\""
        proc = run_in_sandbox(tmp_path, "", wrapper=["sh", "-c", enter, "sh"])
        assert proc.returncode == 0, proc.stderr
        group, processes, memory_max = proc.stdout.split()
        assert group.startswith(pids.PREFIX)
        assert (processes, memory_max) == ("64", str(256 << 20))
        assert os.listdir(container) and not any(n.startswith(pids.PREFIX) for n in os.listdir(container))
    finally:
        for folder in (os.path.join(container, "init"), container):
            if os.path.isdir(folder):
                os.rmdir(folder)
