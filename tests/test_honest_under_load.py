"""No false accusation from load: honest implementations judged beside CPU hogs are never FAILED,
and a batch of calls done together is still caught there. What is taken off each call for the
harness (the copy of its outputs into their slots) is priced on the workers' one thread, in the
same rounds, and never more than half a call; a failure a busy machine may have caused is
measured again, and if the machine stays busy, is inconclusive rather than FAILED."""

import json
import shutil
import subprocess
import sys

import pytest
from conftest import FIXTURES, QUICK_TIMING, build_json, kernel_table, project_toml

from magpie.harness.measurement import (
    ALONE_FAIL,
    BUSY_DOUBT_ALONE,
    BUSY_WAIT_SHARE,
    HARNESS_CAP,
    LAUNCH_FLOOR,
    alone_bound,
    harness_taken_off,
    unvouched_on_a_busy_machine,
)
from magpie.harness.rounds import Rounds

HOGS = 3


@pytest.fixture(scope="module")
def rows(tmp_path_factory):
    """One build beside HOGS CPU hogs. On 64x1024 float outputs (256 KiB, which torch copies on
    two threads where it may) the copy the evaluator priced on its own default of a thread a
    CPU read 2.9 ms a call beside two CPU hogs, and the honest calls it was taken off read
    0.001 µs and failed the launch floor. On 8x8 sets a batch's calls done together save nearly
    all of each call (on 64x1024 sets a few percent: 1.16x, within the noise of calls made alone
    beside the hogs)."""
    root = tmp_path_factory.mktemp("under_load")
    for name in ("good", "many_ops", "batches_its_calls", "spec"):
        shutil.copy(FIXTURES / "adversarial" / f"{name}.py", root / f"{name}.py")
    (root / "same.py").write_text((FIXTURES / "adversarial" / "good.py").read_text())
    (root / "magpie.toml").write_text(
        project_toml(
            kernel_table("wide", "good", ["same", "many_ops"], shapes="[[64, 1024]]"),
            kernel_table("small", "good", ["batches_its_calls"], shapes="[[8, 8]]"),
            name="under_load",
            defaults="trials = 1",
            timing=QUICK_TIMING,
        )
    )
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(HOGS)]
    try:
        assert build_json(root, "-j", "2")["failed"] == []
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    return {
        f"{kernel}/{row['implementation']}": row
        for kernel in ("wide", "small")
        for row in json.loads((root / f"workspaces/reports/{kernel}/compare_report.json").read_text())["results"]
    }


@pytest.mark.parametrize("name", ["wide/good", "wide/same", "wide/many_ops", "small/good"])
def test_honest_implementations_beside_cpu_hogs_are_never_failed(rows, name):
    row = rows[name]
    assert row["performance_state"] in ("SUCCESS", "INCONCLUSIVE"), row["errors"]
    result = row["performance_result"]
    if row["performance_state"] == "SUCCESS":
        # the copy's price, taken off each call, is under what a call costs with it
        assert result["harness_taken_off_us"] <= HARNESS_CAP * (result["median_us"] + result["harness_taken_off_us"])
        assert result["median_us"] > LAUNCH_FLOOR * result["harness_us_per_call"]


def test_a_batch_done_together_is_still_caught_beside_cpu_hogs(rows):
    row = rows["small/batches_its_calls"]
    assert row["performance_state"] == "FAILED", (row["performance_state"], row.get("speedup"))
    assert "calls_done_together" in [f["kind"] for f in row["failures"]]


def test_what_is_taken_off_for_the_harness_never_exceeds_half_a_call():
    measured = Rounds(["baseline", "candidate"], vouched=True)
    measured.harness_ns = 30_000  # a price a busy machine inflated: over the calls themselves
    for ns in (20_000, 22_000, 21_000):
        measured.add_batch("candidate", 0, ns * 10, 10, 0.001)
    for ns in (80_000, 81_000):
        measured.add_batch("baseline", 0, ns * 10, 10, 0.001)
    measured.settle_samples(capped=True)
    assert measured.subtracted_ns == {"candidate": HARNESS_CAP * 21_000, "baseline": 30_000}
    assert measured.samples["candidate"] == [9_500, 11_500, 10_500]  # not 0.001 µs each
    assert measured.samples["baseline"] == [50_000, 51_000]
    # on a GPU the copy's price, from the evaluator's own events, is taken off whole
    assert harness_taken_off(30_000, 21_000, capped=False) == 30_000


def _failed_floor(measured: Rounds, role: str, in_doubt: bool) -> None:
    measured.failed[role] = {
        "passed": False,
        "check": "launch_floor",
        "kind": "calls_done_together",
        "where": "its batches",
        "detail": "a call read ...",
        "floor_in_doubt": in_doubt,
    }


def test_only_a_failure_near_its_limit_on_a_busy_machine_is_in_doubt():
    measured = Rounds(["baseline", "candidate"], vouched=True)
    _failed_floor(measured, "baseline", in_doubt=True)
    measured.cpu_wait_share = BUSY_WAIT_SHARE / 2
    assert measured.in_doubt() == []  # a quiet machine: the failure stands
    measured.cpu_wait_share = 0.5
    assert measured.in_doubt() == ["baseline: a call read ..."]
    measured.alone_bound = {"failed": True, "ratio": BUSY_DOUBT_ALONE - 0.1}
    assert len(measured.in_doubt()) == 2
    measured.alone_bound = {"failed": True, "ratio": BUSY_DOUBT_ALONE + 0.1}
    assert measured.in_doubt() == []  # calls made alone far over its batches: beyond doubt
    measured.alone_bound = {"failed": True, "ratio": ALONE_FAIL + 0.1}
    _failed_floor(measured, "candidate", in_doubt=False)  # read under its own copy: beyond doubt
    assert measured.in_doubt() == []
    measured.failed["candidate"] = {"passed": False, "check": "allclose", "kind": "allclose", "detail": "wrong"}
    assert measured.in_doubt() == []  # a wrong output is wrong on any machine


def test_a_bound_an_honest_candidate_read_beside_cpu_hogs_is_in_doubt_there():
    """Beside three CPU hogs an honest relu's baseline read 299 µs a call in batches and 70 in
    calls made alone, its identical candidate 73 in batches: a bound of 3.8x, which fails it on a
    quiet machine and leaves it in doubt on a busy one; a batch done together reads 9x and over."""
    pairs = {"candidate": [72_000, 71_000, 70_000, 73_000], "baseline": [70_000, 71_500, 69_000, 72_000]}
    bound = alone_bound(pairs, {"baseline": 299_000, "candidate": 73_000})
    assert bound["failed"] and ALONE_FAIL < bound["ratio"] < BUSY_DOUBT_ALONE, bound
    measured = Rounds(["baseline", "candidate"], vouched=True)
    measured.alone_bound, measured.cpu_wait_share = bound, 0.59
    assert measured.in_doubt()
    measured.alone_bound = alone_bound(pairs, {"baseline": 299_000, "candidate": 299_000 / 9.3})
    assert measured.in_doubt() == []


def test_an_implausible_speedup_whose_calls_alone_drew_no_bound_on_a_busy_machine_is_not_credited():
    """Beside four CPU hogs the calls made alone of a 2 ms call read short: the once-a-batch
    cheat's bound came out below zero and it was credited 270x. Such a speedup is inconclusive;
    one the calls alone vouch for, or one measured on a quiet machine, keeps its verdict."""
    nothing = {"lower_us": -1376.7}
    vouched = {"lower_us": 6.4}
    assert unvouched_on_a_busy_machine(True, True, nothing)
    assert unvouched_on_a_busy_machine(True, True, None)
    assert not unvouched_on_a_busy_machine(True, True, vouched)
    assert not unvouched_on_a_busy_machine(True, False, nothing)  # quiet: the bound's own verdict stands
    assert not unvouched_on_a_busy_machine(False, True, nothing)  # not reproducible: failed anyway


def test_the_harness_is_priced_on_the_workers_one_thread_whatever_the_machine_runs():
    """On torch's default of a thread a CPU a 256 KiB copy's calling thread spins at its end for
    the other thread, and counts the spin as its CPU time while that thread waits for a CPU: the
    price read 2.9 ms a call beside two CPU hogs. On the workers' one thread it stays near its
    price on a quieter machine."""
    import torch

    from magpie.harness.batches import HarnessPrice

    outputs = torch.randn(64, 1024)
    before = HarnessPrice(torch, outputs, 64).measure(3)
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        busy = HarnessPrice(torch, outputs, 64).measure(3)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    assert busy < 2 * before, (busy, before)
