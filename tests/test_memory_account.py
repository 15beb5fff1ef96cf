"""One memory account for code under test (issue 38, requirement 2): what a candidate holds in
memfds, in unlinked files of its tmpfs scratch folder and in plain anonymous memory counts against
its one limit (`memory_mb`); past it the sandbox ends with `memory limit exceeded`, and a build
records that as the candidate's failure. On 872a590 RLIMIT_AS alone held: 3 GiB in memfds under a
limit of 2 GiB was judged correct, and 1.25 GiB of unlinked scratch files counted 0 MiB."""

import json
import os
import shutil
import subprocess
import sys
import tempfile

import pytest
from conftest import relu2_report

from magpie import sandbox
from magpie.sandbox import memory

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not memory.available(), reason="no memory cgroup to be had (not root, or none delegated)"
)

LIMIT_MB = 256

# Each holds `sys.argv[1]` MiB its own way and says so; it then sleeps a moment, holding it.
HOGS = {
    "memfd": """
import os, sys
fd = os.memfd_create("hoard")
for _ in range(int(sys.argv[1])):
    os.write(fd, b"x" * (1 << 20))
""",
    "unlinked_scratch_file": """
import os, sys
path = os.path.join(sys.argv[2], "hoard")
fd = os.open(path, os.O_RDWR | os.O_CREAT)
os.unlink(path)
for _ in range(int(sys.argv[1])):
    os.write(fd, b"x" * (1 << 20))
""",
    "anonymous": """
import sys
hoard = [bytearray(b"x" * (1 << 20)) for _ in range(int(sys.argv[1]))]
""",
}
HELD = 'print("held", sys.argv[1], flush=True)\nimport time; time.sleep(0.2)\n'


@pytest.fixture
def scratch():
    """A scratch folder in memory (tmpfs), as a worker's is."""
    folder = tempfile.mkdtemp(prefix="magpie-memory-account-", dir="/dev/shm")
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def run_in_sandbox(tmp_path, scratch: str, hog: str, held_mb: int) -> subprocess.CompletedProcess:
    (tmp_path / "hog.py").write_text(HOGS[hog] + HELD)
    policy = sandbox.Policy(write=[scratch], read=[str(tmp_path)], memory_mb=LIMIT_MB)
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "magpie.sandbox",
            json.dumps(policy.to_json()),
            "--",
            sys.executable,
            str(tmp_path / "hog.py"),
            str(held_mb),
            str(scratch),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.parametrize("hog", list(HOGS))
def test_memory_held_any_way_past_the_limit_ends_the_sandbox(tmp_path, scratch, hog):
    proc = run_in_sandbox(tmp_path, scratch, hog, 2 * LIMIT_MB)
    assert proc.returncode == sandbox.SANDBOX_MEMORY, (proc.stdout, proc.stderr)
    assert "memory limit exceeded" in proc.stderr
    assert "held" not in proc.stdout


@pytest.mark.parametrize("hog", list(HOGS))
def test_memory_held_under_the_limit_is_fine(tmp_path, scratch, hog):
    proc = run_in_sandbox(tmp_path, scratch, hog, LIMIT_MB // 4)
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    assert proc.stdout.split() == ["held", str(LIMIT_MB // 4)]


MEMFD_CANDIDATE = """
import os
import torch

# in memfds of 256 MiB each, as no one file may be larger than `file_mb` (1 GiB)
_hoard = [os.memfd_create(f"hoard{i}") for i in range(-(-HOARD_MB // 256))]
for i in range(HOARD_MB):
    os.write(_hoard[i // 256], b"x" * (1 << 20))


def kernel(x):
    return torch.relu(x) * 2.0
"""


# A worker's limit by device: a CUDA context's host memory counts too.
@pytest.mark.parametrize("device,limit_mb", [("cpu", 1024), pytest.param("cuda", 4096, marks=pytest.mark.gpu)])
def test_a_build_records_a_memfd_hog_as_its_failure_and_judges_the_rest(tmp_path, device, limit_mb):
    """1.5 times `memory_mb` in a memfd: the candidate fails `memory limit exceeded`; the honest
    candidate beside it, in the same build, is correct. On a GPU the same limit holds (no
    RLIMIT_AS there: CUDA reserves far more address space than it uses)."""
    report = relu2_report(
        tmp_path,
        ["memfd_hog", "honest"],
        shapes="[[33, 65]]",
        defaults=f"memory_mb = {limit_mb}",
        device=device,
        sources={
            "memfd_hog": MEMFD_CANDIDATE.replace("HOARD_MB", str(limit_mb * 3 // 2)),
            "honest": MEMFD_CANDIDATE.replace("HOARD_MB", "64"),
        },
    )
    rows = {row["implementation"]: row for row in report["results"]}
    assert rows["memfd_hog"]["correctness_state"] == "FAILED"
    assert "memory limit exceeded" in rows["memfd_hog"]["verdict"], rows["memfd_hog"]
    assert rows["honest"]["correctness_state"] == "SUCCESS", rows["honest"]
