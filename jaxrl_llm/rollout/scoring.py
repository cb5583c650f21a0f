"""Scoring samples while the engine is still decoding: `StreamingScorer`, and the reward
failure counts a step reports (`RewardCounts`).

A rollout's samples finish at different times (a group's short answers long before its
longest one). The driver hands each finished sample to `StreamingScorer.add`; a background
thread scores, whenever it is free, every sample finished since its last batch (one
`reward.score` call: the reward pool spreads it over its worker processes), so rewards run
beside decoding and only the samples finishing last are scored after it. The scores equal
one `reward.score` call over the whole batch: each sample is scored alone either way.
Each call's per-reward breakdown (`Scorer.last_parts`) is summed into `RewardCounts.parts`.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np


@dataclasses.dataclass(frozen=True)
class PartTotals:
    """One reward of a combination over several scoring calls: the sum of its unweighted
    scores, how many samples it scored, the seconds spent scoring with it, and the sums of
    what it counted (`RewardPart.counts`)."""

    total: float = 0.0
    scored: int = 0
    seconds: float = 0.0
    counts: Mapping[str, int] = dataclasses.field(default_factory=dict)

    @classmethod
    def of(cls, part) -> PartTotals:
        """A `rewards.pool.RewardPart` (NaN scores: samples it has no score for)."""
        scores = np.asarray(part.scores, np.float64)
        scored = scores[~np.isnan(scores)]
        counts = dict(getattr(part, "counts", {}))
        return cls(float(scored.sum()), int(scored.size), float(part.seconds), counts)

    def __add__(self, other: PartTotals) -> PartTotals:
        names = [*self.counts, *(k for k in other.counts if k not in self.counts)]
        counts = {k: self.counts.get(k, 0) + other.counts.get(k, 0) for k in names}
        return PartTotals(
            self.total + other.total,
            self.scored + other.scored,
            self.seconds + other.seconds,
            counts,
        )


@dataclasses.dataclass(frozen=True)
class RewardCounts:
    """Samples a reward pool failed on, summed over hosts and calls; `first_error` is one
    failure's message for the stop message; `parts` each reward's `PartTotals` by metric
    name."""

    errors: int = 0
    timeouts: int = 0
    total: int = 0
    first_error: str = ""
    parts: Mapping[str, PartTotals] = dataclasses.field(default_factory=dict)

    @classmethod
    def of(cls, reward, total: int) -> RewardCounts:
        """The last batch of `reward` (a `rewards.pool.Scorer`; a scorer without
        `last_failures` or `last_parts` reports none)."""
        failures = list(getattr(reward, "last_failures", {}).values())
        errors = [f for f in failures if f.kind != "timeout"]
        first = str(errors[0]) if errors else ""
        parts = {k: PartTotals.of(p) for k, p in getattr(reward, "last_parts", {}).items()}
        return cls(len(errors), len(failures) - len(errors), total, first, parts)

    def __add__(self, other: RewardCounts) -> RewardCounts:
        names = [*self.parts, *(k for k in other.parts if k not in self.parts)]
        return RewardCounts(
            self.errors + other.errors,
            self.timeouts + other.timeouts,
            self.total + other.total,
            self.first_error or other.first_error,
            {k: self.parts.get(k, PartTotals()) + other.parts.get(k, PartTotals()) for k in names},
        )

    def check(self, reward) -> None:
        """The pool's stop rule (`RewardPool.check_errors`) on these whole-batch counts."""
        if hasattr(reward, "check_errors"):
            reward.check_errors(self.errors, self.total, self.first_error)


class StreamingScorer:
    """Scores samples as they are added, in batches, on one background thread.

    `reward.score(responses, examples) -> scores` (a `RewardPool` or any object with that
    method); `examples[i]` is sample i's data row. `add(i, text)` once per sample, then
    `result()` waits for the last batch and returns the scores [N] in sample order and the
    summed failure counts. A scoring error (not a reward's own exception, which the pool
    turns into a score) is raised by `result()`.
    """

    def __init__(self, reward, examples: Sequence[Mapping[str, Any]]):
        self._reward, self._examples = reward, list(examples)
        self._scores: list[float | None] = [None] * len(self._examples)
        self._pending: list[tuple[int, str]] = []
        self._counts = RewardCounts()
        self._error: BaseException | None = None
        self._closed = False
        self._wake = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="reward-scorer", daemon=True)
        self._thread.start()

    def add(self, index: int, text: str) -> None:
        with self._wake:
            self._pending.append((index, text))
            self._wake.notify()

    def result(self) -> tuple[list[float], RewardCounts]:
        with self._wake:
            self._closed = True
            self._wake.notify()
        self._thread.join()
        if self._error is not None:
            raise self._error
        missing = [i for i, s in enumerate(self._scores) if s is None]
        if missing:
            raise ValueError(f"{len(missing)} samples were never added, e.g. {missing[:5]}")
        return [float(s) for s in self._scores if s is not None], self._counts

    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._pending and not self._closed:
                    self._wake.wait()
                batch, self._pending = self._pending, []
                if not batch:
                    return
            try:
                scores = self._reward.score(
                    [text for _, text in batch], [self._examples[i] for i, _ in batch]
                )
                self._counts = self._counts + RewardCounts.of(self._reward, len(batch))
            except BaseException as e:  # surfaced by result(); the thread must not die silently
                self._error = e
                return
            for (i, _), s in zip(batch, scores, strict=True):
                self._scores[i] = s
