"""The reproductions' statistics against cases computed by hand."""

import itertools
import math

import numpy as np
import pytest

from jaxrl_llm.repro import stats


def test_interval_of_two_values_spans_both():
    # Resampled means of [0, 1] are 0, 0.5, 1 with probability 1/4, 1/2, 1/4: the 2.5% and
    # 97.5% percentiles are 0 and 1.
    iv = stats.mean_interval([0.0, 1.0])
    np.testing.assert_allclose([iv.mean, iv.low, iv.high], [0.5, 0.0, 1.0], atol=1e-12)
    assert iv.n == 2


def test_interval_of_three_values_excludes_nothing_inside():
    # Means of resamples of [1, 2, 3]: 1 (all ones) has probability 1/27 = 3.7% > 2.5%, so the
    # lower bound is 1; by symmetry the upper is 3.
    iv = stats.mean_interval([1.0, 2.0, 3.0])
    np.testing.assert_allclose([iv.mean, iv.low, iv.high], [2.0, 1.0, 3.0], atol=1e-12)
    assert not iv.excludes(1.5)
    assert iv.excludes(0.0) and iv.excludes(3.5)


def test_tied_values_give_a_point_interval_and_one_value_none():
    iv = stats.mean_interval([0.25, 0.25, 0.25])
    np.testing.assert_allclose([iv.low, iv.high], [0.25, 0.25], atol=0)
    one = stats.mean_interval([0.7])
    assert one.mean == 0.7 and math.isnan(one.low) and math.isnan(one.high)
    assert not one.excludes(0.0)


def test_paired_permutation_p_is_exact_for_all_positive_differences():
    # d = [1, 2, 3]: of the 8 sign flips only +++ and --- reach |mean| >= 2, so p = 2/8.
    cmp = stats.paired_comparison("a", [1.0, 2.0, 3.0], "b", [0.0, 0.0, 0.0])
    np.testing.assert_allclose(cmp.p_value, 0.25, atol=1e-12)
    np.testing.assert_allclose(cmp.min_p_value, 0.25, atol=0)
    np.testing.assert_allclose([cmp.difference.low, cmp.difference.high], [1.0, 3.0], atol=1e-12)
    assert not cmp.significant  # 3 seeds can never reach p < 0.05


def test_paired_p_matches_enumerated_sign_flips():
    a = np.array([0.9, 0.5, 0.8, 0.70, 0.6])
    b = np.array([0.5, 0.6, 0.4, 0.65, 0.3])
    d = a - b
    observed = abs(d.mean())
    flips = [abs((d * np.array(s)).mean()) for s in itertools.product((1, -1), repeat=5)]
    expected = np.mean([f >= observed - 1e-12 for f in flips])  # 6 of 32
    cmp = stats.paired_comparison("a", a, "b", b)
    np.testing.assert_allclose(cmp.p_value, expected, atol=1e-12)
    np.testing.assert_allclose(cmp.p_value, 6 / 32, atol=1e-12)
    np.testing.assert_allclose(cmp.difference.mean, d.mean(), atol=1e-12)


def test_five_seeds_all_better_is_significant():
    cmp = stats.paired_comparison("a", [0.6, 0.7, 0.8, 0.9, 0.75], "b", [0.5, 0.5, 0.6, 0.6, 0.5])
    np.testing.assert_allclose(cmp.p_value, 2 / 32, atol=1e-12)
    assert cmp.difference.low > 0 and not cmp.significant  # 0.0625 is the floor at 5 seeds


def test_identical_arms_give_p_one():
    cmp = stats.paired_comparison("a", [0.5, 0.6], "b", [0.5, 0.6])
    assert cmp.p_value == 1.0 and cmp.difference.mean == 0.0


def test_bad_input_names_the_arm():
    with pytest.raises(ValueError, match="lim has 2, random has 3"):
        stats.paired_comparison("lim", [0.1, 0.2], "random", [0.1, 0.2, 0.3])
    with pytest.raises(ValueError, match="full must be a non-empty"):
        stats.paired_comparison("full", [float("nan")], "b", [0.1])
    with pytest.raises(ValueError, match="values must be a non-empty"):
        stats.mean_interval([])


@pytest.mark.parametrize(
    ("n", "floor"),
    [
        (13, 2 / 2**13),  # 2^13 = 8192 sign patterns <= 9,999 resamples: exact
        (14, 2 / (stats.N_RESAMPLES + 1)),  # 16,384 > 9,999: random resamples
        (20, 2 / (stats.N_RESAMPLES + 1)),
    ],
)
def test_min_p_is_the_floor_the_test_reaches(n, floor):
    """Every seed favours a (all differences positive): only the all-plus pattern (and its
    mirror) is as extreme as the data, so the p-value is the test's floor. Up to 13 seeds
    scipy enumerates all 2^n patterns: p = 2 / 2^n. From 14 on it draws N_RESAMPLES random
    patterns and counts the observed one with them (its `adjustment`), so p >= 2 / (9999 + 1)
    = 0.0002 (reached when no draw repeats the all-plus pattern, as with seed 0: asserted
    only up to 13 seeds, where it is exact). The floor reported was 2 / 2^n, below what the
    test can give (1.2e-4 at 14 seeds)."""
    rng = np.random.default_rng(n)
    b = rng.uniform(0.4, 0.6, n)
    a = b + rng.uniform(0.01, 0.05, n)
    cmp = stats.paired_comparison("a", a, "b", b)
    assert cmp.min_p_value == floor
    assert cmp.p_value == floor if 2**n <= stats.N_RESAMPLES else cmp.p_value >= floor
