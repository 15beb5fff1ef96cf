import random

from magpie.compare.stats import bootstrap_speedup, quantile, summarize_ns
from magpie.execution.actions import rank


def test_summary_of_known_samples():
    s = summarize_ns([1000, 2000, 3000, 4000, 5000])
    assert s["median_us"] == 3.0 and s["min_us"] == 1.0 and s["n"] == 5
    assert s["p20_us"] == 1.8 and s["p80_us"] == 4.2
    assert abs(s["cv"] - (2 ** 0.5) / 3) < 1e-12
    assert quantile([], 0.5) != quantile([], 0.5)  # NaN for no data


def test_false_alarms_stay_near_the_nominal_rate():
    """Two sample sets from one distribution: a 95% interval should exclude 1.0 about 5% of the time."""
    rng = random.Random(7)
    alarms = 0
    for trial in range(100):
        base = [100 + rng.gauss(0, 5) for _ in range(100)]
        same = [100 + rng.gauss(0, 5) for _ in range(100)]
        alarms += bootstrap_speedup(base, same, resamples=400, seed=trial)["verdict"] != "within noise"
    assert alarms <= 12


def test_a_real_shift_is_detected_in_the_right_direction():
    rng = random.Random(1)
    base = [100 + rng.gauss(0, 5) for _ in range(400)]
    faster = [90 + rng.gauss(0, 5) for _ in range(400)]
    result = bootstrap_speedup(base, faster)
    assert result["verdict"] == "faster" and result["ci_low"] > 1.0
    assert 1.08 < result["value"] < 1.14
    assert bootstrap_speedup(faster, base)["verdict"] == "slower"


def _row(impl, correct=True, median=10.0, samples=None, paired=None):
    perf = {"median_us": median} if correct else None
    return {"implementation": impl, "correctness_state": "SUCCESS" if correct else "FAILED",
            "performance_state": "SUCCESS" if correct else "SKIPPED", "performance_result": perf,
            "baseline_result": {"median_us": 10.0}, "samples_us": samples,
            "_paired_speedup": bootstrap_speedup(paired, samples) if paired else None,
            "verdict": "correct" if correct else "incorrect: allclose", "errors": []}


def test_ranking_excludes_incorrect_and_uses_the_baseline():
    rng = random.Random(2)
    base = [10 + rng.random() for _ in range(200)]
    quick = [5 + rng.random() for _ in range(200)]
    rows = [_row("base", samples=base), _row("quick", median=5.5, samples=quick, paired=base),
            _row("broken", correct=False)]
    report = rank("k", rows, {"id": "base"})
    assert report["ranking"] == ["quick", "base"] and report["best"] == "quick"
    assert report["excluded"][0]["implementation"] == "broken"
    quick_row = next(r for r in report["results"] if r["implementation"] == "quick")
    assert quick_row["speedup"]["verdict"] == "faster"
