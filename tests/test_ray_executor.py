"""The Ray executor on a local Ray of 2 GPU ids and no GPUs (`ray.init(num_gpus=2)`), started once
for the module: placement, no retries, cancellation within a second, the local executor's verdicts,
and a no-op build that imports no Ray."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from concurrent.futures import CancelledError, ThreadPoolExecutor

import pytest
from conftest import FIXTURES, magpie_in_process, relu2_project
from test_device_placement import INTERVAL, command_job, intervals, overlapping_on_one_device

from magpie.execution.ray_executor import RayExecutor

ray = pytest.importorskip("ray")


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_gpus=2, num_cpus=4, include_dashboard=False, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()


@pytest.fixture(scope="module")
def executor(local_ray):
    ex = RayExecutor(4)
    yield ex
    ex.shutdown()


def test_no_two_timings_run_on_one_gpu_id_at_once(executor, tmp_path):
    jobs = [command_job(tmp_path, f"timing:k/{i}", INTERVAL) for i in range(4)]
    with ThreadPoolExecutor(len(jobs)) as threads:
        outputs = list(threads.map(lambda job: executor.submit(job).result(), jobs))
    rows = intervals(outputs)
    assert overlapping_on_one_device(rows) == []
    assert {index for index, _, _ in rows} == {0, 1}


def test_a_job_that_crashes_its_worker_runs_once(executor, tmp_path):
    """A judging job whose worker dies is a failure, never run again (Ray's default: 3 retries)."""
    runs = tmp_path / "runs"
    kill_worker = (
        f"echo run >> {runs}; "
        # the Ray worker running this job: the ancestor whose title begins ray:: (not this script, which names it)
        "p=$$; while [ $p -gt 1 ]; do "
        'if tr "\\0" " " < /proc/$p/cmdline | grep -q "^ray[:][:]"; then kill -9 $p; fi; '
        "p=$(awk '/^PPid:/ {{print $2}}' /proc/$p/status); done; sleep 30"  # {{}}: the action is a template
    )
    job = command_job(tmp_path, "timing:k/crash", f"sh -c {shlex.quote(kill_worker)}")
    os.environ["MAGPIE_TRUST_CODE"] = "1"  # the job walks up to its worker: no sandbox hides it
    try:
        future = executor.submit(job)
        with pytest.raises(ray.exceptions.RayError):
            future.result(timeout=120)
    finally:
        del os.environ["MAGPIE_TRUST_CODE"]
    time.sleep(2)  # a retry would have started by now
    assert runs.read_text().splitlines() == ["run"]


def _sleepers(marker: bytes) -> list[int]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                if marker in cmdline.read():
                    found.append(int(pid))
        except OSError:
            pass
    return found


def test_cancel_kills_the_job_and_its_processes_within_a_second(executor, tmp_path):
    marker = b"37.0625"
    future = executor.submit(command_job(tmp_path, "timing:k/sleep", f"sleep {marker.decode()}"))
    deadline = time.monotonic() + 60
    while not _sleepers(marker):
        assert time.monotonic() < deadline, "the job never started"
        time.sleep(0.05)
    cancelled = time.monotonic()
    executor.cancel()
    while _sleepers(marker) and time.monotonic() - cancelled < 5:
        time.sleep(0.01)
    gone_after = time.monotonic() - cancelled
    assert gone_after < 1.0, f"the job's processes outlived the cancel by {gone_after:.2f} s"
    with pytest.raises(CancelledError):  # never a verdict, whatever the killed job returned
        future.result(timeout=30)


def _verdicts(summary: dict) -> dict:
    """Each implementation's verdicts but its timing's (the loaded machine may leave one inconclusive)."""
    return {
        (kernel["kernel"], impl["implementation"]): (impl["compiling_state"], impl["correctness_state"])
        for kernel in summary["kernels"]
        for impl in kernel["implementations"]
    }


@pytest.fixture(scope="module")
def twin_builds(local_ray, tmp_path_factory):
    """One small project built by the local executor and by Ray: (local summary, Ray summary, {executor: root})."""
    summaries, roots = [], {}
    for executor in ("local", "ray"):
        root = roots[executor] = tmp_path_factory.mktemp(f"twin_{executor}")
        shutil.copy(FIXTURES / "adversarial/good.py", root / "fast.py")
        relu2_project(root, ["fast", "raises", "segfaults"], "[[8, 16]]", defaults="trials = 1")
        proc = magpie_in_process("build", "--json", "-j", "2", "--executor", executor, cwd=root)
        assert proc.returncode in (0, 1), proc.stderr
        summaries.append(json.loads(proc.stdout))
    return summaries[0], summaries[1], roots


def test_ray_gives_the_local_executors_verdicts(twin_builds):
    local, on_ray, _ = twin_builds
    assert _verdicts(on_ray) == _verdicts(local)
    assert _verdicts(on_ray)[("relu2", "fast")][1] == "SUCCESS"
    assert _verdicts(on_ray)[("relu2", "segfaults")][1] == "FAILED"  # a crash is a verdict, not a failed build
    assert sorted(on_ray["executed"]) == sorted(local["executed"])


def test_each_timing_records_its_device_under_either_executor(twin_builds):
    for root in twin_builds[2].values():
        timings = [
            json.loads(path.read_text())
            for path in (root / "workspaces" / "store").rglob("result.json")
            if json.loads(path.read_text()).get("task", "").startswith("timing:")
        ]
        assert timings and all(t["device"] == {"index": None, "name": "cpu", "uuid": None} for t in timings)


def test_a_no_op_build_imports_no_ray(twin_builds):
    root = twin_builds[2]["ray"]
    probe = (
        "import sys; from magpie.cli import main; code = main(['build', '--executor', 'ray']); "
        "print(code, 'ray' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", probe], cwd=root, capture_output=True, text=True, timeout=120)
    assert "artifacts up to date" in out.stdout and out.stdout.split()[-2:] == ["0", "False"], out.stderr


def test_sigterm_stops_a_ray_build_as_any_build_and_leaves_no_process(tmp_path):
    """ray.init's own SIGTERM handler (a stack logged, the process ended) is not the build's: the
    build's stops it, exit 143, one line naming the jobs that ran, nothing of Ray or of them left."""
    from test_housekeeping import _descendants, _gone_within

    relu2_project(tmp_path, ["hangs"], "[[8, 16]]", defaults="trials = 1")
    err = tmp_path / "err.txt"
    with err.open("w") as stream:
        build = subprocess.Popen(
            [sys.executable, "-m", "magpie", "build", "-j", "2", "--executor", "ray"],
            cwd=tmp_path,
            stdout=subprocess.DEVNULL,
            stderr=stream,
        )
    try:
        deadline = time.monotonic() + 240
        while "run   correctness:relu2/hangs" not in err.read_text():
            assert build.poll() is None and time.monotonic() < deadline, err.read_text()
            time.sleep(0.2)
        time.sleep(3)  # the hanging candidate's evaluator and workers started
        started = _descendants(build.pid)
        assert any("ray::" in command for command in started.values())
        build.terminate()
        code = build.wait(timeout=60)
    finally:
        build.kill()
    assert code == 143, err.read_text()
    assert "magpie: stopped by SIGTERM while running" in err.read_text()
    assert _gone_within(started, 5) == []
