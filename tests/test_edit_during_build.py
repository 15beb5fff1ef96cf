"""Keys match what was judged: a task's input files are kept, by digest, as its key was
computed from them, and the job runs the kept bytes; a task whose inputs changed while it
ran is not stored under the key it started with."""

import hashlib
import json
import subprocess
import sys
import time

from conftest import relu2_project

from magpie.graph.expand import changed_inputs, snapshot_path
from magpie.harness.spec import load_module
from magpie.supervision import scratch

SLOW = """
import time

import torch

print("loading slow", flush=True)
time.sleep(4)  # the test edits this file meanwhile


def kernel(x):
    return torch.relu(x) * 2.0
"""


def test_an_edit_while_a_task_runs_is_not_stored_under_the_old_key(tmp_path):
    (tmp_path / "slow.py").write_text(SLOW)
    relu2_project(tmp_path, ["slow"], shapes="[[8, 16]]", defaults="trials = 1")
    build = subprocess.Popen(
        [sys.executable, "-m", "magpie", "build", "--json", "-j", "1"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and build.poll() is None and not _loading_slow():
        time.sleep(0.02)
    (tmp_path / "slow.py").write_text(SLOW.replace("* 2.0", "* 3.0"))  # now wrong
    out, err = build.communicate(timeout=300)
    result = json.loads(out)
    assert "correctness:relu2/slow" in result["failed"], (out, err)
    assert "slow.py changed while correctness:relu2/slow ran; not stored: run magpie build again" in err
    (tmp_path / "slow.py").write_text(SLOW)  # reverted: the old key's verdict was never stored
    plan = subprocess.run(
        [sys.executable, "-m", "magpie", "build", "--dry-run", "--json"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    )
    assert "correctness:relu2/slow" in {item["task"] for item in json.loads(plan.stdout)["would_run"]}


def _loading_slow() -> bool:
    """A worker of this build is importing slow.py (what a worker prints is in its scratch folder)."""
    for log in scratch.root().glob("w-*/output.log"):
        try:
            if "loading slow" in log.read_text(errors="replace"):
                return True
        except OSError:
            continue
    return False


def test_inputs_are_kept_by_digest_and_changes_are_seen(tmp_path):
    (tmp_path / "good.py").write_text("def kernel(x):\n    return x\n")
    relu2_project(tmp_path, [], shapes="[[8, 16]]")
    subprocess.run(
        [sys.executable, "-m", "magpie", "build", "--dry-run"], cwd=tmp_path, check=True, capture_output=True
    )
    data = (tmp_path / "good.py").read_bytes()
    kept = snapshot_path(tmp_path / "workspaces/snapshots", hashlib.sha256(data).hexdigest())
    assert kept.read_bytes() == data
    parts = {"inputs": {"good.py": hashlib.sha256(data).hexdigest()}}
    assert changed_inputs(tmp_path, parts) == []
    (tmp_path / "good.py").write_text("def kernel(x):\n    return -x\n")
    assert changed_inputs(tmp_path, parts) == ["good.py"]
    # a job runs the kept bytes, wherever the file's folder puts it on the module path
    module = load_module(tmp_path / "good.py", "kept_good", kept.read_bytes())
    assert module.kernel(3) == 3 and module.__file__ == str(tmp_path / "good.py")
