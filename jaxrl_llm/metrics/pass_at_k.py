"""pass@k (unbiased) and maj@k: pure functions over per-problem samples.

pass@k is the unbiased estimator of Chen et al. 2021 (Codex, eq. 1): with n samples of
which c are correct, pass@k = 1 - C(n - c, k) / C(n, k), averaged over problems.
maj@k: the most frequent extracted answer among the first k samples (ties: the first seen)
is scored against the ground truth.
"""

from __future__ import annotations

import collections
import math


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one problem with n samples, c of them correct (k <= n)."""
    if k > n:
        raise ValueError(f"k={k} > n={n} samples")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def majority_answer(answers: list[str | None]) -> str | None:
    votes = collections.Counter(a for a in answers if a is not None)
    if not votes:
        return None
    best = max(votes.values())
    return next(a for a in answers if a is not None and votes[a] == best)
