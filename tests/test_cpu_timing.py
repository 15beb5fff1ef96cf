"""The CPU's vouched timing (magpie/harness/batches.py, regions.py): the region both sides see,
what a batch proves, how a busy machine's waits come off, and the worker timer kept for inputs a region
cannot hold."""

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest
import torch
from conftest import FIXTURES, build_json, copy_project, relu2_report

from magpie.harness import batches, regions
from magpie.linux import cputime


@pytest.fixture()
def pair(tmp_path):
    """An evaluator's region and the worker's views of the same file."""
    x = torch.randn(5, 7)
    region = regions.Region(torch, tmp_path, regions.Layout((x, 3), torch.relu(x) * 2, 8))
    views = batches.WorkerViews(torch, json.loads(json.dumps(region.offer())))  # as it travels
    yield region, views
    region.close()


def test_what_the_evaluator_writes_the_worker_calls_on_and_its_outputs_come_back(pair):
    region, views = pair
    sets = [(torch.randn(5, 7), 3) for _ in range(6)]
    region.write(sets)
    assert all(torch.equal(v[0], s[0]) and v[1] == 3 for v, s in zip(views.inputs, sets))
    batches.run_batch(torch, lambda x, k: torch.relu(x) * 2, views.inputs[:6], views.outputs[:6])
    region.read(6)
    assert region.unwritten(6) is None
    assert all(torch.equal(region.outputs(i)[0], torch.relu(sets[i][0]) * 2) for i in range(6))
    assert torch.equal(region.inputs(2)[0], sets[2][0]) and region.inputs(2)[1] == 3


def _batch_of_four(pair, called: int):
    """Four new input sets written, the first `called` of them called."""
    region, views = pair
    region.write([(torch.randn(5, 7), 3) for _ in range(4)])
    batches.run_batch(torch, lambda x, k: torch.relu(x) * 2, views.inputs[:called], views.outputs[:called])
    return region


def test_a_call_that_was_skipped_leaves_the_nan_its_slot_was_filled_with(pair):
    region = _batch_of_four(pair, 2)
    region.read(4)
    assert region.unwritten(4) == 2


def test_outputs_written_in_an_earlier_batch_do_not_count_for_the_next(pair):
    region = _batch_of_four(pair, 4)
    region.write([(torch.randn(5, 7), 3) for _ in range(4)])  # the next batch: nothing called
    region.read(4)
    assert region.unwritten(4) == 0


def test_the_first_unwritten_call_is_found_in_any_floating_output_of_several(tmp_path):
    """Slots of three outputs a call (fp32, int64, fp16): a NaN left in the fp16 output of call 5
    and the fp32 one of call 7 make call 5 the first unwritten; integer slots hold no NaN."""
    x = torch.randn(3, 4)
    outputs = (torch.randn(3, 4), torch.arange(5), torch.randn(7).half())
    region = regions.Region(torch, tmp_path, regions.Layout((x,), outputs, 9))
    views = batches.WorkerViews(torch, region.offer())
    region.write([(torch.randn(3, 4),) for _ in range(9)])
    batches.run_batch(torch, lambda x: outputs, views.inputs[:9], views.outputs[:9])
    views.outputs[7][0][1, 2] = float("nan")
    views.outputs[5][2][6] = float("nan")
    region.read(9)
    assert region.unwritten(9) == 5 and region.unwritten(5) is None and region.unwritten(8) == 5
    views.outputs[5][2][6] = 0.5
    region.read(9)
    assert region.unwritten(9) == 7


@pytest.mark.parametrize("cut", [0, 2, 7])  # bytes into call 1's slot: the fill is read back in step
def test_a_worker_that_shrinks_the_file_is_read_as_unwritten_not_a_fault_in_the_evaluator(pair, cut):
    region = _batch_of_four(pair, 4)
    os.truncate(region.path, region.layout.out_base + region.layout.out_stride + cut)
    region.read(4)
    assert region.unwritten(4) == 1


@pytest.mark.parametrize(
    "returned",
    [
        lambda x, k: (torch.relu(x), torch.relu(x)),  # two outputs for one slot
        lambda x, k: torch.relu(x).double(),  # another dtype
        lambda x, k: torch.relu(x)[:4],  # another shape
        lambda x, k: [1.0],  # not a tensor
    ],
)
def test_an_output_unlike_its_slot_stops_the_batch(pair, returned):
    region, views = pair
    region.write([(torch.randn(5, 7), 3)])
    with pytest.raises(batches.BatchOutputError):
        batches.run_batch(torch, returned, views.inputs[:1], views.outputs[:1])


def test_waits_come_off_the_wall_time_but_never_below_the_cpu_time_spent():
    # 10 ms of wall, 4 ms of it on a CPU, the calling thread waited 5 ms, the evaluator 1 ms
    assert batches.busy_wall_ns(10e6, 4e6, 5e6 + 1e6) == pytest.approx(4e6)
    # waits of 3 ms: all of them come off
    assert batches.busy_wall_ns(10e6, 4e6, 2e6 + 1e6) == pytest.approx(7e6)
    # a thread that says it waited 20 ms while others worked 9 ms: no less than the 9 ms of work
    assert batches.busy_wall_ns(10e6, 9e6, 20e6) == pytest.approx(9e6)
    # threads in parallel (more CPU time than wall): nothing comes off
    assert batches.busy_wall_ns(10e6, 30e6, 5e6 + 1e6) == pytest.approx(10e6)


def test_cpu_time_of_threads_and_processes_that_ended_still_counts():
    """A thread that ends keeps its time in its process's CPU clock; a child that ends counts
    in its parent once reaped (in clock ticks). Summing the live threads' own counters lost
    both (a candidate that did its work on a thread that ended was credited 9-10x)."""
    script = textwrap.dedent("""
        import os, sys, threading, time
        def burn(seconds):
            end = time.thread_time() + seconds
            while time.thread_time() < end:
                pass
        sys.stdin.readline()
        worker = threading.Thread(target=burn, args=(0.3,))
        worker.start(); worker.join()
        child = os.fork()
        if child == 0:
            burn(0.3)
            os._exit(0)
        os.waitpid(child, 0)
        print("done", flush=True)
        sys.stdin.readline()
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        time.sleep(0.3)
        before = cputime.TreeTimes(proc.pid, proc.pid)
        proc.stdin.write("go\n")
        proc.stdin.flush()
        assert proc.stdout.readline() == "done\n"
        after = cputime.TreeTimes(proc.pid, proc.pid)
        assert 0.55e9 < after.cpu_since(before) < 0.75e9
    finally:
        proc.kill()


def test_the_kernel_reports_a_spinning_processes_cpu_time_and_its_waits_under_a_hog():
    """On a CPU shared with a hog the spinner waits for it; its time on the CPU is what it did."""
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        for pid in (spinner.pid, hog.pid):
            subprocess.run(["taskset", "-p", "-c", "0", str(pid)], check=True, capture_output=True)
        before = cputime.TreeTimes(spinner.pid, spinner.pid)
        time.sleep(0.5)
        after = cputime.TreeTimes(spinner.pid, spinner.pid)
        on_cpu, waited = after.cpu_since(before), after.waiting - before.waiting
        assert on_cpu > 0.05e9 and waited > 0.05e9 and on_cpu + waited < 0.6e9
        assert cputime.process_named(os.getpid(), os.getpid()) == os.getpid()  # outside any sandbox: itself
        assert cputime.process_named(spinner.pid, 999_999_999) == spinner.pid  # nobody by that name: the root
    finally:
        spinner.kill()
        hog.kill()


TUPLE_SPEC = """
import torch


def make_inputs(shape, dtype, generator):
    return (torch.randn(shape, generator=generator), (0,))


def reference(x, dims):
    return torch.relu(x) * 2.0
"""


def test_a_vouched_measurement_says_where_its_wall_time_went(twin_build):
    """The timing result splits a vouched measurement's wall time into its steps (regions,
    pricing the harness, sizing the batches, the rounds, unmapping), and the rounds into their
    parts (drawing input sets, writing them, the requests, the checks, the calls made alone):
    what a GPU run needs to tell the evaluator's own costs from the budget's. Where the
    measurement was taken again (a baseline read off its own timing,
    `timing.disturbed_fraction`), the steps are the kept measurement's."""
    timing = next(
        json.loads(p.read_text())
        for p in (twin_build / "workspaces/store").glob("*/*/result.json")
        if json.loads(p.read_text()).get("task") == "timing:relu2/twin"
    )
    steps = timing["measurement_steps_s"]
    assert set(steps) == {"regions", "harness_price", "sizing", "rounds", "unmap"}, steps
    kept = timing["phases_s"]["remeasured" if timing.get("remeasured") else "timed"]
    assert all(v >= 0 for v in steps.values()) and sum(steps.values()) <= kept + 1e-3
    parts = timing["round_parts_s"]
    assert set(parts) == {"draw", "write", "request", "check", "alone"}, parts
    assert all(v >= 0 for v in parts.values()) and sum(parts.values()) <= steps["rounds"] + 1e-3


def test_inputs_a_region_cannot_hold_are_timed_by_the_worker_and_say_so(tmp_path):
    """A tuple argument is no tensor or plain value: the worker's timer, checked against the
    evaluator's wall clock, times it, and the method says which clock it was."""
    (tmp_path / "spec.py").write_text(TUPLE_SPEC)
    (tmp_path / "good.py").write_text("import torch\n\n\ndef kernel(x, dims):\n    return torch.relu(x) * 2.0\n")
    (tmp_path / "twin.py").write_text("import torch\n\n\ndef kernel(x, dims):\n    return torch.relu(x) * 2.0\n")
    report = relu2_report(tmp_path, ["twin"], shapes="[[33, 65]]")
    row = next(r for r in report["results"] if r["implementation"] == "twin")
    assert row["performance_state"] == "SUCCESS", row["errors"]
    assert "perf_counter_ns" in row["performance_result"]["method"]
    assert "clock" not in row["performance_result"]


ESCAPES_GROUP = """
import os
import time

import torch

if os.fork() == 0:  # a process of its own group: the SIGSTOP that holds the worker misses it
    os.setpgid(0, 0)
    while True:
        time.sleep(0.001)


def kernel(x):
    return torch.relu(x) * 2.0
"""


def test_a_process_that_left_the_workers_group_fails_the_timing(tmp_path):
    """It would run on while the worker is stopped and the next batch's inputs are written:
    free to read them early. Correct, but its time cannot be vouched for."""
    report = relu2_report(tmp_path, ["escapes"], shapes="[[33, 65]]", sources={"escapes": ESCAPES_GROUP})
    row = next(r for r in report["results"] if r["implementation"] == "escapes")
    assert row["correctness_state"] == "SUCCESS" and row["performance_state"] == "FAILED"
    assert any("kept running while it was stopped" in e for e in row["errors"]), row["errors"]


def test_vouched_gpu_timing_is_the_default_and_only_for_tensors_on_the_projects_device():
    """On a GPU too the evaluator's batches time by default (the worker's own timer can be
    forged); where they run, every argument and output lies on the device."""
    from magpie.harness.rounds import vouched_inputs
    from magpie.manifest.models import TimingSettings

    assert TimingSettings().timed_by == "evaluator"
    x = torch.ones(4)
    assert vouched_inputs(torch, (x, 2.0), x, "cpu")
    assert not vouched_inputs(torch, (x, 2.0), x, "cuda")  # CPU tensors for a GPU project
    assert not vouched_inputs(torch, ((x, x),), x, "cpu")  # a tuple argument: no region slot holds it


def test_gpu_batch_phases_are_medians_that_skip_what_a_worker_did_not_say():
    from magpie.harness.rounds import batch_phases

    records = [
        {"calls": 16, "clock_ns": 1_700_000, "answer_ns": 2_000_000, "stop_ns": 300_000, "worker_loop_ns": 500_000},
        {"calls": 16, "clock_ns": 1_900_000, "answer_ns": 2_200_000, "stop_ns": 100_000, "worker_loop_ns": "fast"},
        {"calls": 8, "clock_ns": 800_000, "answer_ns": 1_000_000, "stop_ns": 200_000, "worker_loop_ns": None},
    ]
    phases = batch_phases(records)
    assert phases == {
        "calls": 16,
        "clock_us": 1700.0,
        "answer_us": 2000.0,
        "stop_us": 200.0,
        "worker_loop_us": 500.0,
        "opened_early": 0,
        "batches": 3,
    }
    records[0]["opened_early"] = True
    assert batch_phases(records)["opened_early"] == 1


def test_a_gates_sleep_follows_the_workers_answers_but_does_not_grow_without_end():
    """Twice the last answer, within bounds; a worker whose calls synchronise (the gate opens
    before every answer, which grows with the sleep) keeps the sleep it had."""
    from magpie.harness.device_region import GATE_MAX_NS, GATE_MIN_NS, next_sleep_ns

    assert next_sleep_ns(1_000_000, False, False, GATE_MIN_NS) == 2_000_000
    assert next_sleep_ns(10_000, False, False, 2_000_000) == GATE_MIN_NS
    assert next_sleep_ns(10**9, False, False, 2_000_000) == GATE_MAX_NS
    # opened early once: a longer sleep may be all it needs
    assert next_sleep_ns(3_000_000, True, False, 2_000_000) == 6_000_000
    sleep = 6_000_000
    for _ in range(5):  # every answer takes the sleep and 1 ms more
        sleep = next_sleep_ns(sleep + 1_000_000, True, True, sleep)
    assert sleep == 6_000_000


def test_what_a_gpu_batch_costs_besides_its_calls_is_the_least_intercept_under_the_calibration():
    """Batches of two sizes a round: the line through a role's times against its calls meets
    zero calls at what a batch costs besides them; the common cost is the least role's
    intercept, within 0 and the least calibration, and that calibration where no batches vary
    in size."""
    from magpie.harness.rounds import Rounds, fixed_cost, other_size

    # every other batch: half, or two where a batch is one call and two fit the region
    assert [other_size(10, 1024), other_size(1, 4), other_size(1, 1)] == [5, 2, 1]

    def batches(fixed_ns, per_call_ns, sizes, short_extra_ns=0.0):
        records = [(None, 10 * fixed_ns, 1, 0.0), (None, 3 * fixed_ns, 2, 0.0)]  # sizing batches: left out
        for i, calls in enumerate(sizes):
            wobble = 1_000 if i % 3 == 0 else -500
            extra = short_extra_ns if calls < max(sizes) else 0.0
            records.append((i // 4, fixed_ns + per_call_ns * calls + wobble + extra, calls, 0.0))
        return records

    calibration = {"baseline": 282_000, "candidate": 282_000}
    honest = batches(30_000, 1_000_000, [2, 1] * 6)
    assert abs(fixed_cost({"baseline": honest}, calibration) - 30_000) < 2_000
    # a first batch that read 2.4x the others (on the H200, a baseline's first beside a candidate)
    # leaves the line where it was; a least-squares line met zero calls below zero (nothing taken off)
    slow_first = [*honest[:2], (0, honest[2][1] * 2.4, *honest[2][2:]), *honest[3:]]
    assert abs(fixed_cost({"baseline": slow_first}, calibration) - 30_000) < 2_000
    # a candidate that pads its short batches (to have more taken off every call) raises its own
    # intercept only: the baseline's stands
    padded = batches(30_000, 100_000, [40, 20] * 6, short_extra_ns=250_000)
    assert abs(fixed_cost({"baseline": honest, "candidate": padded}, calibration) - 30_000) < 2_000
    # alone, its line is capped by the calibration; one that tilts below zero takes nothing off
    assert fixed_cost({"candidate": batches(30_000, 100_000, [40, 20] * 6, 1_000_000)}, calibration) == 282_000
    assert fixed_cost({"baseline": batches(-90_000, 1_000_000, [2, 1] * 6)}, calibration) == 0.0
    # batches of one size (one slow call a round): what an empty batch costs, the least role's
    assert (
        fixed_cost({"baseline": batches(30_000, 9_000_000, [1] * 5)}, {"baseline": 282_000, "candidate": 290_000})
        == 282_000
    )
    assert fixed_cost({"baseline": batches(30_000, 9_000_000, [1] * 5)}, {}) == 0.0

    measured = Rounds(["baseline", "candidate"], vouched=True)
    measured.calibration_ns = {"baseline": 20_000, "candidate": 2_000_000}
    measured.device_batches = {
        "baseline": [(None, 9e6, 1, 0.0), (0, 1_020_000, 100, 0.001), (0, 520_000, 50, 0.001)],
        "candidate": [(0, 2_020_000, 100, 0.001)],
    }
    measured.settle_device_batches()
    # the sizing batch is no sample; each round's batch is (ns - 20 µs) / its calls
    assert measured.samples == {"baseline": [10_000, 10_000], "candidate": [20_000]}


def test_a_handed_over_batch_shows_each_set_only_after_the_last_call_said_it_was_done(pair):
    """The worker's side of a batch handed over one call at a time, on a thread: it sees set
    k + 1 only once call k said it was done, and its outputs are taken as they were then; what
    it writes into a slot later is never seen."""
    import threading

    region, views = pair
    sets = [(torch.randn(5, 7), 3) for _ in range(4)]
    region.write([(torch.zeros(5, 7), 3)] * 4)  # the last batch's sets, still in the slots
    region.start_handover(sets)
    seen = []

    def kernel(x, k):
        seen.append([bool(torch.equal(v[0], s[0])) for v, s in zip(views.inputs[:4], sets)])
        return torch.relu(x) * 2

    worker = threading.Thread(
        target=batches.run_handed_over, args=(torch, kernel, views.inputs, views.outputs, views.control)
    )
    worker.start()
    while region.calls_done() < 0:  # not yet waiting for its first set
        pass
    for call in range(4):
        region.put(call)
        region.release(call)
        while region.calls_done() < call + 1:
            pass
        region.take_output(call)
        views.outputs[call][0].fill_(7.0)  # written after it said it was done: never seen
    region.end_handover()  # it was never told how many calls the batch holds
    worker.join()
    assert seen == [
        [True, False, False, False],
        [True, True, False, False],
        [True, True, True, False],
        [True, True, True, True],
    ]
    assert region.unwritten(4) is None
    assert all(torch.equal(region.outputs(i)[0], torch.relu(sets[i][0]) * 2) for i in range(4))


def test_a_call_handed_over_has_the_cpu_waits_of_a_busy_machine_taken_off():
    """A call handed over is timed by the evaluator's wall clock; another process's time slice
    on the worker's CPU or the evaluator's lands in it whole (with two CPU hogs beside the build
    a 2 ms call read up to 9 ms, and a candidate that did its slow part once a batch was
    credited 202x). What either thread waited for a CPU is taken off; a wake-up's few µs stay
    in; a batch whose worker's own threads or processes ran for half of what was taken off
    keeps its wall times (the waits may be its own doing)."""
    call = batches.handed_over_call_ns
    assert call(3_500_000, 1_500_000) == 2_000_000  # a 2 ms call that waited 1.5 ms for its CPU
    assert call(12_000, 5_000) == 12_000  # a quiet machine's calls read their wall time
    assert call(1_000_000, 1_400_000) == 0  # a wait that began before the release, taken off whole
    walls, less_waits = [3_500_000, 2_100_000], [2_000_000, 2_050_000]
    assert batches.calls_handed_over_ns(walls, less_waits, 60_000) == less_waits  # another program's time slice
    assert batches.calls_handed_over_ns(walls, less_waits, 1_400_000) == walls  # its child ran while it waited
    # the waits it reads, of this process's thread and its own: they only grow, and a sleep is no wait
    waits = cputime.CallWaits(os.getpid())
    try:
        first = waits.read()
        time.sleep(0.1)
        second = waits.read()
    finally:
        waits.close()
    # a sleep counted as a wait would read 100 ms; a busy machine's wake-up may wait a few ms
    assert 0 <= second - first < 50_000_000


def test_calls_made_alone_bound_a_batchs_calls_by_the_baseline_and_fail_a_batch_done_together():
    """The candidate's calls handed over one at a time cost what the baseline's do plus what its
    calls differ by (each entry a batch's median call: on the CPU each call is timed alone, on a
    GPU a batch of equal steps over its calls). Batches whose calls were done together read far
    below that bound and fail; honest ones, faster or slower or noisy, stay within it."""
    from magpie.harness.measurement import ALONE_FAIL, alone_bound

    def entries(call_us, pairs=12, wobble_us=0.3, handover_us=8.0):
        return [(handover_us + call_us + wobble_us * (-1) ** (i // 2)) * 1000 for i in range(pairs)]

    baseline = entries(9)  # a 9 µs call and the hand-over's 8 µs
    # the same relu with the batch loop replaced: its calls made alone as slow as the baseline's,
    # its batches at 1.2 µs a call
    fused = alone_bound(
        {"candidate": entries(9, wobble_us=-0.3), "baseline": baseline}, {"baseline": 9_000, "candidate": 1_200}
    )
    assert fused["failed"] and fused["ratio"] > ALONE_FAIL and abs(fused["difference_us"]) < 0.7
    assert fused["pairs"] == 12 and abs(fused["baseline_alone_us"] - 17) < 0.5
    # an honest candidate twice as fast, one three times slower, and the baseline's own copy
    for call_us, batched_ns in ((4.5, 4_500), (27, 27_000), (9, 9_000)):
        bound = alone_bound(
            {"candidate": entries(call_us), "baseline": baseline}, {"baseline": 9_000, "candidate": batched_ns}
        )
        assert not bound["failed"] and bound["ratio"] < 1.1, (call_us, bound)
    # calls alone read a longer call's cost short against its batches: the plain relu against
    # ten operations saved 19.5 µs a call alone where batches read 30 (it failed at 1.7); what a
    # candidate saves alone is allowed for in part, and one that saves nothing gets nothing
    ten_ops = entries(29)
    faster = alone_bound({"candidate": entries(9.5), "baseline": ten_ops}, {"baseline": 38_000, "candidate": 7_800})
    assert not faster["failed"] and faster["margin_us"] > 9, faster
    together = alone_bound({"candidate": entries(29), "baseline": ten_ops}, {"baseline": 38_000, "candidate": 14_000})
    assert together["failed"], together
    # noise as large as a call widens the margin, never fails honest batches
    noisy = alone_bound(
        {"candidate": entries(9, wobble_us=20), "baseline": entries(9, wobble_us=-20)},
        {"baseline": 9_000, "candidate": 9_000},
    )
    assert not noisy["failed"] and noisy["margin_us"] > 10

    # a GPU's batches handed over a call at a time, each step the GPU's switch between the
    # processes too: it drops out of the pairs' differences, and the allowance is of the
    # baseline's call in batches, not of the switch (a tenth of 285 µs would hide a 20 µs call)
    def steps(call_us, switch_us=285.0):
        return [switch_us * 1000 + call_us * 1000 + 200 * (-1) ** i for i in range(6)]

    gpu = alone_bound({"candidate": steps(23), "baseline": steps(20)}, {"baseline": 20_000, "candidate": 6_000})
    assert gpu["failed"] and abs(gpu["lower_us"] - 21) < 0.5 and gpu["margin_us"] < 2.5
    honest = alone_bound({"candidate": steps(5), "baseline": steps(20)}, {"baseline": 20_000, "candidate": 4_000})
    assert not honest["failed"] and honest["ratio"] < 1
    # ten small kernels a call against one, a batch handed over replayed as a graph where the
    # batches are: alone they differ by what the batches do (on the H200 7.6-8.0 µs against 7.7)
    tiny = alone_bound({"candidate": steps(10.6), "baseline": steps(3)}, {"baseline": 2_300, "candidate": 9_900})
    assert not tiny["failed"] and tiny["ratio"] < 1
    # where the driver cannot capture a batch handed over as a graph, its calls are launched one
    # by one beside graph batches, twice what their small kernels cost there: a looser limit
    apart = {"candidate": steps(18), "baseline": steps(3)}, {"baseline": 3_000, "candidate": 10_500}
    assert alone_bound(*apart)["failed"]
    launched_apart = alone_bound(*apart, launched_apart=True)
    assert ALONE_FAIL < launched_apart["ratio"] and not launched_apart["failed"] and launched_apart["launched_apart"]
    # a GPU batch's call under a quarter of the kernel that copies its outputs was not launched alone
    from magpie.harness.measurement import launch_floor

    assert "done together" in launch_floor(1, 1_300) and launch_floor(900, 1_300) is None
    assert launch_floor(1, 0.0) is None  # nothing priced: nothing to say
    # no bound because threads of the candidate's own held its calling thread in most pairs: said
    from magpie.harness.measurement import unbounded_line
    from magpie.harness.rounds import Rounds

    measured = Rounds(["baseline", "candidate"], vouched=True)
    measured.alone_disturbed, measured.alone_held_by_own_threads["candidate"] = 14, 14
    assert "threads of its own" in unbounded_line(measured)
    measured.alone_held_by_own_threads["candidate"] = 3  # mostly left out for another reason: nothing to say
    assert unbounded_line(measured) is None
    measured.alone_held_by_own_threads["candidate"], measured.alone_bound = 14, {"failed": False}
    assert unbounded_line(measured) is None  # a bound was drawn from the pairs kept
    # a candidate faster beyond the noise whose pairs were nearly all left out is not credited,
    # unless a re-timing drew a bound; one no faster than the baseline needs none
    from magpie.harness.measurement import unvouched_speedup_line

    unbounded = Rounds(["baseline", "candidate"], vouched=True)
    unbounded.alone_disturbed, unbounded.alone["candidate"] = 9, [1e4]
    faster, level = {"ci_low": 3.2}, {"ci_low": 0.97}
    assert "9 of 10 pairs left out" in unvouched_speedup_line(faster, unbounded)
    assert unvouched_speedup_line(level, unbounded) is None
    assert unvouched_speedup_line(faster, unbounded, again=measured) is None  # the re-timing's bound holds
    assert unvouched_speedup_line(faster, measured) is None
    too_few = Rounds(["baseline", "candidate"], vouched=True)
    too_few.alone_disturbed = 1  # one pair made: no bound either way, nothing left out that could bound
    assert unvouched_speedup_line(faster, too_few) is None
    by_chance = Rounds(["baseline", "candidate"], vouched=True)  # a few left out by chance
    by_chance.alone_disturbed, by_chance.alone["candidate"] = 2, [1e4] * 4
    assert unvouched_speedup_line(faster, by_chance) is None
    # too few pairs say nothing
    assert alone_bound({"candidate": baseline[:2], "baseline": baseline[:2]}, {"baseline": 1, "candidate": 1}) is None


def test_a_bound_over_the_batches_is_what_the_candidate_is_credited():
    """Calls done together that save less than ALONE_FAIL are not failed, but their speedup is
    the baseline's time over the bound, not over the batches: the point and the interval scale
    down together (by the median's or, where calls are uneven, the mean's ratio) and the
    verdict is read again. Within the bound, or failed by it, the speedup is the batches'."""
    from magpie.compare.stats import bootstrap_speedup
    from magpie.harness.measurement import credit_within_calls_alone
    from magpie.harness.rounds import Rounds

    def measured(lower_us, failed=False):
        rounds = Rounds(["baseline", "candidate"], vouched=True)
        rounds.samples = {
            "baseline": [30_000 + 100 * (i % 3) for i in range(30)],
            "candidate": [20_000 + 100 * (i % 3) for i in range(30)],
        }
        rounds.sizes = {role: [6] * 5 for role in rounds.samples}
        rounds.alone_bound = {"lower_us": lower_us, "failed": failed, "ratio": lower_us / 20.1}
        return rounds

    def speedup(rounds, statistic="median"):
        kept = rounds.for_speedup(statistic)
        return bootstrap_speedup(
            [s / 1000 for s in kept["baseline"][0]],
            [s / 1000 for s in kept["candidate"][0]],
            baseline_rounds=kept["baseline"][1],
            candidate_rounds=kept["candidate"][1],
            statistic=statistic,
        )

    for statistic in ("median", "mean"):
        together = measured(27.0)
        credited = speedup(together, statistic)
        line = credit_within_calls_alone(
            credited, together.alone_bound, together.for_speedup(statistic)["candidate"][0], statistic
        )
        assert "credited at that" in line and credited["verdict"] == "faster"
        assert credited["value"] * 27.0 == pytest.approx(30.1, rel=1e-3)  # the baseline's time over the bound
        assert credited["ci_low"] <= credited["value"] <= credited["ci_high"]
        bounded = credited["bounded_by_calls_alone"]
        assert bounded["batches_value"] == pytest.approx(30.1 / 20.1, rel=1e-3) and bounded["factor"] > 1.3
    level = measured(30.5)  # its calls alone as slow as the baseline's: no speedup left
    credited = speedup(level)
    credit_within_calls_alone(credited, level.alone_bound, level.for_speedup("median")["candidate"][0], "median")
    assert credited["value"] < 1 and credited["verdict"] != "faster"
    apart = measured(27.0)  # its calls alone launched one by one beside graph batches: no credit from them
    apart.alone_bound["launched_apart"] = True
    for rounds in (measured(15.0), measured(40.0, failed=True), apart):
        untouched = speedup(rounds)
        assert (
            credit_within_calls_alone(
                untouched, rounds.alone_bound, rounds.for_speedup("median")["candidate"][0], "median"
            )
            is None
        )
        assert untouched == speedup(rounds)


def test_a_baseline_that_reads_off_its_own_timing_has_the_measurement_taken_again(tmp_path):
    """Each candidate's timing measures the baseline beside it; where the baseline reads more
    than `timing.disturbed_fraction` off its own timing job, something else ran on the device:
    the measurement is taken again (new input sets), and flagged if it still reads off. With
    the fraction 0 every difference counts, so both steps show."""
    relu2_report(
        tmp_path,
        ["twin"],
        shapes="[[33, 65]]",
        sources={"twin": (FIXTURES / "adversarial" / "good.py").read_text()},
        timing="warmup_ms = 5\nbudget_ms = 60\nrounds = 3\ndisturbed_fraction = 0",
    )
    timing = next(
        json.loads(p.read_text())
        for p in (tmp_path / "workspaces/store").glob("*/*/result.json")
        if json.loads(p.read_text()).get("task") == "timing:relu2/twin"
    )
    assert timing["performance_state"] == "SUCCESS", timing["errors"]
    assert "the baseline read" in timing["remeasured"]["first"] and "the baseline read" in timing["remeasured"]["again"]
    assert "remeasured" in timing["phases_s"]
    assert any(w.startswith("measured again: ") for w in timing["warnings"])
    # on a busy machine a twin's batches can also read faster than its calls alone (another flag)
    assert "disturbed_measurement" in [f["kind"] for f in timing["flags"]]


WRONG_FOR_A_WHILE = """
import time

import torch

_seen = {"last": 0.0, "bursts": 0}


def kernel(x):
    # wrong in its 10th to 14th run of calls (a pause of 0.5 ms starts a run: the worker is
    # stopped between batches): inside the first measurement, right in a second one
    now = time.perf_counter()
    if now - _seen["last"] > 0.0005:
        _seen["bursts"] += 1
    _seen["last"] = now
    if 10 <= _seen["bursts"] <= 14:
        return torch.zeros_like(x)
    return torch.relu(x) * 2.0
"""


def test_a_measurement_that_failed_a_check_is_not_taken_again(tmp_path):
    """A disturbed baseline has the measurement taken again, and the second replaces the
    first: were a failed first one replaced too, a candidate wrong for a while, caught in the
    first, would go free in the second. With every difference counted as disturbed, it fails."""
    report = relu2_report(
        tmp_path,
        ["wrong_for_a_while"],
        shapes="[[33, 65]]",
        sources={"wrong_for_a_while": WRONG_FOR_A_WHILE},
        timing="warmup_ms = 5\nbudget_ms = 60\nrounds = 3\ndisturbed_fraction = 0",
    )
    row = next(r for r in report["results"] if r["implementation"] == "wrong_for_a_while")
    assert row["correctness_state"] == "SUCCESS", row["errors"]
    assert row["performance_state"] == "FAILED", row
    assert any("timed call" in e for e in row["errors"]), row["errors"]


def test_a_baseline_is_disturbed_only_past_the_fraction_and_on_its_own_case():
    """What `judging.disturbed` compares: the baseline's median here against its own timing job's,
    for the same case, past the device's fraction unless the manifest gives one: on a GPU 10%
    (1.5% between jobs is the H200's ordinary spread, 67% is what one disturbed job read), on
    the CPU 25% (jobs of one build read a 10 µs baseline up to 23.5% apart there)."""
    from types import SimpleNamespace

    from magpie.harness.judging import disturbed as judged_disturbed
    from magpie.harness.rounds import Rounds

    measured = Rounds(["candidate", "baseline"])
    measured.samples["baseline"] = [141_000] * 20
    case = SimpleNamespace(label="16777216")

    def disturbed(alone_us, shape="16777216", device="cuda", fraction=None):
        return judged_disturbed(measured, case, fraction, {"shape": shape, "median_us": alone_us}, device)

    assert "(1.67x)" in disturbed(84.5) and "(1.67x)" in disturbed(84.5, device="cpu")
    assert disturbed(139.0) is None and disturbed(155.0) is None
    assert "(1.18x)" in disturbed(120.0) and disturbed(120.0, device="cpu") is None
    assert "(1.18x)" in disturbed(120.0, device="cpu", fraction=0.10)
    assert disturbed(84.5, shape="1024") is None and disturbed(None) is None


def test_an_edits_rebuild_starts_the_baseline_beside_its_candidate(twin_build, tmp_path):
    """An edit rebuilds one candidate's timing but not the baseline's, so no job of the build
    has a baseline worker to hand on: the job starts one with its candidate's, before it holds
    the device alone (on the H200 a late start took 0.24 s of an edit's 4.1 s with the device
    held). Where the baseline's own timing ran in the build, its worker is handed on as before,
    and what that job measured of the baseline alone (its time per call from sizing) is not
    measured again; an earlier build's figures are never taken."""
    good = (FIXTURES / "adversarial" / "good.py").read_text()
    root = copy_project(twin_build, tmp_path / "twin")  # its first build, the session's

    def twin_timing(task: str = "timing:relu2/twin") -> dict:
        return max(
            (
                json.loads(p.read_text())
                for p in (root / "workspaces/store").glob("*/*/result.json")
                if json.loads(p.read_text()).get("task") == task
            ),
            key=lambda r: r["task_started_unix"],
        )

    first = twin_timing()
    assert first["workers_adopted"]["baseline"] is True, first["workers_adopted"]  # the baseline's own job's
    own = twin_timing("timing:relu2/good")["performance_result"]
    assert first["baseline_result"]["from_own_timing"] == ["sizing_us_per_call"]
    assert first["baseline_result"]["sizing_us_per_call"] == own["sizing_us_per_call"] > 0
    assert first["performance_result"]["from_own_timing"] is None
    (root / "twin.py").write_text(good + "# edited\n")
    assert build_json(root, "-j", "2")["failed"] == []
    edited = twin_timing()
    assert edited["task_started_unix"] > first["task_started_unix"]
    assert edited["performance_state"] == "SUCCESS", edited["errors"]
    assert edited["workers_adopted"]["baseline"] is False and "start_baseline" not in edited["phases_s"], edited
    assert edited["baseline_result"]["from_own_timing"] is None


def test_kept_warm_an_edits_rebuild_takes_the_baseline_worker_the_build_before_parked(tmp_path, monkeypatch, short_tmp):
    """Workers are keyed by what they load and how they run, not by their build: with the
    zygote kept warm, the edit's rebuild adopts the baseline's worker (no new process, load or
    first calls before its timing) and takes what the baseline's own timing measured of it
    the build before, still times every call on input sets of this build's seeds, and the
    edited candidate gets a worker of its own (its earlier content's is never adopted): the
    spare the build before started."""
    monkeypatch.setenv("MAGPIE_KEEP_WARM_S", "20")
    monkeypatch.setenv("TMPDIR", str(short_tmp))  # a warm zygote of this test's own
    good = (FIXTURES / "adversarial" / "good.py").read_text()
    relu2_report(tmp_path, ["twin"], shapes="[[33, 65]]", sources={"twin": good})
    (tmp_path / "twin.py").write_text(good + "# edited\n")
    assert build_json(tmp_path, "-j", "2")["failed"] == []
    results = [json.loads(p.read_text()) for p in (tmp_path / "workspaces/store").glob("*/*/result.json")]
    first, edited = sorted(
        (r for r in results if r.get("task") == "timing:relu2/twin"), key=lambda r: r["task_started_unix"]
    )
    assert edited["workers_adopted"] == {"candidate": True, "baseline": True}, edited["workers_adopted"]
    assert edited["performance_state"] == "SUCCESS", edited["errors"]
    assert edited["input_secret"] != first["input_secret"]
    assert edited["baseline_result"]["from_own_timing"] == ["sizing_us_per_call"]
    correctness = max(
        (r for r in results if r.get("task") == "correctness:relu2/twin"), key=lambda r: r["task_started_unix"]
    )
    assert correctness["worker_loads_s"], "the edited candidate's earlier worker was adopted"
    assert [load.get("spare") for load in correctness["worker_loads_s"]] == [True], correctness["worker_loads_s"]
