"""Which clock regime a GPU timing ran in (issue 37.8): SM and memory clocks, power and throttle
reasons read through NVML (ctypes on libnvidia-ml.so.1) over each measurement, shown with the
timing; on the CPU, or without NVML, every figure is null and the record says why. The GPU tests
run on the H200 (`pytest -m gpu`); here, the absent path, the record and where it is shown."""

import ctypes
import json
import time
from pathlib import Path

import pytest
from conftest import FIXTURES, relu2_report

from magpie.cli.compare import table
from magpie.harness.clocks import ClockRegime, ClockSampler, clock_text, open_device, summarise
from magpie.report.models import PerformanceResult


def nvml_present() -> bool:
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return False
    return True


def test_a_cpu_timing_reads_no_clocks_and_says_why():
    sampler = ClockSampler.for_device("cpu", 0)
    with sampler:
        time.sleep(0.05)
    record = ClockRegime.model_validate(sampler.regime())
    assert record.source is None and record.readings == 0 and "cpu" in record.reason
    assert record.sm_clock_mhz is None and record.power_w is None and record.throttle_reasons == {}
    assert clock_text(record.model_dump()).startswith("clocks not read: the device is cpu")


@pytest.mark.skipif(nvml_present(), reason="NVML is installed here: the absent path cannot be taken")
def test_without_nvml_a_gpu_timing_stands_and_its_clocks_say_why():
    nvml, reason = open_device("cuda:0", 0)
    assert nvml is None and "libnvidia-ml.so.1" in reason
    sampler = ClockSampler.for_device("cuda:0", 0, "GPU-0")
    with sampler:
        pass
    record = sampler.regime()
    assert record["readings"] == 0 and record["sm_clock_mhz"] is None and "libnvidia-ml.so.1" in record["reason"]


def test_readings_are_summarised_as_spreads_and_the_share_of_each_throttle_reason():
    """Readings as NVML gives them (a power-capped GEMM: boost, then held under its power limit)."""
    readings = [
        {"sm_clock_mhz": 1980, "mem_clock_mhz": 3201, "power_w": 410.0, "temperature_c": 41, "throttle_mask": 0x0},
        {"sm_clock_mhz": 1755, "mem_clock_mhz": 3201, "power_w": 698.5, "temperature_c": 47, "throttle_mask": 0x4},
        {"sm_clock_mhz": 1650, "mem_clock_mhz": 3201, "power_w": 700.2, "temperature_c": 49, "throttle_mask": 0x4},
        {"sm_clock_mhz": 1980, "mem_clock_mhz": 3201, "power_w": 120.0, "temperature_c": 45, "throttle_mask": 0x1},
        {"sm_clock_mhz": None, "mem_clock_mhz": None, "power_w": None, "temperature_c": None, "throttle_mask": None},
    ]
    limits = {
        "max_sm_clock_mhz": 1980.0,
        "min_sm_clock_mhz": 345.0,
        "max_mem_clock_mhz": 3201.0,
        "power_limit_w": 700.0,
    }
    record = summarise(readings, limits, "burst", 0.02, 0.1)
    assert record.readings == 5 and record.sm_clock_mhz.min == 1650 and record.sm_clock_mhz.max == 1980
    assert record.sm_clock_mhz.median == (1755 + 1980) / 2 and record.mem_clock_mhz.min == 3201
    assert record.throttle_reasons == {"sw_power_cap": 0.5, "gpu_idle": 0.25}
    text = clock_text(record.model_dump())
    assert "SM 1,868 MHz (1,650–1,980) of 1,980 max" in text and "memory 3,201 MHz" in text
    assert "of 700 W limit" in text and "throttled: sw_power_cap 50%" in text and "gpu_idle" not in text
    assert text.endswith("5 readings over 0.10 s, burst")
    # the report's model checks the record where a timing carries it
    perf = {"median_us": 1.0, "p20_us": 1.0, "p80_us": 1.0, "min_us": 1.0, "mean_us": 1.0, "n": 1, "cv": 0.0}
    checked = PerformanceResult.model_validate({**perf, "method": "m", "clocks": record.model_dump()})
    assert checked.clocks.sm_clock_mhz.max == 1980
    with pytest.raises(ValueError):
        PerformanceResult.model_validate({**perf, "method": "m", "clocks": {"regime": "warm", "source": None}})


@pytest.mark.slow  # builds the shared twin project where no other test has
def test_a_cpu_build_records_why_its_clocks_were_not_read_and_every_report_says_so(twin_build):
    report = json.loads((Path(twin_build) / "workspaces/reports/relu2/compare_report.json").read_text())
    for row in report["results"]:
        for role in ("performance_result", "baseline_result"):
            clocks = (row.get(role) or {}).get("clocks")
            if row.get(role):
                assert clocks["readings"] == 0 and clocks["reason"] == "the device is cpu: no GPU clocks to read"
    assert "GPU clocks: clocks not read: the device is cpu" in table(report)
    summary = (Path(twin_build) / "workspaces/reports/summary.md").read_text()
    assert "GPU clocks: clocks not read: the device is cpu" in summary
    html = (Path(twin_build) / "workspaces/reports/report.html").read_text()
    assert 'class="method clocks"' in html and "clocks not read: the device is cpu" in html


# -- on the H200 -------------------------------------------------------------------------------
@pytest.mark.gpu
def test_clocks_are_read_through_a_gemm_and_lie_within_what_nvml_reports():
    import torch

    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    uuid = f"GPU-{torch.cuda.get_device_properties(0).uuid}"
    sampler = ClockSampler.for_device("cuda:0", 0, uuid)
    with sampler:
        end = time.monotonic() + 0.5
        while time.monotonic() < end:
            a @ a
        torch.cuda.synchronize()
    record = ClockRegime.model_validate(sampler.regime())
    assert record.source == "nvml" and record.readings >= 10, record
    sm, mem = record.sm_clock_mhz, record.mem_clock_mhz
    assert 0 < sm.min <= sm.median <= sm.max <= record.max_sm_clock_mhz
    if record.min_sm_clock_mhz is not None:  # P0's floor: a GEMM keeps the board in P0
        assert record.min_sm_clock_mhz <= sm.median
    assert 0 < mem.max <= record.max_mem_clock_mhz
    assert 0 < record.power_w.max <= 1.1 * record.power_limit_w


@pytest.mark.gpu
def test_a_gpu_timing_shows_the_clocks_it_ran_at(tmp_path):
    """The baseline and a copy of it timed on the GPU: each timing (both roles) carries the clocks
    its measurements ran at, within the ceilings NVML reports, and the compare table shows them."""
    sources = {"twin": (FIXTURES / "adversarial/good.py").read_text()}
    report = relu2_report(tmp_path, ["twin"], "[[4096, 4096]]", jobs=1, sources=sources, device="cuda")
    for row in report["results"]:
        for role in ("performance_result", "baseline_result"):
            if row.get(role) is None:
                continue
            clocks = ClockRegime.model_validate(row[role]["clocks"])
            assert clocks.source == "nvml" and clocks.readings >= 2 and clocks.regime == "burst", clocks
            assert 0 < clocks.sm_clock_mhz.min <= clocks.sm_clock_mhz.max <= clocks.max_sm_clock_mhz
    assert "GPU clocks, twin: SM " in table(report)
