"""Summary statistics and bootstrap intervals, in plain Python (no numpy import)."""

from __future__ import annotations

import math
import random
from statistics import fmean, median, pstdev


def quantile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return math.nan
    pos = q * (len(sorted_values) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def summarize_ns(samples_ns: list[int]) -> dict:
    values = sorted(s / 1000.0 for s in samples_ns)
    mean = fmean(values)
    return {
        "median_us": median(values),
        "p20_us": quantile(values, 0.2),
        "p80_us": quantile(values, 0.8),
        "min_us": values[0],
        "mean_us": mean,
        "n": len(values),
        "cv": pstdev(values) / mean if mean > 0 else 0.0,
    }


def thin(values: list[float], limit: int) -> list[float]:
    """Every k-th value, keeping time order, so long sample runs bootstrap quickly."""
    if len(values) <= limit:
        return list(values)
    step = len(values) / limit
    return [values[int(i * step)] for i in range(limit)]


def bootstrap_speedup(baseline_us: list[float], candidate_us: list[float], *, resamples: int = 1000,
                      confidence: float = 0.95, seed: int = 0, max_samples: int = 300) -> dict:
    """Speedup = median(baseline) / median(candidate), with a percentile bootstrap interval
    from resampling each sample set independently. An interval that contains 1.0 means the
    difference is within the noise of these measurements."""
    rng = random.Random(seed)
    point = median(baseline_us) / median(candidate_us)
    base, cand = thin(baseline_us, max_samples), thin(candidate_us, max_samples)
    stats = []
    for _ in range(resamples):
        b = median(rng.choices(base, k=len(base)))
        c = median(rng.choices(cand, k=len(cand)))
        stats.append(b / c)
    stats.sort()
    alpha = (1 - confidence) / 2
    low, high = quantile(stats, alpha), quantile(stats, 1 - alpha)
    if low <= 1.0 <= high:
        verdict = "within noise"
    else:
        verdict = "faster" if low > 1.0 else "slower"
    return {"value": point, "ci_low": low, "ci_high": high, "confidence": confidence,
            "resamples": resamples, "verdict": verdict}
