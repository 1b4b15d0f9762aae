"""Percentiles and the "median over rounds" every benchmark figure is reported as."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence


def percentile(samples: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100), linear between closest ranks."""
    if not samples:
        return math.nan
    ordered = sorted(samples)
    rank = (len(ordered) - 1) * q / 100
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def ms(seconds: float) -> float:
    """Seconds as milliseconds, rounded for a readable report."""
    return round(seconds * 1000, 4)


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else math.nan


def over_rounds(rounds: Sequence[Sequence[float]], figure: Callable[[Sequence[float]], float]) -> float:
    """`figure` of each round's samples, then the median of those: robust to a noisy round."""
    return median([figure(samples) for samples in rounds])


def p50(samples: Sequence[float]) -> float:
    return percentile(samples, 50)


def p95(samples: Sequence[float]) -> float:
    return percentile(samples, 95)


def p99(samples: Sequence[float]) -> float:
    return percentile(samples, 99)


def ratio_over_rounds(
    subject: Sequence[Sequence[float]],
    baseline: Sequence[Sequence[float]],
    figure: Callable[[Sequence[float]], float] = p50,
) -> float:
    """Median over rounds of figure(subject) / figure(baseline), each pair measured side by side."""
    return median([figure(s) / figure(b) for s, b in zip(subject, baseline, strict=True)])


def difference_over_rounds(
    subject: Sequence[Sequence[float]],
    baseline: Sequence[Sequence[float]],
    figure: Callable[[Sequence[float]], float] = p50,
) -> float:
    """Median over rounds of figure(subject) - figure(baseline)."""
    return median([figure(s) - figure(b) for s, b in zip(subject, baseline, strict=True)])
