"""Whether a row of a trace comparison changed beyond run-to-run noise, with many rows at once.

Each row (an op signature or a kernel) has one time per trace on each side; a side's traces are
repeats of one configuration. A row's own repeats are too few (2 to 5) to know its noise, and a
comparison tests hundreds of rows, so by chance alone some would look changed. Hence:

- a noise model fitted over all rows of the comparison: a row's run-to-run variance is
  (rel · mean)² + calls · jitter², a part proportional to its time (clocks, contention) and one
  per call (a short kernel's launch-to-launch jitter, which dominates single-call microsecond
  rows). `rel` is fitted on rows whose calls are long, `jitter` on the rest, each from the
  median of the rows' pooled within-side variances (scaled so that the median of a chi-square
  estimates its mean);
- each row's variance moderated toward the model's (`PRIOR_WEIGHT` degrees of freedom of the
  model beside the row's own n_before + n_after − 2), a Student t test of the difference of
  means with the degrees of freedom summed;
- the Benjamini–Hochberg procedure over a level's rows: a row is a change when its q-value is
  at most `FDR`, so that of the rows called changed, at most that fraction is expected to be
  noise, however many rows there are.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

FDR = 0.05  # the false discovery rate the verdicts control over one level's rows
PRIOR_WEIGHT = 4  # degrees of freedom the fitted noise model counts for beside a row's own
LONG_CALL_US = 20.0  # calls at least this long on average fit the relative part; shorter, the per-call part


@dataclass(frozen=True)
class NoiseModel:
    rel: float  # run-to-run standard deviation as a fraction of a row's time
    jitter_us: float  # per-call standard deviation, µs
    rows: int  # rows it was fitted on

    def variance(self, mean_us: float, calls: float) -> float:
        return (self.rel * mean_us) ** 2 + max(calls, 1.0) * self.jitter_us ** 2


def pooled_variance(before: list[float], after: list[float]) -> tuple[float, int]:
    """The within-side variance pooled over both sides, and its degrees of freedom."""
    squares = sum(sum((x - statistics.fmean(side)) ** 2 for x in side) for side in (before, after) if len(side) > 1)
    df = len(before) + len(after) - 2
    return (squares / df if df > 0 else 0.0), df


def _median_chi_square_scale(df: int) -> float:
    """Median of chi-square(df)/df (Wilson–Hilferty), by which a median of variance estimates
    underestimates their mean."""
    return (1 - 2 / (9 * df)) ** 3


def fit(rows: list[tuple[list[float], list[float], float]]) -> NoiseModel | None:
    """The noise model of one comparison's rows (before times, after times, mean calls per trace);
    None where no row has repeats."""
    judged = []
    for before, after, calls in rows:
        variance, df = pooled_variance(before, after)
        mean = statistics.fmean(before + after)
        if df > 0 and mean > 0:
            judged.append((variance, df, mean, max(calls, 1.0)))
    if not judged:
        return None
    df = statistics.median(row[1] for row in judged)
    scale = _median_chi_square_scale(max(int(df), 1))
    long = [v / m ** 2 for v, _, m, c in judged if m / c >= LONG_CALL_US]
    short = [(v, m, c) for v, _, m, c in judged if m / c < LONG_CALL_US]
    rel2 = statistics.median(long) / scale if long else 0.0
    if not long:  # nothing long: the relative part from every row, then what it leaves per call
        rel2 = statistics.median(v / m ** 2 for v, _, m, _ in judged) / scale
    jitter2 = statistics.median(max(v - rel2 * m ** 2, 0.0) / c for v, m, c in short) / scale if short else 0.0
    return NoiseModel(math.sqrt(rel2), math.sqrt(jitter2), len(judged))


def t_test(before: list[float], after: list[float], prior_variance: float) -> tuple[float, float] | None:
    """Two-sided p-value of the difference of means and its standard error (µs), the row's own
    variance moderated toward the model's; None without repeats on either side."""
    variance, df = pooled_variance(before, after)
    if df <= 0:
        return None
    moderated = (PRIOR_WEIGHT * prior_variance + df * variance) / (PRIOR_WEIGHT + df)
    error = math.sqrt(moderated * (1 / len(before) + 1 / len(after)))
    diff = statistics.fmean(after) - statistics.fmean(before)
    if error == 0:
        return (1.0 if diff == 0 else 0.0), 0.0
    return t_two_sided(abs(diff) / error, PRIOR_WEIGHT + df), error


def t_two_sided(t: float, df: int) -> float:
    """P(|T| >= t) for Student's t with an integer number of degrees of freedom (the finite
    series in the angle theta = atan(t / sqrt(df)))."""
    theta = math.atan(t / math.sqrt(df))
    s, c2 = math.sin(theta), math.cos(theta) ** 2
    if df % 2 == 1:
        term, series = math.cos(theta), 0.0
        if df > 1:
            series = term
            for k in range(3, df - 1, 2):
                term *= c2 * (k - 1) / k
                series += term
        inside = 2 / math.pi * (theta + s * series)
    else:
        term = series = 1.0
        for k in range(2, df - 1, 2):
            term *= c2 * (k - 1) / k
            series += term
        inside = s * series
    return min(max(1.0 - inside, 0.0), 1.0)


def benjamini_hochberg(pvalues: list[float]) -> list[float]:
    """The q-values (adjusted p-values) of the Benjamini–Hochberg procedure, in the given order."""
    m = len(pvalues)
    order = sorted(range(m), key=pvalues.__getitem__)
    q = [1.0] * m
    running = 1.0
    for rank in range(m, 0, -1):
        index = order[rank - 1]
        running = min(running, pvalues[index] * m / rank)
        q[index] = running
    return q
