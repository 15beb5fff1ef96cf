"""Timing the candidate can't fake: a time under the device's roofline floor is impossible, and a
speedup above `implausible_speedup` is timed again on fresh inputs: labelled where it holds,
the timing failed where it does not."""

import json

import pytest
from conftest import SPIN_SOURCE, build_json, kernel_table, project_toml, relu2_report

from magpie.harness.measurement import FLOOR_TOLERANCE, implausible_speedup, roofline_floor

# The baseline does 2 ms of work a call more: an honest candidate is 20x+ faster.
SLOW_BASELINE = (
    SPIN_SOURCE
    + """

def kernel(x):
    spin(0.002)
    return torch.relu(x) * 2.0
"""
)
HONEST = """
import torch


def kernel(x):
    return torch.relu(x) * 2.0
"""
# Fast for its first 70 calls, as slow as the baseline after: the checks (one trial), the first
# call and the first measurement's 60 samples fit in them, the re-timing does not.
COUNTS_CALLS = (
    SPIN_SOURCE
    + """
_calls = [0]


def kernel(x):
    _calls[0] += 1
    if _calls[0] > 70:
        spin(0.002)
    return torch.relu(x) * 2.0
"""
)


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    root = tmp_path_factory.mktemp("implausible")
    # 3 rounds of at most 20 samples each (max_reps), no warm-up: a call count fixed in advance
    report = relu2_report(
        root,
        ["honest", "counts_calls"],
        shapes="[[8, 128]]",
        defaults="trials = 1",
        baseline="slow",
        timing="warmup_ms = 0\nbudget_ms = 90\nrounds = 3\nmax_reps = 60",
        sources={"slow": SLOW_BASELINE, "honest": HONEST, "counts_calls": COUNTS_CALLS},
    )
    return {row["implementation"]: row for row in report["results"]}, report


def _left_inconclusive_by_a_busy_machine(row: dict) -> bool:
    """On a loaded machine an honest implausible speedup whose calls made alone drew no bound is left
    inconclusive (re-measured by the next build), never failed: the outcome a busy machine may give."""
    return row["performance_state"] == "INCONCLUSIVE" and any(
        e.startswith("inconclusive: machine busy") for e in row["errors"]
    )


def test_an_honest_implausible_speedup_is_retimed_confirmed_labelled_and_ranked(report):
    rows, whole = report
    row = rows["honest"]
    if _left_inconclusive_by_a_busy_machine(row):
        pytest.xfail(f"the machine was busy: {row['errors'][0][:120]}")
    assert row["performance_state"] == "SUCCESS", row["errors"]
    speedup = row["speedup"]
    assert speedup["value"] > 10
    label = speedup["implausible"]
    assert label["threshold"] == 10 and label["confirmed"] is True and label["retimed"] > 10
    # labelled (an honest 5 µs kernel's 60 samples may also be flagged uneven by one preemption)
    assert "implausible_speedup" in [f["kind"] for f in row["flags"]]
    assert any("re-timed on fresh inputs" in w and "confirmed" in w for w in row["warnings"])
    assert whole["ranking"][0] == "honest" and whole["best"] == "honest"


def test_a_candidate_fast_only_for_its_first_calls_is_not_credited(report):
    """Fast for its first 70 calls: with per-call samples its first measurement fitted in them
    and only the re-timing found it out ("speedup not reproducible", the decision tested below);
    on the CPU the batches that size the measurement already run past them."""
    rows, whole = report
    row = rows["counts_calls"]
    if row["performance_state"] == "FAILED":
        assert any("speedup not reproducible" in e for e in row["errors"]), row["errors"]
    else:
        assert row["speedup"]["value"] < 10 and "implausible" not in row["speedup"]
    if _left_inconclusive_by_a_busy_machine(rows["honest"]):
        pytest.xfail("the machine was busy: the honest candidate is not ranked until it is re-measured")
    assert whole["ranking"][0] == "honest"


H200 = 4.8  # TB/s


def test_a_time_under_the_roofline_floor_is_impossible():
    # 12 MB at 4.8 TB/s: 2.5 µs
    kind, line = roofline_floor(1.2, 12_000_000, H200, "H200")
    assert kind == "impossible"
    assert line == (
        "1.20 µs is below the 2.50 µs it takes to move its 12.0 MB of inputs and outputs once at 4.8 TB/s (H200)"
    )


def test_the_floor_keeps_a_tolerance_and_says_a_measured_peak():
    floor_us = 12_600_000 / (H200 * 1e12) * 1e6
    assert roofline_floor(floor_us * 1.01, 12_600_000, H200, "H200") is None
    # just under the floor, inside the tolerance: a flag, not a failure
    assert roofline_floor(floor_us * 0.95, 12_600_000, H200, "H200")[0] == "flag"
    limit = FLOOR_TOLERANCE * floor_us - 0.5
    assert roofline_floor(limit * 1.01, 12_600_000, H200, "H200")[0] == "flag"
    kind, line = roofline_floor(limit * 0.99, 12_600_000, 4.1, "H200", measured=True)
    assert kind == "impossible" and "4.1 TB/s (H200, measured by magpie calibrate)" in line
    assert roofline_floor(0.1, 0, H200, "H200") is None


def test_what_the_l2_may_hold_is_not_counted_in_the_floor():
    # 80 MB, of which 40 MB of outputs a flushed L2 of 50 MB may keep unwritten: 40 MB must move
    assert roofline_floor(10.0, 80_000_000, H200, "H200", cached_bytes=40_000_000)[0] == "flag"
    kind, line = roofline_floor(5.0, 80_000_000, H200, "H200", cached_bytes=40_000_000)
    assert kind == "impossible" and "40.0 MB of its 80.0 MB" in line and "8.33 µs" in line
    # all of it may sit in a warm L2: never impossible
    assert roofline_floor(0.01, 30_000_000, H200, "H200", cached_bytes=50_000_000)[0] == "flag"


def _speedup(value, low, high):
    return {"value": value, "ci_low": low, "ci_high": high}


@pytest.mark.parametrize(
    "second, confirmed",
    [
        (_speedup(50.0, 45.0, 56.0), True),  # the same
        (_speedup(12.0, 11.0, 13.0), True),  # disagrees, but still above the threshold
        (_speedup(9.5, 8.0, 11.0), True),  # under the threshold, its interval meets the first's
        (_speedup(1.1, 1.0, 1.2), False),  # not reproducible
    ],
)
def test_implausible_speedup_decision(second, confirmed):
    first = _speedup(54.0, 48.0, 60.0) if second["value"] != 9.5 else _speedup(10.5, 10.1, 10.9)
    label, line = implausible_speedup(first, second, 10.0)
    assert label["confirmed"] is confirmed and label["threshold"] == 10.0 and label["retimed"] == second["value"]
    if not confirmed:
        assert line.startswith("speedup not reproducible: 54x then 1.1x")


COPY_SPEC = """
import torch


def make_inputs(shape, dtype, generator):
    return (torch.randn(shape, generator=generator, dtype=torch.float32).to(dtype),)


def reference(x):
    return x.clone()
"""


@pytest.mark.gpu
@pytest.mark.parametrize("vouched", [False, True], ids=["worker_timer", "vouched"])
def test_on_the_gpu_an_output_that_aliases_its_input_is_an_impossible_time(tmp_path, vouched):
    (tmp_path / "spec.py").write_text(COPY_SPEC)
    files = {
        "clones": "def kernel(x):\n    return x.clone()\n",
        "copies": "import torch\n\ndef kernel(x):\n    return torch.empty_like(x).copy_(x)\n",
        # correct, and moves nothing: under the time 64 MB in and 64 MB out take, whatever the L2 holds
        "aliases": "def kernel(x):\n    return x\n",
    }
    for name, text in files.items():
        (tmp_path / f"{name}.py").write_text(text)
    (tmp_path / "magpie.toml").write_text(
        project_toml(
            kernel_table("copy", "clones", ["copies", "aliases"], shapes="[[4096, 4096]]"),
            name="copy",
            device="cuda",
            defaults="trials = 1",
            timing=f"warmup_ms = 10\nbudget_ms = 60\nrounds = 3\nvouched = {str(vouched).lower()}",
        )
    )
    assert build_json(tmp_path, "-j", "1")["failed"] == []
    report = json.loads((tmp_path / "workspaces/reports/copy/compare_report.json").read_text())
    rows = {row["implementation"]: row for row in report["results"]}
    aliases = rows["aliases"]
    assert aliases["performance_state"] == "FAILED"
    assert "impossible_time" in [f["kind"] for f in aliases["failures"]]
    assert any(
        e.startswith("candidate: ") and e.endswith("(H200): impossible, not ranked") for e in aliases["errors"]
    ), aliases["errors"]
    copies = rows["copies"]
    assert copies["performance_state"] == "SUCCESS", copies["errors"]
    assert "impossible_time" not in [f["kind"] for f in copies["flags"]]
    assert "aliases" not in report["ranking"] and "copies" in report["ranking"]
