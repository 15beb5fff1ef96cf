"""GPU tests: run on the lent H200 through the device tool (`pytest -m gpu`), never in CPU CI."""

import json
import re
import shutil

import pytest
from conftest import FIXTURES, REPO, build_json, magpie, relu2_report
from test_verdicts import EXPECTED, check_candidate_thread_is_stopped, expected

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def gpu_example(tmp_path_factory):
    tree = tmp_path_factory.mktemp("gpu")
    shutil.copytree(REPO / "examples/gpu", tree / "examples/gpu")
    root = tree / "examples/gpu"
    result = build_json(root)
    assert result["failed"] == []
    return root, json.loads((root / "workspaces/reports/softmax/compare_report.json").read_text())


def test_every_kernel_type_is_correct_on_the_gpu(gpu_example):
    _, report = gpu_example
    states = {r["implementation"]: r["correctness_state"] for r in report["results"]}
    assert states == {"torch": "SUCCESS", "triton_online": "SUCCESS", "cuda_rowwise": "SUCCESS"}


def test_gpu_timings_say_how_they_were_taken(gpu_example):
    _, report = gpu_example
    for row in report["results"]:
        perf = row["performance_result"]
        assert row["performance_state"] == "SUCCESS", row["errors"]
        assert "CUDA" in perf["method"] and perf["n"] >= 10
        assert perf["clock"] == "evaluator"  # vouched batches, the default
        assert perf["kernel_us"] > 0 and perf["kernels"]
    candidates = [r for r in report["results"] if not r["is_baseline"]]
    assert all(r["speedup"]["verdict"] in ("faster", "slower", "within noise") for r in candidates)


def test_a_candidates_timing_takes_what_the_baselines_own_measured_of_it_alone(gpu_example):
    """Each candidate's job times the baseline beside it, but takes the harness's copy price,
    the baseline worker's calibration, its time per call and its kernels from the baseline's
    own timing job of the build, and says so (0.2 s of device time a job on the H200)."""
    _, report = gpu_example
    own = next(r for r in report["results"] if r["is_baseline"])["performance_result"]
    for row in (r for r in report["results"] if not r["is_baseline"]):
        beside = row["baseline_result"]
        assert beside["from_own_timing"] == ["calibration_us", "harness_us_per_call", "kernels", "sizing_us_per_call"]
        assert [beside[k] for k in ("harness_us_per_call", "calibration_us", "sizing_us_per_call", "kernels")] == [
            own[k] for k in ("harness_us_per_call", "calibration_us", "sizing_us_per_call", "kernels")
        ]
        assert row["performance_result"]["from_own_timing"] is None


def test_counters_and_roofline_from_ncu(gpu_example):
    _, report = gpu_example
    for row in report["results"]:
        profile = row["profile"]
        assert profile["state"] == "SUCCESS", profile["errors"]
        kernel = max(profile["kernels"], key=lambda k: k["duration_us"])
        assert kernel["duration_us"] > 0 and kernel["dram_bytes"] > 0
        assert kernel["roofline"]["bound"] == "memory"  # softmax moves bytes, it does not multiply


def test_gpu_info_sees_the_h200():
    info = json.loads(magpie("--gpu-info", "--json", cwd=REPO, check=0).stdout)
    gpu = info["gpus"][0]
    assert "H200" in gpu["name"] and gpu["architecture"] == "sm_90" and gpu["sm_count"] == 132


def test_nvml_tells_the_zygote_the_device_memory():
    from magpie.supervision import zygote_server

    sizes = zygote_server.nvidia_device_bytes()
    assert sizes and all(size > 100 << 30 for size in sizes)  # an H200 has 141 GB
    assert zygote_server.parked_cap(sizes) == zygote_server.MAX_PARKED


# Verdicts that do not depend on the device; the memory hog is a host-memory test (no address
# space limit applies to GPU processes) and the CPU clock is not the one timed here.
GPU_VERDICTS = {name: want for name, want in EXPECTED.items() if name not in ("hogs_memory", "fakes_clock")}
# short vouched timing: batches timed by the evaluator (`timing.vouched`, the default)
VOUCHED = "warmup_ms = 5\nbudget_ms = 60\nrounds = 3\nvouched = true"


@pytest.fixture(scope="module")
def gpu_adversarial(tmp_path_factory):
    root = tmp_path_factory.mktemp("adversarial_gpu")
    return relu2_report(
        root,
        [n for n in GPU_VERDICTS if n != "good"],
        shapes="[[33, 65], [8, 128]]",
        jobs=4,
        defaults="timeout_s = 8",
        device="cuda",
        timing=VOUCHED,
    )


@pytest.mark.parametrize("impl", list(GPU_VERDICTS))
def test_adversarial_verdicts_hold_on_the_gpu(gpu_adversarial, impl):
    row = next(r for r in gpu_adversarial["results"] if r["implementation"] == impl)
    compiling, correctness, verdict = expected(impl, row)
    assert (row["compiling_state"], row["correctness_state"]) == (compiling, correctness)
    assert verdict in row["verdict"]


def test_gpu_vouched_batches_catch_cheats_and_credit_none(gpu_adversarial):
    """Kernels this small are timed in graph mode: each batch one replay of a CUDA graph of its
    calls, on input sets of new seeds written into the same places. A graph that replays what
    was wrong while captured fails the check of the batch's outputs; a replaced timer in the
    worker times nothing; what a cache keeps earns nothing."""
    rows = {r["implementation"]: r for r in gpu_adversarial["results"]}
    batch_check = re.compile(r"timed call \d+ of a batch of \d+: allclose")
    assert any("incorrect after timing" in e for e in rows["degrades"]["errors"])
    assert any(batch_check.search(e) for e in rows["lazy_when_timed"]["errors"]), rows["lazy_when_timed"]["errors"]
    # its key (address, version) changes with every write into the region's views: it computes in
    # every captured call, and its host-side 1 ms is not replayed; or what it kept fails a check
    memo = rows["memoizes"]
    if memo["correctness_state"] == "FAILED":  # a held-out shape caught it before timing
        assert memo["verdict"].startswith("incorrect: passes declared shapes, fails held-out"), memo["verdict"]
    elif memo["performance_state"] == "FAILED":
        assert any(batch_check.search(e) for e in memo["errors"]), memo["errors"]
    else:
        assert memo["speedup"]["verdict"] != "faster", memo["speedup"]  # a relu, a mul and a clone
    assert "CUDA graph" in rows["good"]["performance_result"]["method"]
    assert {"good"} <= set(gpu_adversarial["ranking"]) <= {"good", "returns_early", "memoizes"}
    if "returns_early" in gpu_adversarial["ranking"]:
        assert rows["returns_early"]["speedup"]["value"] < 2  # an honest relu under a lying timer


def test_work_left_on_a_side_stream_after_answering_is_timed_or_fails(tmp_path):
    """A candidate that leaves 1 ms of work a call queued on a stream of its own, behind the
    event that stops the evaluator's clock: its outputs are taken for the checks in the
    evaluator's stream right behind that event, so the work is timed or the batch fails."""
    report = relu2_report(
        tmp_path,
        ["defers_to_side_stream"],
        shapes="[[4096, 4096]]",
        jobs=1,
        defaults="timeout_s = 60",
        device="cuda",
        timing=VOUCHED,
    )
    row = next(r for r in report["results"] if r["implementation"] == "defers_to_side_stream")
    assert row["correctness_state"] == "SUCCESS", row["errors"]
    if row["performance_state"] == "SUCCESS":
        assert row["speedup"]["value"] < 0.5, row["speedup"]  # its 1 ms a call counted
    else:
        assert any(k in e for e in row["errors"] for k in ("batch", "GPU was still busy")), row["errors"]


VOUCHED_DEFAULT = "warmup_ms = 5\nbudget_ms = 300\nrounds = 5\nvouched = true"


def test_a_worker_that_does_a_batchs_calls_in_one_launch_is_not_credited_on_the_gpu(tmp_path):
    """The CPU's cheat on the GPU's vouched batches: the same relu as the baseline, its worker's
    batch loop replaced by one launch over all the batch's input sets (a fixed stride apart in
    the region): outputs and inputs are right, the calls were not made one by one. Credited 7.1x,
    then 219x at the default budget, while only batches were timed: a call read 0.001 µs, under
    any kernel's launch (`launch_floor`)."""
    report = relu2_report(
        tmp_path,
        ["batches_its_calls"],
        shapes="[[33, 65]]",
        jobs=1,
        defaults="timeout_s = 60",
        device="cuda",
        timing=VOUCHED_DEFAULT,
    )
    row = next(r for r in report["results"] if r["implementation"] == "batches_its_calls")
    assert row["correctness_state"] == "SUCCESS", row["errors"]
    assert row["performance_state"] == "FAILED" or row["speedup"]["value"] < 1.2, row["speedup"]


def cheat_beside_honest(tmp_path, cheat: str, honest: str, baseline: str, shapes: str) -> tuple[dict, dict]:
    """The rows of a cheat and an honest candidate compared with `baseline` at the default
    budget: both correct, the cheat's timing failed, the honest one's standing."""
    report = relu2_report(
        tmp_path,
        [cheat, honest],
        shapes=shapes,
        jobs=1,
        defaults="timeout_s = 60",
        device="cuda",
        timing=VOUCHED_DEFAULT,
        baseline=baseline,
    )
    rows = {r["implementation"]: r for r in report["results"]}
    assert rows[cheat]["correctness_state"] == rows[honest]["correctness_state"] == "SUCCESS", rows
    assert rows[cheat]["performance_state"] == "FAILED", rows[cheat]["speedup"]
    assert rows[honest]["performance_state"] == "SUCCESS", rows[honest]["errors"]
    return rows[cheat], rows[honest]


def test_calls_done_together_above_the_launch_floor_are_bounded_by_calls_handed_over_on_the_gpu(tmp_path):
    """Ten operations done once over all of a batch's input sets, then three small kernels a
    call: above the launch floor, its batches 2.6-3.9 µs a call against the ten's 9-10 made
    call by call on the H200. Calls handed over one at a time on the GPU
    (`DeviceRegion.start_handover`) cannot be done together: the bound they set fails its
    timing (ratios 3.1-4.8 in bench/calls_alone.py). The honest relu beside it, about 3x
    faster, stands."""
    cheat, honest = cheat_beside_honest(tmp_path, "batches_above_floor", "good", baseline="many_ops", shapes="[[8, 8]]")
    assert "calls_done_together" in {f["kind"] for f in cheat["failures"]}, cheat["failures"]
    assert cheat["performance_result"]["alone_bound"]["pairs"] >= 3
    assert honest["speedup"]["value"] > 1.5, honest["speedup"]
    assert honest["performance_result"]["alone_bound"]["ratio"] < 1.0


def test_honest_small_kernels_timed_as_graph_replays_stand_beside_their_calls_made_alone(tmp_path):
    """Ten small operations a call against one relu on 33x65 sets: timed as graph replays, whose
    small kernels cost about half what they do launched one by one. Calls handed over one at a
    time are replayed as a graph of their own in graph mode (`Worker.handover_graph`), so the
    honest ten read a bound near their batches (0.95-1.00 on the H200; 1.63-1.67 while calls
    alone were launched kernel by kernel) and stand under the 1.5 that fails calls done
    together."""
    report = relu2_report(
        tmp_path,
        ["many_ops"],
        shapes="[[33, 65]]",
        jobs=1,
        defaults="timeout_s = 60",
        device="cuda",
        timing=VOUCHED_DEFAULT,
    )
    row = next(r for r in report["results"] if r["implementation"] == "many_ops")
    assert row["timing_method"]["mode"] == "graph", row["timing_method"]
    assert row["performance_state"] == "SUCCESS", row["errors"]
    bound = row["performance_result"]["alone_bound"]
    assert bound["pairs"] >= 3 and bound["ratio"] < 1.25, bound
    assert row["speedup"]["value"] < 1, row["speedup"]  # ten operations to the baseline's two


def test_a_slow_baselines_fast_candidate_is_bounded_by_calls_handed_over_one_at_a_time(tmp_path):
    """A baseline of about 4 ms a call, too slow for a handed-over batch of several calls in
    the share of a round calls made alone may take: a candidate that does its slow,
    under-occupied part once a batch has its batches bounded by batches of one call, and
    fails; the same code made call by call stands."""
    (tmp_path / "same_slow_call.py").write_text((FIXTURES / "adversarial" / "slow_call.py").read_text())
    cheat, honest = cheat_beside_honest(
        tmp_path, "batches_slow_call", "same_slow_call", baseline="slow_call", shapes="[[33, 65]]"
    )
    bound = cheat["performance_result"]["alone_bound"]
    assert bound["calls_a_batch"] == 1 and bound["pairs"] >= 3 and bound["failed"], bound
    assert not honest["performance_result"]["alone_bound"]["failed"]


def test_work_that_skips_the_gate_sees_old_inputs_or_is_timed(tmp_path):
    """A candidate whose timed calls run on a stream of their own that skips the wait on the
    gate: queued while the evaluator's stream sleeps, its kernels can run before the batch's
    input sets are copied in (the last batch's inputs: the checks fail) or after the gate
    (timed), never credited as faster than the same relu."""
    report = relu2_report(
        tmp_path,
        ["skips_the_gate"],
        shapes="[[4096, 4096]]",
        jobs=1,
        defaults="timeout_s = 60",
        device="cuda",
        timing=VOUCHED,
    )
    row = next(r for r in report["results"] if r["implementation"] == "skips_the_gate")
    assert row["correctness_state"] == "SUCCESS", row["errors"]
    if row["performance_state"] == "SUCCESS":
        assert row["speedup"]["value"] < 1.2, row["speedup"]
    else:
        assert any("batch" in e for e in row["errors"]), row["errors"]


def test_a_thread_the_candidate_leaves_running_is_stopped_on_the_gpu_too(tmp_path):
    check_candidate_thread_is_stopped(tmp_path, "cuda")


def test_kernelbench_models_are_judged_and_timed_on_the_gpu(tmp_path):
    """The model is built on the device from its init inputs; the timing job takes the worker
    the correctness job parked, whose model was rebuilt as a fresh process would build it."""
    for name in ("reference.py", "model_new.py", "model_new_wrong.py"):
        shutil.copy(REPO / "tests/fixtures/kernelbench" / name, tmp_path / name)
    shutil.copy(tmp_path / "model_new.py", tmp_path / "model_new_copy.py")
    (tmp_path / "kb.yaml").write_text(
        "kernels:\n"
        "  - {id: right, type: pytorch, source_files: [model_new.py], spec: reference.py}\n"
        "  - {id: copy, type: pytorch, source_files: [model_new_copy.py], spec: reference.py}\n"
        "  - {id: wrong, type: pytorch, source_files: [model_new_wrong.py], spec: reference.py}\n"
    )
    magpie(
        "compare",
        "--kernel-config",
        "kb.yaml",
        "--device",
        "cuda",
        "--budget-ms",
        "50",
        "-o",
        "kb",
        cwd=tmp_path,
        check=0,
    )
    report = json.loads((tmp_path / "kb/compare_report.json").read_text())
    rows = {r["implementation"]: r for r in report["results"]}
    assert rows["wrong"]["correctness_state"] == "FAILED" and "kernelbench" in rows["wrong"]["verdict"]
    assert rows["copy"]["performance_result"]["median_us"] > 0
    assert rows["right"]["correctness_state"] == "SUCCESS", rows["right"]["verdict"]
    assert rows["copy"]["speedup"]["verdict"] in ("faster", "slower", "within noise")
    results = [json.loads(p.read_text()) for p in (tmp_path / "kb/workspace/store").glob("*/*/result.json")]
    timing = next(r for r in results if r.get("task", "").startswith("timing:") and r["task"].endswith("/copy"))
    assert timing["workers_adopted"]["candidate"] is True


@pytest.mark.gpu
def test_a_disturbed_baseline_is_measured_again_on_the_gpu(tmp_path):
    """`timing.disturbed_fraction` on the GPU's vouched batches: at 0 every difference between
    the baseline beside a candidate and in its own timing counts, so the measurement is taken
    again and flagged, and the row still stands."""
    relu2_report(
        tmp_path,
        ["twin"],
        shapes="[[4096, 4096]]",
        jobs=1,
        defaults="timeout_s = 60",
        device="cuda",
        sources={"twin": (FIXTURES / "adversarial" / "good.py").read_text()},
        timing=VOUCHED + "\ndisturbed_fraction = 0",
    )
    timing = next(
        json.loads(p.read_text())
        for p in (tmp_path / "workspaces/store").glob("*/*/result.json")
        if json.loads(p.read_text()).get("task") == "timing:relu2/twin"
    )
    assert timing["performance_state"] == "SUCCESS", timing["errors"]
    assert "the baseline read" in timing["remeasured"]["again"]
    assert [f["kind"] for f in timing["flags"] if f["kind"] == "disturbed_measurement"] == ["disturbed_measurement"]
