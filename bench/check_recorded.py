"""Recorded measurements checked against what the docs say of them: the JSON the bench scripts
wrote on the H200 (tests/fixtures/h200/) beside the figures docs/performance.md and
docs/security.md quote. No code of magpie's reads these files here, so no change to the code
can make a check fail: they are not unit tests (tests/ keeps the ones where magpie's code
processes a recorded file: parsers, reports, the timing rules replayed on recorded samples).
Run by hand after recording a fixture again or editing the figures the docs quote:

    python bench/check_recorded.py

Each failing check is named with its assertion; the exit code is then 1."""

from __future__ import annotations

import json
import math
import statistics
import sys
import traceback
from pathlib import Path

H200 = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "h200"


def coverage(part: dict) -> float:
    """Share of (run, candidate) whose speedup interval holds the median of the other runs' estimates."""
    runs = part["runs"]
    names = [n for n, row in runs[0]["rows"].items() if row["speedup"]["verdict"] != "baseline"]
    held = checks = 0
    for name in names:
        speedups = [run["rows"][name]["speedup"] for run in runs]
        for i, s in enumerate(speedups):
            others = statistics.median(x["value"] for j, x in enumerate(speedups) if j != i)
            checks += 1
            held += s["ci_low"] <= others <= s["ci_high"]
    return held / checks


def check_the_sweep_spans_1_us_to_100_ms_in_both_modes():
    """tests/test_timer_sweep.py replays the sweep through today's wall-clock check: its rows
    cover 1 µs to 100 ms in both of the GPU timer's modes."""
    timed = [
        role
        for name in ("timer_sweep.json", "timer_sweep_repeat.json", "timer_sweep_swap.json")
        for row in json.loads((H200 / name).read_text())["rows"]
        for role in (row["candidate"], row["baseline"])
        if role and role.get("wall_account")
    ]
    medians = [role["median_us"] for role in timed]
    assert min(medians) < 1.5 and max(medians) > 50_000
    by_mode = {mode: [r["median_us"] for r in timed if r["mode"] == mode] for mode in ("events", "graph")}
    assert min(by_mode["graph"]) < 2 and max(by_mode["graph"]) > 1000  # graph replays of 1 µs to 1.6 ms
    assert min(by_mode["events"]) < 5 and max(by_mode["events"]) > 50_000


def check_workers_carried_across_builds_inflate_only_the_workers_own_timer():
    """Why a GPU worker that times itself serves its own build only, and every other worker
    later builds too (`WorkerPool.build_of_workers`): carried across builds under the worker's
    timer (the 2026-11-30 set, and again on 2026-12-02), memory-bound candidates read 1.3-2.2x
    slower in some runs and intervals held in 59-62% of cases; kept per build, every median
    stayed within 3%. Carried under vouched timing (the default), 10 repeats stayed within 3%,
    79 of 79 intervals held, and the compare took 8.8-9.8 s (11.9-14.3 s with workers new in
    each build), under 2x its 5.1 s of budgets."""
    fixture = json.loads((H200 / "interval_coverage.json").read_text())
    carried = json.loads((H200 / "interval_coverage_carried.json").read_text())

    def worst(part):
        return max(max(v) / min(v) for v in part["medians_us"].values())

    assert worst(fixture["workers_per_build"]) < 1.03
    assert worst(fixture["workers_carried_across_builds"]) > 1.3 and worst(carried["worker_timer"]) > 1.3
    assert coverage(carried["worker_timer"]) < 0.65
    assert math.isclose(fixture["workers_per_build"]["coverage"]["coverage"], coverage(fixture["workers_per_build"]))
    vouched = carried["vouched"]
    assert worst(vouched) < 1.03 and len(vouched["runs"]) == 10
    assert vouched["coverage"]["held"] == vouched["coverage"]["checks"] == 79
    failed = [
        (i, name, row["errors"])
        for i, run in enumerate(vouched["runs"])
        for name, row in run["rows"].items()
        if not row["speedup"]
    ]
    assert len(failed) == 1 and "gpu_idle" in failed[0][2][0]  # a probe that waited: now measured again
    budgets_s = (2 * 8 + 1) * vouched["budget_ms"] / 1000
    assert max(run["wall_s"] for run in vouched["runs"]) < 2 * budgets_s
    for part in (vouched, carried["vouched_again"]):
        adopted = [
            task["workers_adopted"]
            for name, task in part["runs"][-1]["tasks"].items()
            if name.startswith("timing:") and name != "timing:compare/torch_ref"
        ]
        # every candidate's worker carried; the baseline's too, but where a job found it in use
        assert len(adopted) == 8 and all(a["candidate"] for a in adopted)
        assert sum(a["baseline"] for a in adopted) >= 7
    again = carried["vouched_again"]
    assert max(run["wall_s"] for run in again["runs"]) < 1.6 * budgets_s
    assert again["coverage"]["held"] == again["coverage"]["checks"] == 24


def check_the_vouched_sweep_times_every_honest_kernel_and_fails_none():
    """The default GPU timing (the evaluator's batches, `timing.vouched`) over the sweep's 46
    kernels of 0.8 µs to 45 ms: every one correct and timed, none failed (before the copies
    into the slots were priced as the batch makes them, the 1 GiB Triton scale-add read 203 µs,
    under its 434 µs floor, and failed; before a batch's fixed cost was taken off batches of
    one size, it read 1.08 ms against the worker timer's 0.80); kernels of 100 µs and more read
    within 30% below and 15% above the worker's own events, timed on another lease (a GEMM of
    11-13 ms reads 16% under them; the clock-bound spin loops ran 9% slower on this lease: a
    batch of one 4000-step loop took 8.46 ms of events, 7.73 ms on the earlier one)."""
    sweep = json.loads((H200 / "timer_sweep_vouched.json").read_text())
    rows = sweep["rows"]
    assert sweep["build_exit"] == 0 and len(rows) == 46
    assert [r for r in rows if (r["correctness_state"], r["performance_state"]) != ("SUCCESS", "SUCCESS")] == []
    worker = {
        (r["kernel"], r["implementation"]): r["candidate"]["median_us"]
        for r in json.loads((H200 / "timer_sweep.json").read_text())["rows"]
    }
    for r in rows:
        theirs = worker[r["kernel"], r["implementation"]]
        if theirs >= 100:
            assert 0.7 <= r["candidate"]["median_us"] / theirs <= 1.15, (r["kernel"], r["implementation"])


def check_what_vouched_timing_cost_the_kept_warm_compare_is_what_the_docs_say():
    """docs/performance.md: with each candidate's job taking the baseline's copy price,
    calibration, sizing and kernels from the baseline's own timing job, and Triton's key and
    driver utilities made once for every worker, the kept-warm compare of 8 Triton candidates
    took 11.9-12.9 s in 10 runs under vouched timing (13.5-14.5 s before; 9-13 s under the
    worker's timer), an edit to verdict 3.6-4.1 s, the rounds about their 5.1 s of budget;
    only the baseline's own job priced the copies; the memory-bound candidates read 1.64-1.72x
    faster and all 80 intervals held the other runs' median."""
    vouched = json.loads((H200 / "interval_coverage_vouched.json").read_text())
    walls = [run["wall_s"] for run in vouched["runs"]]
    assert len(walls) == 10 and 11.9 < min(walls) and max(walls) < 12.9
    assert 3.6 < min(vouched["edit_to_verdict"]["walls_s"]) and max(vouched["edit_to_verdict"]["walls_s"]) < 4.1
    assert 4.7 < vouched["runs"][-1]["timing_measurement_steps_s"]["rounds"] < 5.2
    assert vouched["runs"][-1]["timing_round_parts_s"]["check"] < 1.3
    priced = {
        name
        for name, task in vouched["runs"][-1]["tasks"].items()
        if name.startswith("timing:") and task["measurement_steps_s"]["copy_price"] > 0
    }
    assert priced == {"timing:compare/torch_ref"}
    assert (vouched["coverage"]["checks"], vouched["coverage"]["held"]) == (80, 80)
    worker = json.loads((H200 / "interval_coverage.json").read_text())["workers_per_build"]
    assert max(r["wall_s"] for r in worker["runs"]) < 14
    speedups = [
        row["speedup"]["value"]
        for run in vouched["runs"]
        for name, row in run["rows"].items()
        if name not in ("torch_ref", "triton_b128")
    ]
    assert 1.64 < min(speedups) and max(speedups) < 1.73


def check_an_edit_to_verdict_with_spare_workers_is_what_the_docs_say():
    """docs/performance.md: with the zygote warm, an edited candidate's correctness job loads it
    into a spare (its CUDA context and timer made before the edit), its timing job takes the
    baseline's copy price, calibration and sizing from the build before (its worker adopted),
    and the command leaves without the interpreter's teardown: 1.97-2.24 s from the edit to the
    verdict over 7 edits (median 2.02 s; 2.47-3.45 s before), against a target of 1.9 s. A spare
    started beside the candidate's first calls slowed them (0.52 s against 0.36-0.39 s)."""
    sets = json.loads((H200 / "edit_to_verdict_spares.json").read_text())
    final = sets["final"]["edit_to_verdict"]
    walls = final["walls_s"]
    assert len(walls) == 7 and 1.96 < min(walls) and max(walls) < 2.25 and 2.0 < statistics.median(walls) < 2.03
    checked, timed = (final["tasks"][f"{rule}:compare/triton_b1024"] for rule in ("correctness", "timing"))
    assert [load.get("spare") for load in checked["worker_loads_s"]] == [True]
    assert checked["phases_s"]["offer"] < 0.01  # no context made: 0.3 s before
    assert timed["measurement_steps_s"]["copy_price"] == 0.0  # the baseline's, from the build before
    assert timed["workers_adopted"] == {"baseline": True, "candidate": True}
    assert final["timeline_s"]["exit"] - final["timeline_s"]["last_timing_end"] < 0.25
    beside = sets["spare_beside_first_calls"]["edit_to_verdict"]["tasks"]["correctness:compare/triton_b1024"]
    assert beside["worker_steps_s"][0]["first_call"] > 0.5 > 0.4 > checked["worker_steps_s"][0]["first_call"]
    assert all(
        s["coverage"]["held"] == s["coverage"]["checks"]
        for name, s in sets.items()
        if isinstance(s, dict) and "coverage" in s
    )


def check_a_triton_spares_warm_up_is_what_the_docs_say():
    """docs/performance.md: on the H200 a Triton spare that compiled magpie's warm-up kernel
    and its candidate's launcher before it was adopted left the edited candidate's first call
    its kernel's compile alone (0.05 s; 0.55 s with the compiler's start and the launcher's C
    compile), the launcher found in the cache the spare handed over, written there before the
    kernel's compile began (after it, by the worker, before); edits 1.84-2.06 s, median 1.92 s,
    against 2.08-2.48 s, median 2.24 s, earlier that day; every interval held."""
    sets = json.loads((H200 / "edit_to_verdict_warmup.json").read_text())
    before, warm = (sets[name]["edit_to_verdict"] for name in ("before_warmup", "warmup"))
    assert 2.23 < statistics.median(before["walls_s"]) < 2.24 and max(before["walls_s"]) < 2.49
    assert 1.91 < statistics.median(warm["walls_s"]) < 1.92
    assert 1.83 < min(warm["walls_s"]) and max(warm["walls_s"]) < 2.07

    def first_call(edit):
        return edit["tasks"]["correctness:compare/triton_b1024"]["worker_steps_s"][0]["first_call"]

    assert first_call(before) > 0.5 and first_call(warm) < 0.06

    def launcher_before_kernel(traced):
        launcher = min(f["t"] for f in traced["compiled"] if "__triton_launcher" in f["file"])
        return launcher < min(f["t"] for f in traced["compiled"] if f["file"].endswith("_k.source"))

    assert warm["traced"] and all(launcher_before_kernel(t) for t in warm["traced"])
    assert all(any("magpie_warmup" in f["file"] for f in t["compiled"]) for t in warm["traced"])
    assert before["traced"] and not any(launcher_before_kernel(t) for t in before["traced"])
    assert all(s["coverage"]["held"] == s["coverage"]["checks"] == 16 for s in sets.values() if isinstance(s, dict))


def check_a_triton_spare_warming_up_beside_its_context_is_what_the_docs_say():
    """docs/performance.md: with the spare's warm-up on a thread beside its context (the load
    waiting for it), an edit right after the verdict no longer waits for the spare: on the
    H200 the edited candidate's correctness job took 0.14-0.16 s (0.25-0.40 s when the warm-up
    followed the context), its launcher built before its kernel's compile in every traced
    edit, and edits 1.71-2.03 s, median 1.76 s (1.71-2.03 s, median 1.79 s, the traced ones
    counted too): under the 1.9 s target."""
    sets = json.loads((H200 / "edit_to_verdict_warmup.json").read_text())
    after, before = (sets[name]["edit_to_verdict"] for name in ("threaded_warmup", "warmup"))

    def correctness_s(edit):
        return edit["timeline_s"]["last_correctness_end"] - edit["timeline_s"]["first_correctness_start"]

    assert max(map(correctness_s, [after, *after["traced"]])) < 0.17
    assert min(map(correctness_s, [before, *before["traced"]])) > 0.24
    walls = after["walls_s"]
    assert 1.75 < statistics.median(walls) < 1.76 and 1.70 < min(walls) and max(walls) < 2.04
    every = after["walls_s"] + [t["wall_s"] for t in after["traced"]]
    assert 1.79 < statistics.median(every) < 1.80 < 1.9 == after["target_s"]
    assert after["tasks"]["correctness:compare/triton_b1024"]["worker_loads_s"][0]["triton_warmup_wait"] < 0.001
    for traced in after["traced"]:
        launcher = min(f["t"] for f in traced["compiled"] if "__triton_launcher" in f["file"])
        assert launcher < min(f["t"] for f in traced["compiled"] if f["file"].endswith("_k.source"))
    assert sets["threaded_warmup"]["coverage"] == {"checks": 16, "held": 16}


def check_h200_vouched_timing_reads_a_large_kernel_as_the_worker_timer_does_and_credits_no_cheat():
    """What docs/performance.md and docs/security.md say of `timing.vouched` on the H200
    (`bench/gpu_vouched.py`, the gated clock): the 4096x4096 relu reads within 4% of the
    worker's own events, a cache by input address earns nothing and a kernel wrong only while
    timed fails."""
    runs = json.loads((H200 / "gpu_vouched.json").read_text())
    vouched, worker = runs["large vouched"]["rows"], runs["large worker timer"]["rows"]
    assert abs(vouched["good"]["median_us"] / worker["good"]["median_us"] - 1) < 0.04
    assert "evaluator's own CUDA events, one recorded as a gate" in vouched["good"]["method"]
    for shape in ("large", "small"):
        rows = runs[f"{shape} vouched"]["rows"]
        assert rows["memoizes"]["speedup"] < 1 and rows["lazy_when_timed"]["performance_state"] == "FAILED"
    assert runs["small worker timer"]["rows"]["memoizes"]["speedup"] > 2  # what the default credits


def check_h200_memory_lent_through_cuda_ipc_is_no_slower_and_the_evaluators_events_track_the_workers():
    """The measurements behind the vouched clock (`bench/ipc_bandwidth.py`,
    `bench/vouched_clock.py`): lent and own memory alike; the evaluator's events within 1% of
    the worker's per call, where its host clock until a probe kernel read 4% over."""
    lent = json.loads((H200 / "ipc_bandwidth.json").read_text())["us_per_call"]
    assert (
        abs(
            lent["lent memory, new inputs, copy"]["borrower_events_us_per_call"]
            / lent["own memory, new inputs, copy"]["borrower_events_us_per_call"]
            - 1
        )
        < 0.01
    )
    clock = json.loads((H200 / "vouched_clock.json").read_text())["rows"]
    for workload in ("large eager", "small graph"):
        row = clock[f"{workload}, event"]
        assert abs(row["evaluator_us_per_call"] / row["worker_events_us_per_call"] - 1) < 0.01
    probe = clock["large eager, probe"]
    assert probe["evaluator_us_per_call"] / probe["worker_events_us_per_call"] > 1.03


def check_h200_calls_made_alone_fail_every_batch_done_together_and_leave_honest_graph_rows_under_the_limit():
    """What docs/performance.md and docs/security.md say of calls made alone on the H200
    (`bench/calls_alone.py`, every row timed as graph replays, batches handed over replayed as
    graphs, on two leases a day apart): every candidate whose batches' calls were done
    together failed its timing, and every honest one read a bound at most 2% over its
    batches' time (credited at the bound), far under ALONE_FAIL."""
    from magpie.harness.measurement import ALONE_FAIL

    honest = []
    for lease in ("calls_alone.json", "calls_alone_repeat.json"):
        for builds in json.loads((H200 / lease).read_text())["projects"].values():
            for build in builds:
                for name, row in build["rows"].items():
                    if name.startswith("batches_"):
                        assert row["performance_state"] == "FAILED", (name, row)
                    elif row["ratio"] is not None:
                        assert row["mode"] == "graph" and row["performance_state"] == "SUCCESS", (name, row)
                        honest.append(row["ratio"])
    assert len(honest) == 26 and max(honest) < 1.03 and ALONE_FAIL >= 1.5


def check_h200_after_theil_sen_no_honest_row_reads_its_baseline_disturbed():
    """Run again on that code (2026-12-02 10:57, two builds each of the relu and the ten
    operations as baselines, `calls_alone_theil_sen.json`): no row flagged
    `disturbed_measurement` (13 of 16 before), the baseline beside each candidate within 7% of
    its own job's, an identical copy credited within noise, and every batch done together failed."""
    projects = json.loads((H200 / "calls_alone_theil_sen.json").read_text())["projects"]
    rows = 0
    for baseline, builds in projects.items():
        for build in builds:
            own = build["rows"][baseline]["median_us"]
            for name, row in build["rows"].items():
                if not row.get("baseline_median_us"):
                    continue
                rows += 1
                assert "disturbed_measurement" not in row["flags"], (name, row["flags"])
                assert abs(row["baseline_median_us"] / own - 1) < 0.07, (name, row["baseline_median_us"], own)
                if name.startswith("batches_"):
                    assert row["performance_state"] == "FAILED"
                if name == "same":
                    assert row["verdict"] == "within noise"
    assert rows == 14


def check_h200_clock_regime_is_what_the_docs_say():
    """The GEMM's clock regimes (performance doc, "Clock regime of that GEMM"): do_bench's 300 ms loop held at the
    power cap reads about 1.16x magpie's build, its SM clock near 1,545 MHz where magpie's stayed at 1,980."""
    run = json.loads((H200 / "clock_regime.json").read_text())
    magpie = run["magpie"]["rows"]["copy"]
    assert run["magpie"]["exit"] == 0 and magpie["performance_state"] == "SUCCESS"
    assert round(magpie["median_us"]) == 1385 and magpie["clocks"]["sm_clock_mhz"]["median"] == 1980
    loop = run["do_bench_300ms"]
    assert round(loop["median_us"]) == 1602 and loop["clocks"]["sm_clock_mhz"]["median"] == 1545
    assert loop["clocks"]["throttle_reasons"]["sw_power_cap"] >= 0.8
    assert abs(run["do_bench_300ms_over_magpie"] - 1.16) < 0.005
    assert round(run["bursts"]["median_us"]) == 1527 and round(run["do_bench_100ms"]["median_us"]) == 1393


def main() -> int:
    checks = [value for name, value in globals().items() if name.startswith("check_") and callable(value)]
    failed = 0
    for check in checks:
        try:
            check()
        except AssertionError:
            failed += 1
            print(f"FAILED {check.__name__}:\n{traceback.format_exc(limit=-1)}", file=sys.stderr)
    print(f"{len(checks) - failed} of {len(checks)} recorded-data checks hold")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
