"""The H200 measurements the timing rules are judged by, replayed on the CPU with today's code:
no honest kernel of the sweep fails the wall-clock check, and speedup intervals hold across
runs. Fixtures: bench/timer_sweep.py and bench/interval_coverage.py on the H200 (and the
latter on the CPU machine). What the recorded runs say by themselves, beside the docs' figures,
bench/check_recorded.py checks (no code of magpie's reads them there)."""

import json
import statistics
from pathlib import Path

from magpie.compare.stats import widen_for_runs
from magpie.harness.measurement import DEFAULT_BETWEEN_RUNS, for_device, timer_inconsistency, wall_check
from magpie.manifest.models import TimingSettings

FIXTURES = Path(__file__).parent / "fixtures" / "h200"


def roles(name: str) -> list[tuple[str, dict]]:
    rows = json.loads((FIXTURES / name).read_text())["rows"]
    return [
        (f"{name}: {r['kernel']}/{r['implementation']}/{role}", r[role])
        for r in rows
        for role in ("candidate", "baseline")
        if r[role] and r[role].get("wall_account")
    ]


# the sweep twice (the second in a busier build: up to 11% of a slow kernel's median went
# unexplained there), and once with each kernel in the mode its probe would not choose
SWEEPS = [*roles("timer_sweep.json"), *roles("timer_sweep_repeat.json"), *roles("timer_sweep_swap.json")]


def test_no_honest_kernel_of_the_sweep_fails_the_wall_clock_check():
    """Every timed role of the three sweeps (205) through today's check; the message names each
    one that fails, with why."""
    failing = {}
    for name, role in SWEEPS:
        account = role["wall_account"]
        summary = {
            "median_us": role["median_us"],
            "early_rounds_ms": [],
            **wall_check(account["wall_s"], account, role["median_us"]),
        }
        problem = timer_inconsistency(summary)
        if problem is not None:
            failing[name] = problem
    assert len(SWEEPS) == 205
    assert not failing, f"{len(failing)} of {len(SWEEPS)} honest roles fail the wall-clock check: {failing}"


def coverage(part: dict, widen: float | None) -> float:
    """Share of (run, candidate) whose interval holds the median of the other runs' estimates;
    widen: recompute the interval from the run's own (bootstrap) one with this between-runs spread."""
    runs = part["runs"]
    names = [n for n, row in runs[0]["rows"].items() if row["speedup"]["verdict"] != "baseline"]
    held = checks = 0
    for name in names:
        speedups = [run["rows"][name]["speedup"] for run in runs]
        for i, s in enumerate(speedups):
            others = statistics.median(x["value"] for j, x in enumerate(speedups) if j != i)
            low, high = s["ci_low"], s["ci_high"]
            if widen is not None:
                low, high = widen_for_runs(s["value"], *s["ci_within_run"], widen)
            checks += 1
            held += low <= others <= high
    return held / checks


def test_speedup_intervals_hold_the_other_runs_median_in_at_least_90_percent_of_cases():
    part = json.loads((FIXTURES / "interval_coverage.json").read_text())["workers_per_build"]
    assert coverage(part, None) >= 0.9  # as measured, with the default between-runs spread
    gpu_default = for_device(TimingSettings().between_runs, DEFAULT_BETWEEN_RUNS, "cuda")
    assert coverage(part, gpu_default) >= 0.9  # recomputed with today's GPU default
    assert coverage(part, 0.0) < 0.5  # a run's own bootstrap alone: far too narrow


def test_on_the_cpu_intervals_hold_only_widened_by_the_cpus_own_spread_between_runs():
    """The H200's 1% between runs, applied on the 2-core CPU machine, left intervals that held
    the other runs' median in 50 and 60 of 80 cases (10 repeats each of the 8-candidate compare,
    `bench/interval_coverage.py --device cpu`): the speedups there spread 2-20% between runs.
    The CPU's default, 6.5%, held 80 of 80 in a third set and 78 of 80 in each of the first two,
    recomputed from their own intervals."""
    data = json.loads((FIXTURES.parent / "interval_coverage_cpu.json").read_text())
    cpu = for_device(TimingSettings().between_runs, DEFAULT_BETWEEN_RUNS, "cpu")
    for name in ("between_runs_1_percent_a", "between_runs_1_percent_b"):
        part = data[name]
        assert {
            row["speedup"]["between_runs"]
            for run in part["runs"]
            for row in run["rows"].values()
            if row["speedup"] and row["speedup"]["verdict"] != "baseline"
        } == {0.01}
        assert coverage(part, None) < 0.8
        assert coverage(part, cpu) >= 0.95
    default = data["between_runs_default"]
    assert {
        row["speedup"]["between_runs"]
        for run in default["runs"]
        for row in run["rows"].values()
        if row["speedup"] and row["speedup"]["verdict"] != "baseline"
    } == {cpu}
    assert coverage(default, None) >= 0.95
