"""The op tables' standard deviations, bit for bit those of the statistics module, faster.

statistics.stdev and pstdev return the square root, correctly rounded, of the exact variance,
summed in fractions one value at a time: a third of a 1M-event inference run. The two here sum
integers over the distinct values instead (durations recorded to the nanosecond, and the rates
derived from them, repeat many times over a signature's calls) and round the same square root."""

from __future__ import annotations

import math
from collections import Counter


def sample_std(values: list[float]) -> float:
    """statistics.stdev(values), for two values or more."""
    counts = Counter(values)
    numerators, denominator = _over_common_denominator(counts)
    total = sum(n * c for n, c in zip(numerators, counts.values()))
    squares = sum(n * n * c for n, c in zip(numerators, counts.values()))
    calls = len(values)
    return _sqrt_of_ratio(calls * squares - total * total, calls * (calls - 1) * denominator * denominator)


def population_std(values: list[float], mean: float) -> float:
    """statistics.pstdev(values, mean): the exact sum of the floats (x - mean)², each rounded as
    pstdev rounds it, over the count."""
    counts = Counter(values)
    numerators, denominator = _over_common_denominator([(x - mean) * (x - mean) for x in counts])
    total = sum(n * c for n, c in zip(numerators, counts.values()))
    return _sqrt_of_ratio(total, len(values) * denominator)


def _over_common_denominator(values) -> tuple[list[int], int]:
    """The floats as integer numerators over one denominator (a power of two), exactly."""
    ratios = [value.as_integer_ratio() for value in values]
    denominator = max(d for _, d in ratios)
    return [n * (denominator // d) for n, d in ratios], denominator


def _sqrt_of_ratio(numerator: int, denominator: int) -> float:
    """√(numerator / denominator) correctly rounded: an integer square root of at least 56 bits
    whose last bit is set where it is inexact (round to odd), then one rounding to a float."""
    shift = max(0, (112 + denominator.bit_length() - numerator.bit_length()) // 2)
    scaled = numerator << 2 * shift
    root = math.isqrt(scaled // denominator)
    return (root | (root * root * denominator != scaled)) / (1 << shift)
