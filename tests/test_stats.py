import math
import random

import pytest

from magpie.compare.stats import bootstrap_speedup, quantile, summarize_ns, t_quantile, thin, thin_rounds
from magpie.execution.actions import rank
from magpie.harness.measurement import paired_speedup


def test_summary_of_known_samples():
    s = summarize_ns([1000, 2000, 3000, 4000, 5000])
    assert s["median_us"] == 3.0 and s["min_us"] == 1.0 and s["n"] == 5
    assert s["p20_us"] == 1.8 and s["p80_us"] == 4.2
    assert abs(s["spread_rel"] - 0.4) < 1e-12
    assert abs(s["cv"] - (2**0.5) / 3) < 1e-12
    assert quantile([], 0.5) != quantile([], 0.5)  # NaN for no data


def test_the_headline_spread_ignores_the_tails_that_inflate_the_cv():
    rng = random.Random(3)
    samples = [int(100_000 * (1 + rng.uniform(-0.01, 0.01))) for _ in range(950)] + [400_000] * 50
    s = summarize_ns(samples)
    assert s["cv"] > 0.5 and s["spread_rel"] < 0.01


def test_thinning_by_rounds_keeps_the_rounds_apart():
    values = list(range(5000))
    sizes = [1100, 900, 1000, 1300, 700]
    kept, counts = thin_rounds(values, sizes, 2000)
    assert kept == thin(values, 2000) and sum(counts) == 2000
    ends = [sum(sizes[: r + 1]) for r in range(len(sizes))]
    start = 0
    for r, count in enumerate(counts):
        assert all(ends[r] - sizes[r] <= v < ends[r] for v in kept[start : start + count])
        assert abs(count - sizes[r] * 2000 / 5000) <= 1
        start += count
    assert thin_rounds(values[:10], [4, 6], 2000) == (values[:10], [4, 6])


def test_student_t_quantiles():
    for df, expected in ((1, 12.7062), (2, 4.3027), (4, 2.7764), (9, 2.2622), (30, 2.0423)):
        assert abs(t_quantile(0.975, df) - expected) < 1e-3


def _rounds(rng, median_us, shift, noise, rounds=5, per_round=40):
    """Samples timed in rounds: each round shifted as a whole (drift between rounds), then noise."""
    out = []
    for _ in range(rounds):
        level = median_us * math.exp(rng.gauss(0, shift))
        out.append([level * (1 + rng.gauss(0, noise)) for _ in range(per_round)])
    return [v for r in out for v in r], [len(r) for r in out]


def _contains(result, value):
    return result["ci_low"] <= value <= result["ci_high"]


def test_round_to_round_shifts_widen_the_interval_and_it_covers_the_truth():
    """Rounds that move as a whole (2% between rounds, 0.5% within): the i.i.d. bootstrap's
    interval is far too narrow to cover the true ratio; resampling rounds covers it."""
    covered = iid_covered = 0
    trials = 40
    for trial in range(trials):
        rng = random.Random(100 + trial)
        base, base_sizes = _rounds(rng, 100.0, 0.02, 0.005)
        cand, cand_sizes = _rounds(rng, 80.0, 0.02, 0.005)
        blocks = bootstrap_speedup(
            base, cand, baseline_rounds=base_sizes, candidate_rounds=cand_sizes, resamples=400, seed=trial
        )
        iid = bootstrap_speedup(base, cand, resamples=400, seed=trial)
        assert blocks["rounds"] == 5 and iid["rounds"] == 1
        assert blocks["ci_high"] - blocks["ci_low"] > 3 * (iid["ci_high"] - iid["ci_low"])
        assert _contains(blocks, blocks["value"]) and _contains(iid, iid["value"])
        covered += _contains(blocks, 1.25)
        iid_covered += _contains(iid, 1.25)
    assert covered >= 0.85 * trials and iid_covered <= 0.5 * trials


def test_equal_implementations_with_drifting_rounds_are_within_noise():
    alarms = 0
    trials = 40
    for trial in range(trials):
        rng = random.Random(500 + trial)
        base, base_sizes = _rounds(rng, 50.0, 0.01, 0.01)
        same, same_sizes = _rounds(rng, 50.0, 0.01, 0.01)
        result = bootstrap_speedup(
            base, same, baseline_rounds=base_sizes, candidate_rounds=same_sizes, resamples=400, seed=trial
        )
        alarms += result["verdict"] != "within noise"
    assert alarms <= 0.1 * trials


def test_the_point_estimate_is_always_inside_its_interval():
    """Random shapes: skewed, heavy-tailed, discrete (ties), few or many rounds, thinned or not."""
    rng = random.Random(11)
    for case in range(60):
        rounds = rng.randint(1, 8)

        def draw(level):
            sizes = [rng.randint(1, 60) for _ in range(rounds)]  # noqa: B023 (draw() runs within the iteration)
            kind = rng.choice(("normal", "lognormal", "ticks", "tail"))
            values = []
            for _ in range(sum(sizes)):
                if kind == "normal":
                    values.append(level + rng.gauss(0, level * 0.05))
                elif kind == "lognormal":
                    values.append(level * rng.lognormvariate(0, 0.3))
                elif kind == "ticks":
                    values.append(level + rng.choice((0, 0, 1, 2)) * 0.5)
                else:
                    values.append(level * (5 if rng.random() < 0.1 else 1) + rng.random())
            return values, sizes

        level = rng.uniform(1, 100)
        base, base_sizes = draw(level)
        cand, cand_sizes = draw(level * rng.choice((0.5, 1.0, 1.0, 1.02, 2.0)))
        result = bootstrap_speedup(
            base,
            cand,
            baseline_rounds=base_sizes,
            candidate_rounds=cand_sizes,
            resamples=200,
            seed=case,
            max_samples=rng.choice((20, 100, 1000)),
        )
        assert result["ci_low"] <= result["value"] <= result["ci_high"], (case, result)
        assert (result["verdict"] == "within noise") == (result["ci_low"] <= 1.0 <= result["ci_high"])


def test_swapping_the_roles_inverts_the_interval():
    rng = random.Random(4)
    base, base_sizes = _rounds(rng, 100.0, 0.02, 0.01)
    cand, cand_sizes = _rounds(rng, 90.0, 0.02, 0.01)
    ahead = bootstrap_speedup(base, cand, baseline_rounds=base_sizes, candidate_rounds=cand_sizes)
    behind = bootstrap_speedup(cand, base, baseline_rounds=cand_sizes, candidate_rounds=base_sizes)
    assert abs(ahead["value"] * behind["value"] - 1) < 1e-12
    assert abs(ahead["ci_low"] * behind["ci_high"] - 1) < 1e-9
    assert abs(ahead["ci_high"] * behind["ci_low"] - 1) < 1e-9


def test_round_sizes_that_do_not_fit_the_samples_fall_back_to_samples():
    rng = random.Random(5)
    base, sizes = _rounds(rng, 100.0, 0.0, 0.01)
    result = bootstrap_speedup(base, base, baseline_rounds=sizes, candidate_rounds=sizes[:-1])
    assert result["rounds"] == 1 and result["resampling"] == "samples (no rounds)"


def test_the_timing_job_hands_the_rounds_to_the_bootstrap():
    rng = random.Random(6)
    base, base_sizes = _rounds(rng, 100.0, 0.02, 0.005)
    cand, cand_sizes = _rounds(rng, 80.0, 0.02, 0.005)
    # the evaluator's kept samples are in ns
    kept = {
        "baseline": ([round(s * 1000) for s in base], base_sizes),
        "candidate": ([round(s * 1000) for s in cand], cand_sizes),
    }
    speedup = paired_speedup(kept, 100.0)
    assert speedup["rounds"] == 5 and speedup["resampling"] == "5 rounds, paired"
    assert speedup["baseline_median_us"] == 100.0 and "block bootstrap" in speedup["method"]
    expected = bootstrap_speedup(base, cand, baseline_rounds=base_sizes, candidate_rounds=cand_sizes)
    assert speedup["ci_low"] == pytest.approx(expected["ci_low"], rel=1e-4)
    assert speedup["ci_high"] == pytest.approx(expected["ci_high"], rel=1e-4)


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
    return {
        "implementation": impl,
        "correctness_state": "SUCCESS" if correct else "FAILED",
        "performance_state": "SUCCESS" if correct else "SKIPPED",
        "performance_result": perf,
        "baseline_result": {"median_us": 10.0},
        "samples_us": samples,
        "_paired_speedup": bootstrap_speedup(paired, samples) if paired else None,
        "verdict": "correct" if correct else "incorrect: allclose",
        "errors": [],
    }


def test_ranking_excludes_incorrect_and_uses_the_baseline():
    rng = random.Random(2)
    base = [10 + rng.random() for _ in range(200)]
    quick = [5 + rng.random() for _ in range(200)]
    rows = [
        _row("base", samples=base),
        _row("quick", median=5.5, samples=quick, paired=base),
        _row("broken", correct=False),
    ]
    report = rank("k", rows, {"id": "base"})
    assert report["ranking"] == ["quick", "base"] and report["best"] == "quick"
    assert report["excluded"][0]["implementation"] == "broken"
    quick_row = next(r for r in report["results"] if r["implementation"] == "quick")
    assert quick_row["speedup"]["verdict"] == "faster"


def test_the_reports_show_the_robust_spread_not_the_cv():
    """The H200 softmax run: cuda_rowwise's CV is 5.9%, its p20-p80 range ±1.0% of the median."""
    import json
    from pathlib import Path

    from magpie.report.render import render, spread_text

    report = json.loads((Path(__file__).parent / "fixtures/h200/compare_report_softmax.json").read_text())
    cuda = next(r for r in report["results"] if r["implementation"] == "cuda_rowwise")["performance_result"]
    assert cuda["cv"] > 0.05 and spread_text(cuda) == "±1.0%"
    html = render([report], "h200")["report.html"]
    assert "<th>CV</th>" not in html and '<td class="num">±1.0%</td>' in html
