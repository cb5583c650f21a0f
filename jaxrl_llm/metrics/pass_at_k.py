"""pass@k (unbiased) and maj@k: pure functions over per-problem samples.

pass@k is the unbiased estimator of Chen et al. 2021 (Codex, eq. 1): with n samples of
which c are correct, pass@k = 1 - C(n - c, k) / C(n, k), averaged over problems.
maj@k: the first k samples vote with their extracted answers over classes of equal answers
(`majority_correct`), and the problem counts as solved when the largest class is the truth's.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Sequence


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one problem with n samples, c of them correct (k <= n)."""
    if k > n:
        raise ValueError(f"k={k} > n={n} samples")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def majority_correct(
    answers: Sequence[str | None],
    correct: Sequence[bool],
    equivalent: Callable[[str, str], bool] = operator.eq,
) -> bool:
    """maj@k of one problem: whether the most voted answer is the truth.

    `answers[i]` is sample i's extracted answer (None: none, which does not vote) and
    `correct[i]` whether the sample solved the problem. Votes go to classes of equal answers:
    every solved sample votes for one class, the truth's (its spellings, `0.5` and
    `\\frac{1}{2}`, all equal the truth); any other answer joins the first class whose first
    answer it is `equivalent` to (e.g. `rewards.answers_equivalent`), the truth's included (a
    right answer whose score a penalty took below `RewardConfig.correct` still votes for it),
    else opens a new one. The largest class wins; a tie goes to the class whose first vote
    came first.
    """
    votes: list[int] = []  # per class, in order of its first vote
    firsts: list[str] = []  # each class's first answer
    truth: int | None = None  # the truth's class
    for answer, ok in zip(answers, correct, strict=True):
        if answer is None:
            continue
        c = truth if ok and truth is not None else _class_of(answer, firsts, equivalent)
        if c is None:
            c = len(votes)
            votes.append(0)
            firsts.append(answer)
        if ok:
            truth = c
        votes[c] += 1
    if truth is None:
        return False
    return votes.index(max(votes)) == truth  # index: the first class with the most votes


def _class_of(answer: str, firsts: list[str], equivalent: Callable[[str, str], bool]) -> int | None:
    """The first class whose first answer `answer` is `equivalent` to, or None."""
    return next((c for c, first in enumerate(firsts) if equivalent(answer, first)), None)
