"""`jaxrl-llm eval`: the unbiased pass@k estimator, majority voting, and an end-to-end run."""

from __future__ import annotations

import math

import pytest

from jaxrl_llm.metrics.pass_at_k import majority_answer, pass_at_k


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (5, 2, 1, 0.4),
        (5, 2, 2, 1 - 3 / 10),  # 1 - C(3,2)/C(5,2) = 0.7
        (5, 0, 3, 0.0),
        (5, 3, 3, 1.0),  # n - c = 2 < k: every 3-subset holds a correct sample
        (5, 5, 1, 1.0),
        (10, 3, 4, 1 - math.comb(7, 4) / math.comb(10, 4)),  # 1 - 35/210
        (1, 1, 1, 1.0),
        (1, 0, 1, 0.0),
    ],
)
def test_pass_at_k_matches_hand_computed(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_1_is_the_fraction_correct():
    for c in range(9):
        assert pass_at_k(8, c, 1) == pytest.approx(c / 8, abs=1e-12)


def test_pass_at_k_rejects_k_above_n():
    with pytest.raises(ValueError, match="k=3 > n=2"):
        pass_at_k(2, 1, 3)


def test_majority_answer_counts_ties_and_missing():
    assert majority_answer(["3", "4", "4", "3", "4"]) == "4"
    assert majority_answer(["7", "5", "5", "7"]) == "7"  # tie: the first seen wins
    assert majority_answer(["5", "7", "7", "5"]) == "5"
    assert majority_answer([None, None, "2"]) == "2"  # unparsed answers do not vote
    assert majority_answer([None, "1", "2", None]) == "1"
    assert majority_answer([None, None]) is None
    assert majority_answer([]) is None
