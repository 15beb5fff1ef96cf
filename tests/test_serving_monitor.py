"""GPU monitor and GPU selection of serving benchmarks (magpie/serving/gpus.py), with a stand-in NVML module
(the hardware is what the double replaces): the sampling thread started and stopped around the run, the
aggregation, idle-GPU selection from NVML and from recorded nvidia-smi CSV, pinning, the one-line errors, and
the report's gpu_monitor / provenance.gpu_allocation on a run with the stand-in engine."""

import json
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from magpie.cli import main
from magpie.serving import gpus
from magpie.serving import runner as runner_mod
from magpie.serving.gpus import GpuError, GpuMonitor, GpuState, NvmlSampler, allocate, parse_smi, select_idle
from magpie.serving.runner import REPORT, run_benchmark

MiB = 2**20


class FakeNvml:
    """pynvml's calls the module makes, over scripted devices: each reading advances a device's counters."""

    NVML_CLOCK_SM, NVML_CLOCK_MEM, NVML_TEMPERATURE_GPU = 0, 1, 0

    def __init__(self, devices):
        self.devices = devices  # list of dicts: total, free, procs, sm (list of clocks, cycled), power_mw, temp
        self.calls = {}
        self.shutdowns = 0
        self.sampling_threads = set()

    def _count(self, name):
        self.calls[name] = self.calls.get(name, 0) + 1

    def nvmlInit(self):
        self._count("init")

    def nvmlShutdown(self):
        self.shutdowns += 1

    def nvmlDeviceGetCount(self):
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, i):
        if not 0 <= i < len(self.devices):
            raise RuntimeError("NVML_ERROR_INVALID_ARGUMENT")
        return i

    def nvmlDeviceGetUUID(self, h):
        return f"GPU-{h}".encode()

    def nvmlDeviceGetMemoryInfo(self, h):
        d = self.devices[h]
        return SimpleNamespace(total=d["total"] * MiB, free=d["free"] * MiB, used=(d["total"] - d["free"]) * MiB)

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        return [SimpleNamespace(pid=p) for p in range(self.devices[h].get("procs", 0))]

    def nvmlDeviceGetClockInfo(self, h, kind):
        self.sampling_threads.add(threading.current_thread().name)
        d = self.devices[h]
        if kind == self.NVML_CLOCK_MEM:
            return d.get("mem", 2619)
        n = d.setdefault("_n", 0)
        d["_n"] = n + 1
        return d["sm"][n % len(d["sm"])]

    def nvmlDeviceGetPowerUsage(self, h):
        return self.devices[h]["power_mw"]

    def nvmlDeviceGetTemperature(self, h, kind):
        return self.devices[h]["temp"]


def two_gpus(**first):
    return FakeNvml(
        [
            {"total": 1000, "free": 990, "sm": [1000, 2000], "power_mw": 300_000, "temp": 50, **first},
            {"total": 1000, "free": 500, "sm": [1500], "power_mw": 100_000, "temp": 40},
        ]
    )


class ListSampler:
    """Readings from a list, one per call; raises where the list holds an exception."""

    source = "test"
    indices = [0]

    def __init__(self, readings):
        self.readings = list(readings)
        self.closed = False

    def sample(self):
        item = self.readings.pop(0) if len(self.readings) > 1 else self.readings[0]
        if isinstance(item, Exception):
            raise item
        return [item]

    def close(self):
        self.closed = True


def test_nvml_sampler_reads_every_metric_of_each_device():
    nvml = two_gpus()
    readings = NvmlSampler(nvml).sample()
    assert readings[0] == {
        "sm_clock_mhz": 1000,
        "mem_clock_mhz": 2619,
        "power_w": 300.0,
        "temperature_c": 50,
        "memory_used_mib": 10.0,
    }
    assert readings[1]["memory_used_mib"] == 500.0 and readings[1]["power_w"] == 100.0
    assert NvmlSampler(nvml, [1]).sample()[0]["sm_clock_mhz"] == 1500


def test_monitor_samples_in_a_thread_between_start_and_stop():
    nvml = two_gpus()
    mon = GpuMonitor(NvmlSampler(nvml, [0]), interval_s=0.01)
    assert not mon.running()
    with mon:
        assert mon.running()
        deadline = time.monotonic() + 5
        while len(mon.readings) < 5 and time.monotonic() < deadline:
            time.sleep(0.01)
    assert not mon.running() and nvml.shutdowns == 1
    n = len(mon.readings)
    time.sleep(0.05)
    assert len(mon.readings) == n  # nothing sampled after the stop
    assert "magpie-gpu-monitor" in nvml.sampling_threads
    s = mon.summary()
    assert s["samples"] == n >= 5 and s["source"] == "nvml" and s["interval_s"] == 0.01 and s["devices"] == [0]
    assert s["sm_clock_mhz"]["min"] == 1000 and s["sm_clock_mhz"]["max"] == 2000
    assert 1000 < s["sm_clock_mhz"]["avg"] < 2000
    assert s["power_w"] == {"min": 300.0, "max": 300.0, "avg": 300.0}
    assert s["duration_s"] > 0


def test_aggregation_pools_devices_and_keeps_each_device():
    nvml = two_gpus()
    mon = GpuMonitor(NvmlSampler(nvml), interval_s=100)  # the start's and the stop's readings only
    mon.start()
    summary = mon.stop()
    assert summary["samples"] == 2 and summary["devices"] == [0, 1]
    assert summary["power_w"] == {"min": 100.0, "max": 300.0, "avg": 200.0}
    assert summary["per_device"]["1"]["temperature_c"] == {"min": 40, "max": 40, "avg": 40}
    assert summary["per_device"]["0"]["sm_clock_mhz"] == {"min": 1000, "max": 2000, "avg": 1500}


def test_failed_readings_are_counted_not_fatal():
    good = {"sm_clock_mhz": 1980, "power_w": 500.0}
    sampler = ListSampler([RuntimeError("NVML_ERROR_GPU_IS_LOST"), good])
    mon = GpuMonitor(sampler, interval_s=100).start()
    s = mon.stop()
    assert s["failed_samples"] == 1 and s["samples"] == 1 and "GPU_IS_LOST" in s["first_error"]
    assert s["sm_clock_mhz"]["avg"] == 1980 and "temperature_c" not in s and sampler.closed


def test_interval_must_be_positive():
    with pytest.raises(ValueError):
        GpuMonitor(ListSampler([{}]), interval_s=0)


def test_idle_gpus_from_nvml():
    states = gpus.nvml_states(
        FakeNvml(
            [
                {"total": 80000, "free": 79000},
                {"total": 80000, "free": 79000, "procs": 2},
                {"total": 80000, "free": 30000},
                {"total": 80000, "free": 80000},
            ]
        )
    )
    assert [s.uuid for s in states] == ["GPU-0", "GPU-1", "GPU-2", "GPU-3"]
    assert select_idle(states, 2) == [0, 3]
    assert select_idle(states, 3, min_free_fraction=0.3) == [0, 2, 3]
    with pytest.raises(GpuError) as err:
        select_idle(states, 3)
    msg = str(err.value)
    assert "\n" not in msg and "3 idle GPUs needed (TP 3), 2 of 4 idle" in msg
    assert "1 (2 compute processes)" in msg and "2 (30000 of 80000 MiB free)" in msg


# nvidia-smi --query-gpu=index,uuid,memory.total,memory.free --format=csv,noheader,nounits (recorded, H200 x4)
SMI_GPUS = """0, GPU-1b3e0c52-93a4-4f1c-8e0f-5a9cbb0d1a01, 143771, 143252
1, GPU-7c2d1e88-0b6f-4d2a-9f4c-3e8a2b9c7d02, 143771, 12044
2, GPU-a8f9b0c1-2d3e-4f5a-8b6c-7d8e9f0a1b03, 143771, 143252
3, GPU-c0d1e2f3-a4b5-4c6d-8e7f-8091a2b3c404, 143771, 143252
"""
# nvidia-smi --query-compute-apps=gpu_uuid,pid,used_memory --format=csv,noheader,nounits
SMI_APPS = """GPU-7c2d1e88-0b6f-4d2a-9f4c-3e8a2b9c7d02, 81234, 131072
GPU-a8f9b0c1-2d3e-4f5a-8b6c-7d8e9f0a1b03, 90211, 512
"""


def test_idle_gpus_from_nvidia_smi_csv():
    states = parse_smi(SMI_GPUS, SMI_APPS)
    assert [(s.index, s.processes) for s in states] == [(0, 0), (1, 1), (2, 1), (3, 0)]
    assert select_idle(states, 2) == [0, 3]
    assert parse_smi("", "") == [] and parse_smi("0, GPU-x, [N/A], [N/A]\n", "") == []


def test_smi_states_runs_both_queries(monkeypatch):
    monkeypatch.setattr(gpus.shutil, "which", lambda name: "/usr/bin/nvidia-smi")
    asked = []

    def fake_run(cmd, **kw):
        asked.append(cmd[1])
        out = SMI_GPUS if cmd[1].startswith("--query-gpu") else SMI_APPS
        return SimpleNamespace(returncode=0, stdout=out)

    states = gpus.smi_states(run=fake_run)
    assert len(states) == 4 and asked == [gpus.SMI_GPU_QUERY[0], gpus.SMI_APPS_QUERY[0]]


def _states(found, source="nvml"):
    return lambda: (found, source, "")


def test_allocate_picks_idle_gpus_and_sets_the_variables():
    found = parse_smi(SMI_GPUS, SMI_APPS)
    updates, alloc = allocate({}, 2, environ={}, states=_states(found, "nvidia-smi"))
    assert updates == {"CUDA_VISIBLE_DEVICES": "0,3", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    assert alloc["mode"] == "auto" and alloc["devices"] == [0, 3] and alloc["idle"] == 2 and alloc["total"] == 4
    assert alloc["uuids"][0].startswith("GPU-1b3e")
    updates, _ = allocate({}, 1, environ={}, states=_states([GpuState(0, 100, 100, 0)], "amdsmi"))
    assert updates == {"HIP_VISIBLE_DEVICES": "0"}


def test_allocate_keeps_pinned_gpus_and_checks_tp():
    never = lambda: pytest.fail("a pinned allocation asks no GPU")  # noqa: E731
    updates, alloc = allocate({"CUDA_VISIBLE_DEVICES": "2,3"}, 2, environ={}, states=never)
    assert updates == {} and alloc == {"mode": "pinned", "variable": "CUDA_VISIBLE_DEVICES", "devices": [2, 3]}
    _, alloc = allocate({}, 1, environ={"HIP_VISIBLE_DEVICES": "1"}, states=never)
    assert alloc["devices"] == [1]
    with pytest.raises(GpuError, match=r"TP 4 needs 4 GPUs, but CUDA_VISIBLE_DEVICES=0,1 pins 2"):
        allocate({"CUDA_VISIBLE_DEVICES": "0,1"}, 4, environ={}, states=never)


def test_allocate_without_a_gpu_is_none_with_the_reason():
    updates, alloc = allocate({}, 1, environ={}, states=lambda: ([], "", "no GPU found (no nvidia-smi)"))
    assert updates == {} and alloc == {"mode": "none", "devices": [], "reason": "no GPU found (no nvidia-smi)"}


def test_not_enough_idle_gpus_is_one_line_from_the_cli(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("HIP_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("ROCR_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(gpus, "gpu_states", _states(parse_smi(SMI_GPUS, SMI_APPS)))
    model = tmp_path / "model"
    model.mkdir()
    code = main(["benchmark", "vllm", "-m", str(model), "--tp", "4", "-o", str(tmp_path / "ws")])
    err = capsys.readouterr().err
    assert code == 1 and err.count("\n") == 1 and "4 idle GPUs needed (TP 4), 2 of 4 idle" in err
    report = json.loads((tmp_path / "ws" / REPORT).read_text())
    assert report["success"] is False and report["provenance"]["gpu_allocation"]["mode"] == "auto"


def test_gpus_flag_must_be_indices(tmp_path, capsys):
    code = main(["benchmark", "vllm", "-m", "x/y", "--gpus", "0,a", "-o", str(tmp_path / "ws")])
    assert code == 2 and "--gpus: expected device indices" in capsys.readouterr().err


def test_no_gpu_means_a_null_monitor_with_the_reason(monkeypatch):
    monkeypatch.setattr(gpus, "load_nvml", lambda: (None, "pynvml is not installed"))
    monkeypatch.setattr(gpus, "load_amdsmi", lambda: (None, "amdsmi is not installed"))
    sampler, why = gpus.open_sampler()
    assert sampler is None and why == "no GPU to monitor (pynvml is not installed; amdsmi is not installed)"


def test_a_run_records_monitor_and_allocation(tmp_path, monkeypatch):
    """The stand-in engine's run (tests/fixtures/serving/fake_engine.py) with the fake NVML: the monitor runs
    during the load only, the allocation picks the idle GPU and reaches the server's environment."""
    from test_serving_local import Fake, cfg

    for name in gpus.PIN_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    nvml = two_gpus()
    monkeypatch.setattr(runner_mod._engines, "get", lambda name: Fake())
    monkeypatch.setattr(gpus, "load_nvml", lambda: (nvml, ""))
    monkeypatch.setattr(gpus, "smi_states", lambda: pytest.fail("NVML answered"))
    started = []
    real_start = GpuMonitor.start
    monkeypatch.setattr(GpuMonitor, "start", lambda self: started.append(self) or real_start(self))
    r = run_benchmark(cfg(tmp_path, "--child", gpu_monitor_interval_s=0.01))
    assert r.success, r.errors
    saved = json.loads((Path(r.workspace_dir) / REPORT).read_text())
    mon = saved["gpu_monitor"]
    assert mon["source"] == "nvml" and mon["devices"] == [0] and mon["samples"] >= 2
    assert mon["sm_clock_mhz"]["max"] == 2000 and saved["gpu_monitor_reason"] is None
    assert len(started) == 1 and not started[0].running()
    alloc = saved["provenance"]["gpu_allocation"]
    assert alloc["mode"] == "auto" and alloc["devices"] == [0] and alloc["source"] == "nvml"
    env = saved["provenance"]["environment"]
    assert env["CUDA_VISIBLE_DEVICES"] == "0" and env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    prov = saved["provenance"]
    assert prov["magpie_version"] and prov["hostname"] and prov["platform"] and prov["command_line"]


def test_a_cpu_run_says_why_there_is_no_monitor(tmp_path, monkeypatch):
    from test_serving_local import Fake, cfg

    for name in gpus.PIN_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(runner_mod._engines, "get", lambda name: Fake())
    monkeypatch.setattr(gpus, "load_nvml", lambda: (None, "pynvml is not installed"))
    monkeypatch.setattr(gpus, "load_amdsmi", lambda: (None, "amdsmi is not installed"))
    monkeypatch.setattr(gpus, "smi_states", lambda: None)
    r = run_benchmark(cfg(tmp_path, "--child"))
    assert r.success and r.gpu_monitor is None and r.gpu_monitor_reason.startswith("no GPU to monitor")
    assert r.provenance.gpu_allocation["mode"] == "none"


def test_hub_revision_from_the_local_cache(tmp_path):
    from magpie.serving.report import hub_revision

    ref = tmp_path / "hub" / "models--org--name" / "refs"
    ref.mkdir(parents=True)
    (ref / "main").write_text("0123abcd\n")
    assert hub_revision("org/name", environ={"HF_HUB_CACHE": str(tmp_path / "hub")}) == "0123abcd"
    assert hub_revision("org/other", environ={"HF_HUB_CACHE": str(tmp_path / "hub")}) is None
    assert hub_revision(str(tmp_path), environ={}) is None


def test_gpu_states_falls_back_from_nvml_to_nvidia_smi_then_none(monkeypatch):
    broken = FakeNvml([])
    broken.nvmlDeviceGetCount = lambda: (_ for _ in ()).throw(RuntimeError("NVML_ERROR_UNINITIALIZED"))
    monkeypatch.setattr(gpus, "load_nvml", lambda: (broken, ""))
    monkeypatch.setattr(gpus, "smi_states", lambda: parse_smi(SMI_GPUS, SMI_APPS))
    found, source, _ = gpus.gpu_states()
    assert source == "nvidia-smi" and len(found) == 4 and broken.shutdowns == 1
    monkeypatch.setattr(gpus, "load_nvml", lambda: (two_gpus(), ""))
    assert gpus.gpu_states()[1] == "nvml"
    monkeypatch.setattr(gpus, "load_nvml", lambda: (broken, ""))
    monkeypatch.setattr(gpus, "smi_states", lambda: None)
    monkeypatch.setattr(gpus.shutil, "which", lambda name: None)
    monkeypatch.setattr(gpus, "load_amdsmi", lambda: (None, "amdsmi is not installed"))
    found, source, reason = gpus.gpu_states()
    assert (
        found == []
        and source == ""
        and reason == ("no GPU found (NVML: NVML_ERROR_UNINITIALIZED; no nvidia-smi; amdsmi is not installed)")
    )


def test_open_sampler_uses_nvml_and_says_why_it_cannot(monkeypatch):
    monkeypatch.setattr(gpus, "load_nvml", lambda: (two_gpus(), ""))
    sampler, why = gpus.open_sampler([1])
    assert isinstance(sampler, NvmlSampler) and sampler.indices == [1] and why == ""
    nvml = two_gpus()
    monkeypatch.setattr(gpus, "load_nvml", lambda: (nvml, ""))
    monkeypatch.setattr(gpus, "load_amdsmi", lambda: (None, "amdsmi is not installed"))
    sampler, why = gpus.open_sampler([5])  # no such device
    assert sampler is None and why.startswith("no GPU to monitor (NVML: ") and nvml.shutdowns == 1
