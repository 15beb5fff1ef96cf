"""Jobs placed on the devices of a host (execution/devices.py, executors.Placed): devices as data,
so the placement runs here without GPUs; a gpu-marked build on a 2-GPU host checks it for real."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from conftest import FIXTURES, QUICK_TIMING, magpie_in_process, relu2_project

from magpie.errors import UserError
from magpie.execution.devices import CPU, Device, Placement, build_devices, gpus_from_listing, models_line
from magpie.execution.executors import LocalProcessExecutor, Placed
from magpie.execution.job import Job
from magpie.graph.expand import TaskSpec

H200 = [Device(0, "NVIDIA H200", "GPU-a"), Device(1, "NVIDIA H200", "GPU-b")]
MIXED = [Device(0, "NVIDIA H200", "GPU-a"), Device(1, "NVIDIA A100", "GPU-c")]

# A job that records, from inside, when it ran (the device comes back in its result).
INTERVAL = "sh -c 'date +%s.%N > {out}/start; sleep 0.6; date +%s.%N > {out}/end'"


def command_job(root: Path, name: str, action: str, rule: str = "timing", kernel: str = "k") -> Job:
    spec = TaskSpec(
        name=name,
        rule=rule,
        scope="impl",
        action=action,
        kernel=kernel,
        impl=None,
        inputs=[],
        config={},
        fingerprint={},
        deps=[],
        params={"root": str(root), "settings": {"project": {"device": "cuda"}}},
    )
    return Job(spec, {}, {})


def intervals(outputs) -> list[tuple[int | None, float, float]]:
    """(device index, start, end) of each interval job's output."""
    return [
        (out.result["device"]["index"], float(out.files["start"].decode()), float(out.files["end"].decode()))
        for out in outputs
    ]


def overlapping_on_one_device(rows) -> list:
    return [(a, b) for i, a in enumerate(rows) for b in rows[i + 1 :] if a[0] == b[0] and a[1] < b[2] and b[1] < a[2]]


def test_a_visible_list_picks_and_renumbers_the_gpus():
    listing = "0, NVIDIA H200, GPU-a\n1, NVIDIA H200, GPU-b\n2, NVIDIA A100, GPU-c\n"
    assert [d.uuid for d in gpus_from_listing(listing, None)] == ["GPU-a", "GPU-b", "GPU-c"]
    picked = gpus_from_listing(listing, "2,GPU-a")
    assert picked == [Device(0, "NVIDIA A100", "GPU-c"), Device(1, "NVIDIA H200", "GPU-a")]
    assert gpus_from_listing(listing, "1,7,0") == [Device(0, "NVIDIA H200", "GPU-b")]  # CUDA stops at 7


def test_a_build_uses_every_visible_gpu_unless_told():
    assert build_devices("cpu", None, H200) == [CPU]
    assert build_devices("cuda", None, H200) == H200
    assert build_devices("cuda", [1], H200) == [H200[1]]
    assert build_devices("cuda:0", None, H200) == [H200[0]]
    with pytest.raises(UserError, match=r"GPU 5 not visible \(visible: 0, 1\)"):
        build_devices("cuda", [0, 5], H200)


def test_a_build_spanning_models_says_so_in_one_line():
    assert models_line(H200) is None
    line = models_line(MIXED)
    assert line is not None and "2 models: NVIDIA H200 (0); NVIDIA A100 (1)" in line and "\n" not in line


def test_measurements_hold_a_device_alone_and_checks_share():
    placement = Placement(H200)
    first = placement.take("timing", "k")
    second = placement.take("timing", "k")
    assert {first, second} == set(H200)
    assert placement.take("correctness", "k") in H200  # a check shares a measured device
    waiting = ThreadPoolExecutor(1).submit(placement.take, "timing", "k")
    time.sleep(0.2)
    assert not waiting.done()  # both devices measured: the third waits
    placement.give_back(second, "timing")
    assert waiting.result(timeout=5) == second


def test_a_kernels_measurements_keep_to_one_model():
    placement = Placement(MIXED)
    h200 = placement.take("timing", "k")
    assert h200.name == "NVIDIA H200"
    other_kernel = placement.take("timing", "j")  # the A100, free: another kernel's first measurement
    assert other_kernel.name == "NVIDIA A100"
    placement.give_back(other_kernel, "timing")
    waiting = ThreadPoolExecutor(1).submit(placement.take, "timing", "k")
    time.sleep(0.2)
    assert not waiting.done()  # the A100 is free, but k was timed on an H200: it waits for one
    placement.give_back(h200, "timing")
    assert waiting.result(timeout=5).name == "NVIDIA H200"


@pytest.fixture(scope="module")
def placed_run(tmp_path_factory):
    """Four timing jobs and two checks, six at once on a pool of six processes, placed on two GPUs given as data."""
    root = tmp_path_factory.mktemp("placed")
    executor = Placed(LocalProcessExecutor(6), Placement(H200))
    jobs = [command_job(root, f"timing:k/{i}", INTERVAL) for i in range(4)]
    jobs += [command_job(root, f"correctness:k/{i}", INTERVAL, rule="correctness") for i in range(2)]
    try:
        with ThreadPoolExecutor(len(jobs)) as threads:  # as doit's runner: one thread per running task
            outputs = list(threads.map(lambda job: executor.submit(job).result(), jobs))
    finally:
        executor.shutdown()
    return outputs


def test_no_two_timings_share_a_device_and_both_devices_are_used(placed_run):
    timings = intervals(placed_run[:4])
    assert overlapping_on_one_device(timings) == []
    assert {index for index, _, _ in timings} == {0, 1}
    starts = sorted(start for _, start, _ in timings)
    assert starts[1] - starts[0] < 0.5  # two at once, one per device


def test_each_placed_result_records_its_device(placed_run):
    for output in placed_run:
        assert output.result["device"] in [d.record() for d in H200]
        assert output.result["state"] == "SUCCESS"


def test_bad_devices_are_one_line_exit_2(tmp_path):
    relu2_project(tmp_path, [], "[[8]]")
    proc = magpie_in_process("build", "--devices", "0,x", cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        "magpie: --devices: '0,x' is not a list of distinct GPU indices such as 0,1"
    ]
    proc = magpie_in_process("build", "--ray-address", "auto", cwd=tmp_path)
    assert proc.returncode == 2 and "--ray-address: only with --executor ray" in proc.stderr


def test_project_devices_is_checked_by_the_manifest(tmp_path):
    relu2_project(tmp_path, [], "[[8]]")
    toml = (tmp_path / "magpie.toml").read_text()
    (tmp_path / "magpie.toml").write_text(toml.replace('device = "cpu"', 'device = "cuda"\ndevices = [-1]', 1))
    proc = magpie_in_process("build", cwd=tmp_path)
    assert proc.returncode == 2 and "devices" in proc.stderr


@pytest.mark.gpu
@pytest.mark.parametrize("executor", ["local", "ray"])
def test_two_timings_at_once_on_two_gpus_each_alone(tmp_path, executor):
    """On a 2-GPU host (nvidia-h200-x2): four candidates' timings at -j 4 spread over both GPUs,
    never two on one GPU at once, each result naming its GPU (index, name, UUID); by the local
    pool and by Ray (started for the build, each timing one Ray task holding a GPU)."""
    if executor == "ray":
        pytest.importorskip("ray")
    for name in ("a", "b", "c", "d"):
        (tmp_path / f"{name}.py").write_text((FIXTURES / "adversarial/good.py").read_text())
    relu2_project(tmp_path, ["a", "b", "c", "d"], "[[4096, 4096]]", device="cuda", timing=QUICK_TIMING)
    proc = magpie_in_process("build", "-j", "4", "--executor", executor, cwd=tmp_path, check=0)
    assert "span" not in proc.stderr
    store = tmp_path / "workspaces" / "store"
    rows = []
    for result in store.rglob("result.json"):
        data = json.loads(result.read_text())
        if str(data.get("task", "")).startswith("timing:"):
            device = data["device"]
            assert device["uuid"] and device["uuid"].startswith("GPU-") and "H200" in device["name"]
            rows.append((device["index"], data["task_started_unix"], data["task_started_unix"] + data["task_seconds"]))
    assert len(rows) == 5  # the baseline's and four candidates'
    assert {index for index, _, _ in rows} == {0, 1}
    assert overlapping_on_one_device(rows) == []
