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
    return majority_correct_at(answers, correct, [len(answers)], equivalent)[0]


def majority_correct_at(
    answers: Sequence[str | None],
    correct: Sequence[bool],
    ks: Sequence[int],
    equivalent: Callable[[str, str], bool] = operator.eq,
) -> list[bool]:
    """`majority_correct` of the first k samples, for each k of `ks`, with each sample's class
    found once: a sample's class depends only on the samples before it, so the first k
    samples' classes are a prefix of all n's (maj@1..maj@n cost the comparisons of maj@n alone,
    where voting k by k repeats them for every k)."""
    if len(answers) != len(correct):
        raise ValueError(f"{len(answers)} answers but {len(correct)} correct flags")
    n = max(ks, default=0)
    if n > len(answers):
        raise ValueError(f"k={n} > n={len(answers)} samples")
    classes = _classes(answers[:n], correct[:n], equivalent)
    return [_truth_wins(classes[:k], correct[:k]) for k in ks]


def _classes(
    answers: Sequence[str | None], correct: Sequence[bool], equivalent: Callable[[str, str], bool]
) -> list[int | None]:
    """Each sample's class (None: no answer, no vote), classes numbered in order of their
    first vote (`majority_correct`'s rule)."""
    out: list[int | None] = []
    firsts: list[str] = []  # each class's first answer
    truth: int | None = None  # the truth's class
    for answer, ok in zip(answers, correct, strict=True):
        if answer is None:
            out.append(None)
            continue
        c = truth if ok and truth is not None else _class_of(answer, firsts, equivalent)
        if c is None:
            c = len(firsts)
            firsts.append(answer)
        if ok:
            truth = c
        out.append(c)
    return out


def _truth_wins(classes: Sequence[int | None], correct: Sequence[bool]) -> bool:
    """Whether the truth's class (that of the first solved sample) has the most votes, a tie
    going to the class numbered first (its first vote came first)."""
    truth = next((c for c, ok in zip(classes, correct, strict=True) if ok), None)
    if truth is None:
        return False
    votes = [0] * (1 + max(c for c in classes if c is not None))
    for c in classes:
        if c is not None:
            votes[c] += 1
    return votes.index(max(votes)) == truth


def _class_of(answer: str, firsts: list[str], equivalent: Callable[[str, str], bool]) -> int | None:
    """The first class whose first answer `answer` is `equivalent` to, or None."""
    return next((c for c, first in enumerate(firsts) if equivalent(answer, first)), None)
