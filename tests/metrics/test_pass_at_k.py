"""`jaxrl-llm eval`: the unbiased pass@k estimator, majority voting, and an end-to-end run."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxrl_llm.metrics.pass_at_k import majority_correct, majority_correct_at, pass_at_k


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


def _same_number(a: str, b: str) -> bool:
    return Fraction(a) == Fraction(b)


def test_majority_counts_ties_and_missing():
    # Voting by string equality (the default): the largest class wins, a tie the first seen.
    assert majority_correct(["3", "4", "4", "3", "4"], [False, True, True, False, True])
    assert not majority_correct(["7", "5", "5", "7"], [False, True, True, False])  # tie: 7 first
    assert majority_correct(["5", "7", "7", "5"], [True, False, False, True])
    assert majority_correct([None, None, "2"], [False, False, True])  # no answer: no vote
    assert not majority_correct([None, "1", "2", None], [False, False, True, False])
    assert not majority_correct([None, None], [False, False])
    assert not majority_correct([], [])


def test_majority_counts_every_correct_spelling_as_one_answer():
    """The samples the reward marked correct all equal the truth, however spelled: 0.5, 1/2
    and \\frac{1}{2} are three votes for it against two for 3 (raw strings made 3 the
    majority)."""
    answers = ["0.5", "\\frac{1}{2}", "3", "3", "1/2"]
    assert majority_correct(answers, [True, True, False, False, True])


def test_majority_merges_equivalent_wrong_answers():
    """Wrong answers are grouped by `equivalent`: 7, 7.0 and 14/2 are three votes for one
    wrong answer against two for the truth 12 (as strings each had one vote)."""
    answers, correct = ["12", "7", "7.0", "14/2", "12"], [True, False, False, False, True]
    assert majority_correct(answers, correct)  # string equality: 12 leads 2 to 1
    assert not majority_correct(answers, correct, equivalent=_same_number)
    # A tie between the truth and a merged wrong answer goes to the one seen first.
    assert not majority_correct(["7", "12", "7.0", "12"], [False, True, False, True], _same_number)
    assert majority_correct(["12", "7", "7.0", "12"], [True, False, False, True], _same_number)


_SAMPLES = st.lists(
    st.tuples(st.sampled_from([None, "1", "1.0", "2", "2.0", "3", "4"]), st.booleans()),
    max_size=12,
)


@settings(max_examples=300, deadline=None)
@given(_SAMPLES, st.data())
def test_maj_at_every_k_equals_voting_on_each_prefix(samples, data):
    """maj@k for several k at once (each sample classed once) equals `majority_correct` run on
    each prefix of k samples (how eval voted before), with merged spellings and ties."""
    answers, correct = [a for a, _ in samples], [c for _, c in samples]
    ks = data.draw(st.lists(st.integers(0, len(samples)), max_size=5))
    for eq in (_same_number, lambda a, b: a == b):
        expected = [majority_correct(answers[:k], correct[:k], eq) for k in ks]
        assert majority_correct_at(answers, correct, ks, eq) == expected


def test_maj_at_every_k_compares_as_often_as_maj_at_n_alone():
    """Voting k by k compared every prefix's answers again: maj@1, 2, 4, ..., 64 of 64
    distinct wrong answers made 2,667 comparisons (each two math_verify parses in eval);
    classing each sample once makes maj@64's 2,016 for all seven."""
    calls = 0

    def counted(a: str, b: str) -> bool:
        nonlocal calls
        calls += 1
        return a == b

    answers, correct = [str(i) for i in range(64)], [False] * 63 + [True]
    ks = [1, 2, 4, 8, 16, 32, 64]
    assert majority_correct_at(answers, correct, ks, counted) == [False] * 7
    assert calls == 64 * 63 // 2  # each sample against the classes before it, once
    with pytest.raises(ValueError, match="k=65 > n=64"):
        majority_correct_at(answers, correct, [65])


def test_a_right_answer_a_penalty_left_unsolved_still_votes_for_the_truth():
    """A right answer scored below RewardConfig.correct (ToRL's failed-cell penalty: 1 - 0.5)
    is not solved, but it is the truth's answer: its vote goes to the truth's class, whether
    it comes before the solved samples or after them (it had opened a class of its own, and
    8, 8 won 2 to 1)."""
    assert majority_correct(["7", "7", "8", "8"], [True, False, False, False])
    assert majority_correct(["7", "7", "8", "8"], [False, True, False, False])
    assert not majority_correct(["8", "7", "8", "7"], [False, False, False, True], _same_number)
    assert majority_correct(["7.0", "8", "7", "8"], [False, False, True, False], _same_number)
