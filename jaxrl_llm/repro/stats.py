"""Seed statistics for the miniature reproductions: intervals of a mean and paired arm tests.

A reproduction runs every arm with the same seeds, so arm A's seed s and arm B's seed s share
their data order, validation set and initial sampling state; the comparison is therefore
paired (differences per seed), which removes the between-seed variance both arms share.

- ``mean_interval``: the mean over seeds and a 95% percentile bootstrap interval
  (``scipy.stats.bootstrap``). Percentile rather than BCa because BCa's jackknife is
  undefined on the few, often tied, values a handful of seeds gives.
- ``paired_comparison``: the mean difference, its bootstrap interval, and a two-sided
  sign-flip permutation test (``scipy.stats.permutation_test`` with
  ``permutation_type="samples"``). Up to 13 seeds it is exact: scipy enumerates all 2^n sign
  patterns (2^13 = 8192 <= ``N_RESAMPLES``), and the smallest p-value it can give is 2 / 2^n
  (0.0625 for 5 seeds): say so rather than read p = 0.06 as weak evidence. From 14 seeds on
  it draws ``N_RESAMPLES`` random patterns and counts the observed one among them, so the
  smallest p is 2 / (N_RESAMPLES + 1) = 0.0002 (``min_p_value``).

One seed gives no interval: the bounds are NaN and the p-value 1.0 (nothing can be tested).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np
from scipy import stats

CONFIDENCE = 0.95
N_RESAMPLES = 9999


@dataclasses.dataclass(frozen=True)
class Interval:
    """A mean over seeds with its 95% bootstrap interval (NaN bounds with one seed)."""

    mean: float
    low: float
    high: float
    n: int

    def excludes(self, value: float) -> bool:
        """True when ``value`` lies outside the interval (False when there is none)."""
        return not math.isnan(self.low) and (value < self.low or value > self.high)


@dataclasses.dataclass(frozen=True)
class PairedComparison:
    """Arm ``a`` minus arm ``b`` over shared seeds."""

    a: str
    b: str
    difference: Interval
    p_value: float  # two-sided sign-flip permutation test of mean difference = 0
    min_p_value: float  # the smallest p the test can give with this many seeds

    @property
    def significant(self) -> bool:
        """The interval excludes 0 and the permutation test rejects at 5%."""
        return self.difference.excludes(0.0) and self.p_value < 0.05


def _as_values(values: Sequence[float] | np.ndarray, what: str) -> np.ndarray:
    x = np.asarray(values, dtype=np.float64)
    if x.ndim != 1 or x.size == 0 or not np.all(np.isfinite(x)):
        raise ValueError(f"{what} must be a non-empty 1-D sequence of finite numbers, got {x!r}")
    return x


def mean_interval(values: Sequence[float] | np.ndarray, *, seed: int = 0) -> Interval:
    """Mean and 95% percentile bootstrap interval of ``values`` (one per seed)."""
    x = _as_values(values, "values")
    if x.size == 1 or np.all(x == x[0]):
        # One value: no spread to resample. All equal: every resample is that value.
        low = high = float("nan") if x.size == 1 else float(x[0])
        return Interval(float(x.mean()), low, high, int(x.size))
    res = stats.bootstrap(
        (x,),
        np.mean,
        confidence_level=CONFIDENCE,
        n_resamples=N_RESAMPLES,
        method="percentile",
        rng=np.random.default_rng(seed),
    )
    ci = res.confidence_interval
    return Interval(float(x.mean()), float(ci.low), float(ci.high), int(x.size))


def permutation_p_floor(n: int) -> float:
    """The smallest p-value the two-sided sign-flip test of ``paired_comparison`` can give
    with ``n`` seeds: 2 / 2^n where scipy enumerates the 2^n patterns (2^n <= N_RESAMPLES),
    else 2 / (N_RESAMPLES + 1): scipy's random test counts the observed pattern as one more
    resample, each side's p is (1 + hits) / (N_RESAMPLES + 1), and it doubles the smaller."""
    patterns = 2**n
    return min(1.0, 2.0 / patterns if patterns <= N_RESAMPLES else 2.0 / (N_RESAMPLES + 1))


def paired_comparison(
    a_name: str,
    a: Sequence[float] | np.ndarray,
    b_name: str,
    b: Sequence[float] | np.ndarray,
    *,
    seed: int = 0,
) -> PairedComparison:
    """Arm a minus arm b, paired by seed: mean difference, interval, permutation p-value."""
    x, y = _as_values(a, a_name), _as_values(b, b_name)
    if x.shape != y.shape:
        raise ValueError(
            f"paired arms need one value per shared seed: {a_name} has {x.size}, "
            f"{b_name} has {y.size}"
        )
    difference = mean_interval(x - y, seed=seed)
    min_p = permutation_p_floor(x.size)
    if x.size == 1 or np.all(x == y):
        return PairedComparison(a_name, b_name, difference, 1.0, min_p)
    res = stats.permutation_test(
        (x, y),
        lambda u, v, axis: np.mean(u - v, axis=axis),
        permutation_type="samples",
        alternative="two-sided",
        n_resamples=N_RESAMPLES,
        vectorized=True,
        rng=np.random.default_rng(seed),
    )
    return PairedComparison(a_name, b_name, difference, float(res.pvalue), min_p)
