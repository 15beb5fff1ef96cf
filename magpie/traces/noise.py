"""Whether a row of a trace comparison changed beyond run-to-run noise, with many rows at once.

Each row (an op signature or a kernel) has one time per trace on each side; a side's traces are
repeats of one configuration. A row's own repeats are too few (2 to 5) to know its noise, and a
comparison tests hundreds of rows, so by chance alone some would look changed. Hence:

- a noise model fitted over all rows of the comparison: a row's run-to-run variance is
  (rel · mean)² + calls · jitter² + call_rel² · mean² / calls: a part proportional to its time
  (clocks, contention, shared by its calls), one per call (a short kernel's launch-to-launch
  jitter) and one proportional to each call's time on its own (many calls average it out). The
  three sizes are a gamma regression of the rows' pooled within-side variances (none negative);
- how far the rows' own variances stray from the model beyond what their few repeats explain
  (Smyth's empirical Bayes: the variance of log(s² / model) less trigamma(df / 2)) gives the
  model's degrees of freedom `prior_df`: real kernels differ in noise (a layer norm's 1.1%
  against a softmax's 0.2% on the H200 repeats), so there the model is worth about two, and a
  row's own spread counts for more;
- each row's variance moderated toward the model's (`prior_df` beside the row's own
  n_before + n_after − 2), a Student t test of the difference of means with the degrees of
  freedom summed;
- the Benjamini–Hochberg procedure over a level's rows: a row is a change when its q-value is
  at most `FDR`, so that of the rows called changed, at most that fraction is expected to be
  noise, however many rows there are.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

FDR = 0.05  # the false discovery rate the verdicts control over one level's rows
DEFAULT_PRIOR_DF = 4  # the model's degrees of freedom where too few rows tell how far rows stray from it
MIN_ROWS_FOR_PRIOR_DF = 5  # rows needed to estimate that spread
MAX_PRIOR_DF = 1000  # rows that agree with the model to this many degrees of freedom: as good as known


@dataclass(frozen=True)
class NoiseModel:
    rel: float  # run-to-run standard deviation as a fraction of a row's time (clocks, contention)
    jitter_us: float  # per-call standard deviation, µs (launch-to-launch jitter of short kernels)
    rows: int  # rows it was fitted on
    prior_df: float = DEFAULT_PRIOR_DF  # how many of a row's own degrees of freedom the model is worth
    call_rel: float = 0.0  # per-call standard deviation as a fraction of a call's time, each call on its own

    def variance(self, mean_us: float, calls: float) -> float:
        calls = max(calls, 1.0)
        return (self.rel * mean_us) ** 2 + calls * self.jitter_us**2 + self.call_rel**2 * mean_us**2 / calls


def pooled_variance(before: list[float], after: list[float]) -> tuple[float, int]:
    """The within-side variance pooled over both sides, and its degrees of freedom."""
    squares = sum(sum((x - statistics.fmean(side)) ** 2 for x in side) for side in (before, after) if len(side) > 1)
    df = len(before) + len(after) - 2
    return (squares / df if df > 0 else 0.0), df


def _terms(mean_us: float, calls: float) -> tuple[float, float, float]:
    """What each of the model's three parts multiplies: rel², jitter², call_rel²."""
    return mean_us**2, calls, mean_us**2 / calls


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
    shape = _shape([(v, _terms(m, c)) for v, _, m, c in judged if v > 0], len(judged))
    return _with_spread(
        shape, [(v / shape.variance(m, c), d) for v, d, m, c in judged if v > 0 and shape.variance(m, c) > 0]
    )


def _shape(rows: list[tuple[float, tuple[float, float, float]]], count: int) -> NoiseModel:
    """The three parts' sizes that fit the rows' variances best as a gamma regression (a sample
    variance's spread grows with its mean, so each row weighs by 1 / fitted²), none negative:
    of the fits on each set of parts, the one of least deviance."""
    best, best_deviance = (0.0, 0.0, 0.0), math.inf
    for used in ((0,), (1,), (2,), (0, 1), (0, 2), (1, 2), (0, 1, 2)):
        coefficients = _gamma_fit(rows, used)
        if coefficients is None:
            continue
        fitted = [sum(c * t for c, t in zip(coefficients, terms)) for _, terms in rows]
        if min(fitted, default=0.0) <= 0:
            continue
        deviance = sum(v / f - math.log(v / f) - 1 for (v, _), f in zip(rows, fitted))
        if deviance < best_deviance - 1e-12:
            best, best_deviance = coefficients, deviance
    rel2, jitter2, call_rel2 = best
    return NoiseModel(math.sqrt(rel2), math.sqrt(jitter2), count, call_rel=math.sqrt(call_rel2))


def _gamma_fit(rows, used: tuple[int, ...]) -> tuple[float, float, float] | None:
    """Iteratively reweighted least squares of variance on the chosen parts; None where a part
    comes out negative or the equations are singular."""
    if len(rows) < len(used):
        return None
    weights = [1 / v**2 for v, _ in rows]
    coefficients = None
    for _ in range(25):
        # normal equations of the weighted least squares, solved by Gaussian elimination
        size = len(used)
        matrix = [
            [sum(w * t[used[i]] * t[used[j]] for w, (_, t) in zip(weights, rows)) for j in range(size)]
            + [sum(w * t[used[i]] * v for w, (v, t) in zip(weights, rows))]
            for i in range(size)
        ]
        solved = _solve(matrix)
        if solved is None or min(solved) < 0:
            return None
        if coefficients is not None and all(
            abs(a - b) <= 1e-9 * max(abs(a), 1e-300) for a, b in zip(solved, coefficients)
        ):
            break
        coefficients = solved
        fitted = [sum(c * t[k] for c, k in zip(coefficients, used)) for _, t in rows]
        if min(fitted) <= 0:
            return None
        weights = [1 / f**2 for f in fitted]
    full = [0.0, 0.0, 0.0]
    for c, k in zip(coefficients, used):
        full[k] = c
    return tuple(full)


def _solve(matrix: list[list[float]]) -> list[float] | None:
    size = len(matrix)
    for col in range(size):
        pivot = max(range(col, size), key=lambda r: abs(matrix[r][col]))
        if matrix[pivot][col] == 0:
            return None
        matrix[col], matrix[pivot] = matrix[pivot], matrix[col]
        for r in range(size):
            if r != col:
                factor = matrix[r][col] / matrix[col][col]
                matrix[r] = [a - factor * b for a, b in zip(matrix[r], matrix[col])]
    return [matrix[i][size] / matrix[i][i] for i in range(size)]


def _with_spread(shape: NoiseModel, ratios: list[tuple[float, int]]) -> NoiseModel:
    """The model's scale and degrees of freedom from how its rows' variances stray from it
    (Smyth's empirical Bayes, 2004): log(s² / model) of a row whose true variance is the model's
    varies as the log of a chi-square (trigamma(d/2)); what the rows vary beyond that is how far
    rows' own noise differs from the model (a kernel noisier than the rest), and the fewer
    degrees of freedom the model is worth beside a row's own repeats."""
    if len(ratios) < MIN_ROWS_FOR_PRIOR_DF:
        return shape
    logs = [math.log(r) - digamma(d / 2) + math.log(d / 2) for r, d in ratios]
    centre = statistics.fmean(logs)
    beyond_chance = statistics.variance(logs) - statistics.fmean(trigamma(d / 2) for _, d in ratios)
    prior_df = min(2 * trigamma_inverse(beyond_chance), MAX_PRIOR_DF) if beyond_chance > 0 else MAX_PRIOR_DF
    factor = math.exp(centre + digamma(prior_df / 2) - math.log(prior_df / 2))
    return NoiseModel(
        shape.rel * math.sqrt(factor),
        shape.jitter_us * math.sqrt(factor),
        shape.rows,
        prior_df,
        shape.call_rel * math.sqrt(factor),
    )


def digamma(x: float) -> float:
    result = 0.0
    while x < 6:
        result -= 1 / x
        x += 1
    f = 1 / (x * x)
    return result + math.log(x) - 0.5 / x - f * (1 / 12 - f * (1 / 120 - f * (1 / 252 - f * (1 / 240 - f / 132))))


def trigamma(x: float) -> float:
    result = 0.0
    while x < 6:
        result += 1 / (x * x)
        x += 1
    f = 1 / (x * x)
    return result + 1 / x + f / 2 + f / x * (1 / 6 - f * (1 / 30 - f * (1 / 42 - f / 30)))


def trigamma_inverse(y: float) -> float:
    """The x > 0 with trigamma(x) = y (Newton's method on 1/trigamma, as Smyth's limma does)."""
    if y > 1e7:
        return 1 / math.sqrt(y)
    if y < 1e-6:
        return 1 / y
    x = 0.5 + 1 / y
    for _ in range(50):
        tri = trigamma(x)
        step = tri * (1 - tri / y) / _tetragamma(x)
        x += step
        if -step / x < 1e-8:
            break
    return x


def _tetragamma(x: float) -> float:
    result = 0.0
    while x < 6:
        result -= 2 / x**3
        x += 1
    f = 1 / (x * x)
    return result - f - f / x - f * f * (1 / 2 - f * (1 / 6 - f * (1 / 6 - 3 * f / 10)))


def t_test(
    before: list[float], after: list[float], prior_variance: float, prior_df: float = DEFAULT_PRIOR_DF
) -> tuple[float, float] | None:
    """Two-sided p-value of the difference of means and its standard error (µs), the row's own
    variance moderated toward the model's; None without repeats on either side."""
    variance, df = pooled_variance(before, after)
    if df <= 0:
        return None
    moderated = (prior_df * prior_variance + df * variance) / (prior_df + df)
    error = math.sqrt(moderated * (1 / len(before) + 1 / len(after)))
    diff = statistics.fmean(after) - statistics.fmean(before)
    if error == 0:
        return (1.0 if diff == 0 else 0.0), 0.0
    # whole degrees of freedom for the series below, rounded down: the test errs toward "within noise"
    return t_two_sided(abs(diff) / error, int(prior_df + df)), error


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
